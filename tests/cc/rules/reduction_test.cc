// Golden tables for reductions, softmax and scans (cc/rules/reduction_rules.cc).
#include "tests/cc/rules/rule_testing.h"

namespace tf_dtensor {
namespace {

using testing::CheckBackwardTable;
using testing::Cat;
using testing::CheckRuleTable;
using testing::IdCheckSteps;
using testing::SoftmaxNonFiniteSteps;
using testing::H;
using testing::HScalar;
using testing::MakeMesh;
using testing::OpCase;
using testing::RuleRow;
using testing::T;

TEST(ReductionRules, TwoDimensionalMesh) {
  const std::vector<RuleRow> rows = {
      // Reducing an unsharded axis is local.
      {"Sum", {T("[x,*]", {8, 8}), H({1})}, "[x,*] host -> [x]",
       {"local Sum [x,*] host [1] -> [x]"}},
      // Reducing a sharded axis leaves partial sums.
      {"Sum", {T("[x,*]", {8, 8}), H({0})}, "[x,*] host -> [*]",
       {"local Sum [x,*] host [1] -> [*]", "all-reduce(sum) [*] over x"}},
      {"Sum", {T("[x,y]", {8, 8}), H({0, 1})}, "[x,y] host -> []",
       {"local Sum [x,y] host [2] -> []", "all-reduce(sum) [] over x,y"}},
      {"Sum", {T("[x,*]", {8, 8}), H({-2})}, "[x,*] host -> [*,*]",
       {"local Sum [x,*] host [1] -> [*,*]", "all-reduce(sum) [*,*] over x"},
       {{"keep_dims", true}}},
      {"Max", {T("[*,y]", {8, 8}), H({1})}, "[*,y] host -> [*]",
       {"local Max [*,y] host [1] -> [*]", "all-reduce(max) [*] over y"}},
      {"Prod", {T("[y,x]", {8, 8}), H({1})}, "[y,x] host -> [y]",
       {"local Prod [y,x] host [1] -> [y]", "all-reduce(prod) [y] over x"}},
      // Mean over a sharded axis: local sum, all-reduce, divide by the global count.
      {"Mean", {T("[x,*]", {8, 6}), H({0})}, "[x,*] host -> [*]",
       {"local Sum [x,*] host [1] -> [*]", "all-reduce(sum) [*] over x",
        "host constant [8] int64", "local Cast host [] -> [] SrcT=int64 DstT=float32",
        "local Div [*] [] -> [*] T=float32"}},
      {"Mean", {T("[x,*]", {8, 6}), H({1})}, "[x,*] host -> [x]",
       {"local Mean [x,*] host [1] -> [x]"}},
      // Ops without a combining reduction gather the reduced axis first.
      {"ArgMax", {T("[x,y]", {8, 8}), H({0})}, "[*,y] host -> [y]",
       {"all-gather axis 0 [x,y] -> [*,y]", "local ArgMax [*,y] host [1] -> [y]"}},
      {"Cumsum", {T("[x,y]", {8, 8}), H({0})}, "[*,y] host -> [*,y]",
       {"all-gather axis 0 [x,y] -> [*,y]", "local Cumsum [*,y] host [1] -> [*,y]"}},
      {"L2Loss", {T("[x,y]", {8, 8})}, "[x,y] -> []",
       {"local L2Loss [x,y] -> []", "all-reduce(sum) [] over x,y"}},
      // tf.debugging.enable_check_numerics' summary (mode 8): the blocks' -inf, +inf and
      // NaN slots add; the other modes name and count the whole tensor, gathered.
      {"DebugNumericSummaryV2", {T("[x,y]", {8, 8})}, "[x,y] -> [*]",
       {"local DebugNumericSummaryV2 [x,y] -> [*]", "all-reduce(sum) [*] over x,y"},
       {}, {{"tensor_debug_mode", 8}}},
      {"DebugNumericSummaryV2", {T("[x,*]", {8, 8})}, "[*,*] -> [*]",
       {"all-gather axis 0 [x,*] -> [*,*]", "local DebugNumericSummaryV2 [*,*] -> [*]"},
       {}, {{"tensor_debug_mode", 2}}},
      {"DebugNumericSummaryV2", {T("[x,*]", {8, 8})}, "error",
       {"tensor_debug_mode 9", "expected 2, 3, 4, 5 or 8"}, {}, {{"tensor_debug_mode", 9}}},
      {"Sum", {T("[x,*]", {8, 8}), H({2})}, "error",
       {"axis 2", "out of range", "input 0 (shape [8, 8], layout [x,*]) of 'Sum'"}},
  };
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}), rows);
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}, "GPU"), rows);
  // A sharded class axis stays sharded: row max and row sum all-reduced over y. On CPUs,
  // rows with NaN or +inf then come out as TF's CPU kernel gives them.
  const std::vector<std::string> softmax = {
      "host constant [1] int32",
      "local Max [x,y] host [1] -> [x,*] T=float32 Tidx=int32 keep_dims=true",
      "all-reduce(max) [x,*] over y", "local Sub [x,y] [x,*] -> [x,y] T=float32",
      "local Exp [x,y] -> [x,y] T=float32", "host constant [1] int32",
      "local Sum [x,y] host [1] -> [x,*] T=float32 Tidx=int32 keep_dims=true",
      "all-reduce(sum) [x,*] over y", "local RealDiv [x,y] [x,*] -> [x,y] T=float32"};
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}),
                 {{"Softmax", {T("[x,y]", {8, 8})}, "[x,y] -> [x,y]",
                   Cat({softmax, SoftmaxNonFiniteSteps("[x,*]", "[x,y]")})}});
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}, "GPU"),
                 {{"Softmax", {T("[x,y]", {8, 8})}, "[x,y] -> [x,y]", softmax}});
}

