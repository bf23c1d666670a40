// The rule of windowed ops (convolutions, poolings and their gradients): the factor rule
// of their batch and channels, with spatial axes that stay sharded through a halo
// exchange where the blocks line up (window_rule.cc says how), and the data formats they
// read. conv_rules.cc declares each op's factors and registers it on this rule.
#ifndef TF_DTENSOR_CC_RULES_WINDOW_RULE_H_
#define TF_DTENSOR_CC_RULES_WINDOW_RULE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "cc/rules/factor.h"

namespace tf_dtensor {
namespace window {

// Which axes of a data-format string hold the batch and channels: "NHWC", "NCHW",
// "NDHWC", "NCDHW".
struct Format {
  bool channels_last = true;
  int spatial = 2;  // number of spatial axes

  int rank() const { return spatial + 2; }
  // The axes in data-format order: n, spatial..., c (channels last) or n, c, spatial...
  std::vector<int> Arrange(int n, const std::vector<int>& space, int c) const {
    std::vector<int> axes = {n};
    if (!channels_last) axes.push_back(c);
    axes.insert(axes.end(), space.begin(), space.end());
    if (channels_last) axes.push_back(c);
    return axes;
  }
};

// The format of a windowed op with `spatial` spatial axes (its data_format attribute).
StatusOr<Format> ReadFormat(const OpContext& ctx, int spatial);

// The channel axis of a value in `format`.
int ChannelAxis(const Format& f);

// The global shape a shape argument names, if it is known.
std::optional<std::vector<int64_t>> HostShape(const OpContext& ctx, int input);

// kPoolGrad: MaxPoolGrad(orig_input, orig_output, grad), x with the halo, the gradient
// of the extended block returned like kInputGrad's.
enum class WindowRole { kForward, kFilterGrad, kInputGrad, kPoolGrad };

// What a windowed op is: which of its inputs carry the sharded rows, its kind of padding.
struct WindowOpInfo {
  int spatial = 2;
  WindowRole role = WindowRole::kForward;
  bool max_pool = false;  // padding is -inf
  bool avg_pool = false;  // padding does not count
  bool conv = false;      // kernel from the filter (or filter_sizes), dilations attr
  bool pool_v2 = false;   // ksize and strides are inputs 1 and 2
  int dy = 2;             // kInputGrad: the input holding the output gradient
};

// A windowed op's rule: the factor rule of `spec` (batch and channels pass through,
// spatial axes need replication) whose spatial axes `window` keeps sharded through a halo
// where the blocks line up, else gathered (no window: always). With `shape_input` >= 0
// that host input is the global shape of output 0 (Conv2DBackpropInput's input_sizes,
// Conv2DBackpropFilter's filter_sizes, AvgPoolGrad's orig_input_shape), and the local op
// gets its own block's. `like`: without a window, the input whose shape the output has.
std::shared_ptr<const Rule> WindowedRule(FactorSpecFn spec, int shape_input,
                                         std::optional<WindowOpInfo> window, int like = -1);

}  // namespace window
}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_RULES_WINDOW_RULE_H_
