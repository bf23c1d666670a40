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
#include "cc/rules/merge.h"
#include "cc/rules/factor.h"
#include "cc/rules/registry.h"
#include "cc/spmd/lowering.h"

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

const bool kRegistered = RegisterRules({
    {"BatchMatMul", std::make_shared<MatmulRule>("adj_x", "adj_y", true),
     Traits().Linear(Linearity::kOneInput)},
    {"BatchMatMulV2", std::make_shared<MatmulRule>("adj_x", "adj_y", true),
     Traits().Linear(Linearity::kOneInput)},
    {"BatchMatMulV3", std::make_shared<MatmulRule>("adj_x", "adj_y", true),
     Traits().Linear(Linearity::kOneInput)},
    {"MatMul", std::make_shared<MatmulRule>("transpose_a", "transpose_b", false),
     Traits().Linear(Linearity::kOneInput)},
});

}  // namespace
}  // namespace tf_dtensor
