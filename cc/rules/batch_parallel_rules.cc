// Batch-parallel ops: independent over their leading ("batch") axes, each result computed
// from the trailing "core" axes of one batch element (a matrix, a signal, an image). The
// batch axes pass through sharded; the core axes are gathered, since the op mixes them.
//   cholesky([x,*,y] of [B, N, N]) -> gather axis 2 -> [x,*,*]
//   matrix_solve([x,*,*] of [B, M, M], [*,*,*] of [B, M, K]) -> [x,*,*]
//   resize_bilinear([x,y,*,*] of [B, H, W, C], size) -> [x,*,*,*]
//   resize_bilinear([x,*,*,y], size) -> [x,*,*,y]   (images: channels are independent)
//   adjust_hue([x,y,*,*] of [B, H, W, 3], delta) -> [x,y,*,*]   (per pixel: core is C alone)
//   lrn([x,*,*,y] of [B, H, W, C]) -> gather C -> [x,*,*,*]   (a window across channels)
//   searchsorted([x,*] sorted, [x,*] values) -> [x,*]        (one sorted row per element)
//   max_pool_with_argmax([x,*,*,y]) -> [x,*,*,*] twice     (indices flatten h, w and c)
// An op declares how many trailing axes are core per data input and per output; the
// batch axes of all of them align on the right and broadcast as in TF's batched linear
// algebra (a size-1 batch axis never shards). The rest is the factor engine (factor.h).
#include "cc/rules/factor.h"
#include "cc/rules/registry.h"
#include "cc/rules/row_blocks.h"

