// Convolutions and pooling, batch- and channel-sharded. For Conv2D, NHWC, x = [n,h,w,ci],
// filter = [kh,kw,ci,co]:
//   [x,*,*,*] conv [*,*,*,*] -> [x,*,*,*]                     (batch: no communication)
//   [*,*,*,*] conv [*,*,*,y] -> [*,*,*,y]                     (output channels)
//   [*,*,*,x] conv [*,*,x,*] -> partial(x) -> all-reduce -> [*,*,*,*]   (input channels)
//   [*,x,*,*] conv ...       -> x gathered on h first          (spatial: replicated)
// The backprops are the same product read another way: Conv2DBackpropInput contracts co,
// Conv2DBackpropFilter contracts the batch (a data-parallel weight gradient is a partial
// sum over batch), and their shape arguments (input_sizes, filter_sizes) are global shapes
// made local for the plan's output. Pooling keeps batch and channels and replicates the
// window axes.
// TODO(#10): spatial axes (h, w, d and the filter's window) are need-replication: they are
// gathered before the op. Spatial sharding needs a halo exchange of the window overlap
// between neighbouring shards (at every padding mode and stride); not done yet.
#include <string>

#include "cc/core/strings.h"
#include "cc/rules/factor.h"
#include "cc/rules/registry.h"

namespace tf_dtensor {
namespace {

// Which axes of a data-format string hold the batch and channels: "NHWC", "NCHW",
// "NDHWC", "NCDHW".
struct Format {
  bool channels_last = true;
  int spatial = 2;  // number of spatial axes

