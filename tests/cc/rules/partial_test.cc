// Pending reductions through rules (PlanOp): linear ops keep them, nonlinear ones get
// their inputs reduced first, and contractions defer theirs inside tf.function.
#include "tests/cc/rules/rule_testing.h"

namespace tf_dtensor {
namespace {

using testing::MakeMesh;
using testing::OpCase;

const PartialSpec kSumY{1, ReduceOp::kSum};
const PartialSpec kMaxY{1, ReduceOp::kMax};

TEST(PartialRules, LinearOpsKeepPendingReductions) {
  for (const char* type : {"CPU", "GPU"}) {
    SCOPED_TRACE(type);
    Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}}, type);
    {
      OpCase add("AddV2", mesh);
      add.In("[x,*]", {4, 6}).Pending({kSumY}).In("[x,*]", {4, 6}).Pending({kSumY});
      EXPECT_EQ(add.PlanString(),
                "[x,*] +partial(y:sum) [x,*] +partial(y:sum) -> [x,*] +partial(y:sum)");
      EXPECT_LINES(add.Collectives(), {"outputs stay partial(y:sum)"});
      EXPECT_LINES(add.Steps(), {"local AddV2 [x,*] +partial(y:sum) [x,*] +partial(y:sum) -> "
                                 "[x,*] +partial(y:sum)"});
    }
    {
      // matmul(P, R) stays partial; the rows stay sharded.
      OpCase mm("MatMul", mesh);
      mm.In("[x,*]", {4, 6}).Pending({kSumY}).In("[*,*]", {6, 3});
      EXPECT_EQ(mm.PlanString(), "[x,*] +partial(y:sum) [*,*] -> [x,*] +partial(y:sum)");
    }
    {
      // A max passes through reduce_max but not through a sum.
      OpCase max("Max", mesh);
      max.In("[*,*]", {4, 6}).Pending({kMaxY}).Host({1});
      EXPECT_EQ(max.PlanString(), "[*,*] +partial(y:max) host -> [*] +partial(y:max)");
      OpCase sum("Sum", mesh);
      sum.In("[*,*]", {4, 6}).Pending({kMaxY}).Host({1});
      EXPECT_EQ(sum.PlanString(), "[*,*] host -> [*]");
      EXPECT_LINES(sum.Collectives(), {"input 0: all-reduce(max) [*,*] +partial(y:max) over y"});
    }
  }
}

TEST(PartialRules, NonlinearOpsReduceFirst) {
  Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}});
  OpCase relu("Relu", mesh);
  relu.In("[x,*]", {4, 6}).Pending({kSumY});
  EXPECT_EQ(relu.PlanString(), "[x,*] -> [x,*]");
  EXPECT_LINES(relu.Steps(), {"all-reduce(sum) [x,*] +partial(y:sum) over y",
                              "local Relu [x,*] -> [x,*]"});
  // P * P is not linear in either; P + R would count R once per device.
  OpCase mul("Mul", mesh);
  mul.In("[*,*]", {4, 6}).Pending({kSumY}).In("[*,*]", {4, 6}).Pending({kSumY});
  EXPECT_EQ(mul.PlanString(), "[*,*] [*,*] -> [*,*]");
  OpCase add("AddV2", mesh);
  add.In("[*,*]", {4, 6}).Pending({kSumY}).In("[*,*]", {4, 6});
  EXPECT_EQ(add.PlanString(), "[*,*] [*,*] -> [*,*]");
}

TEST(PartialRules, ContractionsDeferTheirReductionInsideFunctions) {
  Mesh mesh = MakeMesh({{"x", 2}}, "GPU");
  OpCase eager("MatMul", mesh);
  eager.In("[*,x]", {4, 8}).In("[x,*]", {8, 4});
  EXPECT_EQ(eager.PlanString(), "[*,x] [x,*] -> [*,*]");
  EXPECT_LINES(eager.Steps(), {"local MatMul [*,x] [x,*] -> [*,*]", "all-reduce(sum) [*,*] over x"});
  OpCase deferred("MatMul", mesh);
  deferred.In("[*,x]", {4, 8}).In("[x,*]", {8, 4}).KeepPartial();
  EXPECT_EQ(deferred.PlanString(), "[*,x] [x,*] -> [*,*] +partial(x:sum)");
  EXPECT_LINES(deferred.Steps(), {"local MatMul [*,x] [x,*] -> [*,*] +partial(x:sum)"});
  // Mean over a sharded axis defers its sum too, as its plan (and explain) says: each
  // device divides its own term by the global count.
  OpCase mean("Mean", mesh);
  mean.In("[x,*]", {8, 4}).Host({0}).KeepPartial().OutShapes({{4}});
  std::vector<std::string> steps = mean.Steps();
  ASSERT_TRUE(!steps.empty());
  EXPECT_EQ(steps.back(), "local Div [*] +partial(x:sum) [] -> [*] +partial(x:sum) T=float32");
  for (const std::string& step : steps) EXPECT_EQ(step.find("all-reduce"), std::string::npos);
}

}  // namespace
}  // namespace tf_dtensor