namespace tf_dtensor {
namespace {

// Core-axis counts: per input (nullopt: a host argument or a scalar the op reads whole)
// and per output (kPlaceholder: a scalar that stands in for an output not computed,
// Svd's u and v without compute_uv).
struct CoreAxes {
  static constexpr int kPlaceholder = -1;
  std::vector<std::optional<int>> inputs;
  std::vector<int> outputs;
};
using CoreAxesFn = std::function<StatusOr<CoreAxes>(const OpContext&)>;

StatusOr<FactorSpec> BatchParallelFactors(const OpContext& ctx, const CoreAxes& core) {
  int batch_rank = 0;
  for (size_t i = 0; i < core.inputs.size() && i < ctx.inputs.size(); ++i) {
    if (!core.inputs[i]) continue;
    const int rank = ctx.rank(static_cast<int>(i));
    if (rank < *core.inputs[i]) {
      return InvalidArgument("'" + ctx.op_name + "' needs " + ctx.Describe(static_cast<int>(i)) +
                             " of rank " + std::to_string(*core.inputs[i]) +
                             " or more (its trailing " + std::to_string(*core.inputs[i]) +
                             " axes form one element); got rank " + std::to_string(rank) + ".");
    }
    batch_rank = std::max(batch_rank, rank - *core.inputs[i]);
  }
  FactorSpec spec;
  const std::vector<int> batch = spec.AddAxes(batch_rank);
  spec.inputs.assign(ctx.inputs.size(), std::nullopt);
  for (size_t i = 0; i < core.inputs.size() && i < ctx.inputs.size(); ++i) {
    if (!core.inputs[i]) continue;
    const int leading = ctx.rank(static_cast<int>(i)) - *core.inputs[i];
    std::vector<int> axes(batch.end() - leading, batch.end());
    for (int c = 0; c < *core.inputs[i]; ++c) {
      axes.push_back(spec.Add(FactorKind::kNeedReplication));
    }
    spec.inputs[i] = std::move(axes);
  }
  for (int count : core.outputs) {
    if (count == CoreAxes::kPlaceholder) {
      spec.outputs.emplace_back();
      continue;
    }
    std::vector<int> axes = batch;
    axes.insert(axes.end(), count, FactorSpec::kNew);
    spec.outputs.push_back(std::move(axes));
  }
  return spec;
}

// The declarative helper: a factor rule from the op's core-axis counts.
std::shared_ptr<const Rule> BatchParallel(CoreAxesFn core) {
  return Factors([core = std::move(core)](const OpContext& ctx) -> StatusOr<FactorSpec> {
    TFD_ASSIGN_OR_RETURN(CoreAxes axes, core(ctx));
    return BatchParallelFactors(ctx, axes);
  });
}

// Fixed counts: BatchParallel({2, 2}, {2}) for MatrixSolve.
std::shared_ptr<const Rule> BatchParallel(std::vector<std::optional<int>> inputs,
                                          std::vector<int> outputs) {
  CoreAxes core{std::move(inputs), std::move(outputs)};
  return BatchParallel([core](const OpContext&) -> StatusOr<CoreAxes> { return core; });
}

constexpr std::nullopt_t kHost = std::nullopt;

// Image ops that work on each channel of each image alone (resizes, their gradients,
// contrast): [batch..., H, W, C] with H and W core, gathered, while the channels pass
// through like a batch axis:  resize([x,*,*,y] of [B, H, W, C]) -> [x,*,*,y]. Per input:
// kImage, kHost (a host argument) or kScalar (a value read whole).
enum class ImageInput { kImage, kHost, kScalar };

StatusOr<FactorSpec> PerChannelFactors(const OpContext& ctx,
                                       const std::vector<ImageInput>& kinds) {
  int batch_rank = 0;
  for (size_t i = 0; i < kinds.size() && i < ctx.inputs.size(); ++i) {
    if (kinds[i] != ImageInput::kImage) continue;
    const int rank = ctx.rank(static_cast<int>(i));
    if (rank < 3) {
      return InvalidArgument("'" + ctx.op_name + "' needs " +
                             ctx.Describe(static_cast<int>(i)) +
                             " of rank 3 or more ([..., height, width, channels]); got rank " +
                             std::to_string(rank) + ".");
    }
    batch_rank = std::max(batch_rank, rank - 3);
  }
  FactorSpec spec;
  const std::vector<int> batch = spec.AddAxes(batch_rank);
  const int channels = spec.Add(FactorKind::kPassThrough);
  spec.inputs.assign(ctx.inputs.size(), std::nullopt);
  for (size_t i = 0; i < kinds.size() && i < ctx.inputs.size(); ++i) {
    if (kinds[i] == ImageInput::kHost) continue;
    if (kinds[i] == ImageInput::kScalar) {
      std::vector<int> whole;
      for (int d = 0; d < ctx.rank(static_cast<int>(i)); ++d) {
        whole.push_back(spec.Add(FactorKind::kNeedReplication));
      }
      spec.inputs[i] = std::move(whole);
      continue;
    }
    const int leading = ctx.rank(static_cast<int>(i)) - 3;
    std::vector<int> axes(batch.end() - leading, batch.end());
    axes.push_back(spec.Add(FactorKind::kNeedReplication));
    axes.push_back(spec.Add(FactorKind::kNeedReplication));
    axes.push_back(channels);
    spec.inputs[i] = std::move(axes);
  }
  std::vector<int> out = batch;
  out.insert(out.end(), {FactorSpec::kNew, FactorSpec::kNew, channels});
  spec.outputs = {out};
  return spec;
}

// TF's image kernels refuse an image of no channels, which an uneven channel sharding
// leaves some devices (3 channels over 4): the channels are then gathered.
class PerChannelRule : public FactorRule {
 public:
  explicit PerChannelRule(std::vector<ImageInput> kinds)
      : FactorRule([kinds](const OpContext& ctx) { return PerChannelFactors(ctx, kinds); }) {}

