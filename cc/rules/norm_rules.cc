// Batch normalisation: FusedBatchNorm, FusedBatchNormV2/V3 and their gradients, NHWC and
// NCHW (NDHWC/NCDHW for 5-D). Every axis of x is a pass-through factor; the channel axis
// c is shared with scale, offset, the running statistics and the [c] outputs.
//   channels sharded:  x [*,*,*,y], scale [y] -> y [*,*,*,y], mean [y]   (no communication)
//   inference (is_training=False): elementwise, any sharding, no communication
//   training with n/h/w sharded: synchronised batch norm, statistics of the global batch:
//     x [x,*,*,y] -> sum over n,h,w -> all-reduce(sum) over x -> mean [y]
//                 -> sum of (x - mean)^2 -> all-reduce(sum) over x -> variance [y]
//     (two passes, as TF's kernel does, rather than sums of squares); counts are the
//     global ones, so uneven shards are exact. batch_variance is Bessel-corrected with
//     the global count, and exponential_avg_factor != 1 blends with the running
//     statistics, both as TF's kernels do.
//   gradient, training with n/h/w sharded: all-reduce(sum) of sum(dy) and sum(dy*x_hat),
//     then dx from the global means; scale and offset gradients come out whole. In
//     inference mode dx is elementwise and the scale/offset gradients are sums over the
//     sharded n/h/w: partial, all-reduced (or left pending inside tf.function).
//
// Reserve spaces. TF's kernels disagree on them: on CPU reserve_space_1/2 are the batch
// mean and (biased) variance, on GPU (cuDNN) reserve_space_2 is the inverse standard
// deviation and reserve_space_3 a workspace. The gradient rule reads none of them: in
// training it recomputes the global mean and variance from x (one more pass and two
// all-reduces of [c]), in inference it takes the population statistics that TF's Python
// gradient passes in their place. So it is right whichever kernel wrote the reserve spaces
// and whatever layouts reach it. When the forward runs as the arithmetic below (always for
// V3, for V1/V2 when it synchronises) it writes the convention of the mesh's device type
// in training (mean and biased variance on CPUs, mean and inverse deviation on GPUs, as
// measured on an H200) and an empty reserve_space_3; in inference it passes the population
// statistics through, as the CPU kernel does (the GPU kernel leaves outputs 1-4 unwritten:
// on an H200 they held the previous op's values). V1/V2 without synchronisation run the device's own kernel.
// V3 and the gradients never do: V3's reserve_space_3 and the gradients' unused outputs
// have no static shape (or a different one eagerly) in TF, and tf.function expansion needs
// static shapes; the gradients' reserve_space_4/5 come out empty [0], as TF's graphs say.
#include <string>

#include "cc/core/strings.h"
#include "cc/rules/factor.h"
#include "cc/rules/local_math.h"
#include "cc/rules/expand.h"
#include "cc/rules/registry.h"

