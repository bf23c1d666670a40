// Convolutions and pooling. For Conv2D, NHWC, x = [n,h,w,ci], filter = [kh,kw,ci,co]:
//   [x,*,*,*] conv [*,*,*,*] -> [x,*,*,*]                     (batch: no communication)
//   [*,*,*,*] conv [*,*,*,y] -> [*,*,*,y]                     (output channels)
//   [*,*,*,x] conv [*,*,x,*] -> partial(x) -> all-reduce -> [*,*,*,*]   (input channels)
//   [*,x,*,*] conv ...       -> halo exchange on h -> [*,x,*,*]  (spatial, see below)
// The backprops are the same product read another way: Conv2DBackpropInput contracts co,
// Conv2DBackpropFilter contracts the batch (a data-parallel weight gradient is a partial
// sum over batch) and the spatial axes, and their shape arguments (input_sizes,
// filter_sizes) are global shapes made local for the plan's output. Pooling keeps batch
// and channels. Spatial axes (h, w, d) stay sharded through a halo exchange when the
// blocks line up through the stride (window_rule.cc); otherwise, and for the pooling
// gradients, they are gathered, and debug.explain says why.
#include <algorithm>
#include <optional>
#include <string>

#include "cc/rules/factor.h"
#include "cc/rules/expand.h"
#include "cc/rules/registry.h"
#include "cc/rules/window_rule.h"

namespace tf_dtensor {
namespace {

using window::ChannelAxis;
using window::Format;
using window::HostShape;
using window::ReadFormat;
using window::WindowedRule;
using window::WindowOpInfo;
using window::WindowRole;

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

std::shared_ptr<const Rule> Conv(int spatial, ConvKind kind, bool depthwise = false) {
  FactorSpecFn fn = [=](const OpContext& ctx) {
    return ConvFactors(ctx, spatial, kind, depthwise);
  };
  WindowOpInfo window;
  window.spatial = spatial;
  window.conv = true;
  switch (kind) {
    case ConvKind::kForward:
      window.role = WindowRole::kForward;
      return WindowedRule(fn, -1, window);
    case ConvKind::kBackpropInput:
      window.role = WindowRole::kInputGrad;
      return WindowedRule(fn, 0, window);
    case ConvKind::kBackpropFilter:
      window.role = WindowRole::kFilterGrad;
      return WindowedRule(fn, 1, window);
  }
  return nullptr;
}

enum class PoolKind { kMax, kAvg, kMaxV2 };

// Pooling over input 0; the V2 ops read their window and strides from inputs 1 and 2.
std::shared_ptr<const Rule> Pool(int spatial, PoolKind kind) {
  WindowOpInfo window;
  window.spatial = spatial;
  window.max_pool = kind != PoolKind::kAvg;
  window.avg_pool = kind == PoolKind::kAvg;
  window.pool_v2 = kind == PoolKind::kMaxV2;
  return WindowedRule(
      [=](const OpContext& ctx) { return PoolFactors(ctx, spatial, {0}); }, -1, window);
}

// Pooling gradients over `data` inputs (spatial axes gathered).
std::shared_ptr<const Rule> PoolGrad(int spatial, std::vector<int> data, int like) {
  return WindowedRule(
      [=](const OpContext& ctx) { return PoolFactors(ctx, spatial, data); }, -1, std::nullopt,
      like);
}

// MaxPoolGrad(orig_input, orig_output, grad): spatial axes keep their sharding (halo).
std::shared_ptr<const Rule> MaxPoolGrad(int spatial) {
  WindowOpInfo window;
  window.spatial = spatial;
  window.role = WindowRole::kPoolGrad;
  window.max_pool = true;
  return WindowedRule(
      [=](const OpContext& ctx) { return PoolFactors(ctx, spatial, {0, 1, 2}); }, -1, window);
}

// AvgPoolGrad(orig_input_shape, grad): spatial axes keep their sharding when no window
// is padded (the local VALID gradient then divides by the same window size).
std::shared_ptr<const Rule> AvgPoolGrad(int spatial) {
  WindowOpInfo window;
  window.spatial = spatial;
  window.role = WindowRole::kInputGrad;
  window.avg_pool = true;
  window.dy = 1;
  return WindowedRule(
      [=](const OpContext& ctx) { return PoolFactors(ctx, spatial, {1}); }, 0, window);
}

// Convolutions are linear in one input (a pending sum passes through); the gradients
// read a global shape (input_sizes, filter_sizes) as a host argument.
const RuleTraits kConv = Traits().Linear(Linearity::kOneInput);
const RuleTraits kConvInputGrad =
    Traits().Linear(Linearity::kOneInput).Host(0, HostValue::kShape);
const RuleTraits kConvFilterGrad =
    Traits().Linear(Linearity::kOneInput).Host(1, HostValue::kShape);

const bool kRegistered = RegisterRules({
    {"AvgPool", Pool(2, PoolKind::kAvg), Traits().Linear(Linearity::kSum)},
    {"AvgPool3D", Pool(3, PoolKind::kAvg), Traits().Linear(Linearity::kSum)},
    {"AvgPool3DGrad", AvgPoolGrad(3), Traits().Linear(Linearity::kSum).Host(0, HostValue::kShape)},
    {"AvgPoolGrad", AvgPoolGrad(2), Traits().Linear(Linearity::kSum).Host(0, HostValue::kShape)},
    {"Conv2D", Conv(2, ConvKind::kForward), kConv},
    {"Conv2DBackpropFilter", Conv(2, ConvKind::kBackpropFilter), kConvFilterGrad},
    {"Conv2DBackpropInput", Conv(2, ConvKind::kBackpropInput), kConvInputGrad},
    {"Conv3D", Conv(3, ConvKind::kForward), kConv},
    {"Conv3DBackpropFilterV2", Conv(3, ConvKind::kBackpropFilter), kConvFilterGrad},
    {"Conv3DBackpropInputV2", Conv(3, ConvKind::kBackpropInput), kConvInputGrad},
    {"DepthwiseConv2dNative", Conv(2, ConvKind::kForward, true), kConv},
    {"DepthwiseConv2dNativeBackpropFilter", Conv(2, ConvKind::kBackpropFilter, true),
     kConvFilterGrad},
    {"DepthwiseConv2dNativeBackpropInput", Conv(2, ConvKind::kBackpropInput, true),
     kConvInputGrad},
    {"MaxPool", Pool(2, PoolKind::kMax)},
    {"MaxPool3D", Pool(3, PoolKind::kMax)},
    {"MaxPool3DGrad", MaxPoolGrad(3)},
    {"MaxPool3DGradGrad", PoolGrad(3, {0, 1, 2}, 1)},
    {"MaxPoolGrad", MaxPoolGrad(2)},
    {"MaxPoolGradGrad", PoolGrad(2, {0, 1, 2}, 1)},
    {"MaxPoolGradV2", PoolGrad(2, {0, 1, 2}, 0), Traits().Host(3, -1, HostValue::kShape)},
    {"MaxPoolV2", Pool(2, PoolKind::kMaxV2), Traits().Host(1, -1, HostValue::kShape)},
});

}  // namespace
}  // namespace tf_dtensor
