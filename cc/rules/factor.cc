#include "cc/rules/factor.h"

#include <algorithm>
#include <numeric>

#include "cc/core/strings.h"
#include "cc/rules/row_blocks.h"

namespace tf_dtensor {
namespace {

// Whether input `i` takes part in factor assignment: it is data and has a layout whose
// specs line up with its mapping.
bool Mapped(const OpContext& ctx, const FactorSpec& spec, size_t i) {
  return i < spec.inputs.size() && spec.inputs[i] && ctx.inputs[i].layout &&
         static_cast<int>(spec.inputs[i]->size()) == ctx.rank(static_cast<int>(i)) &&
         ctx.layout(static_cast<int>(i)).rank() == ctx.rank(static_cast<int>(i));
}

// Whether `axis` of input `i`, naming factor `f`, spans the factor (does not broadcast).
bool Spans(const OpContext& ctx, const FactorSpec& spec, const std::vector<int64_t>& sizes,
           size_t i, int axis, int f) {
  if (f < 0) return false;
  const int64_t size = ctx.inputs[i].shape[axis];
  // A size known only at run time spans a contracted factor (whose sizes must agree: a
  // segment sum's ids of data-dependent length beside its data); elsewhere it could be a
  // broadcast 1, and Shardable keeps such a factor whole.
  if (size < 0) return spec.factors[f] == FactorKind::kContracted;
  return size == sizes[f];
}

// Whether factor `f` may be sharded: not where some input's axis of it has a size known
// only at run time that could broadcast (a 1) or not, beside known sizes above 1.
bool Shardable(const OpContext& ctx, const FactorSpec& spec, const std::vector<int64_t>& sizes,
               int f) {
  if (spec.factors[f] == FactorKind::kContracted || sizes[f] <= 1) return true;
  for (size_t i = 0; i < spec.inputs.size() && i < ctx.inputs.size(); ++i) {
    if (!spec.inputs[i]) continue;
    const std::vector<int>& axes = *spec.inputs[i];
    for (size_t a = 0; a < axes.size() && a < ctx.inputs[i].shape.size(); ++a) {
      if (axes[a] == f && ctx.inputs[i].shape[a] < 0) return false;
    }
  }
  return true;
}

Status CheckSpec(const OpContext& ctx, const FactorSpec& spec) {
  const int num_factors = static_cast<int>(spec.factors.size());
  auto bad = [&](const std::string& what) {
    return Internal("The factor rule of '" + ctx.op_name + "' is malformed: " + what + ".");
  };
  if (spec.inputs.size() > ctx.inputs.size()) return bad("more input mappings than inputs");
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    if (!spec.inputs[i]) continue;
    if (static_cast<int>(spec.inputs[i]->size()) != ctx.rank(static_cast<int>(i))) {
      return bad("input " + std::to_string(i) + " maps " +
                 std::to_string(spec.inputs[i]->size()) + " axes of " +
                 ctx.Describe(static_cast<int>(i)));
    }
    for (int f : *spec.inputs[i]) {
      if (f < 0 || f >= num_factors) return bad("input " + std::to_string(i) + " names no factor");
    }
  }
  for (const std::vector<int>& out : spec.outputs) {
    for (int f : out) {
      if (f >= num_factors) return bad("an output names no factor");
    }
  }
  for (int f : spec.priority) {
    if (f < 0 || f >= num_factors) return bad("the priority names no factor");
  }
  return Status::Ok();
}

// The global sizes the inputs give one contracted factor must agree, so that a mismatch
// is reported with global shapes and layouts before any shard runs (a local kernel would
// name only its block's shape). Pass-through factors are not checked: they broadcast, and
// some ops feed them placeholders (FusedBatchNorm's empty mean and variance in training).
// Unknown sizes (-1, while tracing) are not checked.
//   MatMul [4,6] @ [5,3]: k is 6 in input 0 and 5 in input 1 -> InvalidArgument
Status CheckFactorSizes(const OpContext& ctx, const FactorSpec& spec) {
  std::vector<std::optional<std::pair<int, int>>> first(spec.factors.size());  // (input, axis)
  for (size_t i = 0; i < spec.inputs.size() && i < ctx.inputs.size(); ++i) {
    if (!spec.inputs[i]) continue;
    const std::vector<int>& axes = *spec.inputs[i];
    const std::vector<int64_t>& shape = ctx.inputs[i].shape;
    for (size_t a = 0; a < axes.size() && a < shape.size(); ++a) {
      const int f = axes[a];
      const FactorKind kind = spec.factors[f];
      if (kind != FactorKind::kContracted || shape[a] < 0) continue;
      if (!first[f]) {
        first[f] = {static_cast<int>(i), static_cast<int>(a)};
        continue;
      }
      const auto [j, b] = *first[f];
      const int64_t size = ctx.inputs[j].shape[b];
      if (size == shape[a]) continue;
      auto describe = [&](int input, int axis) {
        const InputInfo& in = ctx.inputs[input];
        return "axis " + std::to_string(axis) + " of input " + std::to_string(input) +
               " (global shape " + ShapeString(in.shape) +
               (in.layout ? ", layout " + in.layout->ShortString() : std::string()) + ")";
      };
      return InvalidArgument(
          "'" + ctx.op_name + "' cannot contract " +
          describe(j, b) + " with " + describe(static_cast<int>(i), static_cast<int>(a)) +
          ": sizes " + std::to_string(size) + " and " + std::to_string(shape[a]) + ". " +
          "Contracted axes must have the same size. Check the shapes and the op's transpose or "
          "adjoint attributes.");
    }
  }
  return Status::Ok();
}

}  // namespace

