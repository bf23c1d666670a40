// Indexing with integer tensors: gathers, one-hot encodings and segment sums.
//   gather(params [V,D] [*,y], indices [B] [x]) -> [x,y]   (every device holds whole rows)
//   gather(params [V,D] [x,*], indices [B] [*]) -> [*,*] +partial(x)   (row blocks: each
//     device reads the ids in its block, the others are zeros; the table is never
//     gathered. Chosen when the result (plus ids sharded over x, gathered first) is
//     smaller than the params; else the params are gathered.)
//   gather(params [V,D] [x,*], indices [B] [x]) -> [x,*]   (the same with the ids
//     gathered, and the partial result reduce-scattered back to the ids' sharding)
//   resource_gather(table [x,*] or [*,y], ids) -> the same, reading the DVariable's shards
//   gather_nd(params [V,W,D] [*,*,y], indices [B,2] [x,*]) -> [x,y]  (indexed axes whole)
//   one_hot(indices [x], depth) -> [x,*]                  (the new axis is unsharded)
//   unsorted_segment_sum(data [x,y], ids [x], n) -> partial(x) -> all-reduce -> [*,y]
// An index axis that would share a mesh dimension with a params axis is gathered (indices
// are small).
#include <algorithm>

#include "cc/core/strings.h"
#include "cc/rules/factor.h"
#include "cc/rules/expand.h"
#include "cc/rules/registry.h"
#include "cc/rules/row_blocks.h"
#include "cc/spmd/relayout.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {
namespace {

// GatherV2(params, indices, axis) with attribute batch_dims, and Gather(params, indices)
// (axis 0). Output: params[:axis] + indices[batch_dims:] + params[axis+1:]. The gathered
// axis needs replication (every device reads whole rows); the leading batch_dims axes are
// factors shared by params and indices. Priority: params' own axes, then the batch axes
// (params' sharding, else the indices'), then the other index axes where still free.
StatusOr<FactorSpec> GatherFactors(const OpContext& ctx, bool has_axis) {
  const int params_rank = ctx.rank(0);
  const int indices_rank = ctx.rank(1);
  int64_t axis = 0;
  if (has_axis) {
    TFD_ASSIGN_OR_RETURN(std::vector<int64_t> value, ctx.IntValue(2, "axis"));
    if (value.size() != 1) return InvalidArgument("'" + ctx.op_name + "' takes a scalar axis.");
    axis = value[0];
  }
  int64_t batch_dims = ctx.attrs->GetInt("batch_dims", 0);
  if (batch_dims < 0) batch_dims += indices_rank;
  if (axis < 0) axis += params_rank;
  if (axis < 0 || axis >= params_rank || batch_dims < 0 || batch_dims > axis ||
      batch_dims > indices_rank) {
    return InvalidArgument("'" + ctx.op_name + "' got axis " + std::to_string(axis) +
                           " and batch_dims " + std::to_string(batch_dims) + " for " +
                           ctx.Describe(0) + " and " + ctx.Describe(1) + ".");
  }
  FactorSpec spec;
  std::vector<int> params = spec.AddAxes(params_rank);
  spec.factors[params[axis]] = FactorKind::kNeedReplication;
  std::vector<int> indices(params.begin(), params.begin() + batch_dims);
  for (int d = static_cast<int>(batch_dims); d < indices_rank; ++d) {
    indices.push_back(spec.Add(FactorKind::kPassThrough));
  }
  for (int d = static_cast<int>(batch_dims); d < params_rank; ++d) spec.priority.push_back(d);
  for (int d = 0; d < batch_dims; ++d) spec.priority.push_back(d);
  for (int f = params_rank; f < static_cast<int>(spec.factors.size()); ++f) {
    spec.priority.push_back(f);
  }
  std::vector<int> out(params.begin(), params.begin() + axis);
  out.insert(out.end(), indices.begin() + batch_dims, indices.end());
  out.insert(out.end(), params.begin() + axis + 1, params.end());
  spec.inputs.assign(ctx.inputs.size(), std::nullopt);
  spec.inputs[0] = params;
  spec.inputs[1] = indices;
  spec.outputs = {out};
  return spec;
}

StatusOr<int64_t> GatherAxis(const OpContext& ctx, bool has_axis) {
  if (!has_axis) return 0;
  TFD_ASSIGN_OR_RETURN(std::vector<int64_t> value, ctx.IntValue(2, "axis"));
  if (value.size() != 1) return InvalidArgument("'" + ctx.op_name + "' takes a scalar axis.");
  return value[0] < 0 ? value[0] + ctx.rank(0) : value[0];
}

// Gather, GatherV2 and ResourceGather (axis 0 of a DVariable's value). The factor rule
// replicates the gathered axis; when params are sharded there over a mesh dimension that
// nothing else of the plan uses, each device gathers from its own block instead (see
// row_blocks.h) and the result is a partial sum over that dimension (indices sharded over
// it are gathered first) when that moves less than gathering the params; a DVariable's
// rows are always read in blocks.
class GatherRule : public FactorRule {
 public:
  GatherRule(bool has_axis, bool resource)
      : FactorRule([has_axis](const OpContext& ctx) { return GatherFactors(ctx, has_axis); }),
        has_axis_(has_axis),
        resource_(resource) {}

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    TFD_ASSIGN_OR_RETURN(OpContext params_ctx, ParamsContext(ctx));
    TFD_ASSIGN_OR_RETURN(Plan plan, FactorRule::Forward(params_ctx));
    TFD_ASSIGN_OR_RETURN(int64_t axis, GatherAxis(params_ctx, has_axis_));
    if (resource_) plan.inputs[0] = std::nullopt;
    const InputInfo& params = params_ctx.inputs[0];
    if (!params.layout || params.layout->is_partial() ||
        !params.layout->spec(static_cast<int>(axis)).sharded() || plan.outputs.empty()) {
      return plan;
    }
    // A tensor with a block of no rows is gathered; a DVariable's device with no rows
    // looks up only the ids of its (empty) block (GatherInBlock).
    if (HasEmptyBlock(*params.layout, params.shape, static_cast<int>(axis))) {
      if (!resource_) return plan;
      if (BatchDims(ctx) != 0) {
        return Unimplemented("'" + ctx.op_name + "' with batch_dims has no rule for a "
                             "DVariable of shape " + ShapeString(params.shape) + " sharded " +
                             params.layout->ShortString() + ": some device holds no rows. "
                             "Use fewer shards than rows.");
      }
    }
    // Strings have no sum to combine the row blocks' lookups with: the table is gathered.
    if (params.dtype == TF_STRING) {
      if (!resource_) return plan;
      return Unimplemented("'" + ctx.op_name + "' of a DVariable of strings sharded on its "
                           "rows (" + params.layout->ShortString() + ") has no rule: strings "
                           "have no sum to combine the row blocks' lookups. Read the variable "
                           "(`v.read_value()`) and gather from the value.");
    }
    const int k = params.layout->spec(static_cast<int>(axis)).mesh_dim;
    // k must be free in the plan: only the indices may have claimed it.
    for (size_t i = 0; i < plan.inputs.size(); ++i) {
      if (!plan.inputs[i] || i == 1) continue;
      for (const DimSpec& s : plan.inputs[i]->specs()) {
        if (s.mesh_dim == k && s.sharded()) return plan;
      }
    }
    auto elements = [](const std::vector<int64_t>& shape) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      return n;
    };
    // The cost: an all-reduce of the result (and a gather of ids sharded over k) against
    // an all-gather of the params.
    bool ids_on_k = false;
    for (const DimSpec& s : plan.inputs[1]->specs()) {
      ids_on_k = ids_on_k || (s.sharded() && s.mesh_dim == k);
    }
    const int64_t ids = elements(ctx.inputs[1].shape);
    int64_t batch = 1;
    for (int64_t d = 0; d < BatchDims(ctx); ++d) batch *= ctx.inputs[1].shape[d];
    const int64_t row = params.shape[axis] > 0 ? elements(params.shape) / params.shape[axis] : 0;
    const int64_t result = batch > 0 ? row * (ids / batch) : 0;
    if (!resource_ && result + (ids_on_k ? ids : 0) > elements(params.shape)) return plan;
    plan.inputs[1] = UnshardedOver(*plan.inputs[1], k);
    // Ids sharded over k leave the result sharded over k where the factors put it (their
    // batch axis): the partial results are reduce-scattered to it, not all-reduced and
    // gathered again, as TensorFlow's DTensor keeps the ids' sharding.
    if (!ids_on_k) plan.outputs[0] = UnshardedOver(plan.outputs[0], k);
    if (!resource_) {
      std::vector<DimSpec> specs = plan.inputs[0]->specs();
      specs[axis] = DimSpec::Sharded(k);
      plan.inputs[0] = plan.inputs[0]->WithSpecs(specs);
    }
    plan.partial_dims = {{k}};
    plan.partial_op = ReduceOp::kSum;
    return plan;
  }

  std::vector<std::optional<Layout>> Backward(
      const OpContext& ctx, const std::vector<std::optional<Layout>>& requested) const override {
    StatusOr<OpContext> params_ctx = ParamsContext(ctx);
    if (!params_ctx.ok()) return std::vector<std::optional<Layout>>(ctx.inputs.size());
    std::vector<std::optional<Layout>> result = FactorRule::Backward(*params_ctx, requested);
    if (resource_ && !result.empty()) result[0] = std::nullopt;
    return result;
  }

  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    if (plan.partial_dims.empty() || plan.partial_dims[0].empty()) {
      return ExpandDefault(ctx, plan, builder);
    }
    TFD_ASSIGN_OR_RETURN(OpContext params_ctx, ParamsContext(ctx));
    TFD_ASSIGN_OR_RETURN(int64_t axis, GatherAxis(params_ctx, has_axis_));
    const int64_t batch_dims = BatchDims(ctx);
    const InputInfo& params = params_ctx.inputs[0];
    const int k = plan.partial_dims[0][0];
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> inputs, PrepareInputs(ctx, plan, builder));
    TFD_ASSIGN_OR_RETURN(BlockIds ids, LocalizeIds(builder, inputs[1], *params.layout,
                                                   params.shape, static_cast<int>(axis), 0,
                                                   ctx.op_name, IdRange::kInRange));
    inputs[1] = ids.local;
    // The local lookups' layout: the result's without k (every device reads all the ids).
    const Layout whole = UnshardedOver(plan.outputs[0].WithoutPartial(), k);
    TFD_ASSIGN_OR_RETURN(Layout partial, whole.WithPartial({{k, ReduceOp::kSum}}));
    ValueId out = -1;
    if (HasEmptyBlock(*params.layout, params.shape, static_cast<int>(axis))) {
      TFD_ASSIGN_OR_RETURN(out, LookUpInBlock(ctx, plan, builder, inputs, ids, partial));
    } else {
      TFD_ASSIGN_OR_RETURN(std::vector<ValueId> gathered,
                           builder.LocalOp(ctx.op_name, inputs,
                                           DistinctOver(k, plan.overrides, /*copy_attrs=*/true),
                                           {whole}));
      TFD_ASSIGN_OR_RETURN(
          ValueId mask,
          ExpandMask(builder, ids.in_block, k, static_cast<int>(batch_dims),
                     static_cast<int>(axis - batch_dims),
                     static_cast<int>(params.shape.size() - axis - 1)));
      TFD_ASSIGN_OR_RETURN(ValueId zeros, FillLike(builder, "ZerosLike", gathered[0], k));
      TFD_ASSIGN_OR_RETURN(out, Select(builder, mask, gathered[0], zeros, k, partial));
    }
    if (plan.outputs[0].is_partial()) return std::vector<ValueId>{out};
    if (plan.outputs[0] == whole) {
      TFD_ASSIGN_OR_RETURN(out, builder.AllReduce(out, {k}, ReduceOp::kSum));
    } else {  // a reduce-scatter to the ids' sharding
      TFD_ASSIGN_OR_RETURN(out, Relayout(builder, out, plan.outputs[0],
                                         "the row-block lookups of '" + ctx.op_name + "'"));
    }
    return std::vector<ValueId>{out};
  }

 private:
  // ResourceGather (axis 0, no batch dims) where some device's block has no row, which
  // the masked lookup would clamp its ids to: each device looks up only the ids in its
  // block (KeepInBlock) and places the rows at their ids, zeros elsewhere (a gather of the
  // rows by position); `out` is the partial result's layout.
  static StatusOr<ValueId> LookUpInBlock(const OpContext& ctx, const Plan& plan,
                                         Builder& builder, const std::vector<ValueId>& inputs,
                                         const BlockIds& ids, const Layout& out) {
    const int k = ids.mesh_dim;
    const Mesh& mesh = ctx.mesh;
    // The shapes computed below are replicated in layout but differ wherever the blocks
    // do: along k, and along the mesh dimensions sharding the ids or the rows' trailing
    // axes unevenly ([1,5,5] in [y,x,*] @ mesh(x=2,y=4): rows of 3 columns where x=0, of
    // 2 where x=1), so each device computes its own.
    auto one = [&](const std::string& op, const std::vector<ValueId>& in,
                   std::vector<AttrOverride> attrs, const Layout& layout) {
      LocalOpOptions options = DistinctOver(k, std::move(attrs));
      options.distinct_over = out.DistinctMeshDims();
      return builder.LocalOpValue(op, in, options, layout);
    };
    using A = AttrOverride;
    TFD_ASSIGN_OR_RETURN(InBlockIds kept, KeepInBlock(builder, ids));
    // The looked-up rows: one per kept id, then the result's trailing axes.
    const int id_axes = ctx.rank(1);
    std::vector<DimSpec> specs(1, DimSpec::Replicated());
    specs.insert(specs.end(), out.specs().begin() + id_axes, out.specs().end());
    const Layout rows_layout = out.WithoutPartial().WithSpecs(specs);
    LocalOpOptions look_up = DistinctOver(k, plan.overrides, /*copy_attrs=*/true);
    look_up.distinct_over = out.DistinctMeshDims();
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> rows,
                         builder.LocalOp(ctx.op_name, {inputs[0], kept.local}, look_up,
                                         {rows_layout}));
    // Each id's entry of the result: the kept rows with a row of zeros in front, picked
    // by position (0 for an id outside the block, else 1 + its rank among the kept ids):
    //   in_block [F,T,F,T] -> positions [0,1,0,2]; result = gather([0; rows], positions)
    // A gather of rows works where the block's trailing axes are empty too (a ScatterNd
    // into an empty shape refuses the kept ids: [1,1,1] in [x,y,*] over y=4).
    const int dtype = builder.dtype(rows[0]);
    const int64_t row_rank = rows_layout.rank();
    std::vector<int64_t> paddings(2 * row_rank, 0);
    paddings[0] = 1;
    TFD_ASSIGN_OR_RETURN(ValueId pads, builder.HostConstant(paddings, {row_rank, 2}, TF_INT32));
    TFD_ASSIGN_OR_RETURN(ValueId padded,
                         one("Pad", {rows[0], pads},
                             {A::Type("T", dtype), A::Type("Tpaddings", TF_INT32)},
                             rows_layout));
    const ValueId in_block = ids.in_block;
    const Layout ids_layout = builder.layout(in_block)->WithoutPartial();
    const Layout vector = Layout::Replicated(mesh, 1);
    TFD_ASSIGN_OR_RETURN(ValueId ids_shape,
                         one("Shape", {in_block},
                             {A::Type("T", TF_BOOL), A::Type("out_type", TF_INT32)}, vector));
    TFD_ASSIGN_OR_RETURN(ValueId flat_shape, builder.HostConstant({-1}, {1}, TF_INT32));
    TFD_ASSIGN_OR_RETURN(ValueId flat,
                         one("Reshape", {in_block, flat_shape},
                             {A::Type("T", TF_BOOL), A::Type("Tshape", TF_INT32)}, vector));
    TFD_ASSIGN_OR_RETURN(ValueId counts,
                         one("Cast", {flat},
                             {A::Type("SrcT", TF_BOOL), A::Type("DstT", TF_INT32),
                              A::Bool("Truncate", false)},
                             vector));
    TFD_ASSIGN_OR_RETURN(ValueId zero, builder.HostConstant({0}, {}, TF_INT32));
    TFD_ASSIGN_OR_RETURN(ValueId ranks,
                         one("Cumsum", {counts, zero},
                             {A::Type("T", TF_INT32), A::Type("Tidx", TF_INT32),
                              A::Bool("exclusive", false), A::Bool("reverse", false)},
                             vector));
    TFD_ASSIGN_OR_RETURN(ValueId picked,
                         one("Mul", {counts, ranks}, {A::Type("T", TF_INT32)}, vector));
    TFD_ASSIGN_OR_RETURN(ValueId positions,
                         one("Reshape", {picked, ids_shape},
                             {A::Type("T", TF_INT32), A::Type("Tshape", TF_INT32)},
                             ids_layout));
    return one("GatherV2", {padded, positions, zero},
               {A::Type("Tparams", dtype), A::Type("Tindices", TF_INT32),
                A::Type("Taxis", TF_INT32), A::Int("batch_dims", 0)},
               out);
  }

  static int64_t BatchDims(const OpContext& ctx) {
    int64_t batch_dims = ctx.attrs->GetInt("batch_dims", 0);
    return batch_dims < 0 ? batch_dims + ctx.rank(1) : batch_dims;
  }
  // The context with input 0 standing for the params: a DVariable's value for
  // ResourceGather.
  StatusOr<OpContext> ParamsContext(const OpContext& ctx) const {
    if (!resource_) return ctx;
    if (ctx.inputs.size() < 2 || !ctx.inputs[0].resource) {
      return InvalidArgument("'" + ctx.op_name + "' needs a DVariable handle as input 0; got " +
                             ctx.Describe(0) + ".");
    }
    OpContext out = ctx;
    const ResourceInfo& r = *ctx.inputs[0].resource;
    out.inputs[0] = InputInfo{};
    out.inputs[0].shape = r.value_shape;
    out.inputs[0].dtype = r.value_dtype;
    out.inputs[0].layout = r.value_layout;
    return out;
  }

  bool has_axis_;
  bool resource_;
};