namespace tf_dtensor {
namespace {

// The channel axis and the reduced (batch and spatial) axes of x.
struct Format {
  int rank = 4;
  int channel = 3;
  std::vector<int64_t> reduced;
};

StatusOr<Format> ReadFormat(const OpContext& ctx, int x) {
  const std::string format = ctx.attrs->GetString("data_format").value_or("NHWC");
  Format f;
  f.rank = static_cast<int>(format.size());
  if ((format != "NHWC" && format != "NCHW" && format != "NDHWC" && format != "NCDHW") ||
      ctx.rank(x) != f.rank) {
    return InvalidArgument("'" + ctx.op_name + "' with data_format " + format +
                           " needs x of rank " + std::to_string(format.size()) + "; got " +
                           ctx.Describe(x) + ".");
  }
  f.channel = format[1] == 'C' ? 1 : f.rank - 1;
  for (int a = 0; a < f.rank; ++a) {
    if (a != f.channel) f.reduced.push_back(a);
  }
  return f;
}

// FusedBatchNorm*(x, scale, offset, mean, variance) -> y, batch_mean, batch_variance,
//   reserve_space_1, reserve_space_2[, reserve_space_3]
// FusedBatchNormGrad*(dy, x, scale, reserve_space_1, reserve_space_2[, reserve_space_3])
//   -> dx, scale_backprop, offset_backprop, reserve_space_4, reserve_space_5 (empty [0])
// Empty mean/variance (training without running statistics) do not span c and stay as
// they are.
StatusOr<FactorSpec> BatchNormFactors(const OpContext& ctx, bool grad) {
  const int x = grad ? 1 : 0;
  if (ctx.inputs.size() < 5) {
    return InvalidArgument("'" + ctx.op_name + "' got too few inputs: " + ctx.DescribeInputs() +
                           ".");
  }
  TFD_ASSIGN_OR_RETURN(Format f, ReadFormat(ctx, x));
  FactorSpec spec;
  const std::vector<int> axes = spec.AddAxes(f.rank);
  const std::vector<int> c = {axes[f.channel]};
  spec.inputs.assign(ctx.inputs.size(), std::nullopt);
  if (grad) {
    spec.inputs[0] = axes;
    spec.inputs[1] = axes;
    for (int i = 2; i < 5; ++i) {
      if (ctx.rank(i) == 1) spec.inputs[i] = c;
    }
    spec.outputs = {axes, c, c, {FactorSpec::kNew}, {FactorSpec::kNew}};
  } else {
    spec.inputs[0] = axes;
    for (int i = 1; i < 5; ++i) {
      if (ctx.rank(i) == 1) spec.inputs[i] = c;
    }
    spec.outputs = {axes, c, c, c, c};
    if (ctx.num_outputs > 5) spec.outputs.push_back({FactorSpec::kNew});
  }
  return spec;
}

class BatchNormRule : public FactorRule {
 public:
  // `grad`: the FusedBatchNormGrad ops. `native`: the local kernel may run when x's n/h/w
  // are not sharded (V1/V2 forward; V3's reserve_space_3 has no static
  // shape, which tf.function expansion needs, so V3 and the gradients always run as the
  // arithmetic below).
  BatchNormRule(bool grad, bool native)
      : FactorRule([grad](const OpContext& ctx) { return BatchNormFactors(ctx, grad); }),
        grad_(grad),
        native_(native) {}

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    TFD_ASSIGN_OR_RETURN(Plan plan, FactorRule::Forward(ctx));
    TFD_ASSIGN_OR_RETURN(std::vector<int> sync, SyncDims(ctx, plan));
    if (sync.empty()) return plan;
    if (!Training(ctx)) {
      // Inference-mode gradient: scale_backprop and offset_backprop sum over n/h/w.
      for (int o : {1, 2}) {
        if (grad_ && o < static_cast<int>(plan.partial_dims.size())) plan.partial_dims[o] = sync;
      }
      return plan;
    }
    std::vector<std::string> names;
    for (int d : sync) names.push_back(ctx.mesh.dims()[d].name);
    const std::string over = " over " + Join(names, ",");
    plan.notes = {"all-reduce(sum) of the batch mean" + over,
                                  "all-reduce(sum) of the batch variance" + over};
    if (grad_) {
      plan.notes.push_back("all-reduce(sum) of sum(dy)" + over);
      plan.notes.push_back("all-reduce(sum) of sum(dy * x_hat)" + over);
    }
    return plan;
  }

  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    TFD_ASSIGN_OR_RETURN(std::vector<int> sync, SyncDims(ctx, plan));
    // Not in inference with n/h/w sharded either: an uneven shard gives some device an empty
    // block of x, for which TF's kernel writes NaN batch_mean/batch_variance instead of
    // passing the population statistics through.
    if (native_ && sync.empty()) return ExpandDefault(ctx, plan, builder);
    return grad_ ? ExpandGrad(ctx, plan, sync, builder) : ExpandForward(ctx, plan, sync, builder);
  }

