// Golden tables for ops on a SparseTensor's components with a dense DTensor
// (cc/rules/sparse_rules.cc): the nonzeros pass through or give partial sums, what the
// coordinates index is read whole.
#include "tests/cc/rules/rule_testing.h"

namespace tf_dtensor {
namespace {

using testing::CheckRuleTable;
using testing::H;
using testing::MakeMesh;
using testing::T;

TEST(SparseRules, DenseOperandIsReadWholeAndNonzerosKeepTheirSharding) {
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}), {
      {"SparseDenseCwiseMul",
       {T("[x,*]", {6, 2}, TF_INT64), T("[x]", {6}), H({5, 4}), T("[*,y]", {5, 4})},
       "[x,*] [x] host [*,*] -> [x]",
       {"all-gather axis 1 [*,y] -> [*,*]",
        "local SparseDenseCwiseMul [x,*] [x] host [2] [*,*] -> [x]"}},
      // Values sharded, indices not: the indices are sliced to match (free).
      {"SparseDenseCwiseDiv",
       {T("[*,*]", {6, 2}, TF_INT64), T("[y]", {6}), H({5, 4}), T("[*]", {4})},
       "[y,*] [y] host [*] -> [y]",
       {"slice axis 0 over y [*,*] -> [y,*]",
        "local SparseDenseCwiseDiv [y,*] [y] host [2] [*] -> [y]"}},
  });
}

TEST(SparseRules, SparseTensorDenseAddIsMadeWhole) {
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}), {
      {"SparseTensorDenseAdd",
       {T("[*,*]", {6, 2}, TF_INT64), T("[*]", {6}), H({5, 4}), T("[x,y]", {5, 4})},
       "[*,*] [*] host [*,*] -> [*,*]",
       {"all-gather axis 0 [x,y] -> [*,y]", "all-gather axis 1 [*,y] -> [*,*]",
        "local SparseTensorDenseAdd [*,*] [*] host [2] [*,*] -> [*,*]"}},
  });
}

TEST(SparseRules, SparseReduceSumOfShardedNonzerosIsAPartialSum) {
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}), {
      {"SparseReduceSum",
       {T("[x,*]", {6, 3}, TF_INT64), T("[x]", {6}), H({5, 4, 3}), H({1})},
       "[x,*] [x] host host -> [*,*]",
       {"local SparseReduceSum [x,*] [x] host [3] host [1] -> [*,*]",
        "all-reduce(sum) [*,*] over x"}},
      {"SparseReduceSum",
       {T("[x,*]", {6, 3}, TF_INT64), T("[x]", {6}), H({5, 4, 3}), H({-1, 0})},
       "[x,*] [x] host host -> [*,*,*]",
       {"local SparseReduceSum [x,*] [x] host [3] host [2] -> [*,*,*]",
        "all-reduce(sum) [*,*,*] over x"},
       {{"keep_dims", true}}},
      // No axes: the op reduces none (the dense value, duplicates summed).
      {"SparseReduceSum",
       {T("[*,*]", {6, 3}, TF_INT64), T("[y]", {6}), H({5, 4, 3}), H({})},
       "[y,*] [y] host host -> [*,*,*]",
       {"slice axis 0 over y [*,*] -> [y,*]",
        "local SparseReduceSum [y,*] [y] host [3] host [0] -> [*,*,*]",
        "all-reduce(sum) [*,*,*] over y"}},
      {"SparseReduceSum",
       {T("[*,*]", {6, 3}, TF_INT64), T("[*]", {6}), H({5, 4, 3}), H({3})},
       "error",
       {"'SparseReduceSum'", "reduction axis 3", "rank 3", "layout [*,*]", "[-3, 3)"}},
  });
}

// A position without a nonzero gives 0 (not the lowest value) in SparseReduceMax: each
// device's maximum alone would be wrong where the others' are negative, so the nonzeros
// are gathered.
TEST(SparseRules, SparseReduceMaxGathersTheNonzeros) {
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}), {
      {"SparseReduceMax",
       {T("[x,*]", {6, 3}, TF_INT64), T("[x]", {6}), H({5, 4, 3}), H({1})},
       "[*,*] [*] host host -> [*,*]",
       {"all-gather axis 0 [x,*] -> [*,*]", "all-gather axis 0 [x] -> [*]",
        "local SparseReduceMax [*,*] [*] host [3] host [1] -> [*,*]"}},
  });
}

// The sum of two SparseTensors has a count of nonzeros known only at run time: its
// operands are read whole, the result is whole on every device.
TEST(SparseRules, SparseAddIsMadeWhole) {
  CheckRuleTable(MakeMesh({{"x", 2}}), {
      {"SparseAdd",
       {T("[x,*]", {6, 2}, TF_INT64), T("[x]", {6}), H({5, 4}), T("[*,*]", {3, 2}, TF_INT64),
        T("[x]", {3}), H({5, 4}), T("[]", {})},
       "[*,*] [*] host [*,*] [*] host [] -> [*,*] [*] [*]",
       {"all-gather axis 0 [x,*] -> [*,*]", "all-gather axis 0 [x] -> [*]",
        "all-gather axis 0 [x] -> [*]",
        "local SparseAdd [*,*] [*] host [2] [*,*] [*] host [2] [] -> [*,*] [*] [*]"}},
  });
}

}  // namespace
}  // namespace tf_dtensor
