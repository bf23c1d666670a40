// The elements of a TensorList (a variant DTensor whose ResourceInfo records its
// elements' layout, see tensor_list_rules.cc) as each device holds them, and moving them
// to another layout.
#ifndef TF_DTENSOR_CC_RULES_LIST_ELEMENTS_H_
#define TF_DTENSOR_CC_RULES_LIST_ELEMENTS_H_

#include <string>
#include <vector>

#include "cc/core/layout.h"
#include "cc/core/status.h"
#include "cc/spmd/builder.h"

namespace tf_dtensor {

// The local shape of an element: each device's block, -1 where the blocks differ in size
// (one element_shape argument serves every device) or the size is unknown.
std::vector<int64_t> LocalElementShape(const ResourceInfo& info);

// `element` with a new unsharded leading axis: the layout of stacked elements.
//   stack(list of [x,*] of [B,D]) -> [*,x,*] of [T,B,D]
Layout Stacked(const Layout& element);

// Whether elements of layout `from` reach `to` by slicing alone (no communication).
bool ReachedBySlicing(const Layout& from, const Layout& to, const std::vector<int64_t>& shape);

// The element layout that lists of elements `from` can all take, preferring one the
// others reach by slicing alone (no communication): the most sharded of them,
//   [*] and [x] -> [x];   [x,*] and [*,*] -> [x,*];
// and where there is none, the first one's ([x,*] and [*,x] -> [x,*]).
Layout CommonElementLayout(const std::vector<Layout>& from, const std::vector<int64_t>& shape);

// The collectives that take a list's elements of `info` to `target` (RelayoutStep lines,
// as `debug.explain` shows them), none when they agree.
std::vector<std::string> DescribeListRelayout(const ResourceInfo& info, const Layout& target,
                                              const std::string& what);

// The list `list` with its elements in layout `target`. No TF op maps over a list, so the
// elements are stacked on a new unsharded axis 0, the stack relaid out ([*,x] -> [*,*]
// all-gathers every element, [*,*] -> [*,x] slices them), and its rows made a list again:
//   list of [x] of [8] -> stack [*,x] of [T,8] -> [*,*] -> list of [*] of [8]
// Unset elements of a reserved list become zeros, which is what reading them gives.
StatusOr<ValueId> RelayoutListElements(Builder& builder, ValueId list, const Layout& target,
                                       const std::string& what);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_RULES_LIST_ELEMENTS_H_