// GatherNd(params, indices [..., m]): output indices[:-1] + params[m:]. The m indexed
// axes of params and the index-tuple axis are read whole; the indices' leading axes and
// params' trailing axes keep their sharding, unless a device's block would be empty: TF's
// kernel refuses indices into empty params ("Requested more than 0 entries, but params
// is empty"), so such an axis is read whole (FactorsWithoutEmptyBlocks).
StatusOr<FactorSpec> GatherNdFactors(const OpContext& ctx) {
  const int params_rank = ctx.rank(0);
  const int indices_rank = ctx.rank(1);
  const int64_t m = indices_rank > 0 ? ctx.inputs[1].shape.back() : -1;
  if (indices_rank == 0 || m < 0 || m > params_rank) {
    return InvalidArgument("'GatherNd' needs indices of rank 1 or more whose last axis (at most "
                           "the params' rank) is known; got " + ctx.Describe(0) + " and " +
                           ctx.Describe(1) + ".");
  }
  FactorSpec spec;
  std::vector<int> params = spec.AddAxes(params_rank);
  for (int d = 0; d < m; ++d) spec.factors[params[d]] = FactorKind::kNeedReplication;
  std::vector<int> indices = spec.AddAxes(indices_rank - 1);
  std::vector<int> out = indices;
  indices.push_back(spec.Add(FactorKind::kNeedReplication));
  out.insert(out.end(), params.begin() + m, params.end());
  spec.inputs = {params, indices};
  spec.outputs = {out};
  return spec;
}

