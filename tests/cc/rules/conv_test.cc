// Golden tables for convolutions and pooling (cc/rules/conv_rules.cc): batch and channels
// sharded, spatial axes kept sharded with a halo exchange (cc/spmd/halo.cc) or gathered,
// shape arguments made local.
#include "tests/cc/rules/rule_testing.h"

namespace tf_dtensor {
namespace {

using testing::CheckBackwardTable;
using testing::CheckRuleTable;
using testing::H;
using testing::MakeMesh;
using testing::OpCase;
using testing::RuleRow;
using testing::T;

const std::vector<int64_t> kX = {4, 6, 6, 4};
const std::vector<int64_t> kW = {3, 3, 4, 4};

const std::vector<RuleRow>& Rows2x2() {
  static const auto* rows = new std::vector<RuleRow>{
      // Batch: no communication.
      {"Conv2D", {T("[x,*,*,*]", kX), T("[*,*,*,*]", kW)},
       "[x,*,*,*] [*,*,*,*] -> [x,*,*,*]",
       {"local Conv2D [x,*,*,*] [*,*,*,*] -> [x,*,*,*]"}},
      // Output channels.
      {"Conv2D", {T("[x,*,*,*]", kX), T("[*,*,*,y]", kW)},
       "[x,*,*,*] [*,*,*,y] -> [x,*,*,y]",
       {"local Conv2D [x,*,*,*] [*,*,*,y] -> [x,*,*,y]"}},
      // Input channels: partial sums; the filter is sliced to match.
      {"Conv2D", {T("[x,*,*,y]", kX), T("[*,*,*,*]", kW)},
       "[x,*,*,y] [*,*,y,*] -> [x,*,*,*]",
       {"slice axis 2 over y [*,*,*,*] -> [*,*,y,*]",
        "local Conv2D [x,*,*,y] [*,*,y,*] -> [x,*,*,*]", "all-reduce(sum) [x,*,*,*] over y"}},
      // Without the op's padding and strides (no attributes here) the window is unknown:
      // spatial axes and the filter window are gathered.
      {"Conv2D", {T("[*,x,y,*]", kX), T("[y,*,*,*]", kW)},
       "[*,*,*,*] [*,*,*,*] -> [*,*,*,*]",
       {"all-gather axis 1 [*,x,y,*] -> [*,*,y,*]", "all-gather axis 2 [*,*,y,*] -> [*,*,*,*]",
        "all-gather axis 0 [y,*,*,*] -> [*,*,*,*]",
        "local Conv2D [*,*,*,*] [*,*,*,*] -> [*,*,*,*]"}},
      // input_sizes is global; each device computes its batch block.
      {"Conv2DBackpropInput", {H(kX), T("[*,*,*,*]", kW), T("[x,*,*,*]", kX)},
       "host[2, 6, 6, 4] [*,*,*,*] [x,*,*,*] -> [x,*,*,*]",
       {"host constant [2, 6, 6, 4] int32",
        "local Conv2DBackpropInput host [4] [*,*,*,*] [x,*,*,*] -> [x,*,*,*]"}},
      // The filter's output channels are contracted.
      {"Conv2DBackpropInput", {H(kX), T("[*,*,*,y]", kW), T("[x,*,*,y]", kX)},
       "host[2, 6, 6, 4] [*,*,*,y] [x,*,*,y] -> [x,*,*,*]",
       {"host constant [2, 6, 6, 4] int32",
        "local Conv2DBackpropInput host [4] [*,*,*,y] [x,*,*,y] -> [x,*,*,*]",
        "all-reduce(sum) [x,*,*,*] over y"}},
      // A weight gradient under a sharded batch: a partial sum over the batch.
      {"Conv2DBackpropFilter", {T("[x,*,*,*]", kX), H(kW), T("[x,*,*,*]", kX)},
       "[x,*,*,*] host[3, 3, 4, 4] [x,*,*,*] -> [*,*,*,*]",
       {"host constant [3, 3, 4, 4] int32",
        "local Conv2DBackpropFilter [x,*,*,*] host [4] [x,*,*,*] -> [*,*,*,*]",
        "all-reduce(sum) [*,*,*,*] over x"}},
      {"Conv2DBackpropFilter", {T("[x,*,*,y]", kX), H(kW), T("[x,*,*,*]", kX)},
       "[x,*,*,y] host[3, 3, 2, 4] [x,*,*,*] -> [*,*,y,*]",
       {"host constant [3, 3, 2, 4] int32",
        "local Conv2DBackpropFilter [x,*,*,y] host [4] [x,*,*,*] -> [*,*,y,*]",
        "all-reduce(sum) [*,*,y,*] over x"}},
      // Depthwise: channels pass through, the multiplier stays whole (the filter's y moves
      // from the multiplier to the channels).
      {"DepthwiseConv2dNative", {T("[x,*,*,y]", kX), T("[*,*,*,y]", {3, 3, 4, 2})},
       "[x,*,*,y] [*,*,y,*] -> [x,*,*,y]",
       {"all-to-all axis 3 -> 2 [*,*,*,y] -> [*,*,y,*]",
        "local DepthwiseConv2dNative [x,*,*,y] [*,*,y,*] -> [x,*,*,y]"}},
      // Pooling: batch and channels pass through.
      {"MaxPool", {T("[x,*,*,y]", kX)}, "[x,*,*,y] -> [x,*,*,y]",
       {"local MaxPool [x,*,*,y] -> [x,*,*,y]"}},
      {"AvgPool", {T("[x,y,*,*]", kX)}, "[x,*,*,*] -> [x,*,*,*]",
       {"all-gather axis 1 [x,y,*,*] -> [x,*,*,*]", "local AvgPool [x,*,*,*] -> [x,*,*,*]"}},
      {"MaxPoolGrad", {T("[x,*,*,y]", kX), T("[x,*,*,*]", {4, 3, 3, 4}),
                       T("[x,*,*,y]", {4, 3, 3, 4})},
       "[x,*,*,y] [x,*,*,y] [x,*,*,y] -> [x,*,*,y]",
       {"slice axis 3 over y [x,*,*,*] -> [x,*,*,y]",
        "local MaxPoolGrad [x,*,*,y] [x,*,*,y] [x,*,*,y] -> [x,*,*,y]"}},
      {"AvgPoolGrad", {H(kX), T("[x,*,*,y]", {4, 3, 3, 4})},
       "host[2, 6, 6, 2] [x,*,*,y] -> [x,*,*,y]",
       {"host constant [2, 6, 6, 2] int32", "local AvgPoolGrad host [4] [x,*,*,y] -> [x,*,*,y]"}},
      {"Conv2D", {T("[x,*,*,*,*]", {4, 2, 6, 6, 4}), T("[*,*,*,*]", kW)}, "error",
       {"'Conv2D'", "rank 4"}},
  };
  return *rows;
}

TEST(ConvRules, TwoDimensionalCpuMesh) { CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}), Rows2x2()); }

