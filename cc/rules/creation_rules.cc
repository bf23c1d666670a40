// Ops that create values from host arguments (shapes, seeds, scalars).
//   fill(dims=[8,4], 1.0) with requested [x,*] -> each device fills its [8/|x|,4] block
//   fill(dims=[5,4], 1.0) with requested [x,*] @ mesh(x=4) -> blocks of 2, 2, 1 and 0 rows,
//     each device filling its own (uneven blocks, cut like torch.chunk)
//   empty(shape=[8,4], init=true) likewise (its values unset without init)
//   stateless_random_normal(shape, seed) with requested [x,y] -> the global value is drawn
//     once and sliced, so values equal the single-device result for every layout (uneven
//     ones included); linspace and the stateful random ops likewise
// A request a shape cannot usefully take (an axis of size 1 over several devices: an
// operand that broadcasts later, as tf.ones([1, 4]) * x under call_with_layout) leaves the
// value replicated; the result of call_with_layout is relaid out where the request was made.
// Ops whose inputs are all host arguments and whose outputs are replicated use
// Replicated(); _EagerConst (a constant made from a Python value under a mesh scope, such
// as a shape argument inside call_with_layout) is one of them.
#include <algorithm>

#include "cc/rules/expand.h"
#include "cc/rules/registry.h"
#include "cc/spmd/relayout.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {
namespace {

// Inputs stay as they are (host or replicated); outputs are replicated.
class ReplicatedRule : public Rule {
 public:
  explicit ReplicatedRule(bool stateful) : stateful_(stateful) {}
  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    Plan plan;
    for (const InputInfo& in : ctx.inputs) {
      if (in.layout && !in.resource) {
        plan.inputs.push_back(Layout::Replicated(ctx.mesh, static_cast<int>(in.shape.size())));
      } else {
        plan.inputs.push_back(std::nullopt);
      }
    }
    return plan;  // empty outputs: replicated, whatever their rank
  }
  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> inputs, PrepareInputs(ctx, plan, builder));
    LocalOpOptions options;
    options.run_once = stateful_;
    return builder.LocalOp(ctx.op_name, inputs, options, plan.outputs);
  }

 private:
  bool stateful_;
};

// The layout a value of global shape `dims` is made in: the request where it has the
// value's rank and mesh, nothing pending, and no axis of size 1 over several devices
// (a broadcast operand; see the top of the file); otherwise replicated. Uneven blocks are
// fine: they are cut as every uneven layout is.
Layout MadeIn(const OpContext& ctx, const std::vector<int64_t>& dims) {
  const int rank = static_cast<int>(dims.size());
  Layout replicated = Layout::Replicated(ctx.mesh, rank);
  const std::optional<Layout>& want = ctx.requested;
  if (!want || want->rank() != rank || want->mesh() != ctx.mesh || want->is_partial() ||
      want->is_single_device()) {
    return replicated;
  }
  for (int a = 0; a < rank; ++a) {
    if (dims[a] == 1 && want->NumShards(a) > 1) return replicated;
  }
  return *want;
}