// OneHot(indices, depth, on_value, off_value), attribute axis (-1: last): the indices'
// axes keep their sharding and the new axis is unsharded.
StatusOr<FactorSpec> OneHotFactors(const OpContext& ctx) {
  const int rank = ctx.rank(0);
  int64_t axis = ctx.attrs->GetInt("axis", -1);
  if (axis == -1) axis = rank;
  if (axis < 0 || axis > rank) {
    return InvalidArgument("'OneHot' axis " + std::to_string(axis) + " is out of range for " +
                           ctx.Describe(0) + ".");
  }
  FactorSpec spec;
  std::vector<int> axes = spec.AddAxes(rank);
  spec.inputs.assign(ctx.inputs.size(), std::nullopt);
  spec.inputs[0] = axes;
  axes.insert(axes.begin() + axis, FactorSpec::kNew);
  spec.outputs = {axes};
  return spec;
}

// UnsortedSegmentSum/Max/Min/Prod(data, segment_ids, num_segments): the segment-id axes
// (data's leading axes, shared with the ids) are contracted: each device combines its own
// rows into partial segments, and the partials are all-reduced with `op`. Data's other
// axes keep their sharding and claim mesh dimensions first; the output's leading axis
// (the segments) is new.
template <ReduceOp op>
StatusOr<FactorSpec> SegmentReduceFactors(const OpContext& ctx) {
  const int k = ctx.rank(1);
  const int rank = ctx.rank(0);
  if (k > rank) {
    return InvalidArgument("'" + ctx.op_name + "' needs segment ids whose shape prefixes the "
                           "data's; got " + ctx.Describe(0) + " and " + ctx.Describe(1) + ".");
  }
  FactorSpec spec;
  std::vector<int> leading;
  for (int d = 0; d < k; ++d) leading.push_back(spec.Add(FactorKind::kContracted));
  std::vector<int> trailing = spec.AddAxes(rank - k);
  spec.priority = trailing;
  spec.priority.insert(spec.priority.end(), leading.begin(), leading.end());
  std::vector<int> data = leading;
  data.insert(data.end(), trailing.begin(), trailing.end());
  std::vector<int> out = {FactorSpec::kNew};
  out.insert(out.end(), trailing.begin(), trailing.end());
  spec.inputs = {data, leading, std::nullopt};
  spec.outputs = {out};
  spec.reduce = op;
  return spec;
}

