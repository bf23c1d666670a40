// Batch-parallel ops: leading batch axes pass through sharded, trailing core axes gathered.
#include "tests/cc/rules/rule_testing.h"

namespace tf_dtensor {
namespace {

using testing::CheckRuleTable;
using testing::H;
using testing::HScalar;
using testing::MakeMesh;
using testing::OpCase;
using testing::T;

TEST(BatchParallelRules, Plans) {
  for (const char* type : {"CPU", "GPU"}) {
    SCOPED_TRACE(type);
    CheckRuleTable(
        MakeMesh({{"x", 2}, {"y", 2}}, type),
        {
            {"Cholesky", {T("[x,*,y]", {4, 3, 3})}, "[x,*,*] -> [x,*,*]",
             {"all-gather axis 2 [x,*,y] -> [x,*,*]", "local Cholesky [x,*,*] -> [x,*,*]"}},
            // Uneven batch (3 over x=2) stays sharded.
            {"MatrixInverse", {T("[x,y,*]", {3, 4, 4})}, "[x,*,*] -> [x,*,*]",
             {"all-gather axis 1 [x,y,*] -> [x,*,*]", "local MatrixInverse [x,*,*] -> [x,*,*]"}},
            {"MatrixDeterminant", {T("[y,x,*,*]", {2, 2, 4, 4})}, "[y,x,*,*] -> [y,x]",
             {"local MatrixDeterminant [y,x,*,*] -> [y,x]"}},
            {"Qr", {T("[x,*,*]", {4, 4, 3})}, "[x,*,*] -> [x,*,*] [x,*,*]",
             {"local Qr [x,*,*] -> [x,*,*] [x,*,*]"}},
            {"Svd", {T("[*,x,y]", {4, 4, 3})}, "[*,*,*] -> [*,*] [*,*,*] [*,*,*]",
             {"all-gather axis 1 [*,x,y] -> [*,*,y]", "all-gather axis 2 [*,*,y] -> [*,*,*]",
              "local Svd [*,*,*] -> [*,*] [*,*,*] [*,*,*]"}},
            {"SelfAdjointEigV2", {T("[y,*,*]", {4, 3, 3})}, "[y,*,*] -> [y,*] [y,*,*]",
             {"local SelfAdjointEigV2 [y,*,*] -> [y,*] [y,*,*]"}},
            // Without compute_uv, u and v are placeholder scalars.
            {"Svd", {T("[x,*,*]", {4, 4, 3})}, "[x,*,*] -> [x,*] [] []",
             {"local Svd [x,*,*] -> [x,*] [] []"}, {{"compute_uv", false}}},
            // The second input's batch sharding is taken when the first has none.
            {"MatrixSolve", {T("[*,*,*]", {4, 3, 3}), T("[y,*,x]", {4, 3, 2})},
             "[y,*,*] [y,*,*] -> [y,*,*]",
             {"slice axis 0 over y [*,*,*] -> [y,*,*]", "all-gather axis 2 [y,*,x] -> [y,*,*]",
              "local MatrixSolve [y,*,*] [y,*,*] -> [y,*,*]"}},
            // A size-1 batch axis broadcasts and is never sharded.
            {"MatrixTriangularSolve", {T("[*,*,*]", {1, 3, 3}), T("[x,*,*]", {4, 3, 2})},
             "[*,*,*] [x,*,*] -> [x,*,*]",
             {"local MatrixTriangularSolve [*,*,*] [x,*,*] -> [x,*,*]"}},
            {"MatrixDiag", {T("[x,y]", {4, 3})}, "[x,*] -> [x,*,*]",
             {"all-gather axis 1 [x,y] -> [x,*]", "local MatrixDiag [x,*] -> [x,*,*]"}},
            {"MatrixDiagPartV3", {T("[x,*,*]", {4, 3, 3}), H({-1, 1}), T("[]", {})},
             "[x,*,*] host [] -> [x,*,*]",
             {"local MatrixDiagPartV3 [x,*,*] host [2] [] -> [x,*,*]"}},
            {"MatrixDiagPartV3", {T("[x,*,*]", {4, 3, 3}), HScalar(0), T("[]", {})},
             "[x,*,*] host [] -> [x,*]", {"local MatrixDiagPartV3 [x,*,*] host [] [] -> [x,*]"}},
            {"MatrixBandPart", {T("[x,y,*]", {4, 3, 3}), HScalar(1), HScalar(0)},
             "[x,*,*] host host -> [x,*,*]",
             {"all-gather axis 1 [x,y,*] -> [x,*,*]",
              "local MatrixBandPart [x,*,*] host [] host [] -> [x,*,*]"}},
            // Images: each channel alone, so channels keep their sharding.
            {"ResizeBilinear", {T("[x,*,*,y]", {4, 4, 4, 2}), H({8, 8})},
             "[x,*,*,y] host -> [x,*,*,y]",
             {"local ResizeBilinear [x,*,*,y] host [2] -> [x,*,*,y]"}},
            {"ResizeBilinear", {T("[*,x,*,y]", {4, 4, 4, 2}), H({8, 8})},
             "[*,*,*,y] host -> [*,*,*,y]",
             {"all-gather axis 1 [*,x,*,y] -> [*,*,*,y]",
              "local ResizeBilinear [*,*,*,y] host [2] -> [*,*,*,y]"}},
            // Per pixel: only the channel axis is core.
            {"AdjustHue", {T("[x,y,*,*]", {4, 4, 4, 3}), T("[]", {})},
             "[x,y,*,*] [] -> [x,y,*,*]", {"local AdjustHue [x,y,*,*] [] -> [x,y,*,*]"}},
            // A window across channels: batch and spatial axes keep their sharding.
            {"LRN", {T("[x,*,y,*]", {4, 4, 4, 6})}, "[x,*,y,*] -> [x,*,y,*]",
             {"local LRN [x,*,y,*] -> [x,*,y,*]"}},
            {"LowerBound", {T("[x,y]", {4, 6}), T("[x,*]", {4, 3})}, "[x,*] [x,*] -> [x,*]",
             {"all-gather axis 1 [x,y] -> [x,*]", "local LowerBound [x,*] [x,*] -> [x,*]"}},
            // The argmax indices flatten h, w and c: only the batch stays sharded, and
            // not when the indices count it too.
            {"MaxPoolWithArgmax", {T("[x,*,*,y]", {4, 4, 4, 2})},
             "[x,*,*,*] -> [x,*,*,*] [x,*,*,*]",
             {"all-gather axis 3 [x,*,*,y] -> [x,*,*,*]",
              "local MaxPoolWithArgmax [x,*,*,*] -> [x,*,*,*] [x,*,*,*]"},
             {}, {}, {{"padding", "SAME"}}, {{"ksize", {1, 2, 2, 1}}, {"strides", {1, 2, 2, 1}}}},
            {"MaxPoolWithArgmax", {T("[x,*,*,y]", {4, 4, 4, 2})},
             "[*,*,*,*] -> [*,*,*,*] [*,*,*,*]",
             {"all-gather axis 0 [x,*,*,y] -> [*,*,*,y]",
              "all-gather axis 3 [*,*,*,y] -> [*,*,*,*]",
              "local MaxPoolWithArgmax [*,*,*,*] -> [*,*,*,*] [*,*,*,*]"},
             {{"include_batch_in_index", true}}, {}, {{"padding", "SAME"}},
             {{"ksize", {1, 2, 2, 1}}, {"strides", {1, 2, 2, 1}}}},
            {"Cholesky", {T("[x]", {4})}, "error", {"rank 2 or more"}},
        });
  }
}

// Range in a requested sharded layout: each device gets its own start and limit (a
// replicated vector sliced over the mesh dim) and runs Range on its block; no gather.
TEST(BatchParallelRules, RangeMakesEachBlockOnItsDevice) {
  OpCase range("Range", MakeMesh({{"x", 2}, {"y", 2}}));
  // range(1, 10, 2) = [1, 3, 5, 7, 9] in uneven blocks over y: [1, 7) and [7, 11) by 2.
  range.Host({1}).Host({10}).Host({2}).Requested("[y]");
  EXPECT_EQ(range.PlanString(), "host host host -> [y]");
  EXPECT_LINES(range.Steps(), {"host constant [1, 7] int32",
                               "broadcast host [2] -> [*] @ mesh(x=2,y=2)",
                               "slice axis 0 over y [*] -> [y]",
                               "host constant [] int32",
                               "local Reshape [y] host [0] -> [] T=int32 Tshape=int32",
                               "host constant [7, 11] int32",
                               "broadcast host [2] -> [*] @ mesh(x=2,y=2)",
                               "slice axis 0 over y [*] -> [y]",
                               "host constant [] int32",
                               "local Reshape [y] host [0] -> [] T=int32 Tshape=int32",
                               "local Range [] [] host [1] -> [y]"});

  OpCase plain("Range", MakeMesh({{"x", 2}}));
  plain.Host({0}).Host({10}).Host({1});
  EXPECT_EQ(plain.PlanString(), "host host host -> [*]");
}

TEST(BatchParallelRules, TensorStridedSliceUpdateKeepsWholeAxesSharded) {
  // x[:, 2:6] = v: axis 0 whole (stays sharded, each device slices rows [0, 2) of its
  // block), axis 1 cut (gathered); v follows x.
  OpCase update("TensorStridedSliceUpdate", MakeMesh({{"x", 2}, {"y", 2}}));
  update.In("[x,y]", {4, 8}).Host({0, 2}).Host({0, 6}).Host({1, 1}).In("[*,*]", {4, 4});
  update.Int("begin_mask", 1).Int("end_mask", 1);
  EXPECT_EQ(update.PlanString(), "[x,*] host[0, 2] host[2, 6] host [x,*] -> [x,*]");
  // The input unsharded: the value's sharding of a whole axis is taken.
  OpCase from_value("TensorStridedSliceUpdate", MakeMesh({{"x", 2}, {"y", 2}}));
  from_value.In("[*,*]", {4, 8}).Host({0, 2}).Host({0, 6}).Host({1, 1}).In("[y,*]", {4, 4});
  from_value.Int("begin_mask", 1).Int("end_mask", 1);
  EXPECT_EQ(from_value.PlanString(), "[y,*] host[0, 2] host[2, 6] host [y,*] -> [y,*]");
}

TEST(BatchParallelRules, BitcastAddsOrReadsTheByteAxis) {
  const Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}});
  OpCase same("Bitcast", mesh);
  same.In("[x,y]", {4, 8}).Type("T", TF_FLOAT).Type("type", TF_INT32);
  EXPECT_EQ(same.PlanString(), "[x,y] -> [x,y]");
  OpCase smaller("Bitcast", mesh);
  smaller.In("[x,y]", {4, 8}).Type("T", TF_FLOAT).Type("type", TF_UINT8);
  EXPECT_EQ(smaller.PlanString(), "[x,y] -> [x,y,*]");
  OpCase larger("Bitcast", mesh);
  larger.In("[x,*,y]", {4, 8, 4}, TF_UINT8).Type("T", TF_UINT8).Type("type", TF_FLOAT);
  EXPECT_EQ(larger.PlanString(), "[x,*,*] -> [x,*]");
}

}  // namespace
}  // namespace tf_dtensor
