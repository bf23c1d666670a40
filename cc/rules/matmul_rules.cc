// Matrix products. For a = [m,k], b = [k,n]:
//   [x,*] @ [*,*] -> [x,*]                       (rows carried to the output)
//   [*,x] @ [x,*] -> partial(x) -> all-reduce -> [*,*]   (contracted axis sharded)
//   [y,x] @ [x,*] -> partial(x) -> all-reduce -> [y,*]
//   [*,*] @ [*,y] -> [*,y]
// On virtual CPUs (shared memory) a large product with a sharded contracted axis gathers
// its operands instead (see AdjustForward).
// The factor engine (factor.h) does the rest: a mesh dimension shards at most one of
// batch, m, n, k, claimed in that order (on a clash the later axis is relaid out to
// unsharded); when only one side of k is sharded the other is sliced to match (free),
// rather than gathering. Batch axes merge like broadcasting elementwise ops.
//
// A sparse matrix times a dense one (SparseTensorDenseMatMul, tf.sparse.sparse_dense_matmul
// and the gradient of ExtractVolumePatches): a = (indices [nnz,2], values [nnz], shape)
// times b = [k,n] keeps b's columns sharded, with no collective; a's nonzeros may be split
// over devices, each multiplying its own ones (a partial sum):
//   sp @ [*,x] -> [*,x]              (columns carried to the output)
//   sp([x,*] [x]) @ [*,*] -> partial(x) -> all-reduce -> [*,*]
//   sp @ [x,*] -> gather k -> [*,*]  (a's column indices are global)
#include "cc/rules/merge.h"
#include "cc/rules/factor.h"
#include "cc/rules/registry.h"
#include "cc/spmd/lowering.h"
#include "cc/tf/dtypes.h"

namespace tf_dtensor {
namespace {

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// "mk,kn->mn" with batch axes in front that broadcast like elementwise ops; adjoint or
// transpose attributes swap an operand's last two factors. Priority: batch, m, n, k.
StatusOr<FactorSpec> MatmulFactors(const OpContext& ctx, const char* adjoint_a,
                                   const char* adjoint_b, bool batched) {
  const int ra = ctx.rank(0), rb = ctx.rank(1);
  if (ra < 2 || rb < 2 || (!batched && (ra != 2 || rb != 2))) {
    return InvalidArgument("'" + ctx.op_name + "' needs matrices; got " + ctx.Describe(0) +
                           " and " + ctx.Describe(1) + ".");
  }
  std::vector<int64_t> batch_a(ctx.inputs[0].shape.begin(), ctx.inputs[0].shape.end() - 2);
  std::vector<int64_t> batch_b(ctx.inputs[1].shape.begin(), ctx.inputs[1].shape.end() - 2);
  TFD_ASSIGN_OR_RETURN(std::vector<int64_t> batch_out,
                       BroadcastShapes({batch_a, batch_b}, ctx.op_name));
  FactorSpec spec;
  std::vector<int> batch = spec.AddAxes(static_cast<int>(batch_out.size()));
  const int m = spec.Add(FactorKind::kPassThrough);
  const int n = spec.Add(FactorKind::kPassThrough);
  const int k = spec.Add(FactorKind::kContracted);
  std::vector<int> a(batch.end() - (ra - 2), batch.end());
  std::vector<int> b(batch.end() - (rb - 2), batch.end());
  const bool ta = ctx.attrs->GetBool(adjoint_a, false);
  const bool tb = ctx.attrs->GetBool(adjoint_b, false);
  a.insert(a.end(), ta ? std::initializer_list<int>{k, m} : std::initializer_list<int>{m, k});
  b.insert(b.end(), tb ? std::initializer_list<int>{n, k} : std::initializer_list<int>{k, n});
  std::vector<int> out = batch;
  out.push_back(m);
  out.push_back(n);
  spec.inputs = {a, b};
  spec.outputs = {out};
  return spec;
}

class MatmulRule : public FactorRule {
 public:
  MatmulRule(const char* adjoint_a, const char* adjoint_b, bool batched)
      : FactorRule([=](const OpContext& ctx) {
          return MatmulFactors(ctx, adjoint_a, adjoint_b, batched);
        }) {}