// UnsortedSegment{Sum,Max,Min,Prod} as the factor rule above, and with the segments
// sharded when that is asked of the output ([x,*] requested: the Adam slot the densified
// gradient of a row-sharded embedding meets): the data's segment axes are read whole
// along x (an all-gather of the small data instead of an all-reduce of [V,D]) and each
// device reduces into its own block of segments, ids outside it set to -1 (dropped).
// Blocks must be even: the local num_segments is one host value.
template <ReduceOp op>
class SegmentRule : public FactorRule {
 public:
  SegmentRule() : FactorRule(SegmentReduceFactors<op>) {}

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    TFD_ASSIGN_OR_RETURN(Plan plan, FactorRule::Forward(ctx));
    const std::optional<int> k = BlockDim(ctx, plan);
    if (!k) return plan;
    for (int i = 0; i < 2; ++i) {
      if (plan.inputs[i]) plan.inputs[i] = UnshardedOver(*plan.inputs[i], *k);
    }
    std::vector<DimSpec> specs = plan.outputs[0].specs();
    specs[0] = DimSpec::Sharded(*k);
    plan.outputs[0] = plan.outputs[0].WithSpecs(specs);
    std::vector<int>& partial = plan.partial_dims[0];
    partial.erase(std::remove(partial.begin(), partial.end(), *k), partial.end());
    return plan;
  }

  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    if (plan.outputs.empty() || plan.outputs[0].rank() == 0 ||
        !plan.outputs[0].spec(0).sharded()) {
      return ExpandDefault(ctx, plan, builder);
    }
    const Layout out = plan.outputs[0];
    const int k = out.spec(0).mesh_dim;
    TFD_ASSIGN_OR_RETURN(std::vector<int64_t> segments, ctx.IntValue(2, "num_segments"));
    std::vector<int64_t> out_shape = {segments[0]};
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> inputs, PrepareInputs(ctx, plan, builder));
    TFD_ASSIGN_OR_RETURN(BlockIds ids,
                         LocalizeIds(builder, inputs[1], out.WithoutPartial(), out_shape, 0, -1,
                                     ctx.op_name, IdRange::kBelowRows));
    TFD_ASSIGN_OR_RETURN(inputs[2], builder.HostConstant({segments[0] / out.mesh().DimSize(k)},
                                                         {}, ctx.inputs[2].dtype));
    inputs[1] = ids.local;
    const Layout reduced = out.WithoutPartial();
    std::vector<PartialSpec> pending;
    for (int d : plan.partial_dims[0]) pending.push_back({d, op});
    TFD_ASSIGN_OR_RETURN(Layout made, reduced.WithPartial(pending));
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> result,
                         builder.LocalOp(ctx.op_name, inputs,
                                         DistinctOver(k, plan.overrides, /*copy_attrs=*/true),
                                         {made}));
    if (pending.empty() || out.is_partial()) return result;
    TFD_ASSIGN_OR_RETURN(result[0], builder.AllReduce(result[0], plan.partial_dims[0], op));
    return result;
  }

 private:
  // The mesh dimension the requested output shards its segments over, when the blocks
  // are even, the ids are integers and the dimension is not taken by the data's other axes.
  static std::optional<int> BlockDim(const OpContext& ctx, const Plan& plan) {
    if (!ctx.requested || ctx.requested->rank() != ctx.rank(0) - ctx.rank(1) + 1 ||
        !ctx.requested->spec(0).sharded() || plan.outputs.empty() || !ctx.inputs[2].int_value ||
        ctx.inputs[2].int_value->size() != 1 || ctx.rank(1) == 0) {
      return std::nullopt;
    }
    const int k = ctx.requested->spec(0).mesh_dim;
    if ((*ctx.inputs[2].int_value)[0] % ctx.mesh.DimSize(k) != 0) return std::nullopt;
    for (const DimSpec& spec : plan.outputs[0].specs()) {
      if (spec.sharded() && spec.mesh_dim == k) return std::nullopt;
    }
    return k;
  }
};