// Fill(dims, value) and Empty(shape) (tf.nn.ctc_loss's buffers): each device makes its
// own block of the requested layout. Even blocks take one local shape for every device;
// uneven ones a shape per device:
//   fill([5,4]) in [x,*] @ mesh(x=4): device i fills [rows_i, 4], rows = 2, 2, 1, 0
class FillRule : public Rule {
 public:
  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    TFD_ASSIGN_OR_RETURN(std::vector<int64_t> dims, ctx.IntValue(0, DimsName(ctx)));
    const Layout out = MadeIn(ctx, dims);
    Plan plan;
    plan.inputs = {std::nullopt};
    if (ctx.inputs.size() > 1) {  // Fill's value, a scalar
      plan.inputs.push_back(ctx.inputs[1].layout
                                ? std::optional<Layout>(Layout::Replicated(ctx.mesh, 0))
                                : std::nullopt);
    }
    plan.outputs = {out};
    if (out.IsEven(dims)) {
      TFD_ASSIGN_OR_RETURN(plan.host_inputs[0],
                           out.UniformLocalShape(dims, "the output of '" + ctx.op_name + "'"));
    }
    return plan;
  }

  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    if (plan.host_inputs.count(0)) return ExpandDefault(ctx, plan, builder);
    TFD_ASSIGN_OR_RETURN(std::vector<int64_t> dims, ctx.IntValue(0, DimsName(ctx)));
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> inputs, PrepareInputs(ctx, plan, builder));
    TFD_ASSIGN_OR_RETURN(inputs[0],
                         OwnBlockShape(builder, plan.outputs[0], dims, ctx.inputs[0].dtype));
    LocalOpOptions options;
    options.global_shapes = {dims};
    return builder.LocalOp(ctx.op_name, inputs, options, plan.outputs);
  }

 private:
  static std::string DimsName(const OpContext& ctx) {
    return ctx.op_name == "Empty" ? "shape" : "dims";
  }

  // On each device, the shape of its own block of `dims` in `layout`, a vector of
  // `dtype`: a table of every block's shape, indexed by the coordinates along the mesh
  // dimensions that shard an axis, sliced over those dimensions and reshaped.
  //   [5,4] in [x,*] @ mesh(x=4): table [[2,4],[2,4],[1,4],[0,4]], device i keeps row i
  static StatusOr<ValueId> OwnBlockShape(Builder& builder, const Layout& layout,
                                         const std::vector<int64_t>& dims, int dtype) {
    const int rank = static_cast<int>(dims.size());
    std::vector<int> axes;  // the sharded axes, in order; their mesh dimensions index the table
    std::vector<int64_t> table_shape;
    for (int a = 0; a < rank; ++a) {
      if (!layout.spec(a).sharded()) continue;
      axes.push_back(a);
      table_shape.push_back(layout.NumShards(a));
    }
    table_shape.push_back(rank);
    std::vector<int64_t> table;
    std::vector<int64_t> index(axes.size(), 0);
    for (bool more = true; more;) {
      for (int a = 0; a < rank; ++a) {
        auto axis = std::find(axes.begin(), axes.end(), a);
        table.push_back(axis == axes.end()
                            ? dims[a]
                            : layout.AxisPiece(a, dims[a], index[axis - axes.begin()]).first);
      }
      more = false;  // the next index, the last axis fastest (row-major)
      for (int k = static_cast<int>(axes.size()) - 1; k >= 0 && !more; --k) {
        more = ++index[k] < table_shape[k];
        if (!more) index[k] = 0;
      }
    }
    TFD_ASSIGN_OR_RETURN(ValueId host, builder.HostConstant(table, table_shape, dtype));
    TFD_ASSIGN_OR_RETURN(ValueId value, builder.Broadcast(host, layout.mesh()));
    std::vector<int> mesh_dims;
    for (size_t k = 0; k < axes.size(); ++k) {
      const int mesh_dim = layout.spec(axes[k]).mesh_dim;
      mesh_dims.push_back(mesh_dim);
      TFD_ASSIGN_OR_RETURN(value, builder.Slice(value, static_cast<int>(k), mesh_dim));
    }
    TFD_ASSIGN_OR_RETURN(ValueId vector_shape, builder.HostConstant({rank}, {1}, TF_INT32));
    LocalOpOptions options;
    options.copy_attrs = false;
    options.overrides = {AttrOverride::Type("T", dtype), AttrOverride::Type("Tshape", TF_INT32)};
    options.distinct_over = mesh_dims;
    return builder.LocalOpValue("Reshape", {value, vector_shape}, options,
                                Layout::Replicated(layout.mesh(), 1));
  }
};

