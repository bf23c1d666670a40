// Golden tables for shape ops (cc/rules/shape_rules.cc): transpose and expand_dims.
#include "tests/cc/rules/rule_testing.h"

namespace tf_dtensor {
namespace {

using testing::CheckRuleTable;
using testing::H;
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

}  // namespace
}  // namespace tf_dtensor