// Inside tf.function, an op whose output rows are counted from data (the largest segment
// id, the unique indices) makes a tensor of a size known only at run time, and the
// gradients of the ops that then broadcast against it reduce over axes known only then,
// which only a replicated value can: there every input is read whole and the output is
// replicated, as TF's DTensor would have it, rather than sharded and unplannable later.
FactorSpec ReadWhole(const OpContext& ctx, int num_outputs) {
  FactorSpec spec;
  spec.inputs.assign(ctx.inputs.size(), std::nullopt);
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    if (!ctx.inputs[i].layout) continue;
    std::vector<int> axes;
    for (int d = 0; d < ctx.rank(static_cast<int>(i)); ++d) {
      axes.push_back(spec.Add(FactorKind::kNeedReplication));
    }
    spec.inputs[i] = axes;
  }
  for (int o = 0; o < num_outputs; ++o) spec.outputs.emplace_back();
  return spec;
}

// SegmentSum/Mean/Max/Min/Prod(data, segment_ids): sorted ids, and as many segments as
// the largest id says (known only at run time), so the segment axis (data's axis 0, shared
// with the ids) is read whole and the output's is new; data's other axes keep their
// sharding: segment_sum([x,y] of [8,6], ids) -> [*,y] (eagerly; see ReadWhole).
StatusOr<FactorSpec> SortedSegmentFactors(const OpContext& ctx) {
  const int rank = ctx.rank(0);
  if (rank < 1 || ctx.rank(1) != 1) {
    return InvalidArgument("'" + ctx.op_name + "' needs data of rank 1 or more and 1-D segment "
                           "ids; got " + ctx.Describe(0) + " and " + ctx.Describe(1) + ".");
  }
  if (ctx.in_function) return ReadWhole(ctx, 1);
  FactorSpec spec;
  std::vector<int> axes = spec.AddAxes(rank);
  spec.factors[axes[0]] = FactorKind::kNeedReplication;
  spec.inputs.assign(ctx.inputs.size(), std::nullopt);
  spec.inputs[0] = axes;
  spec.inputs[1] = std::vector<int>{axes[0]};
  std::vector<int> out = axes;
  out[0] = FactorSpec::kNew;
  spec.outputs = {out};
  return spec;
}

