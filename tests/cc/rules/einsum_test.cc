// Golden tables for Einsum (cc/rules/einsum_rules.cc): the plan Forward makes and the
// program Expand writes, on 1-D and 2-D meshes.
#include "tests/cc/rules/rule_testing.h"

namespace tf_dtensor {
namespace {

using testing::CheckBackwardTable;
using testing::CheckRuleTable;
using testing::MakeMesh;
using testing::RuleRow;
using testing::T;

RuleRow Einsum(const std::string& equation, std::vector<testing::Arg> args, std::string plan,
               std::vector<std::string> steps) {
  return RuleRow{"Einsum", std::move(args), std::move(plan), std::move(steps), {}, {},
                 {{"equation", equation}}};
}

TEST(EinsumRules, TwoDimensionalMesh) {
  CheckRuleTable(
      MakeMesh({{"x", 2}, {"y", 2}}),
      {
          // Pass-through letters carry their sharding to the output.
          Einsum("ij,jk->ik", {T("[x,*]", {8, 4}), T("[*,y]", {4, 8})}, "[x,*] [*,y] -> [x,y]",
                 {"local Einsum [x,*] [*,y] -> [x,y]"}),
          // A contracted letter sharded: partial sums, all-reduced.
          Einsum("ij,jk->ik", {T("[y,x]", {8, 4}), T("[x,*]", {4, 8})}, "[y,x] [x,*] -> [y,*]",
                 {"local Einsum [y,x] [x,*] -> [y,*]", "all-reduce(sum) [y,*] over x"}),
          // One side of the contraction sharded: the other is sliced to match.
          Einsum("ij,jk->ik", {T("[*,x]", {8, 4}), T("[*,*]", {4, 8})}, "[*,x] [x,*] -> [*,*]",
                 {"slice axis 0 over x [*,*] -> [x,*]", "local Einsum [*,x] [x,*] -> [*,*]",
                  "all-reduce(sum) [*,*] over x"}),
          // Attention scores and output.
          Einsum("bqhd,bkhd->bhqk", {T("[x,*,y,*]", {2, 4, 2, 4}), T("[x,*,y,*]", {2, 6, 2, 4})},
                 "[x,*,y,*] [x,*,y,*] -> [x,y,*,*]",
                 {"local Einsum [x,*,y,*] [x,*,y,*] -> [x,y,*,*]"}),
          Einsum("bhqk,bkhd->bqhd", {T("[x,*,*,y]", {2, 2, 4, 6}), T("[x,y,*,*]", {2, 6, 2, 4})},
                 "[x,*,*,y] [x,y,*,*] -> [x,*,*,*]",
                 {"local Einsum [x,*,*,y] [x,y,*,*] -> [x,*,*,*]",
                  "all-reduce(sum) [x,*,*,*] over y"}),
          // Full reduction: partial over every sharded mesh dimension.
          Einsum("ij->", {T("[x,y]", {8, 4})}, "[x,y] -> []",
                 {"local Einsum [x,y] -> []", "all-reduce(sum) [] over x,y"}),
          Einsum("ij->ji", {T("[x,y]", {8, 4})}, "[x,y] -> [y,x]",
                 {"local Einsum [x,y] -> [y,x]"}),
          Einsum("i,j->ij", {T("[y]", {8}), T("[x]", {4})}, "[y] [x] -> [y,x]",
                 {"local Einsum [y] [x] -> [y,x]"}),
          // A diagonal: the repeated letter is gathered, the others keep their sharding.
          Einsum("iij->ij", {T("[x,*,y]", {2, 2, 8})}, "[*,*,y] -> [*,y]",
                 {"all-gather axis 0 [x,*,y] -> [*,*,y]", "local Einsum [*,*,y] -> [*,y]"}),
          // A letter repeated in the output writes a diagonal: replicated.
          Einsum("ij->iij", {T("[x,y]", {2, 8})}, "[*,y] -> [*,*,y]",
                 {"all-gather axis 0 [x,y] -> [*,y]", "local Einsum [*,y] -> [*,*,y]"}),
          // Ellipsis: aligned from the right; a size-1 broadcast axis stays unsharded.
          Einsum("...ij,...jk->...ik", {T("[x,*,y]", {2, 4, 8}), T("[y,*]", {8, 4})},
                 "[x,*,y] [y,*] -> [x,*,*]",
                 {"local Einsum [x,*,y] [y,*] -> [x,*,*]", "all-reduce(sum) [x,*,*] over y"}),
          Einsum("...ij,...jk->...ik", {T("[*,*,*,*]", {2, 1, 4, 8}), T("[x,*,*]", {4, 8, 4})},
                 "[*,*,*,*] [x,*,*] -> [*,x,*,*]",
                 {"local Einsum [*,*,*,*] [x,*,*] -> [*,x,*,*]"}),
          // Errors name the op and the equation.
          Einsum("ij,jk", {T("[*,*]", {8, 4}), T("[*,*]", {4, 8})}, "error",
                 {"'Einsum'", "exactly one \"->\""}),
          Einsum("ijk->ik", {T("[*,*]", {8, 4})}, "error",
                 {"'Einsum'", "input 0 (shape [8, 4], layout [*,*])", "its rank is 2"}),
          Einsum("ij->iz", {T("[*,*]", {8, 4})}, "error", {"'Einsum'", "output letter 'z'"}),
          Einsum("...ij->ij", {T("[*,*,*]", {2, 8, 4})}, "error",
                 {"'Einsum'", "no \"...\" in its output"}),
      });
}

TEST(EinsumRules, OneDimensionalMesh) {
  CheckRuleTable(
      MakeMesh({{"x", 2}}),
      {
          Einsum("i,i->", {T("[x]", {8}), T("[*]", {8})}, "[x] [x] -> []",
                 {"slice axis 0 over x [*] -> [x]", "local Einsum [x] [x] -> []",
                  "all-reduce(sum) [] over x"}),
          // Output order decides: b (second operand) takes x before q does.
          Einsum("bqhd,bkhd->bhqk", {T("[*,x,*,*]", {2, 4, 2, 4}), T("[x,*,*,*]", {2, 6, 2, 4})},
                 "[x,*,*,*] [x,*,*,*] -> [x,*,*,*]",
                 {"all-to-all axis 1 -> 0 [*,x,*,*] -> [x,*,*,*]",
                  "local Einsum [x,*,*,*] [x,*,*,*] -> [x,*,*,*]"}),
          Einsum("ii->i", {T("[x,*]", {4, 4})}, "[*,*] -> [*]",
                 {"all-gather axis 0 [x,*] -> [*,*]", "local Einsum [*,*] -> [*]"}),
      });
}

// Inside tf.function a contraction's reduction stays pending; a pending sum on an input
// passes through (einsum is linear in each operand).
TEST(EinsumRules, PartialResults) {
  const Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}});
  testing::OpCase kept("Einsum", mesh);
  kept.In("[*,x]", {8, 4}).In("[x,*]", {4, 8}).Str("equation", "ij,jk->ik").KeepPartial();
  EXPECT_EQ(kept.PlanString(), "[*,x] [x,*] -> [*,*] +partial(x:sum)");
  EXPECT_LINES(kept.Steps(), {"local Einsum [*,x] [x,*] -> [*,*] +partial(x:sum)"});

  testing::OpCase passed("Einsum", mesh);
  passed.In("[*,*]", {8, 4})
      .Pending({PartialSpec{1, ReduceOp::kSum}})
      .In("[*,*]", {4, 8})
      .Str("equation", "ij,jk->ik");
  EXPECT_EQ(passed.PlanString(), "[*,*] +partial(y:sum) [*,*] -> [*,*] +partial(y:sum)");
  EXPECT_LINES(passed.Collectives(), {"outputs stay partial(y:sum)"});
}

