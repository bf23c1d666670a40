// Golden tables for GatherV2, OneHot and UnsortedSegmentSum (cc/rules/gather_rules.cc): the
// plan Forward makes, the program Expand writes, and what Backward asks of the inputs.
#include "tests/cc/rules/rule_testing.h"

namespace tf_dtensor {
namespace {

using testing::CheckBackwardTable;
using testing::Cat;
using testing::CheckRuleTable;
using testing::IdCheckSteps;
using testing::HScalar;
using testing::MakeMesh;
using testing::RuleRow;
using testing::T;

// An embedding lookup keeps the batch sharding of its ids; a sharded gathered axis is read
// by row block (a partial sum) when the result is no larger than the params.
TEST(GatherRules, TwoDimensionalMesh) {
  const std::vector<RuleRow> rows = {
      {"GatherV2", {T("[*,*]", {8, 8}), T("[x]", {8}, TF_INT32), HScalar(0)},
       "[*,*] [x] host -> [x,*]",
       {"local GatherV2 [*,*] [x] host [] -> [x,*]"}},
      {"GatherV2", {T("[*,y]", {8, 8}), T("[x]", {8}, TF_INT32), HScalar(0)},
       "[*,y] [x] host -> [x,y]",
       {"local GatherV2 [*,y] [x] host [] -> [x,y]"}},
      {"GatherV2", {T("[x,*]", {8, 8}), T("[*]", {8}, TF_INT32), HScalar(0)},
       "[x,*] [*] host -> [*,*]",
       Cat({{"host constant [0, 4] int32", "broadcast host [2] -> [*] @ mesh(x=2,y=2)",
        "slice axis 0 over x [*] -> [x]", "host constant [4, 8] int32",
        "broadcast host [2] -> [*] @ mesh(x=2,y=2)", "slice axis 0 over x [*] -> [x]",
        "local GreaterEqual [*] [x] -> [*] T=int32", "local Less [*] [x] -> [*] T=int32",
        "local LogicalAnd [*] [*] -> [*]", "local Sub [*] [x] -> [*] T=int32",
        "local ZerosLike [*] -> [*] T=int32", "local SelectV2 [*] [*] [*] -> [*] T=int32"},
            IdCheckSteps("[*]", "GatherV2", 8, "[x,*] @ mesh(x=2,y=2)"),
            {"local GatherV2 [x,*] [*] host [] -> [*,*]", "host constant [1] int32",
        "local ExpandDims [*] host [] -> [*,*] T=bool Tdim=int32",
        "local ZerosLike [*,*] -> [*,*] T=float32",
        "local SelectV2 [*,*] [*,*] [*,*] -> [*,*] +partial(x:sum) T=float32",
        "all-reduce(sum) [*,*] +partial(x:sum) over x"}})},
      {"GatherV2", {T("[x,y]", {8, 8}), T("[*]", {8}, TF_INT32), HScalar(1)},
       "[x,y] [*] host -> [x,*]",
       Cat({{"host constant [0, 4] int32", "broadcast host [2] -> [*] @ mesh(x=2,y=2)",
        "slice axis 0 over y [*] -> [y]", "host constant [4, 8] int32",
        "broadcast host [2] -> [*] @ mesh(x=2,y=2)", "slice axis 0 over y [*] -> [y]",
        "local GreaterEqual [*] [y] -> [*] T=int32", "local Less [*] [y] -> [*] T=int32",
        "local LogicalAnd [*] [*] -> [*]", "local Sub [*] [y] -> [*] T=int32",
        "local ZerosLike [*] -> [*] T=int32", "local SelectV2 [*] [*] [*] -> [*] T=int32"},
            IdCheckSteps("[*]", "GatherV2", 8, "[x,y] @ mesh(x=2,y=2)"),
            {"local GatherV2 [x,y] [*] host [] -> [x,*]", "host constant [0] int32",
        "local ExpandDims [*] host [] -> [*,*] T=bool Tdim=int32",
        "local ZerosLike [x,*] -> [x,*] T=float32",
        "local SelectV2 [*,*] [x,*] [x,*] -> [x,*] +partial(y:sum) T=float32",
        "all-reduce(sum) [x,*] +partial(y:sum) over y"}})},
      {"GatherV2", {T("[*,x]", {8, 8}), T("[x]", {8}, TF_INT32), HScalar(0)},
       "[*,x] [*] host -> [*,x]",
       {"all-gather axis 0 [x] -> [*]", "local GatherV2 [*,x] [*] host [] -> [*,x]"}},
      {"GatherV2", {T("[*,*,y]", {8, 8, 4}), T("[x,*]", {8, 2}, TF_INT32), HScalar(1)},
       "[x,*,y] [x,*] host -> [x,*,y]",
       {"slice axis 0 over x [*,*,y] -> [x,*,y]", "local GatherV2 [x,*,y] [x,*] host [] -> [x,*,y]"},
       {}, {{"batch_dims", 1}}},
      {"OneHot", {T("[x,y]", {8, 8}, TF_INT32), HScalar(5), T("[]", {}), T("[]", {})},
       "[x,y] host = = -> [x,y,*]",
       {"local OneHot [x,y] host [] [] [] -> [x,y,*]"},
       {}, {{"axis", -1}}},
      {"OneHot", {T("[x,y]", {8, 8}, TF_INT32), HScalar(5), T("[]", {}), T("[]", {})},
       "[x,y] host = = -> [*,x,y]",
       {"local OneHot [x,y] host [] [] [] -> [*,x,y]"},
       {}, {{"axis", 0}}},
      {"OneHot", {T("[x,y]", {8, 8}, TF_INT32), HScalar(5), T("[]", {}), T("[]", {})},
       "[x,y] host = = -> [x,*,y]",
       {"local OneHot [x,y] host [] [] [] -> [x,*,y]"},
       {}, {{"axis", 1}}},
      {"UnsortedSegmentSum", {T("[x,y]", {8, 8}), T("[*]", {8}, TF_INT32), HScalar(5)},
       "[x,y] [x] host -> [*,y]",
       {"slice axis 0 over x [*] -> [x]", "local UnsortedSegmentSum [x,y] [x] host [] -> [*,y]",
        "all-reduce(sum) [*,y] over x"}},
      // Sorted segments: the segment axis and the ids are read whole.
      {"SegmentSum", {T("[x,y]", {8, 8}), T("[x]", {8}, TF_INT32)}, "[*,y] [*] -> [*,y]",
       {"all-gather axis 0 [x,y] -> [*,y]", "all-gather axis 0 [x] -> [*]",
        "local SegmentSum [*,y] [*] -> [*,y]"}},
      {"SparseSegmentMean",
       {T("[x,y]", {8, 8}), T("[*]", {5}, TF_INT32), T("[*]", {5}, TF_INT32)},
       "[*,y] [*] [*] -> [*,y]",
       {"all-gather axis 0 [x,y] -> [*,y]", "local SparseSegmentMean [*,y] [*] [*] -> [*,y]"}},
  };
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}), rows);
}

TEST(GatherRules, Backward) {
  CheckBackwardTable(MakeMesh({{"x", 2}, {"y", 2}}), {
      {"GatherV2", {T("[*,*]", {16, 8}), T("[*]", {4}, TF_INT32), HScalar(0)},
      {"[x,y]"}, "[*,y] [x] -"},
      {"OneHot", {T("[*]", {8}, TF_INT32), HScalar(4), T("[]", {}), T("[]", {})},
      {"[x,*]"}, "[x] - - -"},
      {"UnsortedSegmentSum",
       {T("[*,*]", {8, 4}), T("[*]", {8}), HScalar(3)}, {"[*,y]"}, "[*,y] [*] -"},
  });
}

}  // namespace
}  // namespace tf_dtensor