// SparseSegmentSum/Mean/SqrtN(data, indices, segment_ids[, num_segments]): rows of data
// picked by indices (tf.nn.embedding_lookup_sparse, tf.sparse.segment_*). Data's row axis
// and the index vectors are read whole; data's other axes keep their sharding:
// [x,y] of [V,D] -> [*,y] of [segments, D]. Their gradients (SparseSegment*Grad(grad,
// indices, segment_ids, output_dim0)) scatter the segment rows back: grad's axis 0 is
// read whole, the others keep their sharding. Those without num_segments or output_dim0
// (counted from data) read everything whole inside tf.function (ReadWhole).
StatusOr<FactorSpec> SparseSegmentFactors(const OpContext& ctx) {
  const int rank = ctx.rank(0);
  if (rank < 1 || ctx.rank(1) != 1 || ctx.rank(2) != 1) {
    return InvalidArgument("'" + ctx.op_name + "' needs data of rank 1 or more and 1-D indices "
                           "and segment ids; got " + ctx.Describe(0) + ", " + ctx.Describe(1) +
                           " and " + ctx.Describe(2) + ".");
  }
  const std::string v2 = "GradV2";
  const bool grad_v2 = ctx.op_name.size() > v2.size() &&
                       ctx.op_name.compare(ctx.op_name.size() - v2.size(), v2.size(), v2) == 0;
  const bool counted = ctx.inputs.size() == 3 || grad_v2;
  if (ctx.in_function && counted) return ReadWhole(ctx, grad_v2 ? 2 : 1);
  FactorSpec spec;
  std::vector<int> axes = spec.AddAxes(rank);
  spec.factors[axes[0]] = FactorKind::kNeedReplication;
  const int picks = spec.Add(FactorKind::kNeedReplication);
  spec.inputs.assign(ctx.inputs.size(), std::nullopt);
  spec.inputs[0] = axes;
  spec.inputs[1] = std::vector<int>{picks};
  spec.inputs[2] = std::vector<int>{picks};
  std::vector<int> out = axes;
  out[0] = FactorSpec::kNew;
  spec.outputs = {out};
  // SparseSegment*GradV2 also returns the sorted unique indices it wrote, a new vector.
  if (grad_v2) spec.outputs.push_back({FactorSpec::kNew});
  return spec;
}