// Each letter is a factor: passed through, contracted (partial sums), or gathered when it
// repeats (a diagonal).
TEST(EinsumRules, FactorsOfEquations) {
  const std::vector<RuleRow> rows = {
      {"Einsum", {T("[x,*]", {8, 8}), T("[*,y]", {8, 8})},
       "[x,*] [*,y] -> [x,y]",
       {"local Einsum [x,*] [*,y] -> [x,y]"},
       {}, {}, {{"equation", "ij,jk->ik"}}},
      {"Einsum", {T("[*,x]", {8, 8}), T("[x,y]", {8, 8})},
       "[*,x] [x,y] -> [*,y]",
       {"local Einsum [*,x] [x,y] -> [*,y]", "all-reduce(sum) [*,y] over x"},
       {}, {}, {{"equation", "ij,jk->ik"}}},
      {"Einsum", {T("[*,x]", {8, 8}), T("[*,*]", {8, 8})},
       "[*,x] [x,*] -> [*,*]",
       {"slice axis 0 over x [*,*] -> [x,*]", "local Einsum [*,x] [x,*] -> [*,*]",
        "all-reduce(sum) [*,*] over x"},
       {}, {}, {{"equation", "ij,jk->ik"}}},
      {"Einsum", {T("[x,*,*,y]", {2, 4, 2, 4}), T("[x,*,*,y]", {2, 6, 2, 4})},
       "[x,*,*,y] [x,*,*,y] -> [x,*,*,*]",
       {"local Einsum [x,*,*,y] [x,*,*,y] -> [x,*,*,*]", "all-reduce(sum) [x,*,*,*] over y"},
       {}, {}, {{"equation", "bqhd,bkhd->bhqk"}}},
      {"Einsum", {T("[x,*,y,*]", {2, 4, 2, 4}), T("[*,*,*,*]", {2, 6, 2, 4})},
       "[x,*,y,*] [x,*,y,*] -> [x,y,*,*]",
       {"slice axis 0 over x [*,*,*,*] -> [x,*,*,*]", "slice axis 2 over y [x,*,*,*] -> [x,*,y,*]",
        "local Einsum [x,*,y,*] [x,*,y,*] -> [x,y,*,*]"},
       {}, {}, {{"equation", "bqhd,bkhd->bhqk"}}},
      {"Einsum", {T("[x,y,*,*]", {2, 2, 4, 6}), T("[x,*,y,*]", {2, 6, 2, 4})},
       "[x,y,*,*] [x,*,y,*] -> [x,*,y,*]",
       {"local Einsum [x,y,*,*] [x,*,y,*] -> [x,*,y,*]"},
       {}, {}, {{"equation", "bhqk,bkhd->bqhd"}}},
      {"Einsum", {T("[*,x,*,*]", {2, 4, 2, 4}), T("[x,*,*,*]", {2, 6, 2, 4})},
       "[x,*,*,*] [x,*,*,*] -> [x,*,*,*]",
       {"all-to-all axis 1 -> 0 [*,x,*,*] -> [x,*,*,*]",
        "local Einsum [x,*,*,*] [x,*,*,*] -> [x,*,*,*]"},
       {}, {}, {{"equation", "bqhd,bkhd->bhqk"}}},
      {"Einsum", {T("[x,y]", {8, 8})},
       "[x,y] -> [y,x]",
       {"local Einsum [x,y] -> [y,x]"},
       {}, {}, {{"equation", "ij->ji"}}},
      {"Einsum", {T("[x,y]", {8, 8})},
       "[x,y] -> []",
       {"local Einsum [x,y] -> []", "all-reduce(sum) [] over x,y"},
       {}, {}, {{"equation", "ij->"}}},
      {"Einsum", {T("[x]", {8}), T("[*]", {8})},
       "[x] [x] -> []",
       {"slice axis 0 over x [*] -> [x]", "local Einsum [x] [x] -> []", "all-reduce(sum) [] over x"},
       {}, {}, {{"equation", "i,i->"}}},
      {"Einsum", {T("[y]", {8}), T("[x]", {8})},
       "[y] [x] -> [y,x]",
       {"local Einsum [y] [x] -> [y,x]"},
       {}, {}, {{"equation", "i,j->ij"}}},
      {"Einsum", {T("[x,y]", {8, 8})},
       "[*,*] -> [*]",
       {"all-gather axis 0 [x,y] -> [*,y]", "all-gather axis 1 [*,y] -> [*,*]",
        "local Einsum [*,*] -> [*]"},
       {}, {}, {{"equation", "ii->i"}}},
      {"Einsum", {T("[x,*,y]", {2, 2, 8})},
       "[*,*,y] -> [*,y]",
       {"all-gather axis 0 [x,*,y] -> [*,*,y]", "local Einsum [*,*,y] -> [*,y]"},
       {}, {}, {{"equation", "iij->ij"}}},
      {"Einsum", {T("[x]", {8})},
       "[*] -> [*,*]",
       {"all-gather axis 0 [x] -> [*]", "local Einsum [*] -> [*,*]"},
       {}, {}, {{"equation", "i->ii"}}},
      {"Einsum", {T("[x,*,y]", {2, 4, 8}), T("[y,*]", {8, 4})},
       "[x,*,y] [y,*] -> [x,*,*]",
       {"local Einsum [x,*,y] [y,*] -> [x,*,*]", "all-reduce(sum) [x,*,*] over y"},
       {}, {}, {{"equation", "...ij,...jk->...ik"}}},
      {"Einsum", {T("[*,*,*,*]", {2, 1, 4, 8}), T("[x,*,*]", {3, 8, 4})},
       "[*,*,*,*] [x,*,*] -> [*,x,*,*]",
       {"local Einsum [*,*,*,*] [x,*,*] -> [*,x,*,*]"},
       {}, {}, {{"equation", "...ij,...jk->...ik"}}},
  };
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}), rows);
  CheckRuleTable(MakeMesh({{"x", 2}}), {
      {"Einsum", {T("[*,x,*,*]", {2, 4, 2, 4}), T("[*,x,*,*]", {2, 6, 2, 4})},
       "[*,x,*,*] [*,*,*,*] -> [*,*,x,*]",
       {"all-gather axis 1 [*,x,*,*] -> [*,*,*,*]", "local Einsum [*,x,*,*] [*,*,*,*] -> [*,*,x,*]"},
       {}, {}, {{"equation", "bqhd,bkhd->bhqk"}}},
  });
}

