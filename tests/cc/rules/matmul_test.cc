// Golden tables for matrix products (cc/rules/matmul_rules.cc): the plan Forward makes and
// the program Expand writes, on 1-D and 2-D meshes of CPUs and of GPUs.
#include "cc/spmd/lowering.h"
#include "tests/cc/rules/rule_testing.h"

namespace tf_dtensor {
namespace {

using testing::CheckBackwardTable;
using testing::CheckRuleTable;
using testing::MakeMesh;
using testing::RuleRow;
using testing::T;

// Rows whose plan is the same on every kind of device.
const std::vector<RuleRow>& Rows2x2() {
  static const auto* rows = new std::vector<RuleRow>{
      {"MatMul", {T("[x,*]", {8, 4}), T("[*,*]", {4, 8})},
       "[x,*] [*,*] -> [x,*]",
       {"local MatMul [x,*] [*,*] -> [x,*]"}},
      {"MatMul", {T("[*,*]", {8, 4}), T("[*,y]", {4, 8})},
       "[*,*] [*,y] -> [*,y]",
       {"local MatMul [*,*] [*,y] -> [*,y]"}},
      {"MatMul", {T("[x,*]", {8, 4}), T("[*,y]", {4, 8})},
       "[x,*] [*,y] -> [x,y]",
       {"local MatMul [x,*] [*,y] -> [x,y]"}},
      // Contracted axis sharded: partial sums, all-reduced.
      {"MatMul", {T("[*,x]", {8, 4}), T("[x,*]", {4, 8})},
       "[*,x] [x,*] -> [*,*]",
       {"local MatMul [*,x] [x,*] -> [*,*]", "all-reduce(sum) [*,*] over x"}},
      {"MatMul", {T("[y,x]", {8, 4}), T("[x,*]", {4, 8})},
       "[y,x] [x,*] -> [y,*]",
       {"local MatMul [y,x] [x,*] -> [y,*]", "all-reduce(sum) [y,*] over x"}},
      // One side of k sharded: the other is sliced to match (free).
      {"MatMul", {T("[*,x]", {8, 4}), T("[*,*]", {4, 8})},
       "[*,x] [x,*] -> [*,*]",
       {"slice axis 0 over x [*,*] -> [x,*]", "local MatMul [*,x] [x,*] -> [*,*]",
        "all-reduce(sum) [*,*] over x"}},
      // x shards m already, so b's k is gathered.
      {"MatMul", {T("[x,*]", {8, 4}), T("[x,*]", {4, 8})},
       "[x,*] [*,*] -> [x,*]",
       {"all-gather axis 0 [x,*] -> [*,*]", "local MatMul [x,*] [*,*] -> [x,*]"}},
      // x shards m, so n gives it up; y shards k.
      {"MatMul", {T("[x,y]", {8, 4}), T("[y,x]", {4, 8})},
       "[x,y] [y,*] -> [x,*]",
       {"all-gather axis 1 [y,x] -> [y,*]", "local MatMul [x,y] [y,*] -> [x,*]",
        "all-reduce(sum) [x,*] over y"}},
      // transpose_a: a is [k,m].
      {"MatMul", {T("[x,*]", {4, 8}), T("[*,*]", {4, 8})},
       "[x,*] [x,*] -> [*,*]",
       {"slice axis 0 over x [*,*] -> [x,*]", "local MatMul [x,*] [x,*] -> [*,*]",
        "all-reduce(sum) [*,*] over x"},
       {{"transpose_a", true}}},
      // transpose_b: b is [n,k].
      {"MatMul", {T("[x,*]", {8, 4}), T("[y,*]", {8, 4})},
       "[x,*] [y,*] -> [x,y]",
       {"local MatMul [x,*] [y,*] -> [x,y]"},
       {{"transpose_b", true}}},
      // Batch axes merge like broadcasting elementwise ops.
      {"BatchMatMulV2", {T("[x,*,*]", {4, 8, 4}), T("[*,*,*]", {4, 4, 8})},
       "[x,*,*] [x,*,*] -> [x,*,*]",
       {"slice axis 0 over x [*,*,*] -> [x,*,*]",
        "local BatchMatMulV2 [x,*,*] [x,*,*] -> [x,*,*]"}},
      {"BatchMatMulV2", {T("[x,*,y]", {4, 8, 4}), T("[*,*]", {4, 2})},
       "[x,*,y] [y,*] -> [x,*,*]",
       {"slice axis 0 over y [*,*] -> [y,*]", "local BatchMatMulV2 [x,*,y] [y,*] -> [x,*,*]",
        "all-reduce(sum) [x,*,*] over y"}},
      {"MatMul", {T("[x,*,*]", {2, 8, 4}), T("[*,*]", {4, 8})}, "error",
       {"'MatMul'", "matrices", "input 0 (shape [2, 8, 4], layout [x,*,*])"}},
  };
  return *rows;
}

TEST(MatmulRules, TwoDimensionalCpuMesh) { CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}), Rows2x2()); }

