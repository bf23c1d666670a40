// Ops on shapes and axis order.
//   Shape/Size/Rank([x,*] of [8,4]) -> the GLOBAL values, replicated
//   transpose([x,y], perm=[1,0]) -> [y,x]
//   expand_dims([x,*], 1) -> [x,*,*]        squeeze([x,*,*] of [8,1,4], [1]) -> [x,*]
//   reshape keeps a sharding when it maps cleanly:
//     [B,T,D] [x,*,*] -> [B*T,D] [x,*]      (the sharded axis leads its merged block)
//     [B*T,D] [x,*]   -> [B,T,D] [x,*,*]    (B divisible by |x|)
//   otherwise the blocking axes are gathered first.
#include <numeric>

#include "cc/core/strings.h"
#include "cc/rules/registry.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {
namespace {

class ShapeInfoRule : public Rule {
 public:
  enum class Kind { kShape, kSize, kRank };
  explicit ShapeInfoRule(Kind kind) : kind_(kind) {}

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    Plan plan;
    plan.inputs = {std::nullopt};
    plan.outputs = {Layout::Replicated(ctx.mesh, kind_ == Kind::kShape ? 1 : 0)};
    return plan;
  }

  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan&,
                                        Builder& builder) const override {
    const std::vector<int64_t>& shape = ctx.inputs[0].shape;
    int dtype = ctx.attrs->GetType("out_type").value_or(TF_INT32);
    std::vector<int64_t> values;
    std::vector<int64_t> dims;
    switch (kind_) {
      case Kind::kShape:
        values = shape;
        dims = {static_cast<int64_t>(shape.size())};
        break;
      case Kind::kSize:
        values = {std::accumulate(shape.begin(), shape.end(), int64_t{1},
                                  std::multiplies<int64_t>())};
        break;
      case Kind::kRank:
        values = {static_cast<int64_t>(shape.size())};
        dtype = TF_INT32;
        break;
    }
    TFD_ASSIGN_OR_RETURN(ValueId host, builder.HostConstant(values, dims, dtype));
    TFD_ASSIGN_OR_RETURN(ValueId out, builder.Broadcast(host, ctx.mesh));
    return std::vector<ValueId>{out};
  }

 private:
  Kind kind_;
};

class TransposeRule : public Rule {
 public:
  bool IsHostArgument(int input, int) const override { return input == 1; }
  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    TFD_ASSIGN_OR_RETURN(std::vector<int64_t> perm, ctx.IntValue(1, "permutation"));
    const Layout& in = ctx.layout(0);
    if (static_cast<int>(perm.size()) != in.rank()) {
      return InvalidArgument("Transpose permutation " + ShapeString(perm) + " does not match " +
                             ctx.Describe(0) + ".");
    }
    std::vector<DimSpec> out;
    for (int64_t p : perm) {
      if (p < 0 || p >= in.rank()) {
        return InvalidArgument("Transpose permutation " + ShapeString(perm) +
                               " is out of range for " + ctx.Describe(0) + ".");
      }
      out.push_back(in.spec(static_cast<int>(p)));
    }
    Plan plan;
    plan.inputs = {in, std::nullopt};
    plan.outputs = {in.WithSpecs(out)};
    return plan;
  }
};

class ExpandDimsRule : public Rule {
 public:
  bool IsHostArgument(int input, int) const override { return input == 1; }
  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    TFD_ASSIGN_OR_RETURN(std::vector<int64_t> axis, ctx.IntValue(1, "axis"));
    const Layout& in = ctx.layout(0);
    if (axis.size() != 1) return InvalidArgument("ExpandDims takes one axis.");
    int64_t a = axis[0] < 0 ? axis[0] + in.rank() + 1 : axis[0];
    if (a < 0 || a > in.rank()) {
      return InvalidArgument("ExpandDims axis " + std::to_string(axis[0]) +
                             " is out of range for " + ctx.Describe(0) + ".");
    }
    std::vector<DimSpec> out = in.specs();
    out.insert(out.begin() + a, DimSpec::Replicated());
    Plan plan;
    plan.inputs = {in, std::nullopt};
    plan.outputs = {in.WithSpecs(out)};
    return plan;
  }
};