 private:
  static bool Training(const OpContext& ctx) { return ctx.attrs->GetBool("is_training", true); }
  int XInput() const { return grad_ ? 1 : 0; }

  // The mesh dimensions that shard x's batch and spatial axes in the plan.
  StatusOr<std::vector<int>> SyncDims(const OpContext& ctx, const Plan& plan) const {
    const int x = XInput();
    TFD_ASSIGN_OR_RETURN(Format f, ReadFormat(ctx, x));
    const Layout& layout = plan.inputs[x] ? *plan.inputs[x] : ctx.layout(x);
    std::vector<int> dims;
    for (int64_t a : f.reduced) {
      if (layout.spec(static_cast<int>(a)).sharded()) {
        dims.push_back(layout.spec(static_cast<int>(a)).mesh_dim);
      }
    }
    return dims;
  }

  // The global number of elements each statistic is taken over.
  // -1 where a reduced axis has no static size.
  int64_t Count(const OpContext& ctx, const Format& f) const {
    int64_t count = 1;
    for (int64_t a : f.reduced) {
      const int64_t size = ctx.inputs[XInput()].shape[a];
      if (size < 0) return -1;
      count *= size;
    }
    return count;
  }

  // The count as a value of type U: a constant, or, where a reduced axis has no static
  // size (inside a tf.function: a loop over batches of a tf.data iterator), the elements
  // counted as x's are summed, in the statistics' layout (Count gave a negative number).
  StatusOr<ValueId> CountValue(const OpContext& ctx, const Format& f, ValueId x,
                               const std::vector<int>& sync, const Layout& stat,
                               LocalMath& math, Builder& builder) const {
    const int64_t count = Count(ctx, f);
    if (count >= 0) return math.Count(count);
    TFD_ASSIGN_OR_RETURN(ValueId ones, math.Apply("OnesLike", x));
    return SumOver(ones, sync, f, stat, math, builder);
  }

  // [c] as the statistics' shape ([1,1,1,c] or [1,c,1,1]).
  static std::vector<int64_t> StatShape(const Format& f) {
    std::vector<int64_t> shape(f.rank, 1);
    shape[f.channel] = -1;
    return shape;
  }

  static float FloatAttr(const OpContext& ctx, const std::string& name, float fallback) {
    const AttrValue* v = ctx.attrs->Find(name);
    return v && v->f ? *v->f : fallback;
  }

  static StatusOr<ValueId> SumOver(ValueId value, const std::vector<int>& sync,
                                   const Format& f, const Layout& stat, LocalMath& math,
                                   Builder& builder) {
    TFD_ASSIGN_OR_RETURN(ValueId sum, math.Reduce("Sum", value, f.reduced, stat));
    if (sync.empty()) return sum;
    return builder.AllReduce(sum, sync, ReduceOp::kSum);
  }

