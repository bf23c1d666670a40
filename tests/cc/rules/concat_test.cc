// Golden tables for joining and splitting (cc/rules/concat_rules.cc).
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

TEST(ConcatRules, TwoDimensionalMesh) {
  const std::vector<RuleRow> rows = {
      // The other axes keep their sharding.
      {"ConcatV2", {T("[x,*]", {8, 4}), T("[x,*]", {8, 4}), HScalar(1)},
       "[x,*] [x,*] host -> [x,*]",
       {"local ConcatV2 [x,*] [x,*] host [] -> [x,*]"}},
      // The joined axis is gathered; other axes follow the first input that shards them.
      {"ConcatV2", {T("[x,*]", {8, 4}), T("[*,y]", {8, 4}), HScalar(0)},
       "[*,y] [*,y] host -> [*,y]",
       {"slice axis 1 over y [x,*] -> [x,y]", "all-gather axis 0 [x,y] -> [*,y]",
        "local ConcatV2 [*,y] [*,y] host [] -> [*,y]"}},
      {"ConcatV2", {T("[x,*]", {8, 4}), T("[y,*]", {8, 4}), HScalar(-1)},
       "[x,*] [x,*] host -> [x,*]",
       {"all-gather axis 0 [y,*] -> [*,*]", "slice axis 0 over x [*,*] -> [x,*]",
        "local ConcatV2 [x,*] [x,*] host [] -> [x,*]"}},
      {"Concat", {HScalar(0), T("[x,y]", {8, 4}), T("[x,y]", {8, 4})},
       "host [*,y] [*,y] -> [*,y]",
       {"all-gather axis 0 [x,y] -> [*,y]", "all-gather axis 0 [x,y] -> [*,y]",
        "local Concat host [] [*,y] [*,y] -> [*,y]"}},
      // Stacking adds an unsharded axis.
      {"Pack", {T("[x,*]", {8, 4}), T("[x,*]", {8, 4})},
       "[x,*] [x,*] -> [*,x,*]",
       {"local Pack [x,*] [x,*] -> [*,x,*]"},
       {},
       {{"axis", 0}}},
      {"Split", {HScalar(1), T("[x,y]", {8, 4})},
       "host [x,*] -> [x,*] [x,*]",
       {"all-gather axis 1 [x,y] -> [x,*]", "local Split host [] [x,*] -> [x,*] [x,*]"},
       {},
       {{"num_split", 2}}},
      {"ConcatV2", {T("[x,*]", {8, 4}), T("[x,*]", {8, 4}), HScalar(2)}, "error",
       {"'ConcatV2'", "axis 2", "out of range", "input 0 (shape [8, 4], layout [x,*])"}},
  };
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}), rows);
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}, "GPU"), rows);
}

TEST(ConcatRules, OneDimensionalMesh) {
  CheckRuleTable(MakeMesh({{"x", 2}}),
                 {
                     {"ConcatV2", {T("[x]", {8}), T("[*]", {8}), HScalar(0)},
                      "[*] [*] host -> [*]",
                      {"all-gather axis 0 [x] -> [*]", "local ConcatV2 [*] [*] host [] -> [*]"}},
                     {"ConcatV2", {T("[*,x]", {4, 8}), T("[*,*]", {4, 8}), HScalar(0)},
                      "[*,x] [*,x] host -> [*,x]",
                      {"slice axis 1 over x [*,*] -> [*,x]",
                       "local ConcatV2 [*,x] [*,x] host [] -> [*,x]"}},
                 });
}