TEST(ConvRules, TwoDimensionalGpuMesh) {
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}, "GPU"), Rows2x2());
}

TEST(ConvRules, UnevenBatchStaysWholeUnderALocalShapeArgument) {
  // One local input_sizes serves every device, so a batch of 3 over x=2 is gathered.
  CheckRuleTable(
      MakeMesh({{"x", 2}}),
      {{"Conv2DBackpropInput", {H({3, 6, 6, 4}), T("[*,*,*,*]", kW), T("[x,*,*,*]", {3, 6, 6, 4})},
        "host[3, 6, 6, 4] [*,*,*,*] [*,*,*,*] -> [*,*,*,*]",
        {"host constant [3, 6, 6, 4] int32", "all-gather axis 0 [x,*,*,*] -> [*,*,*,*]",
         "local Conv2DBackpropInput host [4] [*,*,*,*] [*,*,*,*] -> [*,*,*,*]"}}});
}

const std::vector<int64_t> kX8 = {2, 8, 6, 3};
const std::vector<int64_t> kW3 = {3, 3, 3, 4};
const std::map<std::string, std::vector<int64_t>> kStride1 = {{"strides", {1, 1, 1, 1}}};

TEST(ConvRules, SpatialAxesStayShardedWithAHalo) {
  const std::map<std::string, std::string> same = {{"padding", "SAME"}};
  const std::map<std::string, std::string> valid = {{"padding", "VALID"}};
  CheckRuleTable(
      MakeMesh({{"x", 2}}),
      {// SAME, k=3: the last row of the previous block (rows -1:, all-gathered, shifted
       // by one strip with zeros in front, sliced back over x), the first row of the next
       // one likewise, then w padded locally and the op run with VALID padding.
       {"Conv2D", {T("[*,x,*,*]", kX8), T("[*,*,*,*]", kW3)},
        "[*,x,*,*] [*,*,*,*] -> [*,x,*,*]",
        {
        "host constant [0, -1, 0, 0] int64",
        "host constant [0, 0, 0, 0] int64",
        "host constant [1, 1, 1, 1] int64",
        "local StridedSlice [*,x,*,*] host [4] host [4] host [4] -> [*,x,*,*]"
        " Index=int64 begin_mask=13 end_mask=15 ellipsis_mask=0 new_axis_mask=0"
        " shrink_axis_mask=0 T=float32",
        "all-gather axis 1 [*,x,*,*] -> [*,*,*,*]",
        "host constant [0, 0, 0, 0] int64",
        "host constant [0, 1, 0, 0] int64",
        "host constant [1, 1, 1, 1] int64",
        "local StridedSlice [*,*,*,*] host [4] host [4] host [4] -> [*,*,*,*]"
        " Index=int64 begin_mask=13 end_mask=13 ellipsis_mask=0 new_axis_mask=0"
        " shrink_axis_mask=0 T=float32",
        "local ZerosLike [*,*,*,*] -> [*,*,*,*] T=float32",
        "host constant [0, 0, 0, 0] int64",
        "host constant [0, 1, 0, 0] int64",
        "host constant [1, 1, 1, 1] int64",
        "local StridedSlice [*,*,*,*] host [4] host [4] host [4] -> [*,*,*,*]"
        " Index=int64 begin_mask=13 end_mask=13 ellipsis_mask=0 new_axis_mask=0"
        " shrink_axis_mask=0 T=float32",
        "host constant [1] int32",
        "local ConcatV2 [*,*,*,*] [*,*,*,*] host [] -> [*,*,*,*] Tidx=int32 N=2 T=float32",
        "slice axis 1 over x [*,*,*,*] -> [*,x,*,*]",
        "host constant [0, 0, 0, 0] int64",
        "host constant [0, 1, 0, 0] int64",
        "host constant [1, 1, 1, 1] int64",
        "local StridedSlice [*,x,*,*] host [4] host [4] host [4] -> [*,x,*,*]"
        " Index=int64 begin_mask=13 end_mask=13 ellipsis_mask=0 new_axis_mask=0"
        " shrink_axis_mask=0 T=float32",
        "all-gather axis 1 [*,x,*,*] -> [*,*,*,*]",
        "host constant [0, 0, 0, 0] int64",
        "host constant [0, 1, 0, 0] int64",
        "host constant [1, 1, 1, 1] int64",
        "local StridedSlice [*,*,*,*] host [4] host [4] host [4] -> [*,*,*,*]"
        " Index=int64 begin_mask=13 end_mask=13 ellipsis_mask=0 new_axis_mask=0"
        " shrink_axis_mask=0 T=float32",
        "local ZerosLike [*,*,*,*] -> [*,*,*,*] T=float32",
        "host constant [0, 1, 0, 0] int64",
        "host constant [0, 0, 0, 0] int64",
        "host constant [1, 1, 1, 1] int64",
        "local StridedSlice [*,*,*,*] host [4] host [4] host [4] -> [*,*,*,*]"
        " Index=int64 begin_mask=13 end_mask=15 ellipsis_mask=0 new_axis_mask=0"
        " shrink_axis_mask=0 T=float32",
        "host constant [1] int32",
        "local ConcatV2 [*,*,*,*] [*,*,*,*] host [] -> [*,*,*,*] Tidx=int32 N=2 T=float32",
        "slice axis 1 over x [*,*,*,*] -> [*,x,*,*]",
        "host constant [1] int32",
        "local ConcatV2 [*,x,*,*] [*,x,*,*] [*,x,*,*] host [] -> [*,x,*,*]"
        " Tidx=int32 N=3 T=float32",
        "host constant [0, 0, 0, 0, 1, 1, 0, 0] int64",
        "local Pad [*,x,*,*] host [4, 2] -> [*,x,*,*] Tpaddings=int64 T=float32",
        "local Conv2D [*,x,*,*] [*,*,*,*] -> [*,x,*,*] padding=VALID"}, {}, {}, same, kStride1},
       // VALID, k=3: 6 output rows in blocks of 3 start at input rows 0 and 3, the input
       // blocks at 0 and 4: h is gathered.
       {"Conv2D", {T("[*,x,*,*]", kX8), T("[*,*,*,*]", kW3)},
        "[*,*,*,*] [*,*,*,*] -> [*,*,*,*]",
        {"all-gather axis 1 [*,x,*,*] -> [*,*,*,*]",
         "local Conv2D [*,*,*,*] [*,*,*,*] -> [*,*,*,*]"},
        {}, {}, valid, kStride1}});
}

