// Batch norm (norm_rules.cc) over sharded axes: synchronised statistics and pass-through
// channels. Steps are the expansion on a RecordingBuilder, so they show every local op and
// collective.
#include "tests/cc/rules/rule_testing.h"

namespace tf_dtensor {
namespace {

using testing::MakeMesh;
using testing::OpCase;

// The collectives among `steps`.
std::vector<std::string> CollectiveSteps(const std::vector<std::string>& steps) {
  std::vector<std::string> out;
  for (const std::string& s : steps) {
    if (s.rfind("all-reduce", 0) == 0 || s.rfind("all-gather", 0) == 0) out.push_back(s);
  }
  return out;
}

// FusedBatchNorm*: x [4,2,2,4] NHWC, scale and offset laid out as `c`, empty statistics.
void BatchNormInputs(OpCase& op, const std::string& x, const std::string& c, bool v3 = true) {
  op.In(x, {4, 2, 2, 4}).In(c, {4}).In(c, {4}).In("[*]", {0}).In("[*]", {0});
  if (v3) {
    op.OutShapes({{4, 2, 2, 4}, {4}, {4}, {4}, {4}, {0}});
  } else {
    op.OutShapes({{4, 2, 2, 4}, {4}, {4}, {4}, {4}});
  }
}

// FusedBatchNormGradV3: dy and x [4,2,2,4], scale and reserve spaces laid out as `c`.
void BatchNormGradInputs(OpCase& op, const std::string& x, const std::string& c) {
  op.In(x, {4, 2, 2, 4}).In(x, {4, 2, 2, 4}).In(c, {4}).In(c, {4}).In(c, {4}).In("[*]", {0});
  op.OutShapes({{4, 2, 2, 4}, {4}, {4}, {0}, {0}});
}

TEST(NormRules, SynchronisedBatchNorm) {
  OpCase op("FusedBatchNormV3", MakeMesh({{"x", 2}, {"y", 2}}));
  BatchNormInputs(op, "[x,*,*,y]", "[y]");
  EXPECT_EQ(op.PlanString(), "[x,*,*,y] [y] [y] [*] [*] -> [x,*,*,y] [y] [y] [y] [y] [*]");
  EXPECT_LINES(op.Collectives(), {"all-reduce(sum) of the batch mean over x",
                                  "all-reduce(sum) of the batch variance over x"});
  // Global count 4*2*2 = 16; the mean, then the centred squares (two passes); epsilon
  // 1e-4 bitcast from its bits; batch_variance divides by 15 (Bessel).
  EXPECT_LINES(op.Steps(), {"host constant [16] int64",
                   "local Cast host [] -> [] SrcT=int64 DstT=float32",
                   "host constant [0, 1, 2] int32",
                   "local Sum [x,*,*,y] host [3] -> [*,*,*,y] T=float32 Tidx=int32 keep_dims=true",
                   "all-reduce(sum) [*,*,*,y] over x",
                   "local RealDiv [*,*,*,y] [] -> [*,*,*,y] T=float32",
                   "local Sub [x,*,*,y] [*,*,*,y] -> [x,*,*,y] T=float32",
                   "local Square [x,*,*,y] -> [x,*,*,y] T=float32",
                   "host constant [0, 1, 2] int32",
                   "local Sum [x,*,*,y] host [3] -> [*,*,*,y] T=float32 Tidx=int32 keep_dims=true",
                   "all-reduce(sum) [*,*,*,y] over x",
                   "local RealDiv [*,*,*,y] [] -> [*,*,*,y] T=float32",
                   "host constant [953267991] int32",
                   "local Bitcast host [] -> [] T=int32 type=float32",
                   "local AddV2 [*,*,*,y] [] -> [*,*,*,y] T=float32",
                   "local Rsqrt [*,*,*,y] -> [*,*,*,y] T=float32",
                   "host constant [1, 1, 1, -1] int32",
                   "local Reshape [y] host [4] -> [*,*,*,y] T=float32 Tshape=int32",
                   "host constant [1, 1, 1, -1] int32",
                   "local Reshape [y] host [4] -> [*,*,*,y] T=float32 Tshape=int32",
                   "local Mul [*,*,*,y] [*,*,*,y] -> [*,*,*,y] T=float32",
                   "local Mul [x,*,*,y] [*,*,*,y] -> [x,*,*,y] T=float32",
                   "local AddV2 [x,*,*,y] [*,*,*,y] -> [x,*,*,y] T=float32",
                   "host constant [-1] int32",
                   "local Reshape [*,*,*,y] host [1] -> [y] T=float32 Tshape=int32",
                   "host constant [-1] int32",
                   "local Reshape [*,*,*,y] host [1] -> [y] T=float32 Tshape=int32",
                   "host constant [15] int64",
                   "local Cast host [] -> [] SrcT=int64 DstT=float32",
                   "host constant [-1] int32",
                   "local Reshape [*,*,*,y] host [1] -> [y] T=float32 Tshape=int32",
                   "local RealDiv [y] [] -> [y] T=float32",
                   "host constant [] int32",
                   "local Cast host [0] -> [*] SrcT=int32 DstT=float32"});
}

TEST(NormRules, ChannelsOnlyIsLocal) {
  const Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}});
  OpCase v3("FusedBatchNormV3", mesh);
  BatchNormInputs(v3, "[*,*,*,y]", "[y]");
  EXPECT_LINES(v3.Collectives(), {});
  OpCase v2("FusedBatchNormV2", mesh);
  BatchNormInputs(v2, "[*,*,*,y]", "[y]", /*v3=*/false);
  EXPECT_EQ(v2.PlanString(), "[*,*,*,y] [y] [y] [*] [*] -> [*,*,*,y] [y] [y] [y] [y]");
  EXPECT_LINES(v2.Steps(),
               {"local FusedBatchNormV2 [*,*,*,y] [y] [y] [*] [*] -> [*,*,*,y] [y] [y] [y] [y]"});
}

