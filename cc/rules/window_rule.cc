// Spatial sharding of windowed ops: windows and halos.
//
// A spatial axis sharded over mesh dimension x stays sharded when every device can make
// exactly its block of the output from its block of the input plus a halo of rows from
// its neighbours. Output row j reads input rows [j*s - p0, j*s - p0 + e) (stride s, padding
// before p0, window extent e = (k - 1) * dilation + 1). With input blocks starting at I_i
// and output blocks (the output layout's geometry) at O_i, device i needs
//   before = I_i - O_i*s + p0 rows of the previous block, and
//   after  = (O_(i+1) - 1)*s - p0 + e - I_(i+1) rows of the next one,
// the same on every device when I_i = O_i*s (the blocks line up through the stride):
// before = p0 and after = e - s - p0 (negative: the block's last rows are not read).
//   SAME, stride 1, any k:     [*,x,*,*] -> halo (k-1)/2 each side -> [*,x,*,*]
//   SAME, stride 2, 8 rows/x:  out blocks of 4 start at input rows 0, 8: lined up
//   VALID, k=3, 8 rows over 2: out 6 rows in blocks of 3 start at 0, 3, inputs at 0, 4:
//                              not lined up -> the axis is gathered (as before)
// The zero rows of SAME/EXPLICIT padding are the fill at the global edges (-inf for max
// pooling; average pooling divides by a pooled mask of ones, which counts real rows), so
// the local op runs with VALID padding; unsharded spatial axes are padded locally.
// Gradients: Conv*BackpropFilter reads x with the same halo and leaves a partial sum over
// x (the filter gradient sums over all rows); Conv*BackpropInput runs on dy's block,
// makes the extended block of dx, and sends the halo rows back to their owners (the
// transpose of the exchange). MaxPoolGrad and MaxPool3DGrad do the same with orig_input's
// halo; AvgPoolGrad likewise when no window is padded (VALID, or SAME whose windows fit);
// a padded AvgPoolGrad, MaxPoolGradV2 and the grad-of-grad ops gather.
#include "cc/rules/window_rule.h"

#include <algorithm>
#include <string>

