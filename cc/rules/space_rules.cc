// Ops that move blocks of pixels between the spatial axes and the batch or channel axis:
// SpaceToBatchND / BatchToSpaceND (what tf.nn.convolution, atrous_conv2d and dilated
// depthwise convolutions run around a convolution), SpaceToDepth / DepthToSpace.
//
// The axes an op leaves alone keep their sharding and need no communication:
//   space_to_batch([*,*,*,y] of [B,H,W,C], block [2,2]) -> [*,*,*,y]    (channels)
//   depth_to_space([x,*,*,*] of [B,H,W,C], 2) -> [x,*,*,*]               (batch)
// The spatial axes are cut into blocks, and the channels of SpaceToDepth/DepthToSpace are
// interleaved with them, so those are gathered.
//
// The batch of SpaceToBatchND is the subtle one: its output batch puts the block offset in
// front of the input batch (row k * B + b for block offset k and input element b), so a
// device's own input elements are not one block of the output batch. Sharding the output
// batch over x (of size n) asks each device for block offsets k of a range of its own for
// every b: an all-to-all of the view [P, B, ...] (P = product of the block shape) from
// [*,x,...] to [x,*,...], which needs n to divide P and B:
//   space_to_batch([x,*,*,*] of [8,H,W,C], block [2,2]) -> local op on the own 4 elements
//     -> view [4, 8, h, w, C] as [*,x,*,*,*] -> all-to-all -> [x,*,*,*,*] -> [x,*,*,*]
//   batch_to_space([x,*,*,*] of [32,h,w,C], block [2,2]) -> the reverse -> [x,*,*,*]
// so that space_to_batch -> conv -> batch_to_space (a dilated convolution) on a
// batch-sharded input stays batch-sharded: two all-to-alls instead of gathering the batch
// and running the convolution on every device. When n does not divide P and B, or the
// batch is sharded over several mesh dimensions, the batch is gathered.
#include <algorithm>
#include <numeric>
#include <string>