TEST(EinsumRules, Backward) {
  CheckBackwardTable(MakeMesh({{"x", 2}, {"y", 2}}), {
      {"Einsum",
       {T("[*,*]", {8, 4}), T("[*,*]", {4, 6})},
       {"[x,y]"}, "[x,*] [*,y]", {}, {}, {{"equation", "ij,jk->ik"}}},
      {"Einsum",
       {T("[*,*,*,*]", {2, 4, 2, 4}), T("[*,*,*,*]", {2, 6, 2, 4})},
       {"[x,y,*,*]"}, "[x,*,y,*] [x,*,y,*]", {}, {}, {{"equation", "bqhd,bkhd->bhqk"}}},
      {"Einsum",
       {T("[*,*,*,*]", {2, 2, 4, 6}), T("[*,*,*,*]", {2, 6, 2, 4})},
       {"[x,*,y,*]"}, "[x,y,*,*] [x,*,y,*]", {}, {}, {{"equation", "bhqk,bkhd->bqhd"}}},
      {"Einsum", {T("[*,*]", {8, 4})}, {"[x,y]"}, "[y,x]", {}, {}, {{"equation", "ij->ji"}}},
      {"Einsum", {T("[*,*]", {8, 4})}, {"[y]"}, "[y,*]", {}, {}, {{"equation", "ij->i"}}},
      {"Einsum",
       {T("[*]", {4}), T("[*]", {8})}, {"[x,y]"}, "[x] [y]", {}, {}, {{"equation", "i,j->ij"}}},
      {"Einsum",
       {T("[*,*,*]", {2, 2, 8})}, {"[x,y]"}, "[*,*,y]", {}, {}, {{"equation", "iij->ij"}}},
      {"Einsum",
       {T("[*,*,*,*]", {2, 1, 4, 8}), T("[*,*,*]", {4, 8, 4})},
       {"[x,y,*,*]"}, "[x,*,*,*] [y,*,*]", {}, {}, {{"equation", "...ij,...jk->...ik"}}},
  });
}

}  // namespace
}  // namespace tf_dtensor
