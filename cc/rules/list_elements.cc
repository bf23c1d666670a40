#include "cc/rules/list_elements.h"

#include "cc/spmd/relayout.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {

Layout Stacked(const Layout& element) {
  std::vector<DimSpec> specs = {DimSpec::Replicated()};
  for (const DimSpec& s : element.specs()) specs.push_back(s);
  return element.WithSpecs(specs);
}

bool ReachedBySlicing(const Layout& from, const Layout& to, const std::vector<int64_t>& shape) {
  if (from == to) return true;
  StatusOr<std::vector<RelayoutStep>> steps = PlanRelayout(from, to, shape, "a list element");
  if (!steps.ok()) return false;
  for (const RelayoutStep& step : *steps) {
    if (step.kind != RelayoutStep::Kind::kSlice) return false;
  }
  return true;
}

std::vector<int64_t> LocalElementShape(const ResourceInfo& info) {
  std::vector<int64_t> local = info.value_shape;
  const Layout& layout = info.value_layout;
  if (layout.is_single_device() || layout.rank() != static_cast<int>(local.size())) return local;
  for (int d = 0; d < layout.rank(); ++d) {
    const int64_t n = layout.NumShards(d);
    if (n == 1 || local[d] < 0) continue;
    local[d] = local[d] % n == 0 ? local[d] / n : -1;
  }
  return local;
}

Layout CommonElementLayout(const std::vector<Layout>& from, const std::vector<int64_t>& shape) {
  for (const Layout& candidate : from) {
    bool all = true;
    for (const Layout& other : from) all = all && ReachedBySlicing(other, candidate, shape);
    if (all) return candidate;
  }
  return from.front();
}

std::vector<std::string> DescribeListRelayout(const ResourceInfo& info, const Layout& target,
                                              const std::string& what) {
  std::vector<int64_t> stacked_shape = info.value_shape;
  stacked_shape.insert(stacked_shape.begin(), -1);
  return DescribeRelayout(Stacked(info.value_layout), Stacked(target), stacked_shape, what);
}

StatusOr<ValueId> RelayoutListElements(Builder& builder, ValueId list, const Layout& target,
                                       const std::string& what) {
  if (!builder.resource(list)) {
    return Internal("Relayout of the elements of " + what +
                    ", a list whose elements are not known.");
  }
  const ResourceInfo from = *builder.resource(list);
  if (from.value_layout == target) return list;
  if (target.rank() != from.value_layout.rank() || target.mesh() != from.value_layout.mesh()) {
    return InvalidArgument("Cannot relayout the elements of " + what + " from " +
                           from.value_layout.ShortString() + " to " + target.ShortString() +
                           ": the rank or the mesh differs.");
  }
  ResourceInfo to = from;
  to.value_layout = target;
  const std::vector<int64_t> local_from = LocalElementShape(from);
  const std::vector<int64_t> local_to = LocalElementShape(to);
  const int64_t rank = static_cast<int64_t>(local_from.size());
  std::vector<int64_t> stacked_shape = from.value_shape;
  stacked_shape.insert(stacked_shape.begin(), -1);

  LocalOpOptions stack;
  stack.copy_attrs = false;
  stack.overrides = {AttrOverride::Type("element_dtype", from.value_dtype),
                     AttrOverride::Int("num_elements", -1)};
  stack.global_shapes = {stacked_shape};
  TFD_ASSIGN_OR_RETURN(ValueId shape_from, builder.HostConstant(local_from, {rank}, TF_INT32));
  TFD_ASSIGN_OR_RETURN(std::vector<ValueId> stacked,
                       builder.LocalOp("TensorListStack", {list, shape_from}, stack,
                                       {Stacked(from.value_layout)}));
  TFD_ASSIGN_OR_RETURN(ValueId moved, Relayout(builder, stacked[0], Stacked(target), what));

  LocalOpOptions rows;
  rows.copy_attrs = false;
  rows.overrides = {AttrOverride::Type("element_dtype", from.value_dtype),
                    AttrOverride::Type("shape_type", TF_INT32)};
  TFD_ASSIGN_OR_RETURN(ValueId shape_to, builder.HostConstant(local_to, {rank}, TF_INT32));
  TFD_ASSIGN_OR_RETURN(std::vector<ValueId> relaid,
                       builder.LocalOp("TensorListFromTensor", {moved, shape_to}, rows,
                                       {Layout::Replicated(target.mesh(), 0)}));
  builder.set_resource(relaid[0], std::move(to));
  return relaid[0];
}

}  // namespace tf_dtensor