class SqueezeRule : public Rule {
 public:
  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    const Layout& in = ctx.layout(0);
    const std::vector<int64_t>& shape = ctx.inputs[0].shape;
    std::vector<int64_t> dims = ctx.attrs->GetIntList("squeeze_dims");
    std::vector<bool> drop(in.rank(), false);
    if (dims.empty()) {
      for (int d = 0; d < in.rank(); ++d) drop[d] = shape[d] == 1;
    }
    for (int64_t d : dims) drop[d < 0 ? d + in.rank() : d] = true;
    std::vector<DimSpec> out;
    for (int d = 0; d < in.rank(); ++d) {
      if (!drop[d]) out.push_back(in.spec(d));
    }
    Plan plan;
    plan.inputs = {in};
    plan.outputs = {in.WithSpecs(out)};
    return plan;
  }
};

class ReshapeRule : public Rule {
 public:
  bool IsHostArgument(int input, int) const override { return input == 1; }

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    TFD_ASSIGN_OR_RETURN(std::vector<int64_t> target, ctx.IntValue(1, "shape"));
    const std::vector<int64_t>& in_shape = ctx.inputs[0].shape;
    const Layout& in = ctx.layout(0);
    int64_t total = std::accumulate(in_shape.begin(), in_shape.end(), int64_t{1},
                                    std::multiplies<int64_t>());
    // Resolve a -1 in the target shape.
    int64_t known = 1;
    int unknown = -1;
    for (size_t i = 0; i < target.size(); ++i) {
      if (target[i] == -1) {
        unknown = static_cast<int>(i);
      } else {
        known *= target[i];
      }
    }
    if (unknown >= 0 && known > 0) target[unknown] = total / known;
    int64_t target_total = std::accumulate(target.begin(), target.end(), int64_t{1},
                                           std::multiplies<int64_t>());
    if (target_total != total) {
      return InvalidArgument("Cannot reshape " + ctx.Describe(0) + " to " + ShapeString(target) +
                             ": the element counts differ.");
    }
    // Walk both shapes in blocks of equal element count.
    std::vector<DimSpec> in_specs = in.specs();
    std::vector<DimSpec> out(target.size(), DimSpec::Replicated());
    size_t i = 0, j = 0;
    while (i < in_shape.size() || j < target.size()) {
      size_t i0 = i, j0 = j;
      int64_t a = i < in_shape.size() ? in_shape[i++] : 1;
      int64_t b = j < target.size() ? target[j++] : 1;
      while (a != b) {
        if (a < b && i < in_shape.size()) {
          a *= in_shape[i++];
        } else if (b < a && j < target.size()) {
          b *= target[j++];
        } else {
          break;
        }
      }
      // Only the leading input axis of a block may stay sharded, and only if the leading
      // output axis of the block divides evenly.
      for (size_t k = i0; k < i; ++k) {
        if (!in_specs[k].sharded()) continue;
        bool keeps = k == i0 && j0 < target.size() &&
                     target[j0] % in.NumShards(static_cast<int>(k)) == 0 && a == b;
        if (keeps) {
          out[j0] = in_specs[k];
        } else {
          in_specs[k] = DimSpec::Replicated();
        }
      }
    }
    Plan plan;
    Layout out_layout = in.WithSpecs(out);
    plan.inputs = {in.WithSpecs(in_specs), std::nullopt};
    plan.outputs = {out_layout};
    TFD_ASSIGN_OR_RETURN(plan.host_inputs[1],
                         out_layout.LocalShape(target, "the output of '" + ctx.op_name + "'"));
    return plan;
  }
};

const bool kRegistered = RegisterRules({
    {"ExpandDims", std::make_shared<ExpandDimsRule>()},
    {"Rank", std::make_shared<ShapeInfoRule>(ShapeInfoRule::Kind::kRank)},
    {"Reshape", std::make_shared<ReshapeRule>()},
    {"Shape", std::make_shared<ShapeInfoRule>(ShapeInfoRule::Kind::kShape)},
    {"Size", std::make_shared<ShapeInfoRule>(ShapeInfoRule::Kind::kSize)},
    {"Squeeze", std::make_shared<SqueezeRule>()},
    {"Transpose", std::make_shared<TransposeRule>()},
});

}  // namespace
}  // namespace tf_dtensor