std::vector<int> FactorSpec::AddAxes(int rank) {
  std::vector<int> ids;
  for (int d = 0; d < rank; ++d) ids.push_back(Add(FactorKind::kPassThrough));
  return ids;
}

std::vector<int64_t> FactorSizes(const OpContext& ctx, const FactorSpec& spec) {
  std::vector<int64_t> sizes(spec.factors.size(), 1);
  for (size_t i = 0; i < spec.inputs.size() && i < ctx.inputs.size(); ++i) {
    if (!spec.inputs[i]) continue;
    const std::vector<int>& axes = *spec.inputs[i];
    for (size_t a = 0; a < axes.size() && a < ctx.inputs[i].shape.size(); ++a) {
      sizes[axes[a]] = std::max(sizes[axes[a]], ctx.inputs[i].shape[a]);
    }
  }
  return sizes;
}

Plan FactorPlan(const OpContext& ctx, const FactorSpec& spec, const FactorAssignment& assignment) {
  const std::vector<int64_t> sizes = FactorSizes(ctx, spec);
  auto spec_of = [&](int f) {
    return f >= 0 && spec.factors[f] != FactorKind::kNeedReplication ? assignment[f]
                                                                     : DimSpec::Replicated();
  };
  Plan plan;
  plan.inputs.assign(ctx.inputs.size(), std::nullopt);
  std::optional<Layout> base;
  for (size_t i = 0; i < ctx.inputs.size(); ++i) {
    if (!Mapped(ctx, spec, i)) continue;
    const Layout& in = ctx.layout(static_cast<int>(i));
    if (!base) base = in;
    const std::vector<int>& axes = *spec.inputs[i];
    std::vector<DimSpec> specs(axes.size(), DimSpec::Replicated());
    for (size_t a = 0; a < axes.size(); ++a) {
      if (Spans(ctx, spec, sizes, i, static_cast<int>(a), axes[a])) specs[a] = spec_of(axes[a]);
    }
    plan.inputs[i] = in.WithSpecs(std::move(specs));
  }
  if (!base) base = Layout::Replicated(ctx.mesh, 0);
  std::vector<int> partial;
  for (size_t f = 0; f < spec.factors.size(); ++f) {
    if (spec.factors[f] == FactorKind::kContracted && assignment[f].sharded()) {
      partial.push_back(assignment[f].mesh_dim);
    }
  }
  for (const std::vector<int>& out : spec.outputs) {
    std::vector<DimSpec> specs;
    for (int f : out) specs.push_back(spec_of(f));
    plan.outputs.push_back(base->WithSpecs(std::move(specs)));
    plan.partial_dims.push_back(partial);
  }
  plan.partial_op = spec.reduce;
  return plan;
}

