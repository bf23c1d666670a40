// Scatters: updates written into a tensor or a DVariable at integer indices.
//   resource_scatter_add(table [V,D] [x,*], ids [B], updates [B,D]) -> each device adds the
//     updates of the ids in its row block (row_blocks.h); ids and updates are read whole
//     along x (a batch-sharded gradient is gathered: it is small), the table never is.
//   resource_scatter_add(table [*,y], ids, updates [B,D] -> [*,y]) -> local, no communication
//   resource_scatter_update(table [x,*], ids, updates), and any scatter of a scalar update
//     -> each device keeps the ids in its block (Where, GatherNd) and their updates' rows
//   resource_scatter_add(table, ids, 1.0) on [*,y] or [*,*] -> local, the scalar replicated
//   tensor_scatter_add(t [V,D] [*,y], indices [B,1], updates [B,D]) -> [*,y]  (indexed axes
//     and the updates' index axes whole; trailing slice axes keep their sharding)
//   scatter_nd(indices [B,1] [x,*], updates [B,D] [x,y], shape) -> [*,y] +partial(x)
//     (duplicates add up, so each device scatters its updates and the sums combine)
//   sparse_to_dense(...) -> replicated
#include <algorithm>

#include "cc/core/strings.h"
#include "cc/rules/factor.h"
#include "cc/rules/expand.h"
#include "cc/rules/registry.h"
#include "cc/rules/row_blocks.h"
#include "cc/tf/dtypes.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {
namespace {

// How the updates of a ResourceScatter* op combine with the table: what an id outside a
// device's block is given so that it changes nothing there.
enum class Combine { kAdd, kMul, kMinMax, kUpdate };

// ResourceScatter{Add,Sub,Mul,Div,Min,Max,Update}(table, ids, updates), updates of shape
// ids.shape + table.shape[1:] (or a scalar). Ids, and the updates' id axes, are read
// whole; the updates' other axes take the table's sharding. A table sharded on its rows
// runs on each device's block: out-of-block ids get a clamped row and an update that
// leaves it as it is (0 to add, 1 to multiply, the row's own value for min and max); an
// update, a scalar update and a table with an empty block keep only the block's ids
// (ExpandInBlock).
class ResourceScatterRule : public Rule {
 public:
  explicit ResourceScatterRule(Combine combine) : combine_(combine) {}

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    if (ctx.inputs.size() != 3 || !ctx.inputs[0].resource) {
      return InvalidArgument("'" + ctx.op_name + "' needs a DVariable handle as input 0; got " +
                             ctx.Describe(0) + ".");
    }
    const ResourceInfo& table = *ctx.inputs[0].resource;
    const Layout& value = table.value_layout;
    const int ids_rank = ctx.rank(1);
    const int updates_rank = ctx.rank(2);
    const int value_rank = static_cast<int>(table.value_shape.size());
    if (value_rank == 0 || (updates_rank != 0 && updates_rank != ids_rank + value_rank - 1)) {
      return InvalidArgument("'" + ctx.op_name + "' needs updates of shape ids.shape + "
                             "table.shape[1:]; got " + ctx.Describe(1) + " and " +
                             ctx.Describe(2) + " for a table of shape " +
                             ShapeString(table.value_shape) + ".");
    }
    Plan plan;
    plan.inputs = {std::nullopt, Layout::Replicated(ctx.mesh, ids_rank), std::nullopt};
    if (updates_rank == 0) {
      plan.inputs[2] = Layout::Replicated(ctx.mesh, 0);  // one value for every id
    } else {
      std::vector<DimSpec> specs(ids_rank, DimSpec::Replicated());
      for (int d = 1; d < value_rank; ++d) specs.push_back(value.spec(d));
      plan.inputs[2] = Layout::Replicated(ctx.mesh, updates_rank).WithSpecs(specs);
    }
    return plan;
  }

  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    const ResourceInfo& table = *ctx.inputs[0].resource;
    if (table.value_layout.rank() == 0 || !table.value_layout.spec(0).sharded()) {
      return ExpandDefault(ctx, plan, builder);
    }
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> inputs, PrepareInputs(ctx, plan, builder));
    TFD_ASSIGN_OR_RETURN(BlockIds ids, LocalizeIds(builder, inputs[1], table.value_layout,
                                                   table.value_shape, 0, 0, ctx.op_name,
                                                   IdRange::kInRange));
    const int k = ids.mesh_dim;
    if (combine_ == Combine::kUpdate || ctx.rank(2) == 0 ||
        HasEmptyBlock(table.value_layout, table.value_shape, 0)) {
      return ExpandInBlock(ctx, plan, builder, inputs, ids);
    }
    const int trailing = static_cast<int>(table.value_shape.size()) - 1;
    TFD_ASSIGN_OR_RETURN(ValueId mask,
                         ExpandMask(builder, ids.in_block, k, ctx.rank(1), 0, trailing));
    ValueId fill = -1;
    if (combine_ == Combine::kAdd || combine_ == Combine::kMul) {
      TFD_ASSIGN_OR_RETURN(fill, FillLike(builder,
                                          combine_ == Combine::kAdd ? "ZerosLike" : "OnesLike",
                                          inputs[2], k));
    } else {
      // kMinMax: the clamped rows' own values; max(row, row) and min(row, row) leave them.
      LocalOpOptions read = DistinctOver(k, {AttrOverride::Type("dtype", table.value_dtype),
                                             AttrOverride::Type("Tindices",
                                                                builder.dtype(ids.local))});
      TFD_ASSIGN_OR_RETURN(std::vector<ValueId> rows,
                           builder.LocalOp("ResourceGather", {inputs[0], ids.local}, read,
                                           {*builder.layout(inputs[2])}));
      fill = rows[0];
    }
    TFD_ASSIGN_OR_RETURN(ValueId updates, Select(builder, mask, inputs[2], fill, k,
                                                 *builder.layout(inputs[2])));
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> out,
                         builder.LocalOp(ctx.op_name, {inputs[0], ids.local, updates},
                                         DistinctOver(k, plan.overrides, /*copy_attrs=*/true),
                                         {}));
    return out;
  }

 private:
  // Each device runs the op on the ids in its block only (Where, then GatherNd of the
  // ids and of the updates' rows): the way for an update, where an out-of-block id
  // cannot be made harmless as for the other combines (a clamped row rewritten with its
  // own value races with a real update of that row), and for a scalar update, which has
  // no rows to mask. The table is never gathered. One device's kernel sees the same ids,
  // in the same order, for every row it holds.
  static StatusOr<std::vector<ValueId>> ExpandInBlock(const OpContext& ctx, const Plan& plan,
                                                      Builder& builder,
                                                      const std::vector<ValueId>& inputs,
                                                      const BlockIds& ids) {
    const int k = ids.mesh_dim;
    TFD_ASSIGN_OR_RETURN(InBlockIds kept, KeepInBlock(builder, ids));
    const ValueId local_ids = kept.local;
    ValueId updates = inputs[2];
    if (ctx.rank(2) > 0) {  // the kept ids' rows of the updates
      if (kept.listed) {
        TFD_ASSIGN_OR_RETURN(updates, ListOfOne(builder, updates, k));
      }
      TFD_ASSIGN_OR_RETURN(updates, KeptRows(ctx, builder, ids, kept, updates));
    }
    LocalOpOptions options = DistinctOver(k, plan.overrides, /*copy_attrs=*/true);
    options.distinct_over = kept.distinct;
    return builder.LocalOp(ctx.op_name, {inputs[0], local_ids, updates}, options, {});
  }

  // The rows of `updates` (the ids' axes, then the table's trailing axes) of the kept ids,
  // in order: a gather of rows by their position among the ids, which works where a
  // device's block of the trailing axes is empty too (GatherNd refuses an empty tensor:
  // [4,1,5] in [z,x,y] over x=2 leaves a device rows of no column). Ids of rank 2 or more
  // are flattened first: updates [a,b,D] -> [a*b,D].
  static StatusOr<ValueId> KeptRows(const OpContext& ctx, Builder& builder, const BlockIds& ids,
                                    const InBlockIds& kept, ValueId updates) {
    using A = AttrOverride;
    const Layout layout = *builder.layout(updates);  // copies: the builder grows below
    const Mesh mesh = layout.mesh();
    std::vector<int> distinct = kept.distinct;
    for (int d : layout.DistinctMeshDims()) distinct.push_back(d);
    auto one = [&](const std::string& op, const std::vector<ValueId>& in,
                   std::vector<AttrOverride> attrs, const Layout& out) {
      LocalOpOptions options;
      options.copy_attrs = false;
      options.overrides = std::move(attrs);
      options.distinct_over = distinct;
      return builder.LocalOpValue(op, in, options, out);
    };
    const int id_axes = std::max(ctx.rank(1), 1);
    const int dtype = builder.dtype(updates);
    int64_t count = 1;  // the ids (replicated: every device holds them all)
    for (int64_t size : ctx.inputs[1].shape) count *= size;
    std::vector<DimSpec> specs(1, DimSpec::Replicated());
    specs.insert(specs.end(), layout.specs().begin() + id_axes, layout.specs().end());
    const Layout rows = layout.WithSpecs(specs);
    ValueId flat_updates = updates;
    if (id_axes > 1) {  // [a,b,D...] -> [a*b,D...], each device with its own D sizes
      TFD_ASSIGN_OR_RETURN(ValueId shape,
                           one("Shape", {updates},
                               {A::Type("T", dtype), A::Type("out_type", TF_INT32)},
                               Layout::Replicated(mesh, 1)));
      TFD_ASSIGN_OR_RETURN(ValueId begin, builder.HostConstant({id_axes}, {1}, TF_INT32));
      TFD_ASSIGN_OR_RETURN(ValueId size, builder.HostConstant({-1}, {1}, TF_INT32));
      TFD_ASSIGN_OR_RETURN(ValueId trailing,
                           one("Slice", {shape, begin, size},
                               {A::Type("T", TF_INT32), A::Type("Index", TF_INT32)},
                               Layout::Replicated(mesh, 1)));
      TFD_ASSIGN_OR_RETURN(ValueId front, builder.HostConstant({count}, {1}, TF_INT32));
      TFD_ASSIGN_OR_RETURN(ValueId axis, builder.HostConstant({0}, {}, TF_INT32));
      TFD_ASSIGN_OR_RETURN(ValueId flat_shape,
                           one("ConcatV2", {front, trailing, axis},
                               {A::Int("N", 2), A::Type("T", TF_INT32),
                                A::Type("Tidx", TF_INT32)},
                               Layout::Replicated(mesh, 1)));
      TFD_ASSIGN_OR_RETURN(flat_updates,
                           one("Reshape", {updates, flat_shape},
                               {A::Type("T", dtype), A::Type("Tshape", TF_INT32)}, rows));
    }
    // The kept ids' positions among all ids, in order (those of `kept`): its own for ids
    // of rank 0 or 1, else those of the flattened ids.
    TFD_ASSIGN_OR_RETURN(ValueId vector_shape, builder.HostConstant({-1}, {1}, TF_INT32));
    ValueId where = kept.where;
    if (id_axes > 1) {
      TFD_ASSIGN_OR_RETURN(ValueId flat_in_block,
                           one("Reshape", {ids.in_block, vector_shape},
                               {A::Type("T", TF_BOOL), A::Type("Tshape", TF_INT32)},
                               Layout::Replicated(mesh, 1)));
      TFD_ASSIGN_OR_RETURN(where, one("Where", {flat_in_block}, {A::Type("T", TF_BOOL)},
                                      Layout::Replicated(mesh, 2)));
    }
    TFD_ASSIGN_OR_RETURN(ValueId positions,
                         one("Reshape", {where, vector_shape},
                             {A::Type("T", TF_INT64), A::Type("Tshape", TF_INT32)},
                             Layout::Replicated(mesh, 1)));
    TFD_ASSIGN_OR_RETURN(ValueId axis, builder.HostConstant({0}, {}, TF_INT32));
    return one("GatherV2", {flat_updates, positions, axis},
               {A::Type("Tparams", dtype), A::Type("Tindices", TF_INT64),
                A::Type("Taxis", TF_INT32), A::Int("batch_dims", 0)},
               rows);
  }

  Combine combine_;
};