TEST(ConcatRules, StackUnstackAndSplitV) {
  const std::vector<RuleRow> rows = {
      {"ConcatV2", {T("[x,y]", {8, 8}), T("[y,x]", {8, 8}), HScalar(1)},
       "[x,*] [x,*] host -> [x,*]",
       {"all-gather axis 1 [x,y] -> [x,*]", "all-gather axis 0 [y,x] -> [*,x]",
        "all-to-all axis 1 -> 0 [*,x] -> [x,*]", "local ConcatV2 [x,*] [x,*] host [] -> [x,*]"}},
      {"ConcatV2", {T("[*,*]", {8, 8}), T("[y,*]", {8, 8}), HScalar(-1)},
       "[y,*] [y,*] host -> [y,*]",
       {"slice axis 0 over y [*,*] -> [y,*]", "local ConcatV2 [y,*] [y,*] host [] -> [y,*]"}},
      {"Pack", {T("[x,y]", {8, 8}), T("[x,y]", {8, 8})},
       "[x,y] [x,y] -> [*,x,y]",
       {"local Pack [x,y] [x,y] -> [*,x,y]"},
       {}, {{"axis", 0}}},
      {"Pack", {T("[x,y]", {8, 8}), T("[x,y]", {8, 8})},
       "[x,y] [x,y] -> [x,*,y]",
       {"local Pack [x,y] [x,y] -> [x,*,y]"},
       {}, {{"axis", 1}}},
      {"Pack", {T("[x,y]", {8, 8}), T("[x,y]", {8, 8})},
       "[x,y] [x,y] -> [x,y,*]",
       {"local Pack [x,y] [x,y] -> [x,y,*]"},
       {}, {{"axis", 2}}},
      {"Pack", {T("[x,y]", {8, 8}), T("[x,y]", {8, 8})},
       "[x,y] [x,y] -> [x,y,*]",
       {"local Pack [x,y] [x,y] -> [x,y,*]"},
       {}, {{"axis", -1}}},
      {"Pack", {T("[x,*]", {8, 8}), T("[y,x]", {8, 8})},
       "[x,*] [x,*] -> [*,x,*]",
       {"all-gather axis 0 [y,x] -> [*,x]", "all-to-all axis 1 -> 0 [*,x] -> [x,*]",
        "local Pack [x,*] [x,*] -> [*,x,*]"},
       {}, {{"axis", 0}}},
      {"Unpack", {T("[x,y]", {8, 8})},
       "[*,y] -> [y] [y] [y] [y] [y] [y] [y] [y]",
       {"all-gather axis 0 [x,y] -> [*,y]", "local Unpack [*,y] -> [y] [y] [y] [y] [y] [y] [y] [y]"},
       {}, {{"axis", 0}, {"num", 8}}},
      {"Unpack", {T("[x,y]", {8, 8})},
       "[x,*] -> [x] [x] [x] [x] [x] [x] [x] [x]",
       {"all-gather axis 1 [x,y] -> [x,*]", "local Unpack [x,*] -> [x] [x] [x] [x] [x] [x] [x] [x]"},
       {}, {{"axis", 1}, {"num", 8}}},
      {"SplitV", {T("[x,*]", {8, 8}), H({2, 5, 1}), HScalar(1)},
       "[x,*] host host -> [x,*] [x,*] [x,*]",
       {"local SplitV [x,*] host [3] host [] -> [x,*] [x,*] [x,*]"},
       {}, {{"num_split", 3}}},
  };
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}), rows);
}

// Backward: the joined (or split) axis is never asked for sharded.
TEST(ConcatRules, Backward) {
  CheckBackwardTable(MakeMesh({{"x", 2}, {"y", 2}}), {
      {"ConcatV2",
       {T("[*,*]", {4, 8}), T("[*,*]", {4, 8}), HScalar(0)}, {"[x,y]"}, "[*,y] [*,y] -"},
      {"Pack", {T("[*]", {8}), T("[*]", {8})}, {"[*,x]"}, "[x] [x]", {}, {{"axis", 0}}},
      {"Split",
       {HScalar(1), T("[*,*]", {8, 4})}, {"[x,y]", "[x,y]"}, "- [x,*]", {}, {{"num_split", 2}}},
  });
}

}  // namespace
}  // namespace tf_dtensor