// Ops whose value is drawn whole (random ops: their key and counter must stay whole to
// give the single-device values; LinSpace), then cut to the layout asked of it, uneven
// blocks included (MadeIn): no communication, each device keeps its block.
//   stateless_random_normal([5,3], seed) in [x,*] @ mesh(x=4) -> drawn [5,3] on every
//     device, device i keeps rows [2i, 2i+2) (2, 2, 1, 0 rows)
// A stateful op runs once and its value is shared, so every device cuts the same draw.
class MadeWholeRule : public Rule {
 public:
  MadeWholeRule(bool stateful, int shape_input, bool shape_is_count)
      : stateful_(stateful), shape_input_(shape_input), shape_is_count_(shape_is_count) {}

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    Plan plan;
    for (const InputInfo& in : ctx.inputs) {
      plan.inputs.push_back(in.layout && !in.resource
                                ? std::optional<Layout>(Layout::Replicated(
                                      ctx.mesh, static_cast<int>(in.shape.size())))
                                : std::nullopt);
    }
    // Without the shape's value (known only at run time) or a request: replicated.
    std::optional<std::vector<int64_t>> dims = OutputShape(ctx);
    if (dims && ctx.requested) plan.outputs = {MadeIn(ctx, *dims)};
    return plan;
  }

  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> inputs, PrepareInputs(ctx, plan, builder));
    LocalOpOptions options;
    options.run_once = stateful_;
    if (plan.outputs.empty()) return builder.LocalOp(ctx.op_name, inputs, options, {});
    const Layout& out = plan.outputs[0];
    options.global_shapes = {OutputShape(ctx)};
    TFD_ASSIGN_OR_RETURN(
        std::vector<ValueId> whole,
        builder.LocalOp(ctx.op_name, inputs, options,
                        {Layout::Replicated(ctx.mesh, out.rank())}));
    if (out.IsFullyReplicated()) return whole;
    TFD_ASSIGN_OR_RETURN(whole[0], Relayout(builder, whole[0], out,
                                            "the output of '" + ctx.op_name + "'"));
    return whole;
  }

 private:
  std::optional<std::vector<int64_t>> OutputShape(const OpContext& ctx) const {
    if (shape_input_ >= static_cast<int>(ctx.inputs.size())) return std::nullopt;
    const std::optional<std::vector<int64_t>>& value = ctx.inputs[shape_input_].int_value;
    if (!value) return std::nullopt;
    if (!shape_is_count_) return *value;
    if (value->size() != 1) return std::nullopt;
    return std::vector<int64_t>{(*value)[0]};
  }

  bool stateful_;
  int shape_input_;      // the input holding the output's shape (LinSpace: its count)
  bool shape_is_count_;  // the input is the length of a vector (LinSpace's num)
};

// Range(start, limit, delta): replicated, or in a requested sharded layout, where each
// device makes its own block from its offset (uneven blocks included):
//   range(0, 10, 1) with requested [x] @ mesh(x=4) -> blocks [0,3) [3,6) [6,8) [8,10):
//     device i runs Range(start + offset_i * delta, start + (offset_i + size_i) * delta, delta)
// A non-integer range is made replicated; the request is then met by slicing.
class RangeRule : public Rule {
 public:

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    Plan plan;
    for (const InputInfo& in : ctx.inputs) {
      plan.inputs.push_back(in.layout ? std::optional<Layout>(Layout::Replicated(ctx.mesh, 0))
                                      : std::nullopt);
    }
    std::optional<Bounds> bounds = Read(ctx);
    plan.outputs = {bounds ? MadeIn(ctx, {bounds->count}) : Layout::Replicated(ctx.mesh, 1)};
    return plan;
  }

  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    const Layout& out = plan.outputs[0];
    std::optional<Bounds> bounds = Read(ctx);
    if (!bounds || !out.spec(0).sharded()) return ExpandDefault(ctx, plan, builder);
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> inputs, PrepareInputs(ctx, plan, builder));
    const int mesh_dim = out.spec(0).mesh_dim;
    const std::vector<int64_t> sizes = out.PieceSizes({bounds->count}, 0);
    std::vector<int64_t> starts, limits;
    int64_t offset = 0;
    for (int64_t size : sizes) {
      starts.push_back(bounds->start + offset * bounds->delta);
      limits.push_back(bounds->start + (offset + size) * bounds->delta);
      offset += size;
    }
    const int dtype = ctx.inputs[0].dtype;
    // Per device, its own scalar start and limit.
    auto own = [&](const std::vector<int64_t>& values) {
      return PerDeviceEntry(builder, ctx.mesh, values, mesh_dim, dtype);
    };
    TFD_ASSIGN_OR_RETURN(inputs[0], own(starts));
    TFD_ASSIGN_OR_RETURN(inputs[1], own(limits));
    return builder.LocalOp(ctx.op_name, inputs, LocalOpOptions(), plan.outputs);
  }

 private:
  struct Bounds {
    int64_t start, delta, count;
  };
  // The integer bounds and element count, or nullopt (not integers, not known, delta 0).
  static std::optional<Bounds> Read(const OpContext& ctx) {
    if (ctx.inputs.size() != 3) return std::nullopt;
    int64_t v[3];
    for (int i = 0; i < 3; ++i) {
      const std::optional<std::vector<int64_t>>& value = ctx.inputs[i].int_value;
      if (!value || value->size() != 1) return std::nullopt;
      v[i] = (*value)[0];
    }
    if (v[2] == 0) return std::nullopt;
    const int64_t span = v[1] - v[0];
    int64_t count = v[2] > 0 ? (span + v[2] - 1) / v[2] : (span + v[2] + 1) / v[2];
    return Bounds{v[0], v[2], std::max<int64_t>(count, 0)};
  }
};

}  // namespace