  int rank() const { return spatial + 2; }
  // The axes in data-format order: n, spatial..., c (channels last) or n, c, spatial...
  std::vector<int> Arrange(int n, const std::vector<int>& space, int c) const {
    std::vector<int> axes = {n};
    if (!channels_last) axes.push_back(c);
    axes.insert(axes.end(), space.begin(), space.end());
    if (channels_last) axes.push_back(c);
    return axes;
  }
};

StatusOr<Format> ReadFormat(const OpContext& ctx, int spatial) {
  Format f;
  f.spatial = spatial;
  const std::string fallback = spatial == 3 ? "NDHWC" : "NHWC";
  const std::string format = ctx.attrs->GetString("data_format").value_or(fallback);
  if (format == "NHWC" || format == "NDHWC") {
    f.channels_last = true;
  } else if (format == "NCHW" || format == "NCDHW") {
    f.channels_last = false;
  } else {
    return InvalidArgument("'" + ctx.op_name + "' has no rule for data_format " + format + ".");
  }
  return f;
}

Status CheckRank(const OpContext& ctx, int input, int rank) {
  if (ctx.rank(input) == rank) return Status::Ok();
  return InvalidArgument("'" + ctx.op_name + "' needs rank " + std::to_string(rank) +
                         " here; got " + ctx.Describe(input) + ".");
}

std::vector<int> AddSpatial(FactorSpec& spec, int n) {
  std::vector<int> ids;
  for (int d = 0; d < n; ++d) ids.push_back(spec.Add(FactorKind::kNeedReplication));
  return ids;
}

std::vector<int> NewAxes(int n) { return std::vector<int>(n, FactorSpec::kNew); }

// The channel axis of a value in `format`.
int ChannelAxis(const Format& f) { return f.channels_last ? f.rank() - 1 : 1; }

// The global shape a shape argument names, if it is known.
std::optional<std::vector<int64_t>> HostShape(const OpContext& ctx, int input) {
  if (input < static_cast<int>(ctx.inputs.size())) return ctx.inputs[input].int_value;
  return std::nullopt;
}

enum class ConvKind { kForward, kBackpropInput, kBackpropFilter };

// Conv2D/Conv3D and their backprops; `depthwise` for DepthwiseConv2dNative*, whose filter
// is [k..., c, m] and whose output channels c*m are blocked by c (a shard of c is a
// contiguous block of c*m), so m is never sharded.
StatusOr<FactorSpec> ConvFactors(const OpContext& ctx, int spatial, ConvKind kind, bool depthwise) {
  TFD_ASSIGN_OR_RETURN(Format f, ReadFormat(ctx, spatial));
  const int x_in = kind == ConvKind::kBackpropInput ? -1 : 0;
  const int w_in = kind == ConvKind::kBackpropFilter ? -1 : 1;
  const int dy_in = kind == ConvKind::kForward ? -1 : 2;
  if (x_in >= 0) TFD_RETURN_IF_ERROR(CheckRank(ctx, x_in, f.rank()));
  if (w_in >= 0) TFD_RETURN_IF_ERROR(CheckRank(ctx, w_in, f.rank()));
  if (dy_in >= 0) TFD_RETURN_IF_ERROR(CheckRank(ctx, dy_in, f.rank()));

  // The input channels of the data and of the filter, and the filter's last axis; when
  // they disagree the convolution is grouped (or depthwise with a multiplier) and its
  // channels do not shard as one factor.
  const int c_axis = ChannelAxis(f);
  std::optional<int64_t> data_ci, filter_ci, filter_co;
  if (x_in >= 0) data_ci = ctx.inputs[x_in].shape[c_axis];
  if (kind == ConvKind::kBackpropInput) {
    if (auto s = HostShape(ctx, 0); s && static_cast<int>(s->size()) == f.rank()) {
      data_ci = (*s)[c_axis];
    }
  }
  if (w_in >= 0) {
    filter_ci = ctx.inputs[w_in].shape[spatial];
    filter_co = ctx.inputs[w_in].shape[spatial + 1];
  } else if (auto s = HostShape(ctx, 1); s && static_cast<int>(s->size()) == f.rank()) {
    filter_ci = (*s)[spatial];
    filter_co = (*s)[spatial + 1];
  }
  const bool grouped = !depthwise && data_ci && filter_ci && *data_ci != *filter_ci;
  // A depthwise backprop reads dy's c*m channels as c: only m == 1 lines the axes up.
  const bool multiplied =
      depthwise && kind != ConvKind::kForward && (!filter_co || *filter_co != 1);

  FactorSpec spec;
  const int n = spec.Add(kind == ConvKind::kBackpropFilter ? FactorKind::kContracted
                                                           : FactorKind::kPassThrough);
  int co, ci;
  if (depthwise) {
    ci = spec.Add(multiplied ? FactorKind::kNeedReplication : FactorKind::kPassThrough);
    co = spec.Add(FactorKind::kNeedReplication);  // the multiplier m
  } else {
    const FactorKind co_kind = grouped ? FactorKind::kNeedReplication
                               : kind == ConvKind::kBackpropInput ? FactorKind::kContracted
                                                                   : FactorKind::kPassThrough;
    const FactorKind ci_kind = grouped ? FactorKind::kNeedReplication
                               : kind == ConvKind::kForward ? FactorKind::kContracted
                                                            : FactorKind::kPassThrough;
    co = spec.Add(co_kind);
    ci = spec.Add(ci_kind);
  }
  const std::vector<int> x_space = AddSpatial(spec, spatial);
  const std::vector<int> y_space = AddSpatial(spec, spatial);
  std::vector<int> window = AddSpatial(spec, spatial);
  // Data channels: ci for x and dx; the output channels for y and dy (c for depthwise).
  const int y_c = depthwise ? ci : co;
  std::vector<int> filter = window;
  filter.push_back(ci);
  filter.push_back(co);

  spec.inputs.assign(ctx.inputs.size(), std::nullopt);
  if (x_in >= 0) spec.inputs[x_in] = f.Arrange(n, x_space, ci);
  if (w_in >= 0) spec.inputs[w_in] = filter;
  if (dy_in >= 0) spec.inputs[dy_in] = f.Arrange(n, y_space, y_c);
  switch (kind) {
    case ConvKind::kForward:
      spec.outputs = {f.Arrange(n, NewAxes(spatial), y_c)};
      break;
    case ConvKind::kBackpropInput:
      spec.outputs = {f.Arrange(n, NewAxes(spatial), ci)};
      break;
    case ConvKind::kBackpropFilter: {
      std::vector<int> dw = NewAxes(spatial);
      dw.push_back(ci);
      dw.push_back(co);
      spec.outputs = {dw};
      break;
    }
  }
  return spec;
}

// Pooling and its gradients: every data input is [n, spatial..., c] in the op's format
// (its own spatial factors), the output likewise with new spatial axes.
StatusOr<FactorSpec> PoolFactors(const OpContext& ctx, int spatial, std::vector<int> data) {
  TFD_ASSIGN_OR_RETURN(Format f, ReadFormat(ctx, spatial));
  FactorSpec spec;
  const int n = spec.Add(FactorKind::kPassThrough);
  const int c = spec.Add(FactorKind::kPassThrough);
  spec.inputs.assign(ctx.inputs.size(), std::nullopt);
  for (int i : data) {
    TFD_RETURN_IF_ERROR(CheckRank(ctx, i, f.rank()));
    spec.inputs[i] = f.Arrange(n, AddSpatial(spec, spatial), c);
  }
  spec.outputs = {f.Arrange(n, NewAxes(spatial), c)};
  return spec;
}

// A factor rule whose host input `shape_input` is the global shape of output 0
// (Conv2DBackpropInput's input_sizes, Conv2DBackpropFilter's filter_sizes, AvgPoolGrad's
// orig_input_shape): the local op gets the shape of its own block. One shape serves all
// devices, so an output factor whose shards would be uneven stays unsharded.
class ShapedOutputRule : public FactorRule {
 public:
  ShapedOutputRule(FactorSpecFn spec, int shape_input)
      : FactorRule(std::move(spec), [shape_input](int i, int) { return i == shape_input; }),
        shape_input_(shape_input) {}

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    TFD_ASSIGN_OR_RETURN(std::vector<int64_t> global, ctx.IntValue(shape_input_, "shape"));
    TFD_ASSIGN_OR_RETURN(Plan plan, FactorRule::Forward(ctx));
    if (plan.outputs.empty() || plan.outputs[0].rank() != static_cast<int>(global.size())) {
      return InvalidArgument("'" + ctx.op_name + "' names an output shape " +
                             ShapeString(global) + " of the wrong rank.");
    }
    TFD_ASSIGN_OR_RETURN(plan.host_inputs[shape_input_],
                         plan.outputs[0].UniformLocalShape(
                             global, "the output of '" + ctx.op_name + "'"));
    return plan;
  }

