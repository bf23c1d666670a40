#include "cc/rules/rule.h"

#include "cc/core/strings.h"
#include "cc/rules/expand.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {

std::string OpContext::Describe(int input) const {
  const InputInfo& in = inputs[input];
  std::string text = "input " + std::to_string(input) + " (shape " + ShapeString(in.shape);
  if (in.layout) text += ", layout " + in.layout->SpecString();
  return text + ") of '" + op_name + "'";
}

std::string OpContext::DescribeInputs() const {
  std::vector<std::string> parts;
  for (const InputInfo& in : inputs) {
    parts.push_back(in.layout ? in.layout->ShortString() : "host " + ShapeString(in.shape));
  }
  return Join(parts, ", ");
}

std::string OpContext::DescribeOp() const {
  return "'" + op_name + "' with inputs (" + DescribeInputs() + ")";
}

StatusOr<std::vector<int64_t>> OpContext::IntValue(int input, const std::string& what) const {
  if (input < static_cast<int>(inputs.size()) && inputs[input].int_value) {
    return *inputs[input].int_value;
  }
  const std::string head = "'" + op_name + "' needs its " + what + " (input " +
                           std::to_string(input) + ") as a constant integer tensor, on the host "
                           "or replicated, to plan its layouts; ";
  if (input >= static_cast<int>(inputs.size())) return InvalidArgument(head + "it has none.");
  const InputInfo& in = inputs[input];
  if (in.layout && !in.layout->IsFullyReplicated()) {
    return InvalidArgument(head + "got a sharded tensor (" + Describe(input) +
                           "). Relayout it to replicated.");
  }
  if (in.dtype != TF_INT32 && in.dtype != TF_INT64) {
    return InvalidArgument(head + "got " + Describe(input) + ", not an int32 or int64 tensor.");
  }
  return InvalidArgument(
      head + "its value is only known when the function runs (computed from data, or from "
      "sizes known only then, such as tf.where's rows). Compute it from static shapes and "
      "Python numbers, or give the op inputs that are all replicated, which each device then "
      "runs as one device would.");
}

Plan Plan::Whole(const OpContext& ctx, int output_rank) {
  Plan plan;
  for (const InputInfo& in : ctx.inputs) {
    plan.inputs.push_back(in.layout ? std::optional<Layout>(Layout::Replicated(
                                          ctx.mesh, static_cast<int>(in.shape.size())))
                                    : std::nullopt);
  }
  plan.outputs = {Layout::Replicated(ctx.mesh, output_rank)};
  return plan;
}

std::vector<PartialSpec> Plan::PassedPartial(const OpContext& ctx) const {
  for (size_t i = 0; i < inputs.size() && i < ctx.inputs.size(); ++i) {
    const std::optional<Layout>& given = ctx.inputs[i].layout;
    if (inputs[i] && inputs[i]->is_partial() && given &&
        given->partial() == inputs[i]->partial()) {
      return inputs[i]->partial();
    }
  }
  return {};
}

const Layout* UsableRequest(const OpContext& ctx,
                            const std::vector<std::optional<Layout>>& requested_outputs, int o,
                            int rank) {
  if (o < 0 || o >= static_cast<int>(requested_outputs.size())) return nullptr;
  const std::optional<Layout>& r = requested_outputs[o];
  if (!r || r->mesh() != ctx.mesh || r->rank() != rank || r->is_single_device()) return nullptr;
  return &*r;
}

std::vector<std::optional<Layout>> Rule::Backward(
    const OpContext& ctx, const std::vector<std::optional<Layout>>&) const {
  return std::vector<std::optional<Layout>>(ctx.inputs.size());
}

StatusOr<std::vector<ValueId>> Rule::Expand(const OpContext& ctx, const Plan& plan,
                                            Builder& builder) const {
  return ExpandDefault(ctx, plan, builder);
}

}  // namespace tf_dtensor
