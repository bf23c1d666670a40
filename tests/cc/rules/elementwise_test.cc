// Golden tables for elementwise ops with broadcasting (cc/rules/elementwise_rules.cc).
#include "tests/cc/rules/rule_testing.h"

namespace tf_dtensor {
namespace {

using testing::CheckBackwardTable;
using testing::CheckRuleTable;
using testing::MakeMesh;
using testing::OpCase;
using testing::RuleRow;
using testing::T;

TEST(ElementwiseRules, TwoDimensionalMesh) {
  const std::vector<RuleRow> rows = {
      {"AddV2", {T("[x,*]", {8, 8}), T("[x,*]", {8, 8})},
       "[x,*] [x,*] -> [x,*]",
       {"local AddV2 [x,*] [x,*] -> [x,*]"}},
      // Each output axis takes a sharded input's spec; the other input is sliced (free).
      {"Mul", {T("[x,*]", {8, 8}), T("[*,y]", {8, 8})},
       "[x,y] [x,y] -> [x,y]",
       {"slice axis 1 over y [x,*] -> [x,y]", "slice axis 0 over x [*,y] -> [x,y]",
        "local Mul [x,y] [x,y] -> [x,y]"}},
      // x can shard one axis only: the first input wins, the second moves in one exchange.
      {"AddV2", {T("[x,*]", {8, 8}), T("[*,x]", {8, 8})},
       "[x,*] [x,*] -> [x,*]",
       {"all-to-all axis 1 -> 0 [*,x] -> [x,*]", "local AddV2 [x,*] [x,*] -> [x,*]"}},
      // Broadcasting aligns on the right: a rank-1 input follows the last axis.
      {"AddV2", {T("[x,*]", {8, 8}), T("[*]", {8})},
       "[x,*] [*] -> [x,*]",
       {"local AddV2 [x,*] [*] -> [x,*]"}},
      {"AddV2", {T("[*,y]", {8, 8}), T("[x]", {8})},
       "[*,y] [y] -> [*,y]",
       {"all-gather axis 0 [x] -> [*]", "slice axis 0 over y [*] -> [y]",
        "local AddV2 [*,y] [y] -> [*,y]"}},
      {"BiasAdd", {T("[x,y]", {8, 8}), T("[*]", {8})},
       "[x,y] [y] -> [x,y]",
       {"slice axis 0 over y [*] -> [y]", "local BiasAdd [x,y] [y] -> [x,y]"}},
      // Size-1 axes broadcast: they take no sharding.
      {"Sub", {T("[x,*]", {8, 1}), T("[*,y]", {1, 8})},
       "[x,*] [*,y] -> [x,y]",
       {"local Sub [x,*] [*,y] -> [x,y]"}},
      {"Relu", {T("[*,y]", {8, 8})}, "[*,y] -> [*,y]", {"local Relu [*,y] -> [*,y]"}},
      {"AddV2", {T("[x,*]", {8, 8}), T("[*,*]", {3, 8})}, "error",
       {"'AddV2'", "[8, 8]", "[3, 8]"}},
  };
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}), rows);
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}, "GPU"), rows);
}

TEST(ElementwiseRules, OneDimensionalMesh) {
  CheckRuleTable(MakeMesh({{"x", 4}}),
                 {
                     {"AddV2", {T("[x]", {8}), T("[*]", {8})},
                      "[x] [x] -> [x]",
                      {"slice axis 0 over x [*] -> [x]", "local AddV2 [x] [x] -> [x]"}},
                     {"Maximum", {T("[*,x]", {8, 8}), T("[]", {})},
                      "[*,x] [] -> [*,x]",
                      {"local Maximum [*,x] [] -> [*,x]"}},
                     {"Neg", {T("[x,*]", {8, 8})}, "[x,*] -> [x,*]",
                      {"local Neg [x,*] -> [x,*]"}},
                 });
}

// The audit's linear ops keep pending sums: real, imag and conj of a sum are sums, and so
// is complex(a1 + a2, b1 + b2); mul_no_nan is linear in its first input only.
TEST(ElementwiseRules, ComplexPartsPassPartialSums) {
  const Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}});
  const PartialSpec sum_y{1, ReduceOp::kSum};
  for (const char* op : {"Real", "Imag", "Conj"}) {
    SCOPED_TRACE(op);
    OpCase part(op, mesh);
    part.In("[x,*]", {4, 6}, TF_COMPLEX64).Pending({sum_y});
    EXPECT_EQ(part.PlanString(), "[x,*] +partial(y:sum) -> [x,*] +partial(y:sum)");
  }
  OpCase complex("Complex", mesh);
  complex.In("[x,*]", {4, 6}).Pending({sum_y}).In("[x,*]", {4, 6}).Pending({sum_y});
  EXPECT_EQ(complex.PlanString(),
            "[x,*] +partial(y:sum) [x,*] +partial(y:sum) -> [x,*] +partial(y:sum)");
  OpCase angle("Angle", mesh);
  angle.In("[x,*]", {4, 6}, TF_COMPLEX64).Pending({sum_y});
  EXPECT_EQ(angle.PlanString(), "[x,*] -> [x,*]");
  OpCase mul_first("MulNoNan", mesh);
  mul_first.In("[x,*]", {4, 6}).Pending({sum_y}).In("[x,*]", {4, 6});
  EXPECT_EQ(mul_first.PlanString(), "[x,*] +partial(y:sum) [x,*] -> [x,*] +partial(y:sum)");
  OpCase mul_second("MulNoNan", mesh);
  mul_second.In("[x,*]", {4, 6}).In("[x,*]", {4, 6}).Pending({sum_y});
  EXPECT_EQ(mul_second.PlanString(), "[x,*] [x,*] -> [x,*]");
}