// The index-tuple length m of `indices` (its last axis), or an error.
StatusOr<int64_t> TupleLength(const OpContext& ctx, int indices, int target_rank) {
  const int rank = ctx.rank(indices);
  const int64_t m = rank > 0 ? ctx.inputs[indices].shape.back() : -1;
  if (m < 0 || m > target_rank) {
    return InvalidArgument("'" + ctx.op_name + "' needs indices of rank 1 or more whose last "
                           "axis (at most " + std::to_string(target_rank) + ") is known; got " +
                           ctx.Describe(indices) + ".");
  }
  return m;
}

// TensorScatter{Update,Add,Sub,Max,Min}(tensor, indices [..., m], updates): output like
// tensor. The m indexed axes, the indices' axes and the updates' index axes are read
// whole (every device applies every update); the slice axes tensor[m:] are shared with
// the updates' trailing axes and keep their sharding, unless a device's block would be
// empty (4 columns over 8): TF refuses updates into an empty tensor, so that axis is read
// whole.
StatusOr<FactorSpec> TensorScatterFactors(const OpContext& ctx) {
  const int rank = ctx.rank(0);
  TFD_ASSIGN_OR_RETURN(int64_t m, TupleLength(ctx, 1, rank));
  const int batch = ctx.rank(1) - 1;
  if (ctx.rank(2) != batch + rank - m) {
    return InvalidArgument("'" + ctx.op_name + "' needs updates of shape indices.shape[:-1] + "
                           "tensor.shape[m:]; got " + ctx.Describe(2) + ".");
  }
  FactorSpec spec;
  std::vector<int> tensor = spec.AddAxes(rank);
  for (int d = 0; d < m; ++d) spec.factors[tensor[d]] = FactorKind::kNeedReplication;
  std::vector<int> indices, updates;
  for (int d = 0; d <= batch; ++d) indices.push_back(spec.Add(FactorKind::kNeedReplication));
  updates.assign(indices.begin(), indices.end() - 1);
  updates.insert(updates.end(), tensor.begin() + m, tensor.end());
  spec.inputs = {tensor, indices, updates};
  spec.outputs = {tensor};
  return spec;
}