std::shared_ptr<const Rule> ReplicatedStateful() {
  return std::make_shared<ReplicatedRule>(true);
}

namespace {

// Random ops read their shape, then seeds and bounds, as host values, and make their
// value in the requested layout.
const RuleTraits kShapeThenValues =
    Traits().Host(0, HostValue::kShape).Host(1, -1, HostValue::kValue).ReadsRequest();

std::shared_ptr<const Rule> Drawn() { return std::make_shared<MadeWholeRule>(false, 0, false); }
std::shared_ptr<const Rule> DrawnStateful() {
  return std::make_shared<MadeWholeRule>(true, 0, false);
}

const bool kRegistered = RegisterRules({
    {"Empty", std::make_shared<FillRule>(), Traits().Host(0, HostValue::kShape).ReadsRequest()},
    {"Fill", std::make_shared<FillRule>(),
     Traits().Host(0, HostValue::kShape).Host(1, HostValue::kValue).ReadsRequest()},
    {"LinSpace", std::make_shared<MadeWholeRule>(false, 2, true),
     Traits().AllHost(HostValue::kValue).ReadsRequest()},
    {"RandomStandardNormal", DrawnStateful(), kShapeThenValues},
    {"RandomUniform", DrawnStateful(), kShapeThenValues},
    {"RandomUniformInt", DrawnStateful(), kShapeThenValues},
    {"Range", std::make_shared<RangeRule>(), Traits().AllHost(HostValue::kValue).ReadsRequest()},
    {"StatelessRandomGetAlg", Replicated(), Traits().AllHost(HostValue::kValue)},
    {"StatelessRandomGetKeyCounter", Replicated(), Traits().AllHost(HostValue::kValue)},
    {"StatelessRandomGetKeyCounterAlg", Replicated(), Traits().AllHost(HostValue::kValue)},
    {"StatelessRandomNormal", Drawn(), kShapeThenValues},
    {"StatelessRandomNormalV2", Drawn(), kShapeThenValues},
    {"StatelessRandomUniform", Drawn(), kShapeThenValues},
    {"StatelessRandomUniformFullInt", Drawn(), kShapeThenValues},
    {"StatelessRandomUniformFullIntV2", Drawn(), kShapeThenValues},
    {"StatelessRandomUniformInt", Drawn(), kShapeThenValues},
    {"StatelessRandomUniformIntV2", Drawn(), kShapeThenValues},
    {"StatelessRandomUniformV2", Drawn(), kShapeThenValues},
    {"StatelessTruncatedNormal", Drawn(), kShapeThenValues},
    {"StatelessTruncatedNormalV2", Drawn(), kShapeThenValues},
    {"TruncatedNormal", DrawnStateful(), kShapeThenValues},
    {"_EagerConst", Replicated(), Traits().AllHost(HostValue::kValue).PythonConstant()},
});

}  // namespace

std::shared_ptr<const Rule> Replicated() { return std::make_shared<ReplicatedRule>(false); }

}  // namespace tf_dtensor