// How many steps of `steps` start with `prefix`.
int CountSteps(const std::vector<std::string>& steps, const std::string& prefix) {
  int n = 0;
  for (const std::string& s : steps) n += s.rfind(prefix, 0) == 0;
  return n;
}

TEST(ConvRules, SpatialHalosOfPoolingAndGradients) {
  const Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}});
  {
    // Max pooling: -inf (log of zeros) at the global edges; h over x and w over y.
    OpCase op("MaxPool", mesh);
    op.In("[*,x,y,*]", {2, 8, 8, 3}).Str("padding", "SAME").Ints("ksize", {1, 3, 3, 1})
        .Ints("strides", {1, 1, 1, 1});
    EXPECT_EQ(op.PlanString(), "[*,x,y,*] -> [*,x,y,*]");
    EXPECT_LINES(op.Collectives(),
                 {"halo exchange of input 0 axis 1 over x: 1 rows before, 1 after",
                  "halo exchange of input 0 axis 2 over y: 1 rows before, 1 after"});
    const std::vector<std::string> steps = op.Steps();
    EXPECT_EQ(CountSteps(steps, "all-gather axis 1 [*,x,y,*]"), 2);
    EXPECT_EQ(CountSteps(steps, "all-gather axis 2 [*,x,y,*]"), 2);
    EXPECT_EQ(CountSteps(steps, "local Log"), 4);
    EXPECT_EQ(steps.back(), "local MaxPool [*,x,y,*] -> [*,x,y,*] padding=VALID");
  }
  {
    // The filter gradient: x with the halo, dy as it is, a partial sum over x.
    OpCase op("Conv2DBackpropFilter", mesh);
    op.In("[y,x,*,*]", kX8).Host(kW3).In("[y,x,*,*]", {2, 8, 6, 4}).Str("padding", "SAME")
        .Ints("strides", {1, 1, 1, 1});
    EXPECT_EQ(op.PlanString(), "[y,x,*,*] host[3, 3, 3, 4] [y,x,*,*] -> [*,*,*,*]");
    EXPECT_LINES(op.Collectives(),
                 {"all-reduce(sum) of output 0 over y,x",
                  "halo exchange of input 0 axis 1 over x: 1 rows before, 1 after"});
    const std::vector<std::string> steps = op.Steps();
    EXPECT_EQ(CountSteps(steps, "all-gather"), 2);
    EXPECT_EQ(steps.back(), "all-reduce(sum) [*,*,*,*] over y,x");
  }
  {
    // The input gradient: dx of the extended block [1 | 4 | 1] rows (and w padded to 8),
    // then the halo rows go back and are added to their owners' rows.
    OpCase op("Conv2DBackpropInput", mesh);
    op.Host(kX8).In("[*,*,*,*]", kW3).In("[*,x,*,*]", {2, 8, 6, 4}).Str("padding", "SAME")
        .Ints("strides", {1, 1, 1, 1});
    EXPECT_EQ(op.PlanString(), "host[2, 4, 6, 3] [*,*,*,*] [*,x,*,*] -> [*,x,*,*]");
    const std::vector<std::string> steps = op.Steps();
    EXPECT_EQ(steps.front(), "host constant [2, 6, 8, 3] int32");
    EXPECT_EQ(CountSteps(steps, "local Conv2DBackpropInput host [4] [*,*,*,*] [*,x,*,*] -> "
                                "[*,x,*,*] padding=VALID"), 1);
    EXPECT_EQ(CountSteps(steps, "all-gather axis 1"), 2);
    EXPECT_EQ(CountSteps(steps, "local AddV2"), 2);
  }
  {
    // Stride 2 over uneven blocks (7 rows: 4 + 3, output 4 rows: 2 + 2): the last
    // block needs another halo, so h is gathered and explain says why.
    OpCase op("Conv2D", MakeMesh({{"x", 2}}));
    op.In("[*,x,*,*]", {2, 7, 6, 3}).In("[*,*,*,*]", kW3).Str("padding", "SAME")
        .Ints("strides", {1, 2, 2, 1});
    EXPECT_EQ(op.PlanString(), "[*,*,*,*] [*,*,*,*] -> [*,*,*,*]");
    EXPECT_LINES(op.Collectives(),
                 {"input 0: all-gather axis 1 [*,x,*,*] -> [*,*,*,*]",
                  "spatial axis 1 of input 0 gathered over x: the last block needs another "
                  "halo than the others"});
  }
}