TEST(MatmulRules, TwoDimensionalGpuMesh) {
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}, "GPU"), Rows2x2());
}

TEST(MatmulRules, OneDimensionalMesh) {
  const std::vector<RuleRow> rows = {
      {"MatMul", {T("[x,*]", {8, 4}), T("[*,*]", {4, 8})},
       "[x,*] [*,*] -> [x,*]",
       {"local MatMul [x,*] [*,*] -> [x,*]"}},
      {"MatMul", {T("[*,*]", {8, 4}), T("[*,x]", {4, 8})},
       "[*,*] [*,x] -> [*,x]",
       {"local MatMul [*,*] [*,x] -> [*,x]"}},
      {"MatMul", {T("[*,x]", {8, 4}), T("[x,*]", {4, 8})},
       "[*,x] [x,*] -> [*,*]",
       {"local MatMul [*,x] [x,*] -> [*,*]", "all-reduce(sum) [*,*] over x"}},
      {"MatMul", {T("[x,*]", {8, 4}), T("[*,x]", {4, 8})},
       "[x,*] [*,*] -> [x,*]",
       {"all-gather axis 1 [*,x] -> [*,*]", "local MatMul [x,*] [*,*] -> [x,*]"}},
  };
  CheckRuleTable(MakeMesh({{"x", 2}}), rows);
  CheckRuleTable(MakeMesh({{"x", 2}}, "GPU"), rows);
}

// A product larger than its operands with a sharded contracted axis (a weight gradient
// x^T @ dy): on virtual CPUs, which share host memory, gathering the operands is cheaper
// than all-reducing the product; on GPUs the all-reduce stays.
TEST(MatmulRules, SharedMemoryHeuristicSeparatesCpuFromGpu) {
  const std::vector<testing::Arg> args = {T("[*,x]", {8, 2}), T("[x,*]", {2, 8})};
  CheckRuleTable(MakeMesh({{"x", 2}}),
                 {{"MatMul", args, "[*,*] [*,*] -> [*,*]",
                   {"all-gather axis 1 [*,x] -> [*,*]", "all-gather axis 0 [x,*] -> [*,*]",
                    "local MatMul [*,*] [*,*] -> [*,*]"}}});
  CheckRuleTable(MakeMesh({{"x", 2}}, "GPU"),
                 {{"MatMul", args, "[*,x] [x,*] -> [*,*]",
                   {"local MatMul [*,x] [x,*] -> [*,*]", "all-reduce(sum) [*,*] over x"}}});
  // Equal sizes (8x8 = 8x4 + 4x8) keep the all-reduce on CPUs too.
  CheckRuleTable(MakeMesh({{"x", 2}}),
                 {{"MatMul", {T("[*,x]", {8, 4}), T("[x,*]", {4, 8})}, "[*,x] [x,*] -> [*,*]",
                   {"local MatMul [*,x] [x,*] -> [*,*]", "all-reduce(sum) [*,*] over x"}}});
}