#include "cc/core/strings.h"
#include "cc/rules/expand.h"
#include "cc/spmd/halo.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {
namespace window {

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

int ChannelAxis(const Format& f) { return f.channels_last ? f.rank() - 1 : 1; }

std::optional<std::vector<int64_t>> HostShape(const OpContext& ctx, int input) {
  if (input < static_cast<int>(ctx.inputs.size())) return ctx.inputs[input].int_value;
  return std::nullopt;
}

namespace {

// One spatial axis of a windowed op.
struct AxisWindow {
  int64_t size = 0;    // input rows
  int64_t extent = 1;  // (k - 1) * dilation + 1
  int64_t stride = 1;
  int64_t before = 0, after = 0;  // padding
  int64_t out = 0;                // output rows
};

int SpatialAxis(const Format& f, int d) { return f.channels_last ? 1 + d : 2 + d; }

// The windows of every spatial axis, or an error saying why they cannot be read.
StatusOr<std::vector<AxisWindow>> ReadWindows(const OpContext& ctx, const WindowOpInfo& op,
                                              const Format& f) {
  std::vector<int64_t> in_shape, kernel, strides, dilations;
  if (op.role == WindowRole::kInputGrad) {
    if (auto s = HostShape(ctx, 0)) in_shape = *s;
  } else {
    in_shape = ctx.inputs[0].shape;
  }
  if (op.conv) {
    if (op.role == WindowRole::kFilterGrad) {
      if (auto s = HostShape(ctx, 1)) kernel = *s;
    } else {
      kernel = ctx.inputs[1].shape;
    }
    dilations = ctx.attrs->GetIntList("dilations");
    strides = ctx.attrs->GetIntList("strides");
  } else if (op.pool_v2) {
    if (auto s = HostShape(ctx, 1)) kernel = *s;
    if (auto s = HostShape(ctx, 2)) strides = *s;
  } else {
    kernel = ctx.attrs->GetIntList("ksize");
    strides = ctx.attrs->GetIntList("strides");
  }
  const int rank = f.rank();
  if (static_cast<int>(in_shape.size()) != rank || static_cast<int>(strides.size()) != rank ||
      static_cast<int>(kernel.size()) != rank ||
      (!dilations.empty() && static_cast<int>(dilations.size()) != rank)) {
    return InvalidArgument("the window of '" + ctx.op_name + "' is not known");
  }
  const int c = ChannelAxis(f);
  const bool dilated_across = !dilations.empty() && (dilations[0] != 1 || dilations[c] != 1);
  if (strides[0] != 1 || strides[c] != 1 || dilated_across ||
      (!op.conv && (kernel[0] != 1 || kernel[c] != 1))) {
    return InvalidArgument("'" + ctx.op_name + "' strides or pools over batch or channels");
  }
  const std::string padding = ctx.attrs->GetString("padding").value_or("VALID");
  const std::vector<int64_t> explicit_paddings = ctx.attrs->GetIntList("explicit_paddings");
  std::vector<AxisWindow> windows;
  for (int d = 0; d < op.spatial; ++d) {
    const int axis = SpatialAxis(f, d);
    AxisWindow w;
    w.size = in_shape[axis];
    const int64_t k = op.conv ? kernel[d] : kernel[axis];
    w.extent = (k - 1) * (dilations.empty() ? 1 : dilations[axis]) + 1;
    w.stride = strides[axis];
    if (w.stride < 1 || k < 1) return InvalidArgument("a window of '" + ctx.op_name + "' is empty");
    if (padding == "SAME") {
      w.out = (w.size + w.stride - 1) / w.stride;
      const int64_t total = std::max<int64_t>((w.out - 1) * w.stride + w.extent - w.size, 0);
      w.before = total / 2;
      w.after = total - w.before;
    } else if (padding == "EXPLICIT" &&
               static_cast<int>(explicit_paddings.size()) == 2 * rank) {
      w.before = explicit_paddings[2 * axis];
      w.after = explicit_paddings[2 * axis + 1];
    } else if (padding != "VALID") {
      return InvalidArgument("'" + ctx.op_name + "' has padding " + padding);
    }
    if (padding != "SAME") {
      const int64_t padded = w.size + w.before + w.after;
      w.out = padded >= w.extent ? (padded - w.extent) / w.stride + 1 : 0;
    }
    windows.push_back(w);
  }
  return windows;
}

struct Halo {
  int64_t before = 0, after = 0;
};

// Whether -inf exists in `dtype` (0: not known while planning, as in debug.explain).
bool FloatingOrUnknown(int dtype) {
  return dtype == 0 || dtype == TF_FLOAT || dtype == TF_DOUBLE || dtype == TF_HALF ||
         dtype == TF_BFLOAT16;
}

// The halo of `w` cut into `pieces` blocks, or why the blocks do not line up (see above).
StatusOr<Halo> PlanHalo(const AxisWindow& w, int64_t pieces, bool even_only) {
  if (even_only && w.size % pieces != 0) {
    return InvalidArgument(std::to_string(w.size) + " rows do not split evenly");
  }
  Halo h;
  h.before = w.before;
  std::optional<int64_t> after;
  for (int64_t i = 0; i < pieces; ++i) {
    const auto [rows, start] = Layout::Piece(w.size, pieces, i);
    const auto [outs, out_start] = Layout::Piece(w.out, pieces, i);
    if (rows < 1 || outs < 1) return InvalidArgument("a block would be empty");
    if (start != out_start * w.stride) {
      return InvalidArgument("output block " + std::to_string(i) + " starts at row " +
                             std::to_string(out_start) + ", which reads from input row " +
                             std::to_string(out_start * w.stride - w.before) +
                             ", not where input block " + std::to_string(i) + " (row " +
                             std::to_string(start) + ") begins");
    }
    const int64_t need = (out_start + outs - 1) * w.stride - w.before + w.extent - (start + rows);
    if (after && *after != need) {
      return InvalidArgument("the last block needs another halo than the others");
    }
    after = need;
    const int64_t local = rows + h.before + need;
    if (h.before > rows || need > rows || -need >= rows || local < w.extent ||
        (local - w.extent) / w.stride + 1 != outs) {
      return InvalidArgument("a block of " + std::to_string(rows) +
                             " rows is smaller than its halo");
    }
  }
  h.after = *after;
  return h;
}

// A windowed op's rule: the factor rule (batch, channels) plus spatial halos. With
// `shape_input` >= 0 that host input is the global shape of output 0
// (Conv2DBackpropInput's input_sizes, Conv2DBackpropFilter's filter_sizes, AvgPoolGrad's
// orig_input_shape): the local op gets the shape of its own block. One shape serves all
// devices, so an output factor whose shards would be uneven stays unsharded.
class WindowRule : public FactorRule {
 public:
  // `like`: without a window, the input whose shape the output has.
  WindowRule(FactorSpecFn spec, int shape_input, std::optional<WindowOpInfo> window,
             int like = -1)
      : FactorRule(std::move(spec)),
        shape_input_(shape_input),
        window_(window),
        like_(like) {}

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    TFD_ASSIGN_OR_RETURN(Plan plan, FactorRule::Forward(ctx));
    if (window_) AddHalos(ctx, plan);
    if (shape_input_ >= 0) {
      TFD_ASSIGN_OR_RETURN(std::vector<int64_t> global, ctx.IntValue(shape_input_, "shape"));
      if (plan.outputs.empty() || plan.outputs[0].rank() != static_cast<int>(global.size())) {
        return InvalidArgument("'" + ctx.op_name + "' names an output shape " +
                               ShapeString(global) + " of the wrong rank.");
      }
      TFD_ASSIGN_OR_RETURN(plan.host_inputs[shape_input_],
                           plan.outputs[0].UniformLocalShape(
                               global, "the output of '" + ctx.op_name + "'"));
    }
    return plan;
  }

