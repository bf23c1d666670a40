// Golden tables for elementwise ops with broadcasting (cc/rules/elementwise_rules.cc).
#include "tests/cc/rules/rule_testing.h"

namespace tf_dtensor {
namespace {

using testing::CheckRuleTable;
using testing::MakeMesh;
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

}  // namespace
}  // namespace tf_dtensor