// Forcing TF's collective ops on CPUs ends buffer sharing, and with it the gather plan:
// the plan is the one GPUs get, consistent with the lowering that runs it.
TEST(MatmulRules, ForcedCollectiveOpsOnCpusPlanAsWithoutSharedBuffers) {
  ASSERT_OK(SetCollectiveLoweringPolicy("ops"));
  const std::vector<testing::Arg> args = {T("[*,x]", {8, 2}), T("[x,*]", {2, 8})};
  CheckRuleTable(MakeMesh({{"x", 2}}),
                 {{"MatMul", args, "[*,x] [x,*] -> [*,*]",
                   {"local MatMul [*,x] [x,*] -> [*,*]", "all-reduce(sum) [*,*] over x"}}});
  ASSERT_OK(SetCollectiveLoweringPolicy("auto"));
}

TEST(MatmulRules, CollectivesReportedForDebugExplain) {
  testing::OpCase op("MatMul", MakeMesh({{"x", 2}, {"y", 2}}, "GPU"));
  op.In("[y,x]", {8, 4}).In("[*,*]", {4, 8});
  EXPECT_LINES(op.Collectives(),
               {"input 1: slice axis 0 over x [*,*] -> [x,*]", "all-reduce(sum) of output 0 over x"});
}

TEST(MatmulRules, SquareOperands) {
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}), {
      {"MatMul", {T("[*,*]", {8, 8}), T("[*,*]", {8, 8})},
       "[*,*] [*,*] -> [*,*]",
       {"local MatMul [*,*] [*,*] -> [*,*]"}},
      {"MatMul", {T("[x,*]", {8, 8}), T("[*,x]", {8, 8})},
       "[x,*] [*,*] -> [x,*]",
       {"all-gather axis 1 [*,x] -> [*,*]", "local MatMul [x,*] [*,*] -> [x,*]"}},
      {"BatchMatMulV2", {T("[x,*,y]", {4, 8, 8}), T("[*,y,*]", {4, 8, 8})},
       "[x,*,y] [x,y,*] -> [x,*,*]",
       {"slice axis 0 over x [*,y,*] -> [x,y,*]", "local BatchMatMulV2 [x,*,y] [x,y,*] -> [x,*,*]",
        "all-reduce(sum) [x,*,*] over y"}},
      {"BatchMatMulV2", {T("[x,*,*]", {4, 8, 8}), T("[*,*]", {8, 8})},
       "[x,*,*] [*,*] -> [x,*,*]",
       {"local BatchMatMulV2 [x,*,*] [*,*] -> [x,*,*]"}},
  });
}