// Channels, batch and the window on default attributes (stride 1, VALID): spatial axes
// are gathered, input channels leave partial sums, pooling keeps batch and channels.
TEST(ConvRules, ChannelsBatchAndPooling) {
  const std::vector<RuleRow> rows = {
      {"Conv2D", {T("[x,*,*,*]", {4, 6, 6, 4}), T("[*,*,*,*]", {3, 3, 4, 4})},
       "[x,*,*,*] [*,*,*,*] -> [x,*,*,*]",
       {"local Conv2D [x,*,*,*] [*,*,*,*] -> [x,*,*,*]"}},
      {"Conv2D", {T("[*,*,*,*]", {4, 6, 6, 4}), T("[*,*,*,y]", {3, 3, 4, 4})},
       "[*,*,*,*] [*,*,*,y] -> [*,*,*,y]",
       {"local Conv2D [*,*,*,*] [*,*,*,y] -> [*,*,*,y]"}},
      {"Conv2D", {T("[x,*,*,*]", {4, 6, 6, 4}), T("[*,*,*,y]", {3, 3, 4, 4})},
       "[x,*,*,*] [*,*,*,y] -> [x,*,*,y]",
       {"local Conv2D [x,*,*,*] [*,*,*,y] -> [x,*,*,y]"}},
      {"Conv2D", {T("[*,*,*,x]", {4, 6, 6, 4}), T("[*,*,x,*]", {3, 3, 4, 4})},
       "[*,*,*,x] [*,*,x,*] -> [*,*,*,*]",
       {"local Conv2D [*,*,*,x] [*,*,x,*] -> [*,*,*,*]", "all-reduce(sum) [*,*,*,*] over x"}},
      {"Conv2D", {T("[x,*,*,y]", {4, 6, 6, 4}), T("[*,*,*,*]", {3, 3, 4, 4})},
       "[x,*,*,y] [*,*,y,*] -> [x,*,*,*]",
       {"slice axis 2 over y [*,*,*,*] -> [*,*,y,*]",
        "local Conv2D [x,*,*,y] [*,*,y,*] -> [x,*,*,*]", "all-reduce(sum) [x,*,*,*] over y"}},
      {"Conv2D", {T("[*,x,y,*]", {4, 6, 6, 4}), T("[x,*,*,*]", {3, 3, 4, 4})},
       "[*,*,*,*] [*,*,*,*] -> [*,*,*,*]",
       {"all-gather axis 1 [*,x,y,*] -> [*,*,y,*]", "all-gather axis 2 [*,*,y,*] -> [*,*,*,*]",
        "all-gather axis 0 [x,*,*,*] -> [*,*,*,*]", "local Conv2D [*,*,*,*] [*,*,*,*] -> [*,*,*,*]"}},
      {"Conv2D", {T("[x,*,*,*]", {4, 6, 6, 4}), T("[*,*,*,x]", {3, 3, 4, 4})},
       "[x,*,*,*] [*,*,*,*] -> [x,*,*,*]",
       {"all-gather axis 3 [*,*,*,x] -> [*,*,*,*]", "local Conv2D [x,*,*,*] [*,*,*,*] -> [x,*,*,*]"}},
      {"Conv2D", {T("[x,y,*,*]", {4, 4, 6, 6}), T("[*,*,*,*]", {3, 3, 4, 4})},
       "[x,y,*,*] [*,*,y,*] -> [x,*,*,*]",
       {"slice axis 2 over y [*,*,*,*] -> [*,*,y,*]",
        "local Conv2D [x,y,*,*] [*,*,y,*] -> [x,*,*,*]", "all-reduce(sum) [x,*,*,*] over y"},
       {}, {}, {{"data_format", "NCHW"}}},
      {"Conv2DBackpropInput",
       {H({4, 6, 6, 4}), T("[*,*,*,*]", {3, 3, 4, 4}), T("[x,*,*,*]", {4, 6, 6, 4})},
       "host[2, 6, 6, 4] [*,*,*,*] [x,*,*,*] -> [x,*,*,*]",
       {"host constant [2, 6, 6, 4] int32",
        "local Conv2DBackpropInput host [4] [*,*,*,*] [x,*,*,*] -> [x,*,*,*]"}},
      {"Conv2DBackpropInput",
       {H({4, 6, 6, 4}), T("[*,*,*,y]", {3, 3, 4, 4}), T("[x,*,*,y]", {4, 6, 6, 4})},
       "host[2, 6, 6, 4] [*,*,*,y] [x,*,*,y] -> [x,*,*,*]",
       {"host constant [2, 6, 6, 4] int32",
        "local Conv2DBackpropInput host [4] [*,*,*,y] [x,*,*,y] -> [x,*,*,*]",
        "all-reduce(sum) [x,*,*,*] over y"}},
      {"Conv2DBackpropFilter",
       {T("[x,*,*,*]", {4, 6, 6, 4}), H({3, 3, 4, 4}), T("[x,*,*,*]", {4, 6, 6, 4})},
       "[x,*,*,*] host[3, 3, 4, 4] [x,*,*,*] -> [*,*,*,*]",
       {"host constant [3, 3, 4, 4] int32",
        "local Conv2DBackpropFilter [x,*,*,*] host [4] [x,*,*,*] -> [*,*,*,*]",
        "all-reduce(sum) [*,*,*,*] over x"}},
      {"Conv2DBackpropFilter",
       {T("[x,*,*,y]", {4, 6, 6, 4}), H({3, 3, 4, 4}), T("[*,*,*,*]", {4, 6, 6, 4})},
       "[x,*,*,y] host[3, 3, 2, 4] [x,*,*,*] -> [*,*,y,*]",
       {"host constant [3, 3, 2, 4] int32", "slice axis 0 over x [*,*,*,*] -> [x,*,*,*]",
        "local Conv2DBackpropFilter [x,*,*,y] host [4] [x,*,*,*] -> [*,*,y,*]",
        "all-reduce(sum) [*,*,y,*] over x"}},
      {"DepthwiseConv2dNative", {T("[x,*,*,y]", {4, 6, 6, 4}), T("[*,*,*,y]", {3, 3, 4, 2})},
       "[x,*,*,y] [*,*,y,*] -> [x,*,*,y]",
       {"all-to-all axis 3 -> 2 [*,*,*,y] -> [*,*,y,*]",
        "local DepthwiseConv2dNative [x,*,*,y] [*,*,y,*] -> [x,*,*,y]"}},
      {"MaxPool", {T("[x,y,*,*]", {4, 6, 6, 4})},
       "[x,*,*,*] -> [x,*,*,*]",
       {"all-gather axis 1 [x,y,*,*] -> [x,*,*,*]", "local MaxPool [x,*,*,*] -> [x,*,*,*]"}},
      {"AvgPool", {T("[x,y,*,*]", {4, 6, 6, 4})},
       "[x,*,*,*] -> [x,*,*,*]",
       {"all-gather axis 1 [x,y,*,*] -> [x,*,*,*]", "local AvgPool [x,*,*,*] -> [x,*,*,*]"}},
      {"MaxPool", {T("[y,*,*,x]", {4, 6, 6, 4})},
       "[y,*,*,x] -> [y,*,*,x]",
       {"local MaxPool [y,*,*,x] -> [y,*,*,x]"}},
      {"AvgPool", {T("[y,*,*,x]", {4, 6, 6, 4})},
       "[y,*,*,x] -> [y,*,*,x]",
       {"local AvgPool [y,*,*,x] -> [y,*,*,x]"}},
      {"MaxPoolGrad",
       {T("[x,*,*,y]", {4, 6, 6, 4}), T("[x,*,*,*]", {4, 3, 3, 4}), T("[*,*,*,y]", {4, 3, 3, 4})},
       "[x,*,*,y] [x,*,*,y] [x,*,*,y] -> [x,*,*,y]",
       {"slice axis 3 over y [x,*,*,*] -> [x,*,*,y]", "slice axis 0 over x [*,*,*,y] -> [x,*,*,y]",
        "local MaxPoolGrad [x,*,*,y] [x,*,*,y] [x,*,*,y] -> [x,*,*,y]"}},
      {"AvgPoolGrad", {H({4, 6, 6, 4}), T("[x,*,*,y]", {4, 3, 3, 4})},
       "host[2, 6, 6, 2] [x,*,*,y] -> [x,*,*,y]",
       {"host constant [2, 6, 6, 2] int32", "local AvgPoolGrad host [4] [x,*,*,y] -> [x,*,*,y]"}},
      {"MaxPoolGradGrad",
       {T("[x,*,*,y]", {4, 6, 6, 4}), T("[x,*,*,y]", {4, 3, 3, 4}), T("[x,*,*,y]", {4, 6, 6, 4})},
       "[x,*,*,y] [x,*,*,y] [x,*,*,y] -> [x,*,*,y]",
       {"local MaxPoolGradGrad [x,*,*,y] [x,*,*,y] [x,*,*,y] -> [x,*,*,y]"}},
      {"Conv3DBackpropFilterV2",
       {T("[x,y,*,*,*]", {4, 4, 4, 4, 4}), H({2, 2, 2, 4, 4}), T("[x,*,*,*,*]", {4, 4, 4, 4, 4})},
       "[x,y,*,*,*] host[2, 2, 2, 2, 4] [x,*,*,*,*] -> [*,*,*,y,*]",
       {"host constant [2, 2, 2, 2, 4] int32",
        "local Conv3DBackpropFilterV2 [x,y,*,*,*] host [5] [x,*,*,*,*] -> [*,*,*,y,*]",
        "all-reduce(sum) [*,*,*,y,*] over x"},
       {}, {}, {{"data_format", "NCDHW"}}},
  };
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}), rows);
}

TEST(ConvRules, Backward) {
  CheckBackwardTable(MakeMesh({{"x", 2}, {"y", 2}}), {
      {"Conv2D",
       {T("[*,*,*,*]", {4, 6, 6, 4}), T("[*,*,*,*]", {3, 3, 4, 4})},
       {"[x,*,*,y]"}, "[x,*,*,*] [*,*,*,y]"},
  });
}

}  // namespace
}  // namespace tf_dtensor
