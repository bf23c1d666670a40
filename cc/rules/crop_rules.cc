// CropAndResize (tf.image.crop_and_resize) and its gradients. Each box crops one image,
// box_ind[i] names which, and each channel is resized alone:
//   crop_and_resize(image [*,*,*,y], boxes [x,*], box_ind [x], crop_size)
//     -> crops [x,*,*,y]        (no communication)
// The image's batch, height and width are gathered (a box may index any image and read
// any row), as are the crop's height and width in the gradients (each crop row's position
// in the image is computed from its index in the whole crop). A mesh dimension shards
// either the boxes or the channels: image [*,*,*,x] with boxes [x,*] keeps the channels.
// The gradients:
//   crop_and_resize_grad_image(grads [x,*,*,y], boxes [x,*], box_ind [x], image_size)
//     -> each device scatters its boxes into a whole image: partial(x) [*,*,*,y]
//   crop_and_resize_grad_boxes(grads [x,*,*,y], image [*,*,*,y], boxes [x,*], box_ind [x])
//     -> each box's gradient sums over the channels: partial(y) [x,*]
// TF's kernels refuse an image of no channels, which an uneven channel sharding leaves
// some devices (3 channels over 4): the channels are then gathered. CropAndResizeGradImage
// names the image's shape in a host argument that one local shape answers for all
// devices, so its channels stay sharded only when their blocks are even.
#include "cc/core/strings.h"
#include "cc/rules/factor.h"
#include "cc/rules/registry.h"
#include "cc/rules/row_blocks.h"

namespace tf_dtensor {
namespace {

enum class CropOp { kCrop, kGradImage, kGradBoxes };

Status CheckRanks(const OpContext& ctx, const std::vector<int>& ranks, const char* names) {
  bool ok = ctx.inputs.size() == ranks.size();
  for (size_t i = 0; ok && i < ranks.size(); ++i) {
    ok = ranks[i] < 0 || ctx.rank(static_cast<int>(i)) == ranks[i];
  }
  if (ok) return Status::Ok();
  return InvalidArgument("'" + ctx.op_name + "' takes " + names + "; got " +
                         ctx.DescribeInputs() + ".");
}

StatusOr<FactorSpec> CropFactors(const OpContext& ctx, CropOp op) {
  FactorSpec spec;
  // Image axes: batch, height and width read whole; the channels.
  const int batch = spec.Add(FactorKind::kNeedReplication);
  const int height = spec.Add(FactorKind::kNeedReplication);
  const int width = spec.Add(FactorKind::kNeedReplication);
  const int channels =
      spec.Add(op == CropOp::kGradBoxes ? FactorKind::kContracted : FactorKind::kPassThrough);
  // Boxes: one per crop; the four corners read whole.
  const int boxes =
      spec.Add(op == CropOp::kGradImage ? FactorKind::kContracted : FactorKind::kPassThrough);
  const int corners = spec.Add(FactorKind::kNeedReplication);
  // The crop's height and width: new axes of the crop, read whole in the gradients.
  const int crop_height = spec.Add(FactorKind::kNeedReplication);
  const int crop_width = spec.Add(FactorKind::kNeedReplication);
  const std::vector<int> image = {batch, height, width, channels};
  const std::vector<int> box_list = {boxes, corners};
  const std::vector<int> box_ind = {boxes};
  const std::vector<int> crops = {boxes, crop_height, crop_width, channels};
  switch (op) {
    case CropOp::kCrop:
      TFD_RETURN_IF_ERROR(CheckRanks(ctx, {4, 2, 1, 1},
                                     "an image [batch, height, width, channels], boxes "
                                     "[n, 4], box_ind [n] and crop_size [2]"));
      spec.inputs = {image, box_list, box_ind, std::nullopt};
      spec.outputs = {{boxes, FactorSpec::kNew, FactorSpec::kNew, channels}};
      break;
    case CropOp::kGradImage:
      TFD_RETURN_IF_ERROR(CheckRanks(ctx, {4, 2, 1, 1},
                                     "grads [n, crop_height, crop_width, channels], boxes "
                                     "[n, 4], box_ind [n] and image_size [4]"));
      spec.inputs = {crops, box_list, box_ind, std::nullopt};
      spec.outputs = {{FactorSpec::kNew, FactorSpec::kNew, FactorSpec::kNew, channels}};
      break;
    case CropOp::kGradBoxes:
      TFD_RETURN_IF_ERROR(CheckRanks(ctx, {4, 4, 2, 1},
                                     "grads [n, crop_height, crop_width, channels], an "
                                     "image [batch, height, width, channels], boxes [n, 4] "
                                     "and box_ind [n]"));
      spec.inputs = {crops, image, box_list, box_ind};
      spec.outputs = {{boxes, FactorSpec::kNew}};
      break;
  }
  return spec;
}

class CropRule : public FactorRule {
 public:
  explicit CropRule(CropOp op)
      : FactorRule([op](const OpContext& ctx) { return CropFactors(ctx, op); }), op_(op) {}

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    TFD_ASSIGN_OR_RETURN(Plan plan, FactorRule::Forward(ctx));
    if (op_ != CropOp::kGradImage) return plan;
    // image_size names the whole image; the local op gets its own block's shape.
    TFD_ASSIGN_OR_RETURN(std::vector<int64_t> global, ctx.IntValue(3, "image_size"));
    if (global.size() != 4) {
      return InvalidArgument("'" + ctx.op_name + "' needs an image_size of 4 values; got " +
                             ShapeString(global) + ".");
    }
    TFD_ASSIGN_OR_RETURN(plan.host_inputs[3],
                         plan.outputs[0].UniformLocalShape(
                             global, "the output of '" + ctx.op_name + "'"));
    return plan;
  }

 protected:
  void AdjustForward(const OpContext& ctx, const FactorSpec& spec,
                     FactorAssignment& assignment) const override {
    const int channels = spec.inputs[0]->back();  // input 0's last axis, in every op
    const DimSpec& over = assignment[channels];
    if (!over.sharded()) return;
    const int64_t size = FactorSizes(ctx, spec)[channels];
    const int64_t pieces = ctx.mesh.DimSize(over.mesh_dim);
    if (HasEmptyPiece(size, pieces) || (op_ == CropOp::kGradImage && size % pieces != 0)) {
      assignment[channels] = DimSpec::Replicated();
    }
  }

 private:
  CropOp op_;
};

std::shared_ptr<const Rule> Crop(CropOp op) { return std::make_shared<CropRule>(op); }

const bool kRegistered = RegisterRules({
    {"CropAndResize", Crop(CropOp::kCrop), Traits().Host(3, HostValue::kShape)},
    {"CropAndResizeGradBoxes", Crop(CropOp::kGradBoxes)},
    {"CropAndResizeGradImage", Crop(CropOp::kGradImage), Traits().Host(3, HostValue::kShape)},
});

}  // namespace
}  // namespace tf_dtensor
