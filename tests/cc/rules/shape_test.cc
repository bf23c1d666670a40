// Golden tables for shape ops (cc/rules/shape_rules.cc): transpose and expand_dims.
#include "tests/cc/rules/rule_testing.h"

namespace tf_dtensor {
namespace {

using testing::CheckBackwardTable;
using testing::CheckRuleTable;
using testing::H;
using testing::HScalar;
using testing::MakeMesh;
using testing::RuleRow;
using testing::T;

TEST(ShapeRules, TransposePermutesTheSpecs) {
  const std::vector<RuleRow> rows = {
      {"Transpose", {T("[x,y]", {8, 4}), H({1, 0})}, "[x,y] host -> [y,x]",
       {"local Transpose [x,y] host [2] -> [y,x]"}},
      {"Transpose", {T("[x,*,y]", {8, 4, 2}), H({2, 0, 1})}, "[x,*,y] host -> [y,x,*]",
       {"local Transpose [x,*,y] host [3] -> [y,x,*]"}},
      {"Transpose", {T("[x,y]", {8, 4}), H({0, 1})}, "[x,y] host -> [x,y]",
       {"local Transpose [x,y] host [2] -> [x,y]"}},
      {"Transpose", {T("[x,y]", {8, 4}), H({1})}, "error",
       {"permutation [1]", "input 0 (shape [8, 4], layout [x,y]) of 'Transpose'"}},
      {"ExpandDims", {T("[x,y]", {8, 4}), H({-1})}, "[x,y] host -> [x,y,*]",
       {"local ExpandDims [x,y] host [1] -> [x,y,*]"}},
  };
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}), rows);
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}, "GPU"), rows);
  CheckRuleTable(MakeMesh({{"x", 2}}),
                 {{"Transpose", {T("[x,*]", {8, 4}), H({1, 0})}, "[x,*] host -> [*,x]",
                   {"local Transpose [x,*] host [2] -> [*,x]"}}});
}