#include "cc/core/strings.h"
#include "cc/rules/expand.h"
#include "cc/rules/factor.h"
#include "cc/rules/local_math.h"
#include "cc/rules/registry.h"
#include "cc/spmd/relayout.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {
namespace {

// The block shape and the paddings (SpaceToBatchND) or crops (BatchToSpaceND), checked
// against the input.
struct Blocks {
  std::vector<int64_t> shape;  // M block sizes
  std::vector<int64_t> edges;  // 2 * M paddings or crops
  int64_t product = 1;
};

StatusOr<Blocks> ReadBlocks(const OpContext& ctx) {
  Blocks blocks;
  TFD_ASSIGN_OR_RETURN(blocks.shape, ctx.IntValue(1, "block_shape"));
  const std::string edges = ctx.op_name == "SpaceToBatchND" ? "paddings" : "crops";
  TFD_ASSIGN_OR_RETURN(blocks.edges, ctx.IntValue(2, edges));
  const int m = static_cast<int>(blocks.shape.size());
  if (m < 1 || ctx.rank(0) < m + 1 || static_cast<int>(blocks.edges.size()) != 2 * m) {
    return InvalidArgument("'" + ctx.op_name + "' needs a block_shape of M >= 1 sizes, " + edges +
                           " of shape [M, 2] and an input of rank M + 1 or more; got " +
                           std::to_string(m) + " block sizes, " +
                           std::to_string(blocks.edges.size()) + " " + edges + " and " +
                           ctx.Describe(0) + ".");
  }
  for (int64_t b : blocks.shape) {
    if (b < 1) {
      return InvalidArgument("'" + ctx.op_name + "' needs block sizes of 1 or more; got " +
                             ShapeString(blocks.shape) + ".");
    }
    blocks.product *= b;
  }
  return blocks;
}

// Batch axis: passes through only when the blocks are all 1 (the Expand below moves it
// otherwise). Spatial axis i: passes through when its block is 1 and nothing is padded or
// cropped. The remaining axes pass through.
StatusOr<FactorSpec> SpaceBatchFactors(const OpContext& ctx) {
  TFD_ASSIGN_OR_RETURN(Blocks blocks, ReadBlocks(ctx));
  const int rank = ctx.rank(0);
  FactorSpec spec;
  std::vector<int> axes = spec.AddAxes(rank);
  std::vector<int> out = axes;
  if (blocks.product != 1) {
    spec.factors[axes[0]] = FactorKind::kNeedReplication;
    out[0] = FactorSpec::kNew;
  }
  for (size_t i = 0; i < blocks.shape.size(); ++i) {
    if (blocks.shape[i] != 1 || blocks.edges[2 * i] != 0 || blocks.edges[2 * i + 1] != 0) {
      spec.factors[axes[i + 1]] = FactorKind::kNeedReplication;
      out[i + 1] = FactorSpec::kNew;
    }
  }
  spec.inputs = {axes, std::nullopt, std::nullopt};
  spec.outputs = {out};
  return spec;
}

// SpaceToBatchND and BatchToSpaceND, with the batch kept sharded through an all-to-all of
// the block offsets (see the top of the file).
class SpaceBatchRule : public FactorRule {
 public:
  explicit SpaceBatchRule(bool to_batch) : FactorRule(SpaceBatchFactors), to_batch_(to_batch) {}

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    TFD_ASSIGN_OR_RETURN(Plan plan, FactorRule::Forward(ctx));
    const std::optional<int> k = BatchDim(ctx, plan);
    if (!k) return plan;
    std::vector<DimSpec> in = plan.inputs[0] ? plan.inputs[0]->specs() : ctx.layout(0).specs();
    in[0] = DimSpec::Sharded(*k);
    plan.inputs[0] = ctx.layout(0).WithSpecs(in).WithoutPartial();
    std::vector<DimSpec> out = plan.outputs[0].specs();
    out[0] = DimSpec::Sharded(*k);
    plan.outputs[0] = plan.outputs[0].WithSpecs(out);
    const std::string mesh_dim = ctx.mesh.dims()[*k].name;
    plan.notes.push_back("all-to-all over " + mesh_dim + " of the block offsets " +
                         (to_batch_ ? "SpaceToBatchND puts in front of the batch"
                                    : "BatchToSpaceND takes from the front of the batch") +
                         ": the batch stays sharded over " + mesh_dim);
    return plan;
  }

