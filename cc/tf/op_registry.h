// What TF's op registry says of an op: the statefulness the device and the kernel cache
// decide on. Read from the op's OpDef in TF's registry (TF's C++ framework headers: the C
// API has no per-op lookup), so it sees every op the process has loaded, ours included.
#ifndef TF_DTENSOR_CC_TF_OP_REGISTRY_H_
#define TF_DTENSOR_CC_TF_OP_REGISTRY_H_

#include <optional>
#include <string>
#include <vector>

#include "cc/tf/attrs.h"

namespace tf_dtensor {

// Whether TF registers `op_name` as stateful (random, shuffle, ...), or it draws random
// numbers from `seed`/`seed2` attributes although TF registers it as stateless
// (FractionalMaxPool); false for an op TF does not know. Such an op without a rule runs
// once and every device gets its result.
bool IsStatefulOp(const std::string& op_name);

// Whether the op's definition lets its kernel run outside TF's eager dispatch: a known op,
// stateless (no resources, step containers, rendezvous or collectives to look up) and
// without function attributes (no function library to run them).
bool IsStatelessWithoutFunctions(const std::string& op_name);

// How many inputs and outputs TF's definition of `op_name` has: `fixed` single tensors, and
// whether there are also lists (`values` of ConcatV2, AddN's `inputs`, Split's `output`),
// whose lengths an attribute sets. nullopt for an op TF does not know.
struct ArgCount {
  int fixed = 0;
  bool lists = false;
};
struct OpArgCounts {
  ArgCount inputs;
  ArgCount outputs;
};
std::optional<OpArgCounts> ArgCountsOf(const std::string& op_name);

// The dtype (TF_DataType) of each input tensor of `op_name`, lists expanded by their
// length attribute: the one TF's definition fixes, or the one its type attribute has in
// `attrs` ("T" of Div), else 0 (unknown). Stops at a list whose length `attrs` does not
// give; empty for an op TF does not know. What a plan made without tensors (debug.explain)
// knows of its inputs' dtypes: integer division is not linear, float division is.
std::vector<int> InputDTypes(const std::string& op_name, const AttrMap& attrs);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_TF_OP_REGISTRY_H_
