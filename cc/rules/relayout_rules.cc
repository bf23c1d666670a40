// tf_dtensor's own layout ops (registered with TF in device/ops.cc):
//   TfDTensorRelayout(x, layout=L): x (a DTensor, or a host tensor: copy_to_mesh) -> L,
//   on x's mesh or onto another one (copy_to_mesh between meshes).
//   TfDTensorRelayoutLike(x, like): x in like's layout (relayout_like, and the gradient of
//   a relayout, which returns to its input's layout and mesh).
// The relayout itself is planned in spmd/relayout.cc.
#include <string>
#include <vector>

#include "cc/rules/expand.h"
#include "cc/rules/registry.h"
#include "cc/spmd/layout_types.h"
#include "cc/spmd/relayout.h"

namespace tf_dtensor {
namespace {

// A relayout target in TF DTensor's text form, whose specs may be "match" (keep the
// input's sharding of that axis, as TensorFlow's `dtensor.MATCH`): those axes are read
// as unsharded and returned in `match`.
StatusOr<Layout> ParseTarget(const std::string& text, std::vector<int>* match) {
  const std::string kHead = "sharding_specs:";
  const size_t mesh_at = text.find(", mesh:");
  if (text.rfind(kHead, 0) != 0 || mesh_at == std::string::npos ||
      text.find("match") == std::string::npos) {
    return Layout::FromString(text);
  }
  std::string rewritten = kHead;
  size_t start = kHead.size();
  int axis = 0;
  while (start < mesh_at) {
    size_t end = text.find(',', start);
    if (end == std::string::npos || end > mesh_at) end = mesh_at;
    std::string spec = text.substr(start, end - start);
    if (spec == "match") {
      if (match) match->push_back(axis);
      spec = "unsharded";
    }
    rewritten += (axis ? "," : "") + spec;
    ++axis;
    start = end + 1;
  }
  rewritten += text.substr(mesh_at);
  return Layout::FromString(rewritten);
}

class RelayoutRule : public Rule {
 public:
  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    std::optional<std::string> text = ctx.attrs->GetString("layout");
    if (!text) return InvalidArgument("Relayout needs a `layout` attribute.");
    std::vector<int> match;
    TFD_ASSIGN_OR_RETURN(Layout user_target, ParseTarget(*text, &match));
    const InputInfo& in = ctx.inputs[0];
    if (!match.empty()) {
      // MATCH axes keep the input's sharding (a host input has none).
      if (in.layout && !in.from_host && in.layout->mesh() != user_target.mesh()) {
        return InvalidArgument("relayout to " + user_target.ShortString() +
                               ": MATCH keeps an axis's sharding on the same mesh, but the "
                               "input is on " + in.layout->mesh().ShortString() + ".");
      }
      std::vector<DimSpec> specs = user_target.specs();
      for (int a : match) {
        if (in.layout && !in.from_host && a < in.layout->rank()) specs[a] = in.layout->spec(a);
      }
      StatusOr<Layout> matched = Layout::FromSpecs(specs, user_target.mesh(), user_target.type());
      if (!matched.ok()) {
        return InvalidArgument("relayout to " + user_target.ShortString() + " with MATCH axes " +
                               "from the input's " +
                               (in.layout ? in.layout->ShortString() : std::string("layout")) +
                               ": " + matched.status().message());
      }
      user_target = *matched;
    }
    // The runtime form (cc/spmd/layout_types.h): the device marks parted outputs.
    const Layout target = RuntimeLayout(user_target, static_cast<int>(in.shape.size()));
    TFD_RETURN_IF_ERROR(target.LocalShape(in.shape, "input 0 of relayout").status());
    TFD_RETURN_IF_ERROR(CheckReductionsFit(target, in.dtype, "relayout"));
    Plan plan;
    plan.inputs = {target};
    plan.outputs = {target};
    return plan;
  }
  // The input is moved to the target as it is, pending reductions included: those the
  // target keeps stay pending ([x,*] +partial(y:sum) -> [*,x] +partial(y:sum) moves each
  // term, an all-to-all), the others are reduced ([P,P] -> [P,R] over y only).
  bool PlansPendingReductions() const override { return true; }
  // The input is asked for the target (on the target's mesh: copy_to_mesh asks the op
  // that makes the value to make it there), whatever is asked of the result.
  std::vector<std::optional<Layout>> Backward(
      const OpContext& ctx, const std::vector<std::optional<Layout>>&) const override {
    std::vector<std::optional<Layout>> out(ctx.inputs.size());
    std::optional<std::string> text = ctx.attrs->GetString("layout");
    StatusOr<Layout> target = text ? Layout::FromString(*text) : InvalidArgument("no layout");
    if (!out.empty() && target.ok()) out[0] = *target;
    return out;
  }
  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    // The relayout is all there is: no local op.
    return PrepareInputs(ctx, plan, builder);
  }
};

class RelayoutLikeRule : public Rule {
 public:
  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    const InputInfo& in = ctx.inputs[0];
    const InputInfo& like = ctx.inputs[1];
    // A host `like` (a plain tensor) asks for nothing but the op's mesh: replicated.
    Layout target = like.layout && !like.from_host
                        ? *like.layout
                        : Layout::Replicated(ctx.mesh, static_cast<int>(in.shape.size()));
    if (target.rank() != static_cast<int>(in.shape.size()) && !target.is_single_device()) {
      return InvalidArgument("relayout_like: input 0 has rank " +
                             std::to_string(in.shape.size()) + " but the layout of input 1 is " +
                             target.ShortString() + "; give a tensor of the same rank.");
    }
    TFD_RETURN_IF_ERROR(target.LocalShape(in.shape, "input 0 of relayout_like").status());
    Plan plan;
    plan.inputs = {target, like.layout ? *like.layout : target};
    plan.outputs = {target};
    return plan;
  }
  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> inputs, PrepareInputs(ctx, plan, builder));
    return std::vector<ValueId>{inputs[0]};
  }
};

const bool kRegistered = RegisterRules({
    {"TfDTensorRelayout", std::make_shared<RelayoutRule>(),
     Traits().MultiDimAxes().UserRelayout()},
    {"TfDTensorRelayoutLike", std::make_shared<RelayoutLikeRule>(),
     Traits().MultiDimAxes().UserRelayout()},
});

}  // namespace
}  // namespace tf_dtensor