TEST(ShapeRules, ReshapeBroadcastToAndTile) {
  const std::vector<RuleRow> rows = {
      {"Reshape", {T("[x,*,*]", {4, 2, 8}), H({8, 8})},
       "[x,*,*] host[4, 8] -> [x,*]",
       {"host constant [4, 8] int32", "local Reshape [x,*,*] host [2] -> [x,*]"}},
      {"Reshape", {T("[x,*]", {8, 8}), H({4, 2, 8})},
       "[x,*] host[2, 2, 8] -> [x,*,*]",
       {"host constant [2, 2, 8] int32", "local Reshape [x,*] host [3] -> [x,*,*]"}},
      {"Reshape", {T("[*,x]", {8, 8}), H({64})},
       "[*,*] host[64] -> [*]",
       {"all-gather axis 1 [*,x] -> [*,*]", "host constant [64] int32",
        "local Reshape [*,*] host [1] -> [*]"}},
      {"Reshape", {T("[x,*]", {8, 8}), H({64})},
       "[x,*] host[32] -> [x]",
       {"host constant [32] int32", "local Reshape [x,*] host [1] -> [x]"}},
      {"Reshape", {T("[x,y]", {8, 8}), H({8, 2, 4})},
       "[x,y] host[4, 1, 4] -> [x,y,*]",
       {"host constant [4, 1, 4] int32", "local Reshape [x,y] host [3] -> [x,y,*]"}},
      {"Reshape", {T("[x,*]", {8, 8}), H({-1, 4})},
       "[x,*] host[8, 4] -> [x,*]",
       {"host constant [8, 4] int32", "local Reshape [x,*] host [2] -> [x,*]"}},
      {"Reshape", {T("[*,y]", {8, 8}), H({2, 32})},
       "[*,*] host[2, 32] -> [*,*]",
       {"all-gather axis 1 [*,y] -> [*,*]", "host constant [2, 32] int32",
        "local Reshape [*,*] host [2] -> [*,*]"}},
      {"Reshape", {T("[x,*]", {8, 8}), H({60})}, "error",
       {"input 0 (shape [8, 8], layout [x,*]) of 'Reshape'", "[60]", "element counts differ"}},
      {"Reshape", {T("[*,y]", {1, 8}), H({8})},
       "[*,y] host[4] -> [y]",
       {"host constant [4] int32", "local Reshape [*,y] host [1] -> [y]"}},
      {"Reshape", {T("[y]", {8}), H({1, 8})},
       "[y] host[1, 4] -> [*,y]",
       {"host constant [1, 4] int32", "local Reshape [y] host [2] -> [*,y]"}},
      {"Reshape", {T("[x,*,y]", {8, 1, 8}), H({8, 8, 1})},
       "[x,*,y] host[4, 4, 1] -> [x,y,*]",
       {"host constant [4, 4, 1] int32", "local Reshape [x,*,y] host [3] -> [x,y,*]"}},
      {"ExpandDims", {T("[x,*]", {8, 8}), HScalar(1)},
       "[x,*] host -> [x,*,*]",
       {"local ExpandDims [x,*] host [] -> [x,*,*]"}},
      {"Squeeze", {T("[x,*,*]", {8, 1, 8})},
       "[x,*,*] -> [x,*]",
       {"local Squeeze [x,*,*] -> [x,*]"},
       {}, {}, {}, {{"squeeze_dims", {1}}}},
      {"Shape", {T("[x,y]", {8, 8})},
       "= -> [*]",
       {"host constant [8, 8] int32", "broadcast host [2] -> [*] @ mesh(x=2,y=2)"}},
      {"Size", {T("[x,y]", {8, 8})},
       "= -> []",
       {"host constant [64] int32", "broadcast host [] -> [] @ mesh(x=2,y=2)"}},
      {"Rank", {T("[x,y]", {8, 8})},
       "= -> []",
       {"host constant [2] int32", "broadcast host [] -> [] @ mesh(x=2,y=2)"}},
      {"BroadcastTo", {T("[y]", {8}), H({4, 8})},
       "[y] host[4, 4] -> [*,y]",
       {"host constant [4, 4] int32", "local BroadcastTo [y] host [2] -> [*,y]"}},
      {"BroadcastTo", {T("[x,*]", {8, 1}), H({8, 8})},
       "[x,*] host[4, 8] -> [x,*]",
       {"host constant [4, 8] int32", "local BroadcastTo [x,*] host [2] -> [x,*]"}},
      {"BroadcastTo", {T("[x,y]", {8, 8}), H({2, 8, 8})},
       "[x,y] host[2, 4, 4] -> [*,x,y]",
       {"host constant [2, 4, 4] int32", "local BroadcastTo [x,y] host [3] -> [*,x,y]"}},
      {"Tile", {T("[x,y]", {8, 8}), H({1, 1})},
       "[x,y] host -> [x,y]",
       {"local Tile [x,y] host [2] -> [x,y]"}},
      {"Tile", {T("[x,y]", {8, 8}), H({1, 3})},
       "[x,*] host -> [x,*]",
       {"all-gather axis 1 [x,y] -> [x,*]", "local Tile [x,*] host [2] -> [x,*]"}},
      {"Tile", {T("[x,y]", {8, 8}), H({2, 1})},
       "[*,y] host -> [*,y]",
       {"all-gather axis 0 [x,y] -> [*,y]", "local Tile [*,y] host [2] -> [*,y]"}},
      {"Tile", {T("[x,y]", {8, 8}), H({2, 2})},
       "[*,*] host -> [*,*]",
       {"all-gather axis 0 [x,y] -> [*,y]", "all-gather axis 1 [*,y] -> [*,*]",
        "local Tile [*,*] host [2] -> [*,*]"}},
      {"BroadcastGradientArgs", {H({2, 1}), H({2, 1})},
       "host host -> [*] [*]",
       {"host constant [] int32", "broadcast host [0] -> [*] @ mesh(x=2,y=2)",
        "host constant [] int32", "broadcast host [0] -> [*] @ mesh(x=2,y=2)"}},
      {"ConcatOffset", {H({1}), H({2, 3}), H({2, 5})}, "host host host -> [*] [*]",
       {"host constant [0, 0] int32", "broadcast host [2] -> [*] @ mesh(x=2,y=2)",
        "host constant [0, 3] int32", "broadcast host [2] -> [*] @ mesh(x=2,y=2)"}},
      {"InvertPermutation", {H({1, 0})}, "host -> [*]",
       {"host constant [1, 0] int32", "broadcast host [2] -> [*] @ mesh(x=2,y=2)"}},
  };
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}), rows);
}

TEST(ShapeRules, BroadcastToTakesTheRequestedShardingOfNewAxes) {
  testing::OpCase op("BroadcastTo", MakeMesh({{"x", 2}, {"y", 2}}));
  op.In("[y]", {8}).Host({4, 8}).Requested("[x,*]");
  EXPECT_EQ(op.PlanString(), "[y] host[2, 4] -> [x,y]");
  EXPECT_LINES(op.Collectives(), {});
}

// Backward: Reshape has no backward half, so it asks nothing.
TEST(ShapeRules, Backward) {
  CheckBackwardTable(MakeMesh({{"x", 2}, {"y", 2}}), {
      {"Transpose", {T("[*,*]", {8, 4}), H({1, 0})}, {"[x,y]"}, "[y,x] -"},
      {"Transpose", {T("[*,*,*]", {2, 4, 8}), H({2, 0, 1})}, {"[*,y,x]"}, "[y,x,*] -"},
      {"ExpandDims", {T("[*,*]", {8, 4}), HScalar(1)}, {"[x,*,y]"}, "[x,y] -"},
      {"Squeeze", {T("[*,*,*]", {8, 1, 4})}, {"[x,y]"}, "[x,*,y]"},
      {"BroadcastTo", {T("[*]", {8}), H({4, 8})}, {"[x,y]"}, "[y] -"},
      {"BroadcastTo", {T("[*,*]", {1, 8}), H({4, 8})}, {"[x,y]"}, "[*,y] -"},
      {"Reshape", {T("[*,*]", {8, 4}), H({32})}, {"[x]"}, "- -"},
      {"Tile", {T("[*,*]", {8, 4}), H({1, 2})}, {"[x,y]"}, "[x,*] -"},
  });
}

}  // namespace
}  // namespace tf_dtensor