  std::vector<std::optional<Layout>> Backward(
      const OpContext& ctx, const std::vector<std::optional<Layout>>& requested) const override {
    std::vector<std::optional<Layout>> wanted = FactorRule::Backward(ctx, requested);
    const Layout* out = UsableRequest(ctx, requested, 0, ctx.rank(0));
    if (out == nullptr || !out->spec(0).sharded() || !Movable(ctx, out->spec(0).mesh_dim)) {
      return wanted;
    }
    std::vector<DimSpec> in = wanted[0] ? wanted[0]->specs()
                                        : Layout::Replicated(ctx.mesh, ctx.rank(0)).specs();
    for (const DimSpec& spec : in) {
      if (spec.sharded() && spec.mesh_dim == out->spec(0).mesh_dim) return wanted;
    }
    in[0] = out->spec(0);
    wanted[0] = Layout::Replicated(ctx.mesh, ctx.rank(0)).WithSpecs(in);
    return wanted;
  }

  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    if (plan.outputs.empty() || !plan.outputs[0].spec(0).sharded() ||
        !Movable(ctx, plan.outputs[0].spec(0).mesh_dim)) {
      return ExpandDefault(ctx, plan, builder);
    }
    TFD_ASSIGN_OR_RETURN(Blocks blocks, ReadBlocks(ctx));
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> inputs, PrepareInputs(ctx, plan, builder));
    const Layout& out = plan.outputs[0];
    const int k = out.spec(0).mesh_dim;
    const int64_t n = ctx.mesh.DimSize(k);
    const int64_t p = blocks.product;
    // The blocked side: the output of SpaceToBatchND, the input of BatchToSpaceND, as
    // [P * B, rest...] global, laid out as `blocked` (the batch over k).
    const Layout blocked = to_batch_ ? out : *plan.inputs[0];
    std::vector<int64_t> shape = ctx.inputs[0].shape;
    if (to_batch_) {
      shape[0] *= p;
      for (size_t i = 0; i < blocks.shape.size(); ++i) {
        shape[i + 1] = (shape[i + 1] + blocks.edges[2 * i] + blocks.edges[2 * i + 1]) /
                       blocks.shape[i];
      }
    }
    // Each device's block of the rest axes (even: BatchDim checked).
    std::vector<int64_t> rest;
    std::vector<DimSpec> rest_specs;
    for (int d = 1; d < blocked.rank(); ++d) {
      const DimSpec& spec = blocked.spec(d);
      rest.push_back(spec.sharded() ? shape[d] / ctx.mesh.DimSize(spec.mesh_dim) : shape[d]);
      rest_specs.push_back(spec);
    }
    // The view [P, B, rest...] of the batch axis, sharded over k on B (each device's own
    // elements, every offset: `on_elements`) or on P (its offsets, every element).
    auto view_layout = [&](bool on_elements) {
      std::vector<DimSpec> specs = {on_elements ? DimSpec::Replicated() : DimSpec::Sharded(k),
                                    on_elements ? DimSpec::Sharded(k) : DimSpec::Replicated()};
      specs.insert(specs.end(), rest_specs.begin(), rest_specs.end());
      return blocked.WithSpecs(specs);
    };
    LocalMath math(builder, ctx.mesh, ctx.inputs[0].dtype);
    auto view = [&](ValueId value, bool on_elements) -> StatusOr<ValueId> {
      std::vector<int64_t> local = {on_elements ? p : p / n,
                                    on_elements ? shape[0] / p / n : shape[0] / p};
      local.insert(local.end(), rest.begin(), rest.end());
      std::vector<int64_t> global = {p, shape[0] / p};
      global.insert(global.end(), shape.begin() + 1, shape.end());
      return math.Reshape(value, local, view_layout(on_elements), global);
    };
    // ... and back to [P * B, rest...] over k, as the local op reads it (BatchToSpaceND:
    // each device's own elements, every offset) or as the output is laid out
    // (SpaceToBatchND: its offsets, every element).
    auto merge = [&](ValueId value) -> StatusOr<ValueId> {
      std::vector<int64_t> local = {shape[0] / n};
      local.insert(local.end(), rest.begin(), rest.end());
      return math.Reshape(value, local, blocked, shape);
    };
    const std::string what = "the block offsets of '" + ctx.op_name + "'";
    LocalOpOptions options;
    options.overrides = plan.overrides;
    options.global_shapes = {to_batch_ ? shape : std::vector<int64_t>()};
    if (!to_batch_) {
      options.global_shapes = {ctx.inputs[0].shape};
      options.global_shapes[0]->at(0) /= p;
      for (size_t i = 0; i < blocks.shape.size(); ++i) {
        int64_t& size = options.global_shapes[0]->at(i + 1);
        size = size * blocks.shape[i] - blocks.edges[2 * i] - blocks.edges[2 * i + 1];
      }
    }
    if (to_batch_) {
      // Each device's op makes the rows (offset, own element): its block of the view
      // sharded on B. The local op's result is read only through that view.
      TFD_ASSIGN_OR_RETURN(std::vector<ValueId> local,
                           builder.LocalOp(ctx.op_name, inputs, options, {out}));
      TFD_ASSIGN_OR_RETURN(ValueId by_element, view(local[0], /*on_elements=*/true));
      TFD_ASSIGN_OR_RETURN(ValueId by_offset,
                           Relayout(builder, by_element, view_layout(false), what));
      TFD_ASSIGN_OR_RETURN(ValueId result, merge(by_offset));
      return std::vector<ValueId>{result};
    }
    TFD_ASSIGN_OR_RETURN(ValueId by_offset, view(inputs[0], /*on_elements=*/false));
    TFD_ASSIGN_OR_RETURN(ValueId by_element,
                         Relayout(builder, by_offset, view_layout(true), what));
    TFD_ASSIGN_OR_RETURN(inputs[0], merge(by_element));
    return builder.LocalOp(ctx.op_name, inputs, options, {out});
  }

 private:
  // The whole batch of the op's blocked side: the output's for SpaceToBatchND, the input's
  // for BatchToSpaceND (P times the elements of the other side).
  int64_t BlockedBatch(const OpContext& ctx, int64_t product) const {
    const int64_t batch = ctx.inputs[0].shape[0];
    return to_batch_ ? batch * product : batch;
  }

  // Whether the batch can stay sharded over mesh dimension k: blocks known, P > 1, and n
  // dividing both P and the unblocked batch.
  bool Movable(const OpContext& ctx, int k) const {
    StatusOr<Blocks> blocks = ReadBlocks(ctx);
    if (!blocks.ok() || blocks->product == 1) return false;
    for (int64_t size : ctx.inputs[0].shape) {
      if (size < 0) return false;  // the views' local shapes need every size
    }
    const int64_t n = ctx.mesh.DimSize(k);
    const int64_t elements = BlockedBatch(ctx, blocks->product) / blocks->product;
    return blocks->product % n == 0 && elements % n == 0 &&
           BlockedBatch(ctx, blocks->product) % blocks->product == 0;
  }

  // The mesh dimension the input's batch is sharded over, when the batch can stay sharded
  // over it (the plan leaves that dimension free).
  std::optional<int> BatchDim(const OpContext& ctx, const Plan& plan) const {
    if (!ctx.inputs[0].layout || ctx.layout(0).rank() != ctx.rank(0) || plan.outputs.empty()) {
      return std::nullopt;
    }
    const DimSpec batch = ctx.layout(0).spec(0);
    if (!batch.sharded() || batch.multi() || !Movable(ctx, batch.mesh_dim)) return std::nullopt;
    for (const DimSpec& spec : plan.outputs[0].specs()) {
      if (spec.sharded() && spec.mesh_dim == batch.mesh_dim) return std::nullopt;
    }
    // The views reshape every device's block with one shape: the other sharded axes must
    // be even.
    const Layout& in = plan.inputs[0] ? *plan.inputs[0] : ctx.layout(0);
    for (int d = 1; d < in.rank(); ++d) {
      const DimSpec& spec = in.spec(d);
      if (spec.multi() || (spec.sharded() && (ctx.inputs[0].shape[d] < 0 ||
                                              ctx.inputs[0].shape[d] %
                                                      ctx.mesh.DimSize(spec.mesh_dim) != 0))) {
        return std::nullopt;
      }
    }
    return batch.mesh_dim;
  }

  bool to_batch_;
};