// The segment ops read num_segments as a host value, and the request (see SegmentRule).
const RuleTraits kSegment = Traits().Host(2, HostValue::kCount).ReadsRequest();

// The sparse segment ops read num_segments (or a gradient's output_dim0) as a host value.
const RuleTraits kSparseSegment = Traits().Host(3, HostValue::kCount);

const bool kRegistered = RegisterRules({
    {"Gather", std::make_shared<GatherRule>(/*has_axis=*/false, /*resource=*/false)},
    {"GatherNd", FactorsWithoutEmptyBlocks(GatherNdFactors)},
    {"GatherV2", std::make_shared<GatherRule>(/*has_axis=*/true, /*resource=*/false),
     Traits().Host(2, HostValue::kAxis)},
    {"OneHot", Factors(OneHotFactors), Traits().Host(1, HostValue::kCount)},
    {"ResourceGather", std::make_shared<GatherRule>(/*has_axis=*/false, /*resource=*/true)},
    {"SegmentMax", Factors(SortedSegmentFactors)},
    {"SegmentMean", Factors(SortedSegmentFactors)},
    {"SegmentMin", Factors(SortedSegmentFactors)},
    {"SegmentProd", Factors(SortedSegmentFactors)},
    {"SegmentSum", Factors(SortedSegmentFactors)},
    {"SparseSegmentMean", Factors(SparseSegmentFactors)},
    {"SparseSegmentMeanGrad", Factors(SparseSegmentFactors), kSparseSegment},
    {"SparseSegmentMeanGradV2", Factors(SparseSegmentFactors), kSparseSegment},
    {"SparseSegmentMeanWithNumSegments", Factors(SparseSegmentFactors), kSparseSegment},
    {"SparseSegmentSqrtN", Factors(SparseSegmentFactors)},
    {"SparseSegmentSqrtNGrad", Factors(SparseSegmentFactors), kSparseSegment},
    {"SparseSegmentSqrtNGradV2", Factors(SparseSegmentFactors), kSparseSegment},
    {"SparseSegmentSqrtNWithNumSegments", Factors(SparseSegmentFactors), kSparseSegment},
    {"SparseSegmentSum", Factors(SparseSegmentFactors)},
    {"SparseSegmentSumGrad", Factors(SparseSegmentFactors), kSparseSegment},
    {"SparseSegmentSumGradV2", Factors(SparseSegmentFactors), kSparseSegment},
    {"SparseSegmentSumWithNumSegments", Factors(SparseSegmentFactors), kSparseSegment},
    {"UnsortedSegmentMax", std::make_shared<SegmentRule<ReduceOp::kMax>>(), kSegment},
    {"UnsortedSegmentMin", std::make_shared<SegmentRule<ReduceOp::kMin>>(), kSegment},
    {"UnsortedSegmentProd", std::make_shared<SegmentRule<ReduceOp::kProd>>(), kSegment},
    {"UnsortedSegmentSum", std::make_shared<SegmentRule<ReduceOp::kSum>>(), kSegment},
});

}  // namespace
}  // namespace tf_dtensor
