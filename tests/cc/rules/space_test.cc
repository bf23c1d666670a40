// Golden tables for SpaceToBatchND, BatchToSpaceND, SpaceToDepth and DepthToSpace
// (cc/rules/space_rules.cc): channels keep their sharding, blocked spatial axes are
// gathered, and a batch-sharded input stays batch-sharded through an all-to-all of the
// block offsets when the mesh dimension divides both the offsets and the elements.
#include "tests/cc/rules/rule_testing.h"

namespace tf_dtensor {
namespace {

using testing::CheckRuleTable;
using testing::H;
using testing::MakeMesh;
using testing::RuleRow;
using testing::T;

TEST(SpaceRules, TwoDimensionalMesh) {
  const std::vector<RuleRow> rows = {
      // Channels: local.
      {"SpaceToBatchND", {T("[*,*,*,y]", {3, 4, 4, 4}), H({2, 2}), H({0, 0, 0, 0})},
       "[*,*,*,y] host host -> [*,*,*,y]",
       {"local SpaceToBatchND [*,*,*,y] host [2] host [4] -> [*,*,*,y]"}},
      // Batch over x (4 elements, 4 offsets): one all-to-all.
      // Each device's rows (offset, own element) are its block of the view [4, 4, ...]
      // over x on the elements; the all-to-all moves x to the offsets.
      {"SpaceToBatchND", {T("[x,*,*,y]", {4, 4, 4, 4}), H({2, 2}), H({0, 0, 0, 0})},
       "[x,*,*,y] host host -> [x,*,*,y]",
       {"local SpaceToBatchND [x,*,*,y] host [2] host [4] -> [x,*,*,y]",
        "host constant [4, 2, 2, 2, 2] int32",
        "local Reshape [x,*,*,y] host [5] -> [*,x,*,*,y] T=float32 Tshape=int32",
        "all-to-all axis 1 -> 0 [*,x,*,*,y] -> [x,*,*,*,y]", "host constant [8, 2, 2, 2] int32",
        "local Reshape [x,*,*,*,y] host [4] -> [x,*,*,y] T=float32 Tshape=int32"}},
      // 3 elements over x=2: the batch is gathered.
      {"SpaceToBatchND", {T("[x,*,*,*]", {3, 4, 4, 4}), H({2, 2}), H({0, 0, 0, 0})},
       "[*,*,*,*] host host -> [*,*,*,*]",
       {"all-gather axis 0 [x,*,*,*] -> [*,*,*,*]",
        "local SpaceToBatchND [*,*,*,*] host [2] host [4] -> [*,*,*,*]"}},
      // A blocked spatial axis is gathered; a block of 1 keeps its axis.
      {"SpaceToBatchND", {T("[*,x,y,*]", {2, 4, 4, 3}), H({2, 1}), H({0, 0, 0, 0})},
       "[*,*,y,*] host host -> [*,*,y,*]",
       {"all-gather axis 1 [*,x,y,*] -> [*,*,y,*]",
        "local SpaceToBatchND [*,*,y,*] host [2] host [4] -> [*,*,y,*]"}},
      // The reverse: x moves from the offsets to the elements before the local op.
      {"BatchToSpaceND", {T("[x,*,*,y]", {8, 2, 2, 4}), H({2, 2}), H({0, 0, 0, 0})},
       "[x,*,*,y] host host -> [x,*,*,y]",
       {"host constant [2, 2, 2, 2, 2] int32",
        "local Reshape [x,*,*,y] host [5] -> [x,*,*,*,y] T=float32 Tshape=int32",
        "all-to-all axis 0 -> 1 [x,*,*,*,y] -> [*,x,*,*,y]", "host constant [4, 2, 2, 2] int32",
        "local Reshape [*,x,*,*,y] host [4] -> [x,*,*,y] T=float32 Tshape=int32",
        "local BatchToSpaceND [x,*,*,y] host [2] host [4] -> [x,*,*,y]"}},
      // One element per offset: it cannot be split over x=2.
      {"BatchToSpaceND", {T("[x,*,*,*]", {4, 2, 2, 4}), H({2, 2}), H({0, 0, 0, 0})},
       "[*,*,*,*] host host -> [*,*,*,*]",
       {"all-gather axis 0 [x,*,*,*] -> [*,*,*,*]",
        "local BatchToSpaceND [*,*,*,*] host [2] host [4] -> [*,*,*,*]"}},
      {"DepthToSpace", {T("[x,y,*,*]", {2, 2, 2, 8})}, "[x,*,*,*] -> [x,*,*,*]",
       {"all-gather axis 1 [x,y,*,*] -> [x,*,*,*]", "local DepthToSpace [x,*,*,*] -> [x,*,*,*]"},
       {}, {{"block_size", 2}}},
      {"SpaceToDepth", {T("[x,*,*,y]", {2, 4, 4, 2})}, "[x,*,*,*] -> [x,*,*,*]",
       {"all-gather axis 3 [x,*,*,y] -> [x,*,*,*]", "local SpaceToDepth [x,*,*,*] -> [x,*,*,*]"},
       {}, {{"block_size", 2}}},
      // Block shape and paddings must agree.
      {"SpaceToBatchND", {T("[x,*,*,*]", {4, 4, 4, 4}), H({2, 2, 2}), H({0, 0, 0, 0})},
       "error", {"'SpaceToBatchND' needs a block_shape"}},
  };
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}), rows);
}

}  // namespace
}  // namespace tf_dtensor