  std::vector<std::optional<Layout>> Backward(
      const OpContext& ctx, const std::vector<std::optional<Layout>>& requested) const override;

  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override;

 protected:
  void AdjustForward(const OpContext& ctx, const FactorSpec& spec,
                     FactorAssignment& assignment) const override {
    // A depthwise convolution with a channel multiplier m > 1 makes (c block) * m output
    // channels per device, which are the blocks of c * m only when c shards evenly:
    // otherwise its channels are gathered.
    if (window_ && window_->conv && window_->role == WindowRole::kForward &&
        ctx.op_name.rfind("Depthwise", 0) == 0 && spec.inputs.size() > 1 && spec.inputs[1]) {
      const std::vector<int64_t>& w = ctx.inputs[1].shape;
      const int s = window_->spatial;
      if (static_cast<int>(w.size()) == s + 2 && w[s + 1] != 1) {
        const int f = (*spec.inputs[1])[s];
        if (f >= 0 && assignment[f].sharded() &&
            w[s] % ctx.mesh.DimSize(assignment[f].mesh_dim) != 0) {
          assignment[f] = DimSpec::Replicated();
        }
      }
    }
    if (shape_input_ < 0) return;
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
  // The input whose spatial sharding asks for a halo: x, or dy for the input gradient.
  int source() const { return window_->role == WindowRole::kInputGrad ? window_->dy : 0; }
  // Keeps each spatial axis of the source sharded when its halo works (see above).
  void AddHalos(const OpContext& ctx, Plan& plan) const;
  // The spatial axes the plan keeps sharded, with their halos.
  std::vector<std::pair<int, Halo>> Halos(const OpContext& ctx, const Plan& plan,
                                          const Format& f,
                                          const std::vector<AxisWindow>& windows) const;

  // The global shape of the output, when it can be read.
  std::optional<std::vector<int64_t>> OutputShape(const OpContext& ctx) const;
  // The local op's options: the plan's overrides and, where the output shape is known,
  // zeros instead of the kernel on devices with an empty input block (uneven shards):
  // TF's CPU kernels mishandle those (Conv2D of a [0,5,4,1] batch returns its input, a
  // filter of 0 channels is refused, DepthwiseConv2dNativeBackpropFilter of an empty
  // batch returns uninitialised memory, the oneDNN MaxPoolGrad aborts, MaxPool3DGradGrad
  // refuses). Zeros are the local op's true value: an empty input block either makes an
  // empty output block (batch, channels, rows) or is the empty range of a contraction
  // (a convolution sums over channels and, for the filter gradient, batch and rows),
  // whose sum is zero, whatever pending reductions the term then joins.
  LocalOpOptions Options(const OpContext& ctx, const Plan& plan) const;
  StatusOr<std::vector<ValueId>> ExpandPlain(const OpContext& ctx, const Plan& plan,
                                             Builder& builder) const {
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> inputs, PrepareInputs(ctx, plan, builder));
    return ExpandWithInputs(ctx, plan, inputs, Options(ctx, plan), builder);
  }

