// Fourier transforms: the transformed axes run unsharded; their shardings move as in
// TensorFlow's DTensor (forward: one axis right, inverse: one axis left; the one pushed out
// goes to the nearest unsharded axis on the left, or is dropped).
#include "tests/cc/rules/rule_testing.h"

namespace tf_dtensor {
namespace {

using testing::MakeMesh;
using testing::OpCase;

struct FftCase {
  const char* op;
  const char* in;
  std::vector<int64_t> shape;
  std::vector<int64_t> fft_length;  // RFFT/IRFFT only
  std::vector<int64_t> out_shape;
  const char* plan;
  std::vector<std::string> steps;
};

void Check(const Mesh& mesh, const FftCase& c) {
  SCOPED_TRACE(std::string(c.op) + c.in);
  OpCase op(c.op, mesh);
  op.In(c.in, c.shape, TF_COMPLEX64);
  if (!c.fft_length.empty()) op.Host(c.fft_length);
  op.OutShapes({c.out_shape});
  EXPECT_EQ(op.PlanString(), c.plan);
  EXPECT_LINES(op.Steps(), c.steps);
}

TEST(FftRules, ShardingsMoveAsInTensorFlow) {
  for (const char* type : {"CPU", "GPU"}) {
    SCOPED_TRACE(type);
    const Mesh mesh = MakeMesh({{"b", 2}, {"x", 2}, {"y", 2}}, type);
    const std::vector<FftCase> cases = {
        // 1-D: the last axis's mesh dim goes to the nearest free axis on its left.
        {"FFT", "[*,*,y]", {4, 8, 8}, {}, {4, 8, 8}, "[*,y,*] -> [*,y,*]",
         {"all-to-all axis 2 -> 1 [*,*,y] -> [*,y,*]", "local FFT [*,y,*] -> [*,y,*]"}},
        {"RFFT", "[*,x,y]", {4, 8, 8}, {8}, {4, 8, 5}, "[y,x,*] host -> [y,x,*]",
         {"all-to-all axis 2 -> 0 [*,x,y] -> [y,x,*]",
          "local RFFT [y,x,*] host [1] -> [y,x,*]"}},
        // No free axis: dropped.
        {"FFT", "[b,x,y]", {4, 8, 8}, {}, {4, 8, 8}, "[b,x,*] -> [b,x,*]",
         {"all-gather axis 2 [b,x,y] -> [b,x,*]", "local FFT [b,x,*] -> [b,x,*]"}},
        // 2-D forward: the block [x,y] becomes [*,x]; y goes to axis 0.
        {"FFT2D", "[*,x,y]", {4, 8, 8}, {}, {4, 8, 8}, "[y,*,*] -> [y,*,x]",
         {"all-to-all axis 2 -> 0 [*,x,y] -> [y,x,*]", "all-gather axis 1 [y,x,*] -> [y,*,*]",
          "local FFT2D [y,*,*] -> [y,*,*]", "slice axis 2 over x [y,*,*] -> [y,*,x]"}},
        {"FFT2D", "[*,x,*]", {4, 8, 8}, {}, {4, 8, 8}, "[*,*,*] -> [*,*,x]",
         {"all-gather axis 1 [*,x,*] -> [*,*,*]", "local FFT2D [*,*,*] -> [*,*,*]",
          "slice axis 2 over x [*,*,*] -> [*,*,x]"}},
        // 2-D inverse mirrors it.
        {"IFFT2D", "[*,x,y]", {4, 8, 8}, {}, {4, 8, 8}, "[x,*,*] -> [x,y,*]",
         {"all-to-all axis 1 -> 0 [*,x,y] -> [x,*,y]", "all-gather axis 2 [x,*,y] -> [x,*,*]",
          "local IFFT2D [x,*,*] -> [x,*,*]", "slice axis 1 over y [x,*,*] -> [x,y,*]"}},
        {"IFFT2D", "[*,x,*]", {4, 8, 8}, {}, {4, 8, 8}, "[*,*,*] -> [*,x,*]",
         {"all-gather axis 1 [*,x,*] -> [*,*,*]", "local IFFT2D [*,*,*] -> [*,*,*]",
          "slice axis 1 over x [*,*,*] -> [*,x,*]"}},
        // 3-D: the block shifts right by one; y is pushed out to axis 0.
        {"FFT3D", "[*,b,x,y]", {4, 4, 4, 4}, {}, {4, 4, 4, 4}, "[y,*,*,*] -> [y,*,b,x]",
         {"all-to-all axis 3 -> 0 [*,b,x,y] -> [y,b,x,*]",
          "all-gather axis 1 [y,b,x,*] -> [y,*,x,*]",
          "all-gather axis 2 [y,*,x,*] -> [y,*,*,*]", "local FFT3D [y,*,*,*] -> [y,*,*,*]",
          "slice axis 2 over b [y,*,*,*] -> [y,*,b,*]",
          "slice axis 3 over x [y,*,b,*] -> [y,*,b,x]"}},
    };
    for (const FftCase& c : cases) Check(mesh, c);
  }
}

TEST(FftRules, RefusesTooFewAxes) {
  OpCase op("FFT2D", MakeMesh({{"x", 2}}));
  op.In("[x]", {4}, TF_COMPLEX64);
  EXPECT_NE(op.PlanString().find("last 2 axes"), std::string::npos);
}

}  // namespace
}  // namespace tf_dtensor