TEST(NormRules, Gradients) {
  const Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}});
  OpCase training("FusedBatchNormGradV3", mesh);
  BatchNormGradInputs(training, "[x,*,*,y]", "[y]");
  EXPECT_EQ(training.PlanString(), "[x,*,*,y] [x,*,*,y] [y] [y] [y] = -> [x,*,*,y] [y] [y] [*] [*]");
  const std::vector<std::string> synchronised = {
      "all-reduce(sum) of the batch mean over x", "all-reduce(sum) of the batch variance over x",
      "all-reduce(sum) of sum(dy) over x", "all-reduce(sum) of sum(dy * x_hat) over x"};
  EXPECT_LINES(training.Collectives(), synchronised);
  EXPECT_LINES(CollectiveSteps(training.Steps()),
               {"all-reduce(sum) [*,*,*,y] over x", "all-reduce(sum) [*,*,*,y] over x",
                "all-reduce(sum) [*,*,*,y] over x", "all-reduce(sum) [*,*,*,y] over x"});

  OpCase inference("FusedBatchNormGradV3", mesh);
  BatchNormGradInputs(inference, "[x,*,*,y]", "[y]");
  inference.Bool("is_training", false);
  EXPECT_LINES(inference.Collectives(),
               {"all-reduce(sum) of output 1 over x", "all-reduce(sum) of output 2 over x"});
  EXPECT_LINES(CollectiveSteps(inference.Steps()),
               {"all-reduce(sum) [*,*,*,y] over x", "all-reduce(sum) [*,*,*,y] over x"});

  OpCase deferred("FusedBatchNormGradV3", mesh);
  BatchNormGradInputs(deferred, "[x,*,*,y]", "[y]");
  deferred.Bool("is_training", false).KeepPartial();
  // Inside tf.function the scale/offset gradients' sums stay pending.
  EXPECT_EQ(deferred.PlanString(),
            "[x,*,*,y] [x,*,*,y] [y] [y] [y] = -> [x,*,*,y] [y] +partial(x:sum) "
            "[y] +partial(x:sum) [*] [*]");
  EXPECT_LINES(CollectiveSteps(deferred.Steps()), {});
}

TEST(NormRules, BadFormat) {
  OpCase op("FusedBatchNormV3", MakeMesh({{"x", 2}}));
  op.In("[x,*,*]", {4, 2, 4}).In("[*]", {4}).In("[*]", {4}).In("[*]", {0}).In("[*]", {0});
  EXPECT_EQ(op.PlanString(),
            "error: 'FusedBatchNormV3' with data_format NHWC needs x of rank 4; got input 0 "
            "(shape [4, 2, 4], layout [x,*,*]) of 'FusedBatchNormV3'.");
}

}  // namespace
}  // namespace tf_dtensor