 protected:
  void AdjustForward(const OpContext& ctx, const FactorSpec& spec,
                     FactorAssignment& assignment) const override {
    const std::optional<std::vector<int64_t>> global = HostShape(ctx, shape_input_);
    if (!global || spec.outputs.empty() || spec.outputs[0].size() != global->size()) return;
    for (size_t a = 0; a < global->size(); ++a) {
      const int f = spec.outputs[0][a];
      if (f < 0 || !assignment[f].sharded()) continue;
      if ((*global)[a] % ctx.mesh.DimSize(assignment[f].mesh_dim) != 0) {
        assignment[f] = DimSpec::Replicated();
      }
    }
  }

 private:
  int shape_input_;
};

std::shared_ptr<const Rule> Conv(int spatial, ConvKind kind, bool depthwise = false) {
  FactorSpecFn fn = [=](const OpContext& ctx) {
    return ConvFactors(ctx, spatial, kind, depthwise);
  };
  switch (kind) {
    case ConvKind::kForward:
      return Linear(Factors(fn), Linearity::kOneInput);
    case ConvKind::kBackpropInput:
      return Linear(std::make_shared<ShapedOutputRule>(fn, 0), Linearity::kOneInput);
    case ConvKind::kBackpropFilter:
      return Linear(std::make_shared<ShapedOutputRule>(fn, 1), Linearity::kOneInput);
  }
  return nullptr;
}

// Pooling over `data` inputs; `host` marks the window/stride arguments of the V2 ops.
std::shared_ptr<const Rule> Pool(int spatial, std::vector<int> data,
                                 std::function<bool(int, int)> host = nullptr) {
  return Factors([=](const OpContext& ctx) { return PoolFactors(ctx, spatial, data); },
                 std::move(host));
}

bool FromInput(int first, int input) { return input >= first; }

std::shared_ptr<const Rule> PoolGradFromShape(int spatial) {
  return std::make_shared<ShapedOutputRule>(
      [=](const OpContext& ctx) { return PoolFactors(ctx, spatial, {1}); }, 0);
}

const bool kRegistered = RegisterRules({
    {"AvgPool", Linear(Pool(2, {0}), Linearity::kSum)},
    {"AvgPool3D", Linear(Pool(3, {0}), Linearity::kSum)},
    {"AvgPool3DGrad", Linear(PoolGradFromShape(3), Linearity::kSum)},
    {"AvgPoolGrad", Linear(PoolGradFromShape(2), Linearity::kSum)},
    {"Conv2D", Conv(2, ConvKind::kForward)},
    {"Conv2DBackpropFilter", Conv(2, ConvKind::kBackpropFilter)},
    {"Conv2DBackpropInput", Conv(2, ConvKind::kBackpropInput)},
    {"Conv3D", Conv(3, ConvKind::kForward)},
    {"Conv3DBackpropFilterV2", Conv(3, ConvKind::kBackpropFilter)},
    {"Conv3DBackpropInputV2", Conv(3, ConvKind::kBackpropInput)},
    {"DepthwiseConv2dNative", Conv(2, ConvKind::kForward, true)},
    {"DepthwiseConv2dNativeBackpropFilter", Conv(2, ConvKind::kBackpropFilter, true)},
    {"DepthwiseConv2dNativeBackpropInput", Conv(2, ConvKind::kBackpropInput, true)},
    {"MaxPool", Pool(2, {0})},
    {"MaxPool3D", Pool(3, {0})},
    {"MaxPool3DGrad", Pool(3, {0, 1, 2})},
    {"MaxPool3DGradGrad", Pool(3, {0, 1, 2})},
    {"MaxPoolGrad", Pool(2, {0, 1, 2})},
    {"MaxPoolGradGrad", Pool(2, {0, 1, 2})},
    {"MaxPoolGradV2", Pool(2, {0, 1, 2}, [](int i, int) { return FromInput(3, i); })},
    {"MaxPoolV2", Pool(2, {0}, [](int i, int) { return FromInput(1, i); })},
});

}  // namespace
}  // namespace tf_dtensor