TEST(ReductionRules, OneDimensionalMesh) {
  CheckRuleTable(MakeMesh({{"x", 2}}),
                 {
                     {"Sum", {T("[x]", {8}), H({0})}, "[x] host -> []",
                      {"local Sum [x] host [1] -> []", "all-reduce(sum) [] over x"}},
                     {"Min", {T("[*,x]", {8, 8}), H({0})}, "[*,x] host -> [x]",
                      {"local Min [*,x] host [1] -> [x]"}},
                 });
}

TEST(ReductionRules, KeepDimsCrossEntropyAndBiasGradients) {
  const std::vector<RuleRow> rows = {
      {"Sum", {T("[x,y]", {8, 8}), H({0})},
       "[x,y] host -> [*,y]",
       {"local Sum [x,y] host [1] -> [*,y]", "all-reduce(sum) [*,y] over x"},
       {{"keep_dims", true}}},
      {"Max", {T("[*,y]", {8, 8}), H({-1})},
       "[*,y] host -> [*]",
       {"local Max [*,y] host [1] -> [*]", "all-reduce(max) [*] over y"}},
      {"Min", {T("[x,*]", {8, 8}), H({0})},
       "[x,*] host -> [*]",
       {"local Min [x,*] host [1] -> [*]", "all-reduce(min) [*] over x"}},
      {"Prod", {T("[x,*]", {8, 8}), H({0})},
       "[x,*] host -> [*]",
       {"local Prod [x,*] host [1] -> [*]", "all-reduce(prod) [*] over x"}},
      {"All", {T("[x,*]", {8, 8}), H({0})},
       "[*,*] host -> [*]",
       {"all-gather axis 0 [x,*] -> [*,*]", "local All [*,*] host [1] -> [*]"}},
      {"LogSoftmax", {T("[x,y]", {8, 8})},
       "[x,y] -> [x,y]",
       {"host constant [1] int32",
        "local Max [x,y] host [1] -> [x,*] T=float32 Tidx=int32 keep_dims=true",
        "all-reduce(max) [x,*] over y", "local Sub [x,y] [x,*] -> [x,y] T=float32",
        "local Exp [x,y] -> [x,y] T=float32", "host constant [1] int32",
        "local Sum [x,y] host [1] -> [x,*] T=float32 Tidx=int32 keep_dims=true",
        "all-reduce(sum) [x,*] over y", "local Log [x,*] -> [x,*] T=float32",
        "local Sub [x,y] [x,*] -> [x,y] T=float32"}},
      {"SparseSoftmaxCrossEntropyWithLogits", {T("[x,y]", {8, 8}), T("[*]", {8}, TF_INT32)},
       "[x,y] [x] -> [x] [x,y]",
       // The row statistics, the labels checked against the 8 classes (as one CPU device
       // does), the one-hot, and the label's term picked by a select.
       Cat({{"slice axis 0 over x [*] -> [x]", "host constant [1] int32",
             "local Max [x,y] host [1] -> [x,*] T=float32 Tidx=int32 keep_dims=true",
             "all-reduce(max) [x,*] over y", "local Sub [x,y] [x,*] -> [x,y] T=float32",
             "local Exp [x,y] -> [x,y] T=float32", "host constant [1] int32",
             "local Sum [x,y] host [1] -> [x,*] T=float32 Tidx=int32 keep_dims=true",
             "all-reduce(sum) [x,*] over y"},
            IdCheckSteps("[x]", "SparseSoftmaxCrossEntropyWithLogits", 8,
                         "[x,y] @ mesh(x=2,y=2)"),
            {"host constant [0] int32", "host constant [8] int32", "host constant [1] int32",
             "local Range host [] host [] host [] -> [*] Tidx=int32",
             "slice axis 0 over y [*] -> [y]", "host constant [-1, 1] int32",
             "local Reshape [x] host [2] -> [x,*] T=int32 Tshape=int32",
             "local Equal [x,*] [y] -> [x,y] T=int32 incompatible_shape_error=true",
             "local Cast [x,y] -> [x,y] SrcT=bool DstT=float32",
             "local RealDiv [x,y] [x,*] -> [x,y] T=float32",
             "local Sub [x,y] [x,y] -> [x,y] T=float32", "local Log [x,*] -> [x,*] T=float32",
             "local Sub [x,*] [x,y] -> [x,y] T=float32", "local ZerosLike [x,y] -> [x,y] T=float32",
             "local SelectV2 [x,y] [x,y] [x,y] -> [x,y] T=float32", "host constant [1] int32",
             "local Sum [x,y] host [1] -> [x] T=float32 Tidx=int32 keep_dims=false",
             "all-reduce(sum) [x] over y"}})},
      {"SoftmaxCrossEntropyWithLogits", {T("[x,y]", {8, 8}), T("[*,*]", {8, 8})},
       "[x,y] [x,y] -> [x] [x,y]",
       {"slice axis 0 over x [*,*] -> [x,*]", "slice axis 1 over y [x,*] -> [x,y]",
        "host constant [1] int32",
        "local Max [x,y] host [1] -> [x,*] T=float32 Tidx=int32 keep_dims=true",
        "all-reduce(max) [x,*] over y", "local Sub [x,y] [x,*] -> [x,y] T=float32",
        "local Exp [x,y] -> [x,y] T=float32", "host constant [1] int32",
        "local Sum [x,y] host [1] -> [x,*] T=float32 Tidx=int32 keep_dims=true",
        "all-reduce(sum) [x,*] over y", "local RealDiv [x,y] [x,*] -> [x,y] T=float32",
        "local Sub [x,y] [x,y] -> [x,y] T=float32", "local Log [x,*] -> [x,*] T=float32",
        "local Sub [x,*] [x,y] -> [x,y] T=float32", "local Mul [x,y] [x,y] -> [x,y] T=float32",
        "host constant [1] int32",
        "local Sum [x,y] host [1] -> [x] T=float32 Tidx=int32 keep_dims=false",
        "all-reduce(sum) [x] over y"}},
      {"SparseSoftmaxCrossEntropyWithLogits", {T("[*,*]", {8, 8}), T("[y]", {8}, TF_INT32)},
       "[y,*] [y] -> [y] [y,*]",
       {"slice axis 0 over y [*,*] -> [y,*]",
        "local SparseSoftmaxCrossEntropyWithLogits [y,*] [y] -> [y] [y,*]"}},
      {"BiasAddGrad", {T("[x,*,y]", {8, 8, 8})},
       "[x,*,y] -> [y]",
       {"local BiasAddGrad [x,*,y] -> [y]", "all-reduce(sum) [y] over x"},
       {}, {}, {{"data_format", "NHWC"}}},
      {"BiasAddGrad", {T("[x,*,y]", {8, 8, 8})},
       "[x,*,y] -> [*]",
       {"local BiasAddGrad [x,*,y] -> [*]", "all-reduce(sum) [*] over x,y"},
       {}, {}, {{"data_format", "NCHW"}}},
      {"Cumsum", {T("[x,y]", {8, 8}), HScalar(1)},
       "[x,*] host -> [x,*]",
       {"all-gather axis 1 [x,y] -> [x,*]", "local Cumsum [x,*] host [] -> [x,*]"}},
  };
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}), rows);
}