// SpaceToDepth / DepthToSpace(input, block_size, data_format): the batch passes through;
// the spatial axes and the channels are interleaved, so they are gathered.
StatusOr<FactorSpec> DepthFactors(const OpContext& ctx) {
  const int rank = ctx.rank(0);
  const std::string format = ctx.attrs->GetString("data_format").value_or("NHWC");
  if (rank != (format == "NCHW_VECT_C" ? 5 : 4)) {
    return InvalidArgument("'" + ctx.op_name + "' needs an input of rank 4 (5 for NCHW_VECT_C); "
                           "got " + ctx.Describe(0) + ".");
  }
  FactorSpec spec;
  std::vector<int> axes = spec.AddAxes(rank);
  std::vector<int> out = axes;
  for (int d = 1; d < rank; ++d) {
    spec.factors[axes[d]] = FactorKind::kNeedReplication;
    out[d] = FactorSpec::kNew;
  }
  spec.inputs = {axes};
  spec.outputs = {out};
  return spec;
}

const RuleTraits kSpaceBatch =
    Traits().Host(1, HostValue::kShape).Host(2, HostValue::kPaddings);

const bool kRegistered = RegisterRules({
    {"BatchToSpaceND", std::make_shared<SpaceBatchRule>(/*to_batch=*/false), kSpaceBatch},
    {"DepthToSpace", Factors(DepthFactors)},
    {"SpaceToBatchND", std::make_shared<SpaceBatchRule>(/*to_batch=*/true), kSpaceBatch},
    {"SpaceToDepth", Factors(DepthFactors)},
});

}  // namespace
}  // namespace tf_dtensor
