// Batch-parallel ops: independent over their leading ("batch") axes, each result computed
// from the trailing "core" axes of one batch element (a matrix, a signal, an image). The
// batch axes pass through sharded; the core axes are gathered, since the op mixes them.
//   cholesky([x,*,y] of [B, N, N]) -> gather axis 2 -> [x,*,*]
//   matrix_solve([x,*,*] of [B, M, M], [*,*,*] of [B, M, K]) -> [x,*,*]
//   resize_bilinear([x,*,*,y] of [B, H, W, C], size) -> [x,*,*,*]
//   adjust_hue([x,y,*,*] of [B, H, W, 3], delta) -> [x,y,*,*]   (per pixel: core is C alone)
//   lrn([x,*,*,y] of [B, H, W, C]) -> gather C -> [x,*,*,*]   (a window across channels)
//   searchsorted([x,*] sorted, [x,*] values) -> [x,*]        (one sorted row per element)
// An op declares how many trailing axes are core per data input and per output; the
// batch axes of all of them align on the right and broadcast as in TF's batched linear
// algebra (a size-1 batch axis never shards). The rest is the factor engine (factor.h).
#include "cc/rules/factor.h"
#include "cc/rules/registry.h"

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

// Shorthands for the common shapes.
std::shared_ptr<const Rule> Unary(int core) { return BatchParallel({core}, {core}); }
// An op with a host argument after its one data input (resize's size).
std::shared_ptr<const Rule> UnaryWithHost(int core) { return BatchParallel({core, kHost}, {core}); }
// Image ops with a scalar factor (contrast, hue delta, saturation scale) read whole.
std::shared_ptr<const Rule> ImageWithScalar(int core) { return BatchParallel({core, 0}, {core}); }

const bool kRegistered = RegisterRules({
    {"AdjustContrastv2", ImageWithScalar(3)},
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
    {"Qr", BatchParallel({2}, {2, 2})},
    {"RGBToHSV", Unary(1)},
    {"ResizeArea", UnaryWithHost(3), Traits().Host(1, HostValue::kShape)},
    {"ResizeBicubic", UnaryWithHost(3), Traits().Host(1, HostValue::kShape)},
    {"ResizeBicubicGrad", BatchParallel({3, 3}, {3})},
    {"ResizeBilinear", UnaryWithHost(3), Traits().Host(1, HostValue::kShape)},
    {"ResizeBilinearGrad", BatchParallel({3, 3}, {3})},
    {"ResizeNearestNeighbor", UnaryWithHost(3), Traits().Host(1, HostValue::kShape)},
    {"ResizeNearestNeighborGrad", UnaryWithHost(3), Traits().Host(1, HostValue::kShape)},
    {"SelfAdjointEigV2", BatchParallel(EigCore)},
    {"Svd", BatchParallel(SvdCore)},
    {"UpperBound", BatchParallel({1, 1}, {1})},
});

}  // namespace
}  // namespace tf_dtensor
