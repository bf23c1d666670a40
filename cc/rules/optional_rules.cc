// Optionals, which tf.cond's gradient wraps a branch's intermediates in (the other branch
// gives OptionalNone), a loop's accumulator lists among them when the branch holds a
// while loop.
//
// An optional is a scalar variant, replicated. Like a TensorList, one that holds a list
// records the list's element metadata (ResourceInfo) as its own: dispatch passes a
// variant input's metadata on to a variant output (dispatch.cc), so
//   from_value(list of [x] elements) -> optional of that list -> get_value -> list of [x]
// and each device's optional holds its own local list. A plain value is held whole,
// since OptionalGetValue's output_shapes name its global shape:
//   from_value(t [x,*]) -> t gathered to [*,*] first;  get_value -> [*,*]
//   has_value(optional) -> [];  none() -> []
#include "cc/rules/registry.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {
namespace {

// Inputs as the op gives them, except plain tensors read replicated; the outputs
// replicated whatever their rank.
class OptionalRule : public Rule {
 public:
  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    Plan plan;
    int lists = 0;
    for (int i = 0; i < static_cast<int>(ctx.inputs.size()); ++i) {
      const InputInfo& in = ctx.inputs[i];
      if (!in.layout || in.dtype == TF_VARIANT) {
        lists += in.dtype == TF_VARIANT && in.resource ? 1 : 0;
        plan.inputs.push_back(std::nullopt);
        continue;
      }
      plan.inputs.push_back(Layout::Replicated(ctx.mesh, ctx.rank(i)));
    }
    if (lists > 1) {
      // An optional records one list's element metadata; cond_v2 wraps one value in each.
      return Unimplemented("'" + ctx.op_name + "' wraps " + std::to_string(lists) +
                           " TensorLists in one optional (inputs: " + ctx.DescribeInputs() +
                           "); an optional can hold at most one list. Wrap each list in an "
                           "optional of its own.");
    }
    return plan;
  }
};

std::shared_ptr<const Rule> Optional() { return std::make_shared<OptionalRule>(); }

const bool kRegistered = RegisterRules({
    {"OptionalFromValue", Optional()},
    {"OptionalGetValue", Optional()},
    {"OptionalHasValue", Optional()},
    {"OptionalNone", Optional()},
});

}  // namespace
}  // namespace tf_dtensor