// ScatterNd(indices [..., m], updates, shape): duplicates add up, so the index axes are
// contracted (each device scatters its updates; partial sums); the slice axes shape[m:]
// are shared with the updates' trailing axes; the m indexed output axes are new.
StatusOr<FactorSpec> ScatterNdFactors(const OpContext& ctx) {
  TFD_ASSIGN_OR_RETURN(std::vector<int64_t> shape, ctx.IntValue(2, "shape"));
  const int rank = static_cast<int>(shape.size());
  TFD_ASSIGN_OR_RETURN(int64_t m, TupleLength(ctx, 0, rank));
  const int batch = ctx.rank(0) - 1;
  if (ctx.rank(1) != batch + rank - m) {
    return InvalidArgument("'ScatterNd' needs updates of shape indices.shape[:-1] + "
                           "shape[m:]; got " + ctx.Describe(1) + " for shape " +
                           ShapeString(shape) + ".");
  }
  FactorSpec spec;
  std::vector<int> indices;
  for (int d = 0; d < batch; ++d) indices.push_back(spec.Add(FactorKind::kContracted));
  std::vector<int> updates = indices;
  indices.push_back(spec.Add(FactorKind::kNeedReplication));
  std::vector<int> slice = spec.AddAxes(rank - static_cast<int>(m));
  updates.insert(updates.end(), slice.begin(), slice.end());
  std::vector<int> out(m, FactorSpec::kNew);
  out.insert(out.end(), slice.begin(), slice.end());
  spec.inputs = {indices, updates, std::nullopt};
  spec.outputs = {out};
  spec.priority = slice;
  spec.priority.insert(spec.priority.end(), indices.begin(), indices.end());
  return spec;
}