  // What both directions share: x (in the arithmetic type U), its mean and variance in the
  // statistics' layout (x's, with only c sharded), centred x and 1/sqrt(variance + eps).
  // Training takes global moments of x; inference the given population statistics.
  struct Normalised {
    Format f;
    Layout x_layout, stat, vector;
    ValueId x, count, mean, variance, sum_squares, centred, inverse;
  };
  StatusOr<Normalised> Normalise(const OpContext& ctx, const std::vector<ValueId>& in,
                                 const std::vector<int>& sync, int mean_input, LocalMath& math,
                                 Builder& builder) const {
    const int x = XInput();
    TFD_ASSIGN_OR_RETURN(Format f, ReadFormat(ctx, x));
    const Layout x_layout = builder.layout(in[x])->WithoutPartial();
    std::vector<DimSpec> stat(f.rank, DimSpec::Replicated());
    stat[f.channel] = x_layout.spec(f.channel);
    Normalised n{f, x_layout, x_layout.WithSpecs(stat), x_layout.WithSpecs({stat[f.channel]})};
    TFD_ASSIGN_OR_RETURN(n.x, math.Cast(in[x], ctx.inputs[x].dtype, math.type()));
    TFD_ASSIGN_OR_RETURN(n.count, CountValue(ctx, f, n.x, sync, n.stat, math, builder));
    if (Training(ctx)) {
      // Two passes, as TF's kernels: the mean, then the mean square of the centred values.
      TFD_ASSIGN_OR_RETURN(ValueId sum, SumOver(n.x, sync, f, n.stat, math, builder));
      TFD_ASSIGN_OR_RETURN(n.mean, math.Apply("RealDiv", {sum, n.count}, n.stat));
      TFD_ASSIGN_OR_RETURN(n.centred, math.Apply("Sub", {n.x, n.mean}, x_layout));
      TFD_ASSIGN_OR_RETURN(ValueId squares, math.Apply("Square", n.centred));
      TFD_ASSIGN_OR_RETURN(n.sum_squares, SumOver(squares, sync, f, n.stat, math, builder));
      TFD_ASSIGN_OR_RETURN(n.variance, math.Apply("RealDiv", {n.sum_squares, n.count}, n.stat));
    } else {
      TFD_ASSIGN_OR_RETURN(n.mean, math.Reshape(in[mean_input], StatShape(f), n.stat));
      TFD_ASSIGN_OR_RETURN(n.variance, math.Reshape(in[mean_input + 1], StatShape(f), n.stat));
      TFD_ASSIGN_OR_RETURN(n.centred, math.Apply("Sub", {n.x, n.mean}, x_layout));
    }
    TFD_ASSIGN_OR_RETURN(ValueId eps, math.Float(FloatAttr(ctx, "epsilon", 1e-4f)));
    TFD_ASSIGN_OR_RETURN(ValueId shifted, math.Apply("AddV2", {n.variance, eps}, n.stat));
    TFD_ASSIGN_OR_RETURN(n.inverse, math.Apply("Rsqrt", shifted));
    return n;
  }

  // An empty [0] tensor of type U (the unused reserve spaces).
  static StatusOr<ValueId> Empty(const OpContext& ctx, LocalMath& math, Builder& builder) {
    TFD_ASSIGN_OR_RETURN(ValueId none, builder.HostConstant({}, {0}, TF_INT32));
    return math.Op("Cast", {none},
                   {AttrOverride::Type("SrcT", TF_INT32), AttrOverride::Type("DstT", math.type())},
                   Layout::Replicated(ctx.mesh, 1));
  }

  // y = (x - mean) * (scale / sqrt(variance + eps)) + offset.
  StatusOr<std::vector<ValueId>> ExpandForward(const OpContext& ctx, const Plan& plan,
                                               const std::vector<int>& sync,
                                               Builder& builder) const {
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> in, PrepareInputs(ctx, plan, builder));
    const int x_type = ctx.inputs[0].dtype;
    const int u_type = ctx.inputs[1].dtype;
    LocalMath math(builder, ctx.mesh, u_type);
    TFD_ASSIGN_OR_RETURN(Normalised n, Normalise(ctx, in, sync, 3, math, builder));
    TFD_ASSIGN_OR_RETURN(ValueId scale, math.Reshape(in[1], StatShape(n.f), n.stat));
    TFD_ASSIGN_OR_RETURN(ValueId offset, math.Reshape(in[2], StatShape(n.f), n.stat));
    TFD_ASSIGN_OR_RETURN(ValueId factor, math.Apply("Mul", {n.inverse, scale}, n.stat));
    TFD_ASSIGN_OR_RETURN(ValueId y, math.Apply("Mul", {n.centred, factor}, n.x_layout));
    TFD_ASSIGN_OR_RETURN(y, math.Apply("AddV2", {y, offset}, n.x_layout));
    TFD_ASSIGN_OR_RETURN(y, math.Cast(y, u_type, x_type));