// Backward: reduced axes are asked for unsharded; softmax keeps its class axis.
TEST(ReductionRules, Backward) {
  CheckBackwardTable(MakeMesh({{"x", 2}, {"y", 2}}), {
      {"Sum", {T("[*,*]", {8, 4}), H({1})}, {"[x]"}, "[x,*] -"},
      {"Sum", {T("[*,*]", {8, 4}), H({0})}, {"[y]"}, "[*,y] -"},
      {"Sum", {T("[*,*]", {8, 4}), H({0})}, {"[*,y]"}, "[*,y] -", {{"keep_dims", true}}},
      {"Max", {T("[*,*,*]", {8, 4, 2}), H({1, 2})}, {"[x]"}, "[x,*,*] -"},
      {"ArgMax", {T("[*,*]", {8, 4}), HScalar(1)}, {"[x]"}, "[x,*] -"},
      {"Softmax", {T("[*,*]", {8, 4})}, {"[x,y]"}, "[x,y]"},
      {"Cumsum", {T("[*,*]", {8, 4}), HScalar(0)}, {"[x,y]"}, "[*,y] -"},
      {"SparseSoftmaxCrossEntropyWithLogits",
       {T("[*,*]", {8, 4}), T("[*]", {8})}, {"[x]", ""}, "[x,*] [x]"},
      {"L2Loss", {T("[*,*]", {8, 4})}, {"[]"}, "[*,*]"},
      {"BiasAddGrad", {T("[*,*]", {8, 4})}, {"[y]"}, "[*,y]"},
  });
}

