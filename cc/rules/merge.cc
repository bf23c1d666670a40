#include "cc/rules/merge.h"

#include "cc/core/strings.h"

namespace tf_dtensor {

StatusOr<std::vector<int64_t>> BroadcastShapes(const std::vector<std::vector<int64_t>>& shapes,
                                               const std::string& op_name) {
  size_t rank = 0;
  for (const auto& s : shapes) rank = std::max(rank, s.size());
  std::vector<int64_t> out(rank, 1);
  for (const auto& s : shapes) {
    size_t offset = rank - s.size();
    for (size_t i = 0; i < s.size(); ++i) {
      int64_t& o = out[offset + i];
      if (s[i] == o || s[i] == 1) continue;
      // A size known only at run time (a data-dependent size inside tf.function) is
      // taken to match the other operands' (as TF's shape inference does), not to
      // broadcast: -1 with 4 -> 4.
      if (s[i] < 0) {
        if (o == 1) o = s[i];
        continue;
      }
      if (o == 1 || o < 0) {
        o = s[i];
        continue;
      }
      std::vector<std::string> parts;
      for (const auto& t : shapes) parts.push_back(ShapeString(t));
      return InvalidArgument("Incompatible shapes for '" + op_name + "': " + Join(parts, " vs ") +
                             " cannot be broadcast together.");
    }
  }
  return out;
}

std::vector<DimSpec> MergeBroadcast(const std::vector<const Layout*>& layouts,
                                    const std::vector<std::vector<int64_t>>& shapes,
                                    const std::vector<int64_t>& out_shape,
                                    std::vector<bool>* used) {
  const int rank = static_cast<int>(out_shape.size());
  std::vector<DimSpec> out(rank, DimSpec::Replicated());
  for (int d = 0; d < rank; ++d) {
    for (size_t k = 0; k < layouts.size(); ++k) {
      if (!layouts[k]) continue;
      int offset = rank - static_cast<int>(shapes[k].size());
      int in_dim = d - offset;
      if (in_dim < 0 || (shapes[k][in_dim] != out_shape[d] && shapes[k][in_dim] >= 0)) continue;
      const DimSpec& spec = layouts[k]->spec(in_dim);
      if (spec.sharded() && !(*used)[spec.mesh_dim]) {
        out[d] = spec;
        (*used)[spec.mesh_dim] = true;
        break;
      }
    }
  }
  return out;
}

std::vector<DimSpec> ProjectBroadcast(const std::vector<DimSpec>& out,
                                      const std::vector<int64_t>& in_shape,
                                      const std::vector<int64_t>& out_shape) {
  const int offset = static_cast<int>(out_shape.size() - in_shape.size());
  std::vector<DimSpec> specs(in_shape.size(), DimSpec::Replicated());
  for (size_t i = 0; i < in_shape.size(); ++i) {
    if (in_shape[i] == out_shape[offset + i] || in_shape[i] < 0) specs[i] = out[offset + i];
  }
  return specs;
}

}  // namespace tf_dtensor