StatusOr<Plan> FactorRule::Forward(const OpContext& ctx) const {
  TFD_ASSIGN_OR_RETURN(FactorSpec spec, spec_(ctx));
  TFD_RETURN_IF_ERROR(CheckSpec(ctx, spec));
  TFD_RETURN_IF_ERROR(CheckFactorSizes(ctx, spec));
  const std::vector<int64_t> sizes = FactorSizes(ctx, spec);
  FactorAssignment assignment(spec.factors.size(), DimSpec::Replicated());
  std::vector<bool> used(ctx.mesh.num_dims(), false);
  std::vector<int> order = spec.priority;
  if (order.empty()) {
    order.resize(spec.factors.size());
    std::iota(order.begin(), order.end(), 0);
  }
  for (int f : order) {
    if (spec.factors[f] == FactorKind::kNeedReplication || assignment[f].sharded() ||
        !Shardable(ctx, spec, sizes, f)) {
      continue;
    }
    for (size_t i = 0; i < ctx.inputs.size() && !assignment[f].sharded(); ++i) {
      if (!Mapped(ctx, spec, i)) continue;
      const std::vector<int>& axes = *spec.inputs[i];
      for (size_t a = 0; a < axes.size(); ++a) {
        if (axes[a] != f || !Spans(ctx, spec, sizes, i, static_cast<int>(a), f)) continue;
        const DimSpec& s = ctx.layout(static_cast<int>(i)).spec(static_cast<int>(a));
        if (s.sharded() && !used[s.mesh_dim]) {
          assignment[f] = s;
          used[s.mesh_dim] = true;
          break;
        }
      }
    }
  }
  AdjustForward(ctx, spec, assignment);
  return FactorPlan(ctx, spec, assignment);
}

std::vector<std::optional<Layout>> FactorRule::Backward(
    const OpContext& ctx, const std::vector<std::optional<Layout>>& requested) const {
  std::vector<std::optional<Layout>> result(ctx.inputs.size());
  StatusOr<FactorSpec> made = spec_(ctx);
  if (!made.ok() || !CheckSpec(ctx, *made).ok()) return result;
  const FactorSpec& spec = *made;
  const std::vector<int64_t> sizes = FactorSizes(ctx, spec);
  FactorAssignment assignment(spec.factors.size(), DimSpec::Replicated());
  std::vector<bool> used(ctx.mesh.num_dims(), false);
  bool any = false;
  for (size_t o = 0; o < spec.outputs.size(); ++o) {
    const std::vector<int>& axes = spec.outputs[o];
    const Layout* want =
        UsableRequest(ctx, requested, static_cast<int>(o), static_cast<int>(axes.size()));
    if (!want) continue;
    any = true;
    for (size_t a = 0; a < axes.size(); ++a) {
      const int f = axes[a];
      const DimSpec& s = want->spec(static_cast<int>(a));
      if (f < 0 || !s.sharded() || used[s.mesh_dim] || assignment[f].sharded() ||
          spec.factors[f] != FactorKind::kPassThrough ||
          sizes[f] % ctx.mesh.DimSize(s.mesh_dim) != 0) {
        continue;
      }
      assignment[f] = s;
      used[s.mesh_dim] = true;
    }
  }
  if (!any) return result;
  const Layout base = Layout::Replicated(ctx.mesh, 0);
  for (size_t i = 0; i < spec.inputs.size() && i < ctx.inputs.size(); ++i) {
    if (!spec.inputs[i]) continue;
    const std::vector<int>& axes = *spec.inputs[i];
    std::vector<DimSpec> specs(axes.size(), DimSpec::Replicated());
    for (size_t a = 0; a < axes.size(); ++a) {
      if (Spans(ctx, spec, sizes, i, static_cast<int>(a), axes[a])) specs[a] = assignment[axes[a]];
    }
    result[i] = base.WithSpecs(std::move(specs));
  }
  return result;
}

std::shared_ptr<const Rule> Factors(FactorSpecFn spec) {
  return std::make_shared<FactorRule>(std::move(spec));
}

namespace {

class NoEmptyBlocksRule : public FactorRule {
 public:
  explicit NoEmptyBlocksRule(FactorSpecFn spec) : FactorRule(std::move(spec)) {}

 protected:
  void AdjustForward(const OpContext& ctx, const FactorSpec& spec,
                     FactorAssignment& assignment) const override {
    const std::vector<int64_t> sizes = FactorSizes(ctx, spec);
    for (size_t f = 0; f < assignment.size(); ++f) {
      if (assignment[f].sharded() &&
          HasEmptyPiece(sizes[f], ctx.mesh.DimSize(assignment[f].mesh_dim))) {
        assignment[f] = DimSpec::Replicated();
      }
    }
  }
};

}  // namespace

std::shared_ptr<const Rule> FactorsWithoutEmptyBlocks(FactorSpecFn spec) {
  return std::make_shared<NoEmptyBlocksRule>(std::move(spec));
}

StatusOr<int> NormalizeAxis(const OpContext& ctx, int64_t axis, int rank, int input) {
  if (axis < -rank || axis >= rank) {
    return InvalidArgument("'" + ctx.op_name + "' axis " + std::to_string(axis) +
                           " is out of range for " + ctx.Describe(input) + " (rank " +
                           std::to_string(rank) + ").");
  }
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

}  // namespace tf_dtensor