  int shape_input_;
  std::optional<WindowOpInfo> window_;
  int like_;
};

std::optional<std::vector<int64_t>> WindowRule::OutputShape(const OpContext& ctx) const {
  if (!window_) {
    if (like_ < 0) return std::nullopt;
    return ctx.inputs[like_].shape;
  }
  switch (window_->role) {
    case WindowRole::kInputGrad:
      return HostShape(ctx, 0);
    case WindowRole::kFilterGrad:
      return HostShape(ctx, 1);
    case WindowRole::kPoolGrad:
      return ctx.inputs[0].shape;
    case WindowRole::kForward:
      break;
  }
  StatusOr<Format> f = ReadFormat(ctx, window_->spatial);
  if (!f.ok()) return std::nullopt;
  StatusOr<std::vector<AxisWindow>> windows = ReadWindows(ctx, *window_, *f);
  if (!windows.ok()) return std::nullopt;
  std::vector<int64_t> shape = ctx.inputs[0].shape;
  for (int d = 0; d < window_->spatial; ++d) shape[SpatialAxis(*f, d)] = (*windows)[d].out;
  if (window_->conv) {
    const std::vector<int64_t>& w = ctx.inputs[1].shape;
    const int s = window_->spatial;
    if (static_cast<int>(w.size()) != s + 2) return std::nullopt;
    // Depthwise: c*m channels, told apart from Conv by the filter's in-channels.
    const bool depthwise = ctx.op_name.rfind("Depthwise", 0) == 0;
    shape[ChannelAxis(*f)] = depthwise ? w[s] * w[s + 1] : w[s + 1];
  }
  return shape;
}

LocalOpOptions WindowRule::Options(const OpContext& ctx, const Plan& plan) const {
  LocalOpOptions options;
  options.overrides = plan.overrides;
  std::optional<std::vector<int64_t>> shape = OutputShape(ctx);
  if (!shape || plan.outputs.size() != 1 ||
      plan.outputs[0].rank() != static_cast<int>(shape->size())) {
    return options;
  }
  options.zeros_for_empty_blocks = true;
  options.global_shapes = {*shape};
  return options;
}

void WindowRule::AddHalos(const OpContext& ctx, Plan& plan) const {
  const WindowOpInfo& op = *window_;
  StatusOr<Format> f = ReadFormat(ctx, op.spatial);
  if (!f.ok()) return;
  StatusOr<std::vector<AxisWindow>> windows = ReadWindows(ctx, op, *f);
  const int src = source();
  std::vector<int> inputs = {src};
  if (op.role == WindowRole::kFilterGrad) inputs.push_back(2);
  if (op.role == WindowRole::kPoolGrad) inputs = {0, 1, 2};
  const bool returns = op.role == WindowRole::kInputGrad || op.role == WindowRole::kPoolGrad;
  bool padded = false;
  for (const AxisWindow& w : windows.ok() ? *windows : std::vector<AxisWindow>()) {
    padded = padded || w.before != 0 || w.after != 0;
  }
  std::vector<bool> used(ctx.mesh.num_dims(), false);
  auto mark = [&](const Layout& l) {
    for (int d : l.DistinctMeshDims()) used[d] = true;
  };
  for (const std::optional<Layout>& in : plan.inputs) {
    if (in) mark(*in);
  }
  for (const Layout& out : plan.outputs) mark(out);
  for (const std::vector<int>& dims : plan.partial_dims) {
    for (int d : dims) used[d] = true;
  }
  for (int d = 0; d < op.spatial; ++d) {
    const int axis = SpatialAxis(*f, d);
    std::optional<DimSpec> spec;
    for (int i : inputs) {
      if (spec || i >= static_cast<int>(ctx.inputs.size()) || !ctx.inputs[i].layout ||
          ctx.layout(i).rank() != f->rank()) {
        continue;
      }
      if (ctx.layout(i).spec(axis).sharded()) spec = ctx.layout(i).spec(axis);
    }
    if (!spec) continue;
    bool planned = true;
    for (int i : inputs) planned = planned && plan.inputs[i].has_value();
    if (!planned || plan.outputs.empty()) continue;
    const std::string& name = ctx.mesh.dims()[spec->mesh_dim].name;
    const std::string what = "spatial axis " + std::to_string(axis) + " of input " +
                             std::to_string(src) + " gathered over " + name + ": ";
    std::string why;
    if (!windows.ok()) {
      // No window to plan with (debug.explain without the op's attributes): the axis is
      // gathered as the factor plan says, with nothing more to tell.
      continue;
    } else if (used[spec->mesh_dim]) {
      why = name + " shards another axis of the op";
    } else if (op.max_pool && !FloatingOrUnknown(ctx.inputs[0].dtype)) {
      why = "max pooling pads with -inf, which only floating types have";
    } else if (op.avg_pool && op.role == WindowRole::kInputGrad && padded) {
      why = "the gradient of a padded average pool divides by each window's real rows";
    } else {
      StatusOr<Halo> halo = PlanHalo((*windows)[d], ctx.mesh.DimSize(spec->mesh_dim),
                                     op.role == WindowRole::kInputGrad);
      if (halo.ok() && returns) {
        // The returned rows land inside the block: it must hold both halos.
        const int64_t pieces = ctx.mesh.DimSize(spec->mesh_dim);
        const int64_t rows = Layout::Piece((*windows)[d].size, pieces, pieces - 1).first;
        if (rows < halo->before + std::max<int64_t>(halo->after, 0)) {
          halo = InvalidArgument("a block of " + std::to_string(rows) +
                                 " rows is smaller than its halos");
        }
      }
      if (halo.ok()) {
        used[spec->mesh_dim] = true;
        for (int i : inputs) {
          std::vector<DimSpec> specs = plan.inputs[i]->specs();
          specs[axis] = *spec;
          plan.inputs[i] = Layout::FromSpecs(specs, plan.inputs[i]->mesh(),
                                             plan.inputs[i]->type(), plan.inputs[i]->partial())
                               .value();
        }
        if (op.role == WindowRole::kFilterGrad) {
          plan.partial_dims[0].push_back(spec->mesh_dim);
        } else {
          std::vector<DimSpec> specs = plan.outputs[0].specs();
          specs[axis] = *spec;
          plan.outputs[0] = Layout::FromSpecs(specs, plan.outputs[0].mesh(),
                                              plan.outputs[0].type(), plan.outputs[0].partial())
                                .value();
        }
        plan.notes.push_back("halo exchange of input " + std::to_string(src) + " axis " +
                             std::to_string(axis) + " over " + name + ": " +
                             std::to_string(halo->before) + " rows before, " +
                             std::to_string(halo->after) + " after");
        continue;
      }
      why = halo.status().message();
    }
    plan.notes.push_back(what + why);
  }
}

std::vector<std::pair<int, Halo>> WindowRule::Halos(const OpContext& ctx, const Plan& plan,
                                                    const Format& f,
                                                    const std::vector<AxisWindow>& windows) const {
  std::vector<std::pair<int, Halo>> halos;
  const std::optional<Layout>& in = plan.inputs[source()];
  for (int d = 0; in && d < window_->spatial; ++d) {
    const DimSpec& spec = in->spec(SpatialAxis(f, d));
    if (!spec.sharded()) continue;
    StatusOr<Halo> halo = PlanHalo(windows[d], ctx.mesh.DimSize(spec.mesh_dim), false);
    if (halo.ok()) halos.push_back({d, *halo});
  }
  return halos;
}

std::vector<std::optional<Layout>> WindowRule::Backward(
    const OpContext& ctx, const std::vector<std::optional<Layout>>& requested) const {
  std::vector<std::optional<Layout>> result = FactorRule::Backward(ctx, requested);
  // A forward op asked for a spatially sharded output asks the same of its input when
  // the halo works.
  if (!window_ || window_->role != WindowRole::kForward || result.empty() || !result[0]) {
    return result;
  }
  StatusOr<Format> f = ReadFormat(ctx, window_->spatial);
  const Layout* want = UsableRequest(ctx, requested, 0, ctx.rank(0));
  if (!f.ok() || !want) return result;
  StatusOr<std::vector<AxisWindow>> windows = ReadWindows(ctx, *window_, *f);
  if (!windows.ok()) return result;
  std::vector<DimSpec> specs = result[0]->specs();
  for (int d = 0; d < window_->spatial; ++d) {
    const int axis = SpatialAxis(*f, d);
    const DimSpec& s = want->spec(axis);
    if (!s.sharded() || !PlanHalo((*windows)[d], ctx.mesh.DimSize(s.mesh_dim), false).ok()) {
      continue;
    }
    bool taken = false;
    for (const DimSpec& o : specs) taken = taken || (o.sharded() && o.mesh_dim == s.mesh_dim);
    if (!taken) specs[axis] = s;
  }
  result[0] = result[0]->WithSpecs(specs);
  return result;
}

StatusOr<std::vector<ValueId>> WindowRule::Expand(const OpContext& ctx, const Plan& plan,
                                                  Builder& builder) const {
  if (!window_) return ExpandPlain(ctx, plan, builder);
  const WindowOpInfo& op = *window_;
  TFD_ASSIGN_OR_RETURN(Format f, ReadFormat(ctx, op.spatial));
  StatusOr<std::vector<AxisWindow>> read = ReadWindows(ctx, op, f);
  if (!read.ok()) return ExpandPlain(ctx, plan, builder);
  const std::vector<AxisWindow>& windows = *read;
  const std::vector<std::pair<int, Halo>> halos = Halos(ctx, plan, f, windows);
  if (halos.empty()) return ExpandPlain(ctx, plan, builder);
  auto halo_of = [&](int d) -> const Halo* {
    for (const auto& [axis, h] : halos) {
      if (axis == d) return &h;
    }
    return nullptr;
  };

  // Every spatial axis is padded or extended here; the local op runs with VALID padding.
  LocalOpOptions options = Options(ctx, plan);
  options.overrides.push_back(AttrOverride::String("padding", "VALID"));
  if (ctx.attrs->GetString("padding").value_or("") == "EXPLICIT") {
    options.overrides.push_back(AttrOverride::IntList("explicit_paddings", {}));
  }

  if (op.role == WindowRole::kInputGrad || op.role == WindowRole::kPoolGrad) {
    // dx of the extended block, then the halo rows go back to their owners.
    Plan local = plan;
    if (op.role == WindowRole::kInputGrad) {
      std::vector<int64_t>& sizes = local.host_inputs[0];
      for (int d = 0; d < op.spatial; ++d) {
        const int axis = SpatialAxis(f, d);
        const AxisWindow& w = windows[d];
        const Halo* h = halo_of(d);
        sizes[axis] = h ? sizes[axis] + h->before + h->after : w.size + w.before + w.after;
      }
    }
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> inputs, PrepareInputs(ctx, local, builder));
    for (int d = 0; op.role == WindowRole::kPoolGrad && d < op.spatial; ++d) {
      const int axis = SpatialAxis(f, d);
      const AxisWindow& w = windows[d];
      const HaloFill fill = HaloFill::kNegativeInfinity;
      if (const Halo* h = halo_of(d)) {
        TFD_ASSIGN_OR_RETURN(inputs[0],
                             ExchangeHalo(builder, inputs[0], axis, h->before, h->after, fill));
      } else {
        TFD_ASSIGN_OR_RETURN(inputs[0], PadAxis(builder, inputs[0], axis, w.before, w.after, fill));
      }
    }
    // The local op makes the block extended by each spatial axis's halo or padding.
    std::vector<int64_t> grow(f.rank(), 0);
    for (int d = 0; d < op.spatial; ++d) {
      const Halo* h = halo_of(d);
      grow[SpatialAxis(f, d)] = h ? h->before + h->after : windows[d].before + windows[d].after;
    }
    options.zeros_grow = {grow};
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> out,
                         ExpandWithInputs(ctx, plan, inputs, options, builder));
    for (int d = 0; d < op.spatial; ++d) {
      const int axis = SpatialAxis(f, d);
      const AxisWindow& w = windows[d];
      if (const Halo* h = halo_of(d)) {
        TFD_ASSIGN_OR_RETURN(out[0], ReturnHalo(builder, out[0], axis, h->before, h->after));
      } else if (w.before != 0 || w.after != 0) {
        TFD_ASSIGN_OR_RETURN(out[0],
                             SliceRows(builder, out[0], axis, w.before, w.before + w.size));
      }
    }
    return out;
  }

  TFD_ASSIGN_OR_RETURN(std::vector<ValueId> inputs, PrepareInputs(ctx, plan, builder));
  const HaloFill fill = op.max_pool ? HaloFill::kNegativeInfinity : HaloFill::kZeros;
  bool padded = false;
  for (const AxisWindow& w : windows) padded = padded || w.before != 0 || w.after != 0;
  // Average pooling divides by the real rows of each window: a pooled mask counts them.
  std::optional<ValueId> mask;
  if (op.avg_pool && padded) {
    LocalOpOptions ones;
    ones.copy_attrs = false;
    ones.overrides = {AttrOverride::Type("T", ctx.inputs[0].dtype)};
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> m, builder.LocalOp("OnesLike", {inputs[0]}, ones,
                                                                 {*builder.layout(inputs[0])}));
    mask = m[0];
  }
  for (int d = 0; d < op.spatial; ++d) {
    const int axis = SpatialAxis(f, d);
    const AxisWindow& w = windows[d];
    for (ValueId* v : {&inputs[0], mask ? &*mask : nullptr}) {
      if (!v) continue;
      const HaloFill how = v == &inputs[0] ? fill : HaloFill::kZeros;
      if (const Halo* h = halo_of(d)) {
        TFD_ASSIGN_OR_RETURN(*v, ExchangeHalo(builder, *v, axis, h->before, h->after, how));
      } else {
        TFD_ASSIGN_OR_RETURN(*v, PadAxis(builder, *v, axis, w.before, w.after, how));
      }
    }
  }
  if (!mask) return ExpandWithInputs(ctx, plan, inputs, options, builder);
  TFD_ASSIGN_OR_RETURN(std::vector<ValueId> sum,
                       builder.LocalOp(ctx.op_name, inputs, options, plan.outputs));
  inputs[0] = *mask;
  TFD_ASSIGN_OR_RETURN(std::vector<ValueId> count,
                       builder.LocalOp(ctx.op_name, inputs, options, plan.outputs));
  LocalOpOptions divide;
  divide.copy_attrs = false;
  divide.overrides = {AttrOverride::Type("T", ctx.inputs[0].dtype)};
  return builder.LocalOp("RealDiv", {sum[0], count[0]}, divide, plan.outputs);
}

}  // namespace

std::shared_ptr<const Rule> WindowedRule(FactorSpecFn spec, int shape_input,
                                         std::optional<WindowOpInfo> window, int like) {
  return std::make_shared<WindowRule>(std::move(spec), shape_input, window, like);
}

}  // namespace window
}  // namespace tf_dtensor