// A sparse matrix (indices, values, host shape) times a dense b: b's columns keep their
// sharding, b's contracted axis is gathered, nonzeros split over a mesh dimension are
// partial sums; adjoint_b makes b [n,k].
TEST(MatmulRules, SparseTensorDenseMatMul) {
  const testing::Arg indices = T("[*,*]", {6, 2}, TF_INT64);
  const testing::Arg values = T("[*]", {6});
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}), {
      {"SparseTensorDenseMatMul", {indices, values, testing::H({5, 6}), T("[*,y]", {6, 4})},
       "[*,*] [*] host [*,y] -> [*,y]",
       {"local SparseTensorDenseMatMul [*,*] [*] host [2] [*,y] -> [*,y]"}},
      // b's contracted axis is gathered: a's column indices are global.
      {"SparseTensorDenseMatMul", {indices, values, testing::H({5, 6}), T("[x,y]", {6, 4})},
       "[*,*] [*] host [*,y] -> [*,y]",
       {"all-gather axis 0 [x,y] -> [*,y]",
        "local SparseTensorDenseMatMul [*,*] [*] host [2] [*,y] -> [*,y]"}},
      {"SparseTensorDenseMatMul", {indices, values, testing::H({5, 6}), T("[x,y]", {4, 6})},
       "[*,*] [*] host [x,*] -> [*,x]",
       {"all-gather axis 1 [x,y] -> [x,*]",
        "local SparseTensorDenseMatMul [*,*] [*] host [2] [x,*] -> [*,x]"},
       {{"adjoint_b", true}}},
      {"SparseTensorDenseMatMul", {indices, values, testing::H({6, 5}), T("[*,x]", {5, 4})},
       "[*,*] [*] host [*,x] -> [*,x]",
       {"local SparseTensorDenseMatMul [*,*] [*] host [2] [*,x] -> [*,x]"},
       {{"adjoint_a", true}}},
      // Nonzeros split over x: each device multiplies its own, partial sums over x.
      {"SparseTensorDenseMatMul",
       {T("[x,*]", {6, 2}, TF_INT64), T("[x]", {6}), testing::H({5, 6}), T("[*,y]", {6, 4})},
       "[x,*] [x] host [*,y] -> [*,y]",
       {"local SparseTensorDenseMatMul [x,*] [x] host [2] [*,y] -> [*,y]",
        "all-reduce(sum) [*,y] over x"}},
      // y shards b's columns first, so the nonzeros give it up.
      {"SparseTensorDenseMatMul",
       {T("[y,*]", {6, 2}, TF_INT64), T("[*]", {6}), testing::H({5, 6}), T("[*,y]", {6, 4})},
       "[*,*] [*] host [*,y] -> [*,y]",
       {"all-gather axis 0 [y,*] -> [*,*]",
        "local SparseTensorDenseMatMul [*,*] [*] host [2] [*,y] -> [*,y]"}},
      {"SparseTensorDenseMatMul", {T("[*]", {6}, TF_INT64), values, testing::H({5, 6}),
                                   T("[*,*]", {6, 4})}, "error",
       {"'SparseTensorDenseMatMul'", "a_indices of shape [nnz, 2]", "input 0 (shape [6]"}},
  });
  CheckBackwardTable(MakeMesh({{"x", 2}, {"y", 2}}), {
      {"SparseTensorDenseMatMul", {indices, values, testing::H({5, 6}), T("[*,*]", {6, 4})},
       {"[x,y]"}, "[*,*] [*] - [*,y]"},
  });
}

// Backward: each output factor's mesh dimension goes to the inputs holding it; a factor
// the mesh dimension does not divide is not asked for; no request, no preference.
TEST(MatmulRules, Backward) {
  CheckBackwardTable(MakeMesh({{"x", 2}, {"y", 2}}), {
      {"MatMul", {T("[*,*]", {8, 4}), T("[*,*]", {4, 6})}, {"[x,y]"}, "[x,*] [*,y]"},
      {"MatMul", {T("[*,*]", {8, 4}), T("[*,*]", {4, 6})}, {"[*,x]"}, "[*,*] [*,x]"},
      {"MatMul",
       {T("[*,*]", {4, 8}), T("[*,*]", {4, 6})}, {"[x,*]"}, "[*,x] [*,*]", {{"transpose_a", true}}},
      {"MatMul",
       {T("[*,*]", {8, 4}), T("[*,*]", {6, 4})}, {"[y,x]"}, "[y,*] [x,*]", {{"transpose_b", true}}},
      {"MatMul", {T("[*,*]", {3, 4}), T("[*,*]", {4, 6})}, {"[x,y]"}, "[*,*] [*,y]"},
      {"BatchMatMulV2",
       {T("[*,*,*]", {4, 8, 8}), T("[*,*]", {8, 6})}, {"[x,*,y]"}, "[x,*,*] [*,y]"},
      {"BatchMatMulV2",
       {T("[*,*,*]", {4, 8, 8}), T("[*,*,*]", {1, 8, 6})}, {"[x,y,*]"}, "[x,y,*] [*,*,*]"},
      {"MatMul", {T("[x,*]", {8, 4}), T("[*,*]", {4, 6})}, {""}, "- -"},
  });
  CheckBackwardTable(MakeMesh({{"x", 2}}), {
      {"MatMul", {T("[*,*]", {8, 4}), T("[*,*]", {4, 6})}, {"[*,x]"}, "[*,*] [*,x]"},
  });
}

}  // namespace
}  // namespace tf_dtensor