    std::vector<ValueId> out;
    if (!Training(ctx)) {
      // Inference passes the population statistics through, as TF's kernels do.
      out = {y, in[3], in[4], in[3], in[4]};
    } else {
      TFD_ASSIGN_OR_RETURN(ValueId mean, math.Reshape(n.mean, {-1}, n.vector));
      TFD_ASSIGN_OR_RETURN(ValueId variance, math.Reshape(n.variance, {-1}, n.vector));
      // batch_variance: unbiased over the global count (n/(n-1)). For n = 1 as one device
      // of the mesh's type: TF's CPU kernel divides by 1, cuDNN by 0 (NaN, measured on an
      // H200).
      const int64_t count = Count(ctx, n.f);
      const bool gpu = ctx.mesh.device_type() == "GPU";
      ValueId bessel;
      if (count >= 0) {
        TFD_ASSIGN_OR_RETURN(bessel,
                             math.Count(count > 1 ? count - 1 : (gpu && count == 1 ? 0 : 1)));
      } else {
        // max(n - 1, 1) on CPUs, max(n - 1, 0) on GPUs: the constants above, for n >= 1.
        TFD_ASSIGN_OR_RETURN(ValueId one, math.Count(1));
        TFD_ASSIGN_OR_RETURN(ValueId least, math.Count(gpu ? 0 : 1));
        TFD_ASSIGN_OR_RETURN(ValueId less, math.Apply("Sub", {n.count, one}, n.stat));
        TFD_ASSIGN_OR_RETURN(less, math.Apply("Maximum", {less, least}, n.stat));
        TFD_ASSIGN_OR_RETURN(bessel, math.Reshape(less, {-1}, n.vector));
      }
      TFD_ASSIGN_OR_RETURN(ValueId sum_squares, math.Reshape(n.sum_squares, {-1}, n.vector));
      TFD_ASSIGN_OR_RETURN(ValueId batch_variance,
                           math.Apply("RealDiv", {sum_squares, bessel}, n.vector));
      ValueId batch_mean = mean;
      const float factor_value = FloatAttr(ctx, "exponential_avg_factor", 1.0f);
      if (factor_value != 1.0f) {
        // (1 - f) * running + f * batch, as TF's kernels blend them.
        TFD_ASSIGN_OR_RETURN(ValueId keep, math.Float(1.0f - factor_value));
        TFD_ASSIGN_OR_RETURN(ValueId take, math.Float(factor_value));
        auto blend = [&](ValueId running, ValueId batch) -> StatusOr<ValueId> {
          TFD_ASSIGN_OR_RETURN(ValueId a, math.Apply("Mul", {keep, running}, n.vector));
          TFD_ASSIGN_OR_RETURN(ValueId b, math.Apply("Mul", {take, batch}, n.vector));
          return math.Apply("AddV2", {a, b}, n.vector);
        };
        TFD_ASSIGN_OR_RETURN(batch_mean, blend(in[3], mean));
        TFD_ASSIGN_OR_RETURN(batch_variance, blend(in[4], batch_variance));
      }
      // reserve_space_2 as one device of the mesh's type writes it: the biased variance
      // on CPUs, 1/sqrt(variance + eps) on GPUs (cuDNN's saved inverse deviation).
      ValueId reserve_2 = variance;
      if (gpu) {
        TFD_ASSIGN_OR_RETURN(reserve_2, math.Reshape(n.inverse, {-1}, n.vector));
      }
      out = {y, batch_mean, batch_variance, mean, reserve_2};
    }
    if (ctx.num_outputs > 5) {
      TFD_ASSIGN_OR_RETURN(ValueId empty, Empty(ctx, math, builder));
      out.push_back(empty);
    }
    return out;
  }

  // Training: dx = scale * inv * (dy - (sum(dy) + x_hat * sum(dy * x_hat)) / n), with the
  // sums all-reduced first; scale_backprop = sum(dy * x_hat), offset_backprop = sum(dy).
  // Inference: dx = dy * scale * inv (elementwise), and the two sums are partial.
  StatusOr<std::vector<ValueId>> ExpandGrad(const OpContext& ctx, const Plan& plan,
                                            const std::vector<int>& sync,
                                            Builder& builder) const {
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> in, PrepareInputs(ctx, plan, builder));
    const int x_type = ctx.inputs[1].dtype;
    const int u_type = ctx.inputs[2].dtype;
    const bool training = Training(ctx);
    LocalMath math(builder, ctx.mesh, u_type);
    TFD_ASSIGN_OR_RETURN(Normalised n, Normalise(ctx, in, sync, 3, math, builder));
    TFD_ASSIGN_OR_RETURN(ValueId dy, math.Cast(in[0], ctx.inputs[0].dtype, u_type));
    TFD_ASSIGN_OR_RETURN(ValueId x_hat, math.Apply("Mul", {n.centred, n.inverse}, n.x_layout));
    TFD_ASSIGN_OR_RETURN(ValueId dy_x_hat, math.Apply("Mul", {dy, x_hat}, n.x_layout));
    const std::vector<int> none;
    const std::vector<int>& now = training ? sync : none;
    TFD_ASSIGN_OR_RETURN(ValueId sum_dy, SumOver(dy, now, n.f, n.stat, math, builder));
    TFD_ASSIGN_OR_RETURN(ValueId sum_dy_x_hat, SumOver(dy_x_hat, now, n.f, n.stat, math, builder));
    TFD_ASSIGN_OR_RETURN(ValueId scale, math.Reshape(in[2], StatShape(n.f), n.stat));
    TFD_ASSIGN_OR_RETURN(ValueId factor, math.Apply("Mul", {scale, n.inverse}, n.stat));
    ValueId dx = dy;
    if (training) {
      TFD_ASSIGN_OR_RETURN(ValueId term, math.Apply("Mul", {x_hat, sum_dy_x_hat}, n.x_layout));
      TFD_ASSIGN_OR_RETURN(term, math.Apply("AddV2", {term, sum_dy}, n.x_layout));
      TFD_ASSIGN_OR_RETURN(term, math.Apply("RealDiv", {term, n.count}, n.x_layout));
      TFD_ASSIGN_OR_RETURN(dx, math.Apply("Sub", {dy, term}, n.x_layout));
    }
    TFD_ASSIGN_OR_RETURN(dx, math.Apply("Mul", {dx, factor}, n.x_layout));
    TFD_ASSIGN_OR_RETURN(dx, math.Cast(dx, u_type, x_type));

    std::vector<ValueId> out = {dx};
    for (int o : {1, 2}) {
      // Inference: partial over the sharded n/h/w; reduced now unless the plan defers it.
      const Layout& want = plan.outputs[o];
      ValueId sum = o == 1 ? sum_dy_x_hat : sum_dy;
      if (!training && !sync.empty() && !want.is_partial()) {
        TFD_ASSIGN_OR_RETURN(sum, builder.AllReduce(sum, sync, ReduceOp::kSum));
      }
      TFD_ASSIGN_OR_RETURN(sum, math.Reshape(sum, {-1}, want));
      out.push_back(sum);
    }
    for (int r = 0; r < 2; ++r) {
      TFD_ASSIGN_OR_RETURN(ValueId empty, Empty(ctx, math, builder));
      out.push_back(empty);
    }
    return out;
  }

  bool grad_;
  bool native_;
};

std::shared_ptr<const Rule> BatchNorm(bool native) {
  return std::make_shared<BatchNormRule>(/*grad=*/false, native);
}
std::shared_ptr<const Rule> BatchNormGrad() {
  return std::make_shared<BatchNormRule>(/*grad=*/true, /*native=*/false);
}

const bool kRegistered = RegisterRules({
    {"FusedBatchNorm", BatchNorm(/*native=*/true)},
    {"FusedBatchNormGrad", BatchNormGrad()},
    {"FusedBatchNormGradV2", BatchNormGrad()},
    {"FusedBatchNormGradV3", BatchNormGrad()},
    {"FusedBatchNormV2", BatchNorm(/*native=*/true)},
    {"FusedBatchNormV3", BatchNorm(/*native=*/false)},
});

}  // namespace
}  // namespace tf_dtensor
