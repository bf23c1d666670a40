// Golden tables for CropAndResize and its gradients (cc/rules/crop_rules.cc): the boxes
// and the channels keep their shardings; the image's batch, height and width are read
// whole; the gradients' sums over boxes (image) and channels (boxes) are partial.
#include "tests/cc/rules/rule_testing.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {
namespace {

using testing::CheckRuleTable;
using testing::H;
using testing::MakeMesh;
using testing::OpCase;
using testing::RuleRow;
using testing::T;

TEST(CropRules, TwoDimensionalMesh) {
  const std::vector<RuleRow> rows = {
      // Boxes over x, channels over y: no communication.
      {"CropAndResize",
       {T("[*,*,*,y]", {3, 5, 6, 4}), T("[x,*]", {6, 4}), T("[x]", {6}, TF_INT32), H({3, 4})},
       "[*,*,*,y] [x,*] [x] host -> [x,*,*,y]",
       {"local CropAndResize [*,*,*,y] [x,*] [x] host [2] -> [x,*,*,y]"}},
      // A sharded batch, height or width of the image is gathered (any box reads any image).
      {"CropAndResize",
       {T("[x,y,*,*]", {4, 6, 6, 3}), T("[*,*]", {5, 4}), T("[*]", {5}, TF_INT32), H({2, 2})},
       "[*,*,*,*] [*,*] [*] host -> [*,*,*,*]",
       {"all-gather axis 0 [x,y,*,*] -> [*,y,*,*]", "all-gather axis 1 [*,y,*,*] -> [*,*,*,*]",
        "local CropAndResize [*,*,*,*] [*,*] [*] host [2] -> [*,*,*,*]"}},
      // A batch over x gathered; the boxes keep x.
      {"CropAndResize",
       {T("[x,*,*,*]", {4, 6, 6, 3}), T("[x,*]", {6, 4}), T("[x]", {6}, TF_INT32), H({2, 2})},
       "[*,*,*,*] [x,*] [x] host -> [x,*,*,*]",
       {"all-gather axis 0 [x,*,*,*] -> [*,*,*,*]",
        "local CropAndResize [*,*,*,*] [x,*] [x] host [2] -> [x,*,*,*]"}},
      // Channels and boxes over one mesh dim: the channels (the image comes first) keep it.
      {"CropAndResize",
       {T("[*,*,*,x]", {2, 6, 6, 4}), T("[x,*]", {6, 4}), T("[*]", {6}, TF_INT32), H({2, 2})},
       "[*,*,*,x] [*,*] [*] host -> [*,*,*,x]",
       {"all-gather axis 0 [x,*] -> [*,*]",
        "local CropAndResize [*,*,*,x] [*,*] [*] host [2] -> [*,*,*,x]"}},
      // Boxes uneven (5 over 2); box_ind follows the boxes.
      {"CropAndResize",
       {T("[*,*,*,*]", {2, 6, 6, 3}), T("[y,*]", {5, 4}), T("[*]", {5}, TF_INT32), H({2, 2})},
       "[*,*,*,*] [y,*] [y] host -> [y,*,*,*]",
       {"slice axis 0 over y [*] -> [y]",
        "local CropAndResize [*,*,*,*] [y,*] [y] host [2] -> [y,*,*,*]"}},
      // One channel over 2 devices would leave one without any: gathered.
      {"CropAndResize",
       {T("[*,*,*,y]", {2, 6, 6, 1}), T("[*,*]", {5, 4}), T("[*]", {5}, TF_INT32), H({2, 2})},
       "[*,*,*,*] [*,*] [*] host -> [*,*,*,*]",
       {"all-gather axis 3 [*,*,*,y] -> [*,*,*,*]",
        "local CropAndResize [*,*,*,*] [*,*] [*] host [2] -> [*,*,*,*]"}},
      // The image's gradient: each device scatters its boxes, summed over x; its own
      // channels' block of image_size.
      {"CropAndResizeGradImage",
       {T("[x,*,*,y]", {6, 2, 3, 4}), T("[x,*]", {6, 4}), T("[x]", {6}, TF_INT32),
        H({3, 5, 5, 4})},
       "[x,*,*,y] [x,*] [x] host[3, 5, 5, 2] -> [*,*,*,y]",
       {"host constant [3, 5, 5, 2] int32",
        "local CropAndResizeGradImage [x,*,*,y] [x,*] [x] host [4] -> [*,*,*,y]",
        "all-reduce(sum) [*,*,*,y] over x"}},
      // The crop's rows are read whole; uneven channels (3 over 2) are gathered, as one
      // image_size serves every device.
      {"CropAndResizeGradImage",
       {T("[*,x,*,y]", {6, 2, 3, 3}), T("[*,*]", {6, 4}), T("[*]", {6}, TF_INT32),
        H({3, 5, 5, 3})},
       "[*,*,*,*] [*,*] [*] host[3, 5, 5, 3] -> [*,*,*,*]",
       {"all-gather axis 1 [*,x,*,y] -> [*,*,*,y]", "all-gather axis 3 [*,*,*,y] -> [*,*,*,*]",
        "host constant [3, 5, 5, 3] int32",
        "local CropAndResizeGradImage [*,*,*,*] [*,*] [*] host [4] -> [*,*,*,*]"}},
      // The boxes' gradient: boxes stay over x, the channels' sum is partial over y.
      {"CropAndResizeGradBoxes",
       {T("[x,*,*,y]", {6, 2, 3, 4}), T("[*,*,*,*]", {3, 5, 5, 4}), T("[x,*]", {6, 4}),
        T("[x]", {6}, TF_INT32)},
       "[x,*,*,y] [*,*,*,y] [x,*] [x] -> [x,*]",
       {"slice axis 3 over y [*,*,*,*] -> [*,*,*,y]",
        "local CropAndResizeGradBoxes [x,*,*,y] [*,*,*,y] [x,*] [x] -> [x,*]",
        "all-reduce(sum) [x,*] over y"}},
      {"CropAndResize",
       {T("[*,*,*]", {3, 5, 6}), T("[*,*]", {6, 4}), T("[*]", {6}, TF_INT32), H({3, 4})},
       "error", {"'CropAndResize' takes an image [batch, height, width, channels]"}},
  };
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}), rows);
  CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}, "GPU"), rows);
}

TEST(CropRules, BoxGradientStaysPendingInsideFunctions) {
  OpCase op("CropAndResizeGradBoxes", MakeMesh({{"x", 2}, {"y", 4}}));
  op.In("[*,*,*,y]", {6, 2, 3, 8})
      .In("[*,*,*,y]", {3, 5, 5, 8})
      .In("[*,*]", {6, 4})
      .In("[*]", {6}, TF_INT32)
      .KeepPartial();
  EXPECT_EQ(op.PlanString(), "[*,*,*,y] [*,*,*,y] [*,*] [*] -> [*,*] +partial(y:sum)");
}

}  // namespace
}  // namespace tf_dtensor
