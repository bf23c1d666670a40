// Matrix products. For a = [m,k], b = [k,n]:
//   [x,*] @ [*,*] -> [x,*]                       (rows carried to the output)
//   [*,x] @ [x,*] -> partial(x) -> all-reduce -> [*,*]   (contracted axis sharded)
//   [y,x] @ [x,*] -> partial(x) -> all-reduce -> [y,*]
//   [*,*] @ [*,y] -> [*,y]
// On virtual CPUs (shared memory) a large product with a sharded contracted axis gathers
// its operands instead (see Forward).
// A mesh dimension shards at most one of m, n, k: on a clash the earlier of m, n, k
// keeps it and the later axis is relaid out to unsharded. When only one side of k is
// sharded the other is sliced to match (free), rather than gathering.
// Batch matmuls merge their batch axes like broadcasting elementwise ops.
#include <algorithm>

#include "cc/propagation/merge.h"
#include "cc/rules/registry.h"

namespace tf_dtensor {
namespace {

struct MatmulAxes {
  int m, k;  // axes of a
  int kb, n;  // axes of b
};

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Elements of the product: batch (broadcast) x m x n.
std::vector<int64_t> OutputShape(const OpContext& ctx, const MatmulAxes& ax) {
  const std::vector<int64_t>& a = ctx.inputs[0].shape;
  const std::vector<int64_t>& b = ctx.inputs[1].shape;
  std::vector<int64_t> out;
  const size_t batch = std::max(a.size(), b.size()) - 2;
  for (size_t i = 0; i < batch; ++i) {
    int64_t da = i + a.size() >= batch + 2 ? a[i + a.size() - batch - 2] : 1;
    int64_t db = i + b.size() >= batch + 2 ? b[i + b.size() - batch - 2] : 1;
    out.push_back(std::max(da, db));
  }
  out.push_back(a[ax.m]);
  out.push_back(b[ax.n]);
  return out;
}

class MatmulRule : public Rule {
 public:
  MatmulRule(const char* adjoint_a, const char* adjoint_b, bool batched)
      : adjoint_a_(adjoint_a), adjoint_b_(adjoint_b), batched_(batched) {}

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    const Layout& a = ctx.layout(0);
    const Layout& b = ctx.layout(1);
    const int ra = ctx.rank(0), rb = ctx.rank(1);
    if (ra < 2 || rb < 2 || (!batched_ && (ra != 2 || rb != 2))) {
      return InvalidArgument("'" + ctx.op_name + "' needs matrices; got " + ctx.Describe(0) +
                             " and " + ctx.Describe(1) + ".");
    }
    bool ta = ctx.attrs->GetBool(adjoint_a_, false);
    bool tb = ctx.attrs->GetBool(adjoint_b_, false);
    MatmulAxes ax{ta ? ra - 1 : ra - 2, ta ? ra - 2 : ra - 1, tb ? rb - 1 : rb - 2,
                  tb ? rb - 2 : rb - 1};
    std::vector<bool> used(ctx.mesh.num_dims(), false);

    // Batch axes: broadcast-merge of a[:-2] and b[:-2].
    std::vector<int64_t> batch_a(ctx.inputs[0].shape.begin(), ctx.inputs[0].shape.end() - 2);
    std::vector<int64_t> batch_b(ctx.inputs[1].shape.begin(), ctx.inputs[1].shape.end() - 2);
    TFD_ASSIGN_OR_RETURN(std::vector<int64_t> batch_out,
                         BroadcastShapes({batch_a, batch_b}, ctx.op_name));
    Layout a_batch = a.WithSpecs({a.specs().begin(), a.specs().end() - 2});
    Layout b_batch = b.WithSpecs({b.specs().begin(), b.specs().end() - 2});
    std::vector<DimSpec> out =
        MergeBroadcast({&a_batch, &b_batch}, {batch_a, batch_b}, batch_out, &used);

    auto take = [&used](const DimSpec& s) {
      if (!s.sharded() || used[s.mesh_dim]) return DimSpec::Replicated();
      used[s.mesh_dim] = true;
      return s;
    };
    DimSpec m = take(a.spec(ax.m));
    DimSpec n = take(b.spec(ax.n));
    // The contracted axis: prefer a's sharding, else b's.
    DimSpec k = take(a.spec(ax.k));
    if (!k.sharded()) k = take(b.spec(ax.kb));
    // On devices that share host memory an all-gather is one concatenation whose result
    // every device shares, while an all-reduce reads every partial product. When the
    // product is larger than its operands (a weight gradient x^T @ dy under a sharded
    // batch: [*,x] @ [x,*]), gathering the operands and multiplying once is cheaper:
    //   [*,x] @ [x,*] -> gather k -> [*,*] @ [*,*] -> [*,*]   (no partial, no all-reduce)
    if (k.sharded() && ctx.mesh.shares_host_memory() &&
        NumElements(OutputShape(ctx, ax)) > NumElements(ctx.inputs[0].shape) +
                                                NumElements(ctx.inputs[1].shape)) {
      k = DimSpec::Replicated();
    }

    std::vector<DimSpec> a_specs = ProjectBroadcast(out, batch_a, batch_out);
    std::vector<DimSpec> b_specs = ProjectBroadcast(out, batch_b, batch_out);
    a_specs.resize(ra, DimSpec::Replicated());
    b_specs.resize(rb, DimSpec::Replicated());
    a_specs[ax.m] = m;
    a_specs[ax.k] = k;
    b_specs[ax.kb] = k;
    b_specs[ax.n] = n;
    out.push_back(m);
    out.push_back(n);

    Plan plan;
    plan.inputs = {a.WithSpecs(a_specs), b.WithSpecs(b_specs)};
    plan.outputs = {a.WithSpecs(out)};
    plan.partial_dims = {k.sharded() ? std::vector<int>{k.mesh_dim} : std::vector<int>{}};
    return plan;
  }

 private:
  const char* adjoint_a_;
  const char* adjoint_b_;
  bool batched_;
};

const bool kRegistered = RegisterRules({
    {"BatchMatMul", Linear(std::make_shared<MatmulRule>("adj_x", "adj_y", true), Linearity::kOneInput)},
    {"BatchMatMulV2", Linear(std::make_shared<MatmulRule>("adj_x", "adj_y", true), Linearity::kOneInput)},
    {"BatchMatMulV3", Linear(std::make_shared<MatmulRule>("adj_x", "adj_y", true), Linearity::kOneInput)},
    {"MatMul", Linear(std::make_shared<MatmulRule>("transpose_a", "transpose_b", false), Linearity::kOneInput)},
});

}  // namespace
}  // namespace tf_dtensor