// ScatterNd with its shape argument made local to the output's blocks (an axis that its
// mesh dimension does not divide stays whole).
class ScatterNdRule : public FactorRule {
 public:
  ScatterNdRule() : FactorRule(ScatterNdFactors) {}

  // Linear in the updates only: a sum or mean pending on them passes to the output; pending
  // indices (or any other reduction) are reduced first.
  std::optional<std::vector<PartialSpec>> PartialThrough(const OpContext& ctx) const override {
    const std::optional<Layout>& indices = ctx.inputs[0].layout;
    const std::optional<Layout>& updates = ctx.inputs[1].layout;
    if ((indices && indices->is_partial()) || !updates || !updates->is_partial()) {
      return std::nullopt;
    }
    // Duplicate indices add updates: an integer mean (truncating) is made first.
    for (const PartialSpec& p : updates->partial()) {
      if (p.op != ReduceOp::kSum &&
          (p.op != ReduceOp::kMean || IsIntegerDType(ctx.inputs[1].dtype))) {
        return std::nullopt;
      }
    }
    return updates->partial();
  }

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    TFD_ASSIGN_OR_RETURN(std::vector<int64_t> global, ctx.IntValue(2, "shape"));
    TFD_ASSIGN_OR_RETURN(Plan plan, FactorRule::Forward(ctx));
    TFD_ASSIGN_OR_RETURN(plan.host_inputs[2],
                         plan.outputs[0].UniformLocalShape(global, "the output of 'ScatterNd'"));
    return plan;
  }

 protected:
  void AdjustForward(const OpContext& ctx, const FactorSpec& spec,
                     FactorAssignment& assignment) const override {
    StatusOr<std::vector<int64_t>> global = ctx.IntValue(2, "shape");
    if (!global.ok()) return;
    for (size_t a = 0; a < global->size(); ++a) {
      const int f = spec.outputs[0][a];
      if (f >= 0 && assignment[f].sharded() &&
          (*global)[a] % ctx.mesh.DimSize(assignment[f].mesh_dim) != 0) {
        assignment[f] = DimSpec::Replicated();
      }
    }
  }
};