 protected:
  void AdjustForward(const OpContext& ctx, const FactorSpec& spec,
                     FactorAssignment& assignment) const override {
    const int channels = spec.outputs[0].back();
    const DimSpec& over = assignment[channels];
    if (!over.sharded()) return;
    if (HasEmptyPiece(FactorSizes(ctx, spec)[channels], ctx.mesh.DimSize(over.mesh_dim))) {
      assignment[channels] = DimSpec::Replicated();
    }
  }
};

std::shared_ptr<const Rule> PerChannel(std::vector<ImageInput> kinds) {
  return std::make_shared<PerChannelRule>(std::move(kinds));
}

constexpr ImageInput kImage = ImageInput::kImage;


// The V2/V3 diagonal ops take k as a scalar or a [lo, hi] band; a band of more than one
// diagonal adds an axis (num_diags) in front of the diagonal's own.
StatusOr<int> DiagonalCore(const OpContext& ctx, int k_input) {
  TFD_ASSIGN_OR_RETURN(std::vector<int64_t> k, ctx.IntValue(k_input, "diagonal index k"));
  if (k.empty() || k.size() > 2) {
    return InvalidArgument("'" + ctx.op_name + "' needs k as one or two integers; got " +
                           std::to_string(k.size()) + ".");
  }
  return k.size() == 2 && k[0] != k[1] ? 2 : 1;
}

// MatrixDiagV2/V3(diagonal, k, num_rows, num_cols, padding_value) -> [..., M, N].
StatusOr<CoreAxes> MatrixDiagCore(const OpContext& ctx) {
  TFD_ASSIGN_OR_RETURN(int diagonal, DiagonalCore(ctx, 1));
  return CoreAxes{{diagonal, kHost, kHost, kHost, 0}, {2}};
}

// MatrixDiagPartV2/V3(input, k, padding_value) -> [..., max_len] or [..., num_diags, max_len].
StatusOr<CoreAxes> MatrixDiagPartCore(const OpContext& ctx) {
  TFD_ASSIGN_OR_RETURN(int diagonal, DiagonalCore(ctx, 1));
  return CoreAxes{{2, kHost, 0}, {diagonal}};
}

// MatrixSetDiagV2/V3(input, diagonal, k) -> [..., M, N].
StatusOr<CoreAxes> MatrixSetDiagCore(const OpContext& ctx) {
  TFD_ASSIGN_OR_RETURN(int diagonal, DiagonalCore(ctx, 2));
  return CoreAxes{{2, diagonal, kHost}, {2}};
}

// Svd(input) -> s [..., P], u, v [..., M, P] / [..., N, P]; without compute_uv, u and v
// are placeholder scalars.
StatusOr<CoreAxes> SvdCore(const OpContext& ctx) {
  if (!ctx.attrs->GetBool("compute_uv", true)) {
    return CoreAxes{{2}, {1, CoreAxes::kPlaceholder, CoreAxes::kPlaceholder}};
  }
  return CoreAxes{{2}, {1, 2, 2}};
}

// SelfAdjointEigV2(input) -> e [..., N], v [..., N, N] (a placeholder without compute_v).
StatusOr<CoreAxes> EigCore(const OpContext& ctx) {
  if (!ctx.attrs->GetBool("compute_v", true)) return CoreAxes{{2}, {1, CoreAxes::kPlaceholder}};
  return CoreAxes{{2}, {1, 2}};
}

// MaxPoolWithArgmax(input) -> output, argmax and MaxPoolGradWithArgmax(input, grad,
// argmax): the argmax indices flatten (y * W + x) * C + c within each image, so height,
// width and channels are core; the batch passes through unless include_batch_in_index
// puts it in the indices too, which makes every axis core.
StatusOr<CoreAxes> ArgmaxPoolCore(const OpContext& ctx) {
  const int core = ctx.attrs->GetBool("include_batch_in_index", false) ? 4 : 3;
  if (ctx.op_name == "MaxPoolWithArgmax") return CoreAxes{{core}, {core, core}};
  return CoreAxes{{core, core, core}, {core}};
}

// A batch-parallel rule whose kernels must not see an empty block (the max pooling
// gradients abort on one): a batch sharding that would leave a device no element (3
// over 4) is gathered instead.
std::shared_ptr<const Rule> NoEmptyBlocks(CoreAxesFn core) {
  return FactorsWithoutEmptyBlocks(
      [core = std::move(core)](const OpContext& ctx) -> StatusOr<FactorSpec> {
        TFD_ASSIGN_OR_RETURN(CoreAxes axes, core(ctx));
        return BatchParallelFactors(ctx, axes);
      });
}

// Shorthands for the common shapes.
std::shared_ptr<const Rule> Unary(int core) { return BatchParallel({core}, {core}); }
// Image ops with a scalar factor (contrast, hue delta, saturation scale) read whole.
std::shared_ptr<const Rule> ImageWithScalar(int core) { return BatchParallel({core, 0}, {core}); }

const bool kRegistered = RegisterRules({
    {"AdjustContrastv2", PerChannel({kImage, ImageInput::kScalar})},
    {"AdjustHue", ImageWithScalar(1)},
    {"AdjustSaturation", ImageWithScalar(1)},
    {"Cholesky", Unary(2)},
    {"CholeskyGrad", BatchParallel({2, 2}, {2})},
    {"Cross", BatchParallel({1, 1}, {1})},
    {"ExtractImagePatches", Unary(3)},
    {"ExtractVolumePatches", Unary(4)},
    {"HSVToRGB", Unary(1)},
    {"LRN", Unary(1)},
    {"LRNGrad", BatchParallel({1, 1, 1}, {1})},
    {"LogMatrixDeterminant", BatchParallel({2}, {0, 0})},
    {"LowerBound", BatchParallel({1, 1}, {1})},
    {"Lu", BatchParallel({2}, {2, 1})},
    {"MatrixBandPart", BatchParallel({2, kHost, kHost}, {2}),
     Traits().Host(1, 2, HostValue::kCount)},
    {"MatrixDeterminant", BatchParallel({2}, {0})},
    {"MatrixDiag", BatchParallel({1}, {2})},
    {"MatrixDiagPart", BatchParallel({2}, {1})},
    {"MatrixDiagPartV2", BatchParallel(MatrixDiagPartCore), Traits().Host(1, HostValue::kValue)},
    {"MatrixDiagPartV3", BatchParallel(MatrixDiagPartCore), Traits().Host(1, HostValue::kValue)},
    {"MatrixDiagV2", BatchParallel(MatrixDiagCore), Traits().Host(1, 3, HostValue::kValue)},
    {"MatrixDiagV3", BatchParallel(MatrixDiagCore), Traits().Host(1, 3, HostValue::kValue)},
    {"MatrixInverse", Unary(2)},
    {"MatrixSetDiag", BatchParallel({2, 1}, {2})},
    {"MatrixSetDiagV2", BatchParallel(MatrixSetDiagCore), Traits().Host(2, -1, HostValue::kValue)},
    {"MatrixSetDiagV3", BatchParallel(MatrixSetDiagCore), Traits().Host(2, -1, HostValue::kValue)},
    {"MatrixSolve", BatchParallel({2, 2}, {2})},
    {"MatrixSolveLs", BatchParallel({2, 2, 0}, {2})},
    {"MatrixSquareRoot", Unary(2)},
    {"MatrixTriangularSolve", BatchParallel({2, 2}, {2})},
    {"MaxPoolGradWithArgmax", NoEmptyBlocks(ArgmaxPoolCore)},
    {"MaxPoolWithArgmax", NoEmptyBlocks(ArgmaxPoolCore)},
    {"Qr", BatchParallel({2}, {2, 2})},
    {"RGBToHSV", Unary(1)},
    {"ResizeArea", PerChannel({kImage, ImageInput::kHost}), Traits().Host(1, HostValue::kShape)},
    {"ResizeBicubic", PerChannel({kImage, ImageInput::kHost}),
     Traits().Host(1, HostValue::kShape)},
    {"ResizeBicubicGrad", PerChannel({kImage, kImage})},
    {"ResizeBilinear", PerChannel({kImage, ImageInput::kHost}),
     Traits().Host(1, HostValue::kShape)},
    {"ResizeBilinearGrad", PerChannel({kImage, kImage})},
    {"ResizeNearestNeighbor", PerChannel({kImage, ImageInput::kHost}),
     Traits().Host(1, HostValue::kShape)},
    {"ResizeNearestNeighborGrad", PerChannel({kImage, ImageInput::kHost}),
     Traits().Host(1, HostValue::kShape)},
    {"SelfAdjointEigV2", BatchParallel(EigCore)},
    {"Svd", BatchParallel(SvdCore)},
    {"UpperBound", BatchParallel({1, 1}, {1})},
});

}  // namespace
}  // namespace tf_dtensor