// Inputs follow the merged layout: replicated ones are sliced, broadcast axes align from
// the right, and BiasAdd's bias follows the channel axis.
TEST(ElementwiseRules, BroadcastingAndChannels) {
  const std::vector<RuleRow> rows = {
      {"AddV2", {T("[x,*]", {8, 8}), T("[x,*]", {8, 8})},
       "[x,*] [x,*] -> [x,*]",
       {"local AddV2 [x,*] [x,*] -> [x,*]"}},
      {"AddV2", {T("[x,*]", {8, 8}), T("[*,*]", {8, 8})},
       "[x,*] [x,*] -> [x,*]",
       {"slice axis 0 over x [*,*] -> [x,*]", "local AddV2 [x,*] [x,*] -> [x,*]"}},
      {"AddV2", {T("[*,*]", {8, 8}), T("[*,y]", {8, 8})},
       "[*,y] [*,y] -> [*,y]",
       {"slice axis 1 over y [*,*] -> [*,y]", "local AddV2 [*,y] [*,y] -> [*,y]"}},
      {"AddV2", {T("[x,*]", {8, 8}), T("[*,y]", {8, 8})},
       "[x,y] [x,y] -> [x,y]",
       {"slice axis 1 over y [x,*] -> [x,y]", "slice axis 0 over x [*,y] -> [x,y]",
        "local AddV2 [x,y] [x,y] -> [x,y]"}},
      {"AddV2", {T("[x,*]", {8, 8}), T("[*,x]", {8, 8})},
       "[x,*] [x,*] -> [x,*]",
       {"all-to-all axis 1 -> 0 [*,x] -> [x,*]", "local AddV2 [x,*] [x,*] -> [x,*]"}},
      {"AddV2", {T("[x,*]", {8, 8}), T("[*]", {8})},
       "[x,*] [*] -> [x,*]",
       {"local AddV2 [x,*] [*] -> [x,*]"}},
      {"AddV2", {T("[x,y]", {8, 8}), T("[*]", {8})},
       "[x,y] [y] -> [x,y]",
       {"slice axis 0 over y [*] -> [y]", "local AddV2 [x,y] [y] -> [x,y]"}},
      {"AddV2", {T("[x,y]", {8, 8}), T("[*,*]", {8, 1})},
       "[x,y] [x,*] -> [x,y]",
       {"slice axis 0 over x [*,*] -> [x,*]", "local AddV2 [x,y] [x,*] -> [x,y]"}},
      {"Mul", {T("[*,*]", {8, 8}), T("[*,*]", {4, 8})}, "error",
       {"Incompatible shapes for 'Mul'", "[8, 8] vs [4, 8]"}},
      {"Select", {T("[*]", {8}), T("[x,*]", {8, 8}), T("[x,*]", {8, 8})},
       "[x] [x,*] [x,*] -> [x,*]",
       {"slice axis 0 over x [*] -> [x]", "local Select [x] [x,*] [x,*] -> [x,*]"}},
      {"BiasAdd", {T("[x,*,y]", {4, 8, 8}), T("[*]", {8})},
       "[x,*,y] [y] -> [x,*,y]",
       {"slice axis 0 over y [*] -> [y]", "local BiasAdd [x,*,y] [y] -> [x,*,y]"},
       {}, {}, {{"data_format", "NHWC"}}},
      {"BiasAdd", {T("[x,y,*]", {4, 8, 8}), T("[*]", {8})},
       "[x,y,*] [y] -> [x,y,*]",
       {"slice axis 0 over y [*] -> [y]", "local BiasAdd [x,y,*] [y] -> [x,y,*]"},
       {}, {}, {{"data_format", "NCHW"}}},
  };
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}), rows);
  CheckRuleTable(MakeMesh({{"x", 2}}), {
      {"Relu", {T("[x,*]", {8, 8})},
       "[x,*] -> [x,*]",
       {"local Relu [x,*] -> [x,*]"}},
  });
}

// Backward: a request projected through broadcasting; one of another rank is ignored.
TEST(ElementwiseRules, Backward) {
  CheckBackwardTable(MakeMesh({{"x", 2}, {"y", 2}}), {
      {"AddV2", {T("[*,*]", {8, 4}), T("[*]", {4})}, {"[x,y]"}, "[x,y] [y]"},
      {"Mul", {T("[*,*]", {8, 4}), T("[*,*]", {1, 4})}, {"[x,y]"}, "[x,y] [*,y]"},
      {"Mul", {T("[*,*]", {8, 4}), T("[]", {})}, {"[x,y]"}, "[x,y] []"},
      {"Relu", {T("[*,*]", {8, 4})}, {"[y,x]"}, "[y,x]"},
      {"IdentityN", {T("[*,*]", {8, 4}), T("[*]", {4})}, {"[x,*]", ""}, "[x,*] -"},
      {"AddV2", {T("[*,*]", {8, 4}), T("[*]", {4})}, {"[x]"}, "- -"},
  });
}

}  // namespace
}  // namespace tf_dtensor