std::shared_ptr<const Rule> Scatter(Combine combine) {
  return std::make_shared<ResourceScatterRule>(combine);
}

const bool kRegistered = RegisterRules({
    {"ResourceScatterAdd", Scatter(Combine::kAdd)},
    {"ResourceScatterDiv", Scatter(Combine::kMul)},
    {"ResourceScatterMax", Scatter(Combine::kMinMax)},
    {"ResourceScatterMin", Scatter(Combine::kMinMax)},
    {"ResourceScatterMul", Scatter(Combine::kMul)},
    {"ResourceScatterSub", Scatter(Combine::kAdd)},
    {"ResourceScatterUpdate", Scatter(Combine::kUpdate)},
    {"ScatterNd", std::make_shared<ScatterNdRule>(), Traits().Host(2, HostValue::kShape)},
    {"SparseToDense", Replicated(), Traits().AllHost(HostValue::kValue)},
    {"TensorScatterAdd", FactorsWithoutEmptyBlocks(TensorScatterFactors)},
    {"TensorScatterMax", FactorsWithoutEmptyBlocks(TensorScatterFactors)},
    {"TensorScatterMin", FactorsWithoutEmptyBlocks(TensorScatterFactors)},
    {"TensorScatterSub", FactorsWithoutEmptyBlocks(TensorScatterFactors)},
    {"TensorScatterUpdate", FactorsWithoutEmptyBlocks(TensorScatterFactors)},
});

}  // namespace
}  // namespace tf_dtensor