 protected:
  // Where the mesh's lowering shares buffers an all-gather is one concatenation whose
  // result every device shares, while an all-reduce reads every partial product. When the
  // product is larger than its operands (a weight gradient x^T @ dy under a sharded
  // batch: [*,x] @ [x,*]), gathering the operands and multiplying once is cheaper:
  //   [*,x] @ [x,*] -> gather k -> [*,*] @ [*,*] -> [*,*]   (no partial, no all-reduce)
  void AdjustForward(const OpContext& ctx, const FactorSpec& spec,
                     FactorAssignment& assignment) const override {
    const int k = static_cast<int>(spec.factors.size()) - 1;
    if (!assignment[k].sharded() || !CollectiveLowering::For(ctx.mesh).shares_buffers()) return;
    const std::vector<int64_t> sizes = FactorSizes(ctx, spec);
    int64_t product = 1;
    for (int f : spec.outputs[0]) product *= sizes[f];
    if (product > NumElements(ctx.inputs[0].shape) + NumElements(ctx.inputs[1].shape)) {
      assignment[k] = DimSpec::Replicated();
    }
  }
};

// SparseTensorDenseMatMul(a_indices [nnz,2], a_values [nnz], a_shape [2], b): a's rows m
// and columns k are coordinates inside a_indices, not axes, so the output's rows are new
// (unsharded) and b's contracted axis k is read whole (a device holding part of k would
// need a's entries in that part, renumbered). b's other axis n passes through. The
// nonzeros (a_indices' axis 0, a_values) are a contracted factor: split over a mesh
// dimension, each device multiplies its own and the outputs are partial sums. adjoint_a
// swaps m and k inside a_indices only; adjoint_b makes b [n,k]. a_shape is a host value.
StatusOr<FactorSpec> SparseDenseMatmulFactors(const OpContext& ctx) {
  if (ctx.rank(0) != 2 || ctx.rank(1) != 1 || ctx.rank(3) != 2 ||
      (ctx.inputs[0].shape[1] >= 0 && ctx.inputs[0].shape[1] != 2)) {
    return InvalidArgument("'" + ctx.op_name + "' needs a_indices of shape [nnz, 2], 1-D "
                           "a_values and a matrix b; got " + ctx.Describe(0) + ", " +
                           ctx.Describe(1) + " and " + ctx.Describe(3) + ".");
  }
  FactorSpec spec;
  const int n = spec.Add(FactorKind::kPassThrough);
  const int nonzeros = spec.Add(FactorKind::kContracted);
  const int coordinates = spec.Add(FactorKind::kNeedReplication);
  const int k = spec.Add(FactorKind::kNeedReplication);
  const bool adjoint_b = ctx.attrs->GetBool("adjoint_b", false);
  spec.inputs = {std::vector<int>{nonzeros, coordinates}, std::vector<int>{nonzeros}, std::nullopt,
                 adjoint_b ? std::vector<int>{n, k} : std::vector<int>{k, n}};
  spec.outputs = {{FactorSpec::kNew, n}};
  return spec;
}

class SparseDenseMatmulRule : public FactorRule {
 public:
  SparseDenseMatmulRule() : FactorRule(SparseDenseMatmulFactors) {}

  // Linear in a_values and in b, one at a time: a sum (or a mean of real numbers) pending
  // on one of them passes to the output; pending indices, or both pending, are reduced
  // first.
  std::optional<std::vector<PartialSpec>> PartialThrough(const OpContext& ctx) const override {
    const std::optional<Layout>& indices = ctx.inputs[0].layout;
    if (indices && indices->is_partial()) return std::nullopt;
    std::optional<std::vector<PartialSpec>> through;
    for (int i : {1, 3}) {
      const std::optional<Layout>& in = ctx.inputs[i].layout;
      if (!in || !in->is_partial()) continue;
      if (through) return std::nullopt;
      for (const PartialSpec& p : in->partial()) {
        if (p.op != ReduceOp::kSum &&
            (p.op != ReduceOp::kMean || IsIntegerDType(ctx.inputs[i].dtype))) {
          return std::nullopt;
        }
      }
      through = in->partial();
    }
    return through;
  }
};

const bool kRegistered = RegisterRules({
    {"BatchMatMul", std::make_shared<MatmulRule>("adj_x", "adj_y", true),
     Traits().Linear(Linearity::kOneInput)},
    {"BatchMatMulV2", std::make_shared<MatmulRule>("adj_x", "adj_y", true),
     Traits().Linear(Linearity::kOneInput)},
    {"BatchMatMulV3", std::make_shared<MatmulRule>("adj_x", "adj_y", true),
     Traits().Linear(Linearity::kOneInput)},
    {"MatMul", std::make_shared<MatmulRule>("transpose_a", "transpose_b", false),
     Traits().Linear(Linearity::kOneInput)},
    {"SparseTensorDenseMatMul", std::make_shared<SparseDenseMatmulRule>(),
     Traits().Host(2, HostValue::kShape)},
});

}  // namespace
}  // namespace tf_dtensor