TEST(ReductionRules, SoftmaxKeepsAShardedClassAxis) {
  const Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}});
  OpCase softmax("Softmax", mesh);
  softmax.In("[x,y]", {4, 6});
  EXPECT_EQ(softmax.PlanString(), "[x,y] -> [x,y]");
  EXPECT_LINES(softmax.Steps(), Cat({{"host constant [1] int32",
                                 "local Max [x,y] host [1] -> [x,*] T=float32 Tidx=int32 keep_dims=true",
                                 "all-reduce(max) [x,*] over y",
                                 "local Sub [x,y] [x,*] -> [x,y] T=float32",
                                 "local Exp [x,y] -> [x,y] T=float32",
                                 "host constant [1] int32",
                                 "local Sum [x,y] host [1] -> [x,*] T=float32 Tidx=int32 keep_dims=true",
                                 "all-reduce(sum) [x,*] over y",
                                 "local RealDiv [x,y] [x,*] -> [x,y] T=float32"},
                                     // A row with NaN or +inf as TF's CPU kernel gives it.
                                     SoftmaxNonFiniteSteps("[x,*]", "[x,y]")}));

  OpCase local("LogSoftmax", mesh);
  local.In("[x,*]", {4, 6});
  EXPECT_LINES(local.Steps(), {"local LogSoftmax [x,*] -> [x,*]"});

  OpCase sparse("SparseSoftmaxCrossEntropyWithLogits", mesh);
  sparse.In("[x,y]", {4, 6}).In("[x]", {4}, TF_INT32).OutShapes({{4}, {4, 6}});
  EXPECT_EQ(sparse.PlanString(), "[x,y] [x] -> [x] [x,y]");
  EXPECT_LINES(sparse.Collectives(), {"all-reduce(sum) of output 0 over y",
                                      "all-reduce(max) of the row max over y",
                                      "all-reduce(sum) of the row sum over y"});
  // After the row statistics (as for Softmax): the labels checked against the classes
  // (CPU), each shard's one-hot against its own slice of the class indices, backprop =
  // softmax - one_hot, loss = the sum of the label's terms (picked by a select).
  std::vector<std::string> steps = sparse.Steps();
  ASSERT_EQ(steps.size(), 40u);
  EXPECT_LINES(std::vector<std::string>(steps.begin() + 8, steps.begin() + 22),
               IdCheckSteps("[x]", "SparseSoftmaxCrossEntropyWithLogits", 6,
                            "[x,y] @ mesh(x=2,y=2)"));
  EXPECT_LINES(std::vector<std::string>(steps.begin() + 22, steps.end()),
               {"host constant [0] int32",
                "host constant [6] int32",
                "host constant [1] int32",
                "local Range host [] host [] host [] -> [*] Tidx=int32",
                "slice axis 0 over y [*] -> [y]",
                "host constant [-1, 1] int32",
                "local Reshape [x] host [2] -> [x,*] T=int32 Tshape=int32",
                "local Equal [x,*] [y] -> [x,y] T=int32 incompatible_shape_error=true",
                "local Cast [x,y] -> [x,y] SrcT=bool DstT=float32",
                "local RealDiv [x,y] [x,*] -> [x,y] T=float32",
                "local Sub [x,y] [x,y] -> [x,y] T=float32",
                "local Log [x,*] -> [x,*] T=float32",
                "local Sub [x,*] [x,y] -> [x,y] T=float32",
                "local ZerosLike [x,y] -> [x,y] T=float32",
                "local SelectV2 [x,y] [x,y] [x,y] -> [x,y] T=float32",
                "host constant [1] int32",
                "local Sum [x,y] host [1] -> [x] T=float32 Tidx=int32 keep_dims=false",
                "all-reduce(sum) [x] over y"});
}

}  // namespace
}  // namespace tf_dtensor
