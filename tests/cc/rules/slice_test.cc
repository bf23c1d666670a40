// Golden tables for StridedSlice, StridedSliceGrad, Slice, Pad, MirrorPadGrad, ReverseV2,
// Roll and ReverseSequence
// (cc/rules/slice_rules.cc): axes cut, padded or reversed are gathered; whole axes keep
// their sharding.
#include "tests/cc/rules/rule_testing.h"

namespace tf_dtensor {
namespace {

using testing::CheckBackwardTable;
using testing::CheckRuleTable;
using testing::H;
using testing::MakeMesh;
using testing::RuleRow;
using testing::T;

TEST(SliceRules, TwoDimensionalMesh) {
  const std::vector<RuleRow> rows = {
      {"StridedSlice", {T("[x,y]", {8, 8}), H({0, 2}), H({0, 6}), H({1, 1})},
       "[x,*] host[0, 2] host[4, 6] host -> [x,*]",
       {"all-gather axis 1 [x,y] -> [x,*]", "host constant [0, 2] int32",
        "host constant [4, 6] int32",
        "local StridedSlice [x,*] host [2] host [2] host [2] -> [x,*]"},
       {}, {{"begin_mask", 1}, {"end_mask", 1}}},
      {"StridedSlice", {T("[x,y]", {8, 8}), H({2}), H({6}), H({1})},
       "[*,y] host[2] host[6] host -> [*,y]",
       {"all-gather axis 0 [x,y] -> [*,y]", "host constant [2] int32", "host constant [6] int32",
        "local StridedSlice [*,y] host [1] host [1] host [1] -> [*,y]"}},
      {"StridedSlice", {T("[x,y]", {8, 8}), H({0, 0}), H({0, 1}), H({1, 1})},
       "[x,*] host[0, 0] host[0, 1] host -> [x]",
       {"all-gather axis 1 [x,y] -> [x,*]", "host constant [0, 0] int32",
        "host constant [0, 1] int32", "local StridedSlice [x,*] host [2] host [2] host [2] -> [x]"},
       {}, {{"ellipsis_mask", 1}, {"shrink_axis_mask", 2}}},
      {"StridedSlice", {T("[x,y]", {8, 8}), H({0, 0}), H({0, 0}), H({1, 1})},
       "[x,y] host[0, 0] host[4, 0] host -> [x,*,y]",
       {"host constant [0, 0] int32", "host constant [4, 0] int32",
        "local StridedSlice [x,y] host [2] host [2] host [2] -> [x,*,y]"},
       {}, {{"begin_mask", 1}, {"end_mask", 1}, {"new_axis_mask", 2}}},
      {"StridedSlice", {T("[x,y]", {8, 8}), H({0, 0, 1}), H({0, 0, 0}), H({1, 1, 1})},
       "[x,*] host[0, 0, 1] host[0, 0, 0] host -> [*,x,*]",
       {"all-gather axis 1 [x,y] -> [x,*]", "host constant [0, 0, 1] int32",
        "host constant [0, 0, 0] int32",
        "local StridedSlice [x,*] host [3] host [3] host [3] -> [*,x,*]"},
       {}, {{"new_axis_mask", 1}, {"ellipsis_mask", 2}, {"end_mask", 4}}},
      {"StridedSlice", {T("[x,y]", {8, 8}), H({0}), H({0}), H({-1})},
       "[*,y] host[0] host[0] host -> [*,y]",
       {"all-gather axis 0 [x,y] -> [*,y]", "host constant [0] int32", "host constant [0] int32",
        "local StridedSlice [*,y] host [1] host [1] host [1] -> [*,y]"},
       {}, {{"begin_mask", 1}, {"end_mask", 1}}},
      {"StridedSlice", {T("[x,y]", {8, 8}), H({0, -100}), H({8, 100}), H({1, 1})},
       "[x,y] host[0, 0] host[4, 4] host -> [x,y]",
       {"host constant [0, 0] int32", "host constant [4, 4] int32",
        "local StridedSlice [x,y] host [2] host [2] host [2] -> [x,y]"}},
      {"StridedSliceGrad", {H({8, 8}), H({0, 2}), H({0, 6}), H({1, 1}), T("[x,y]", {8, 4})},
       "host[4, 8] host[0, 2] host[4, 6] host [x,*] -> [x,*]",
       {"host constant [4, 8] int32", "host constant [0, 2] int32", "host constant [4, 6] int32",
        "all-gather axis 1 [x,y] -> [x,*]",
        "local StridedSliceGrad host [2] host [2] host [2] host [2] [x,*] -> [x,*]"},
       {}, {{"begin_mask", 1}, {"end_mask", 1}}},
      {"Slice", {T("[x,y]", {8, 8}), H({0, 0}), H({-1, -1})},
       "[x,y] host host[-1, -1] -> [x,y]",
       {"host constant [-1, -1] int32", "local Slice [x,y] host [2] host [2] -> [x,y]"}},
      {"Slice", {T("[x,y]", {8, 8}), H({0, 2}), H({8, 4})},
       "[x,*] host host[-1, 4] -> [x,*]",
       {"all-gather axis 1 [x,y] -> [x,*]", "host constant [-1, 4] int32",
        "local Slice [x,*] host [2] host [2] -> [x,*]"}},
      {"Slice", {T("[x,y]", {8, 8}), H({1, 0}), H({2, 8})},
       "[*,y] host host[2, -1] -> [*,y]",
       {"all-gather axis 0 [x,y] -> [*,y]", "host constant [2, -1] int32",
        "local Slice [*,y] host [2] host [2] -> [*,y]"}},
      {"Pad", {T("[x,y]", {8, 8}), H({0, 0, 1, 1})},
       "[x,*] host -> [x,*]",
       {"all-gather axis 1 [x,y] -> [x,*]", "local Pad [x,*] host [4] -> [x,*]"}},
      {"MirrorPad", {T("[x,y]", {8, 8}), H({0, 0, 1, 1})},
       "[x,*] host -> [x,*]",
       {"all-gather axis 1 [x,y] -> [x,*]", "local MirrorPad [x,*] host [4] -> [x,*]"}},
      {"ReverseV2", {T("[x,y]", {8, 8}), H({0})},
       "[*,y] host -> [*,y]",
       {"all-gather axis 0 [x,y] -> [*,y]", "local ReverseV2 [*,y] host [1] -> [*,y]"}},
      {"MirrorPadGrad", {T("[x,y]", {8, 10}), H({0, 0, 1, 1})},
       "[x,*] host -> [x,*]",
       {"all-gather axis 1 [x,y] -> [x,*]", "local MirrorPadGrad [x,*] host [4] -> [x,*]"}},
      {"Roll", {T("[x,y]", {8, 8}), H({3}), H({1})},
       "[x,*] host host -> [x,*]",
       {"all-gather axis 1 [x,y] -> [x,*]", "local Roll [x,*] host [1] host [1] -> [x,*]"}},
      // The lengths follow the batch axis.
      {"ReverseSequence", {T("[x,y,*]", {4, 8, 2}), T("[*]", {4}, TF_INT32)},
       "[x,*,*] [x] -> [x,*,*]",
       {"all-gather axis 1 [x,y,*] -> [x,*,*]", "slice axis 0 over x [*] -> [x]",
        "local ReverseSequence [x,*,*] [x] -> [x,*,*]"},
       {}, {{"seq_dim", 1}, {"batch_dim", 0}}},
  };
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}), rows);
}

TEST(SliceRules, Backward) {
  CheckBackwardTable(MakeMesh({{"x", 2}, {"y", 2}}), {
      {"Pad", {T("[*,*]", {8, 4}), H({0, 0, 1, 1})}, {"[x,y]"}, "[x,*] -"},
      {"ReverseV2", {T("[*,*]", {8, 4}), H({0})}, {"[x,y]"}, "[*,y] -"},
  });
}

}  // namespace
}  // namespace tf_dtensor
