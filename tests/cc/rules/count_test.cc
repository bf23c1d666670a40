// Golden tables for the counting ops (cc/rules/count_rules.cc): each device counts its
// block into every bin; the blocks' counts add (binary_output: combine with max).
#include "tests/cc/rules/rule_testing.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {
namespace {

using testing::CheckRuleTable;
using testing::H;
using testing::HScalar;
using testing::MakeMesh;
using testing::OpCase;
using testing::RuleRow;
using testing::T;

TEST(CountRules, TwoDimensionalMesh) {
  const std::vector<RuleRow> rows = {
      // Values sharded on any axis: each block counted, the counts summed over x and y.
      {"HistogramFixedWidth", {T("[x,y]", {8, 6}), T("[*]", {2}), HScalar(4)},
       "[x,y] [*] host -> [*]",
       {"local HistogramFixedWidth [x,y] [*] host [] -> [*]", "all-reduce(sum) [*] over x,y"}},
      {"HistogramFixedWidth", {T("[*,x]", {5, 7}), T("[*]", {2}), HScalar(3)},
       "[*,x] [*] host -> [*]",
       {"local HistogramFixedWidth [*,x] [*] host [] -> [*]", "all-reduce(sum) [*] over x"}},
      // Replicated values: no communication; a sharded value_range is read whole.
      {"HistogramFixedWidth", {T("[*]", {9}), T("[y]", {2}), HScalar(3)},
       "[*] [*] host -> [*]",
       {"all-gather axis 0 [y] -> [*]", "local HistogramFixedWidth [*] [*] host [] -> [*]"}},
      // 1-D bincount: partial sum over the input's mesh dim; weights follow the input.
      {"DenseBincount", {T("[x]", {9}, TF_INT32), HScalar(5), T("[*]", {9})},
       "[x] host [x] -> [*]",
       {"slice axis 0 over x [*] -> [x]", "local DenseBincount [x] host [] [x] -> [*]",
        "all-reduce(sum) [*] over x"}},
      // Empty weights are read whole.
      {"DenseBincount", {T("[y]", {9}, TF_INT32), HScalar(5), T("[*]", {0})},
       "[y] host [*] -> [*]",
       {"local DenseBincount [y] host [] [*] -> [*]", "all-reduce(sum) [*] over y"}},
      // binary_output: whether a value occurs in any block, a max.
      {"DenseBincount", {T("[x]", {9}, TF_INT32), HScalar(5), T("[*]", {0})},
       "[x] host [*] -> [*]",
       {"local DenseBincount [x] host [] [*] -> [*]", "all-reduce(max) [*] over x"},
       {{"binary_output", true}}},
      // 2-D: the batch stays sharded, a sharded counted axis leaves a partial sum.
      {"DenseBincount", {T("[x,y]", {4, 6}, TF_INT32), HScalar(5), T("[x,y]", {4, 6})},
       "[x,y] host [x,y] -> [x,*]",
       {"local DenseBincount [x,y] host [] [x,y] -> [x,*]", "all-reduce(sum) [x,*] over y"}},
      {"DenseBincount", {T("[y,*]", {4, 6}, TF_INT32), HScalar(5), T("[*]", {0})},
       "[y,*] host [*] -> [y,*]",
       {"local DenseBincount [y,*] host [] [*] -> [y,*]"}},
      {"DenseBincount", {T("[*,x]", {4, 6}, TF_INT32), HScalar(5), T("[*]", {0})},
       "[*,x] host [*] -> [*,*]",
       {"local DenseBincount [*,x] host [] [*] -> [*,*]", "all-reduce(max) [*,*] over x"},
       {{"binary_output", true}}},
      {"DenseBincount", {T("[x]", {9}, TF_INT32), HScalar(5), T("[*]", {4})},
       "error", {"weights of its input's shape or of shape [0]", "'DenseBincount'"}},
      {"DenseBincount", {T("[x,*,*]", {2, 2, 2}, TF_INT32), HScalar(5), T("[*]", {0})},
       "error", {"rank 1 or 2"}},
  };
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}), rows);
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}, "GPU"), rows);
}

// Inside tf.function the blocks' counts stay pending: the output is partial.
TEST(CountRules, CountsStayPendingInsideFunctions) {
  OpCase op("HistogramFixedWidth", MakeMesh({{"x", 2}, {"y", 4}}));
  op.In("[y,x]", {8, 6}).In("[*]", {2}).HostScalar(4).KeepPartial();
  EXPECT_EQ(op.PlanString(), "[y,x] [*] host -> [*] +partial(x:sum,y:sum)");
  EXPECT_LINES(op.Collectives(), {"partial(sum) of output 0 over y,x, reduced where needed"});
}

}  // namespace
}  // namespace tf_dtensor
