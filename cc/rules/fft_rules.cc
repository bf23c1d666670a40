// Fourier transforms over the last `core` axes (FFT, FFT2D, FFT3D, their inverses and
// the real forms). Each device transforms whole signals, so the transformed axes are
// unsharded while the op runs; as in TensorFlow's DTensor, their mesh dimensions are not
// dropped but move: a forward transform shifts the transformed block's shardings one
// axis right, an inverse one axis left, and the sharding pushed out of the block goes to
// the nearest unsharded axis on the block's left (or is dropped):
//   fft([*,*,y])     -> [*,y,*]        fft2d([*,x,y]) -> [y,*,x]      fft2d([b,x,y]) -> [b,*,x]
//   ifft2d([*,x,y])  -> [x,y,*]        fft3d([*,b,x,y]) -> [y,*,b,x]
//   fft2d([*,x,*])   -> [*,*,x]        ifft2d([*,x,*]) -> [*,x,*]
// The op runs on the input with the block unsharded and the other axes as in the output
// (an all-to-all moves a displaced sharding), then the block is sliced to the output.
#include "cc/rules/expand.h"
#include "cc/rules/registry.h"
#include "cc/spmd/relayout.h"

namespace tf_dtensor {
namespace {

class FftRule : public Rule {
 public:
  FftRule(int core, bool inverse) : core_(core), inverse_(inverse) {}

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    const int rank = ctx.rank(0);
    if (rank < core_) {
      return InvalidArgument("'" + ctx.op_name + "' transforms the last " +
                             std::to_string(core_) + " axes; got " + ctx.Describe(0) + ".");
    }
    const Layout in = ctx.layout(0).WithoutPartial();
    const int start = rank - core_;
    std::vector<DimSpec> out = in.specs();
    std::vector<DimSpec> compute = in.specs();
    if (!in.is_single_device()) {
      const std::vector<DimSpec>& s = in.specs();
      std::optional<DimSpec> pushed_out;
      for (int i = start; i < rank; ++i) out[i] = DimSpec::Replicated();
      if (core_ == 1) {
        pushed_out = s[rank - 1];
      } else if (!inverse_) {
        for (int i = start + 1; i < rank - 1; ++i) out[i] = s[i - 1];
        const bool both = s[rank - 2].sharded() && s[rank - 1].sharded();
        out[rank - 1] = s[rank - 2].sharded() ? s[rank - 2] : s[rank - 1];
        if (both) pushed_out = s[rank - 1];
      } else {
        for (int i = start + 1; i < rank - 1; ++i) out[i] = s[i + 1];
        const bool both = s[start].sharded() && s[start + 1].sharded();
        out[start] = s[start + 1].sharded() ? s[start + 1] : s[start];
        if (both) pushed_out = s[start];
      }
      if (pushed_out && pushed_out->sharded()) {
        for (int i = start - 1; i >= 0; --i) {
          if (!out[i].sharded() && ctx.inputs[0].shape[i] > 1) {
            out[i] = *pushed_out;
            break;
          }
        }
      }
      for (int i = 0; i < rank; ++i) compute[i] = i < start ? out[i] : DimSpec::Replicated();
    }
    Plan plan;
    plan.inputs.assign(ctx.inputs.size(), std::nullopt);
    plan.inputs[0] = in.WithSpecs(compute);
    plan.outputs = {in.WithSpecs(out)};
    return plan;
  }

  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    Plan local = plan;
    local.outputs = {*plan.inputs[0]};
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> in, PrepareInputs(ctx, local, builder));
    LocalOpOptions options;
    options.overrides = plan.overrides;
    options.global_shapes = {OutputShape(ctx)};
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> out,
                         ExpandWithInputs(ctx, local, in, options, builder));
    TFD_ASSIGN_OR_RETURN(out[0], Relayout(builder, out[0], plan.outputs[0],
                                          "the result of '" + ctx.op_name + "'"));
    return out;
  }

 private:
  // The result's global shape: the input's, with the real transforms' last axes sized by
  // fft_length (RFFT: n/2+1 on the last; IRFFT: n), where it is known.
  std::optional<std::vector<int64_t>> OutputShape(const OpContext& ctx) const {
    std::vector<int64_t> shape = ctx.inputs[0].shape;
    if (ctx.inputs.size() < 2) return shape;
    const std::optional<std::vector<int64_t>>& length = ctx.inputs[1].int_value;
    if (!length || static_cast<int>(length->size()) != core_) return std::nullopt;
    const int start = static_cast<int>(shape.size()) - core_;
    for (int i = 0; i < core_; ++i) shape[start + i] = (*length)[i];
    if (!inverse_) shape.back() = length->back() / 2 + 1;
    return shape;
  }

  int core_;
  bool inverse_;
};

std::shared_ptr<const Rule> Fft(int core, bool inverse = false) {
  return std::make_shared<FftRule>(core, inverse);
}

const bool kRegistered = RegisterRules({
    {"FFT", Fft(1)},
    {"FFT2D", Fft(2)},
    {"FFT3D", Fft(3)},
    {"IFFT", Fft(1, true)},
    {"IFFT2D", Fft(2, true)},
    {"IFFT3D", Fft(3, true)},
    {"IRFFT", Fft(1, true), Traits().Host(1, HostValue::kShape)},
    {"IRFFT2D", Fft(2, true), Traits().Host(1, HostValue::kShape)},
    {"IRFFT3D", Fft(3, true), Traits().Host(1, HostValue::kShape)},
    {"RFFT", Fft(1), Traits().Host(1, HostValue::kShape)},
    {"RFFT2D", Fft(2), Traits().Host(1, HostValue::kShape)},
    {"RFFT3D", Fft(3), Traits().Host(1, HostValue::kShape)},
});

}  // namespace
}  // namespace tf_dtensor
