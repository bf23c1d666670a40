#include "cc/spmd/relayout.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <optional>
#include <queue>
#include <set>
#include <utility>

#include "cc/core/lru_cache.h"
#include "cc/core/strings.h"
#include "cc/tf/dtypes.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {

StatusOr<ValueId> Builder::AllToAll(ValueId value, int from_dim, int to_dim) {
  int mesh_dim = layout(value)->spec(from_dim).mesh_dim;
  TFD_ASSIGN_OR_RETURN(ValueId gathered, AllGather(value, from_dim));
  return Slice(gathered, to_dim, mesh_dim);
}

StatusOr<ValueId> Builder::ReduceScatter(ValueId value, int dim, int mesh_dim, ReduceOp op) {
  TFD_ASSIGN_OR_RETURN(ValueId reduced, AllReduce(value, {mesh_dim}, op));
  return Slice(reduced, dim, mesh_dim);
}

StatusOr<ValueId> Builder::SliceOver(ValueId value, int dim, const DimSpec& spec) {
  if (spec.multi()) {
    return Unimplemented("This builder cannot shard an axis over several mesh dimensions.");
  }
  return Slice(value, dim, spec.mesh_dim);
}

namespace {

std::string MeshDimNames(const Mesh& mesh, const std::vector<int>& dims) {
  std::vector<std::string> names;
  for (int d : dims) names.push_back(mesh.dims()[d].name);
  return Join(names, ",");
}

// `from` with axis `axis` checked against its rank: the steps that change an axis.
Status CheckAxis(const Layout& from, int axis, const char* step) {
  if (axis < 0 || axis >= from.rank()) {
    return Internal(std::string(step) + " of axis " + std::to_string(axis) + " of " +
                    from.ShortString());
  }
  return Status::Ok();
}

// The layout after a step, or an Internal error naming the step: a planner or a rule that
// asks for an impossible step fails there, not on the devices.
StatusOr<Layout> Checked(StatusOr<Layout> layout, const char* step) {
  if (!layout.ok()) return Internal(std::string(step) + ": " + layout.status().message());
  return layout;
}

bool Contains(const std::vector<PartialSpec>& partial, const PartialSpec& p) {
  for (const PartialSpec& q : partial) {
    if (q == p) return true;
  }
  return false;
}

// Pending reductions grouped by kind, in order of first appearance: one all-reduce each.
using ReductionGroups = std::vector<std::pair<ReduceOp, std::vector<int>>>;
void AddToGroup(ReductionGroups& groups, const PartialSpec& p) {
  auto same = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& group) { return group.first == p.op; });
  if (same == groups.end()) {
    groups.push_back({p.op, {p.mesh_dim}});
  } else {
    same->second.push_back(p.mesh_dim);
  }
}

}  // namespace

std::string RelayoutStep::ToString() const {
  const std::string op_name = ReduceOpName(op);
  switch (kind) {
    case Kind::kAllReduce:
      return "all-reduce(" + op_name + ") " + from.SpecString() + " over " +
             MeshDimNames(from.mesh(), mesh_dims);
    case Kind::kReduceScatter:
      return "reduce-scatter(" + op_name + ") axis " + std::to_string(axis) + " over " +
             MeshDimNames(from.mesh(), mesh_dims) + " " + from.SpecString() + " -> " +
             to.SpecString();
    case Kind::kAllToAll:
      return "all-to-all axis " + std::to_string(axis) + " -> " + std::to_string(to_axis) + " " +
             from.SpecString() + " -> " + to.SpecString();
    case Kind::kAllGather:
      return "all-gather axis " + std::to_string(axis) + " " + from.SpecString() + " -> " +
             to.SpecString();
    case Kind::kSlice:
      return "slice axis " + std::to_string(axis) + " over " + to.SpecName(spec) + " " +
             from.SpecString() + " -> " + to.SpecString();
    case Kind::kToPartial:
      return "to-partial(" + op_name + ") " + from.SpecString() + " -> " + to.SpecString();
    case Kind::kMoveToMesh:
      return "move " + from.ShortString() + " -> " + to.ShortString();
  }
  return "";
}

StatusOr<RelayoutStep> AllReduceStep(const Layout& from, std::vector<int> mesh_dims, ReduceOp op) {
  // The pending reductions over `mesh_dims` are done; the others stay.
  std::vector<PartialSpec> still;
  for (const PartialSpec& p : from.partial()) {
    if (std::find(mesh_dims.begin(), mesh_dims.end(), p.mesh_dim) == mesh_dims.end()) {
      still.push_back(p);
    }
  }
  TFD_ASSIGN_OR_RETURN(Layout to, Checked(from.WithoutPartial().WithPartial(still), "all-reduce"));
  RelayoutStep step{RelayoutStep::Kind::kAllReduce, from, std::move(to)};
  step.mesh_dims = std::move(mesh_dims);
  step.op = op;
  return step;
}

StatusOr<RelayoutStep> ReduceScatterStep(const Layout& from, int axis, int mesh_dim, ReduceOp op) {
  TFD_RETURN_IF_ERROR(CheckAxis(from, axis, "reduce-scatter"));
  std::vector<PartialSpec> still;
  for (const PartialSpec& p : from.partial()) {
    if (p.mesh_dim != mesh_dim) still.push_back(p);
  }
  std::vector<DimSpec> specs = from.specs();
  specs[axis] = DimSpec::Sharded(mesh_dim);
  TFD_ASSIGN_OR_RETURN(Layout to, Checked(Layout::FromSpecs(std::move(specs), from.mesh(),
                                                            from.type(), std::move(still)),
                                          "reduce-scatter"));
  RelayoutStep step{RelayoutStep::Kind::kReduceScatter, from, std::move(to), axis};
  step.mesh_dims = {mesh_dim};
  step.op = op;
  return step;
}

StatusOr<RelayoutStep> AllToAllStep(const Layout& from, int axis, int to_axis) {
  TFD_RETURN_IF_ERROR(CheckAxis(from, axis, "all-to-all"));
  TFD_RETURN_IF_ERROR(CheckAxis(from, to_axis, "all-to-all"));
  if (!from.spec(axis).sharded() || from.spec(to_axis).sharded()) {
    return Internal("all-to-all from axis " + std::to_string(axis) + " to " +
                    std::to_string(to_axis) + " of " + from.ShortString());
  }
  std::vector<DimSpec> specs = from.specs();
  std::swap(specs[axis], specs[to_axis]);
  TFD_ASSIGN_OR_RETURN(
      Layout to, Checked(Layout::FromSpecs(std::move(specs), from.mesh(), from.type(),
                                           from.partial()),
                         "all-to-all"));
  return RelayoutStep{RelayoutStep::Kind::kAllToAll, from, std::move(to), axis, to_axis};
}

StatusOr<RelayoutStep> AllGatherStep(const Layout& from, int axis) {
  TFD_RETURN_IF_ERROR(CheckAxis(from, axis, "all-gather"));
  if (!from.spec(axis).sharded()) {
    return Internal("all-gather of unsharded axis " + std::to_string(axis) + " of " +
                    from.ShortString());
  }
  std::vector<DimSpec> specs = from.specs();
  specs[axis] = DimSpec::Replicated();
  TFD_ASSIGN_OR_RETURN(
      Layout to, Checked(Layout::FromSpecs(std::move(specs), from.mesh(), from.type(),
                                           from.partial()),
                         "all-gather"));
  return RelayoutStep{RelayoutStep::Kind::kAllGather, from, std::move(to), axis};
}

StatusOr<RelayoutStep> SliceStep(const Layout& from, int axis, const DimSpec& spec) {
  TFD_RETURN_IF_ERROR(CheckAxis(from, axis, "slice"));
  if (from.spec(axis).sharded() || !spec.sharded()) {
    return Internal("slice of axis " + std::to_string(axis) + " of " + from.ShortString() +
                    " (it must go from unsharded to sharded)");
  }
  std::vector<DimSpec> specs = from.specs();
  specs[axis] = spec;
  TFD_ASSIGN_OR_RETURN(
      Layout to, Checked(Layout::FromSpecs(std::move(specs), from.mesh(), from.type(),
                                           from.partial()),
                         "slice"));
  RelayoutStep step{RelayoutStep::Kind::kSlice, from, std::move(to), axis};
  step.spec = spec;
  return step;
}

StatusOr<RelayoutStep> ToPartialStep(const Layout& from, std::vector<int> mesh_dims, ReduceOp op) {
  std::vector<PartialSpec> added;
  for (int d : mesh_dims) added.push_back({d, op});
  TFD_ASSIGN_OR_RETURN(Layout to, Checked(from.WithPartial(std::move(added)), "to-partial"));
  RelayoutStep step{RelayoutStep::Kind::kToPartial, from, std::move(to)};
  step.mesh_dims = std::move(mesh_dims);
  step.op = op;
  return step;
}

StatusOr<RelayoutStep> MoveToMeshStep(const Layout& from, const Mesh& mesh, int rank) {
  if (!from.IsFullyReplicated() && !from.is_single_device()) {
    return Internal("move to another mesh of " + from.SpecString() + ", which is not whole");
  }
  return RelayoutStep{RelayoutStep::Kind::kMoveToMesh, from, Layout::Replicated(mesh, rank)};
}

namespace {

// What a plan costs each device, in the ledger's ring model (elements of the mean block,
// so that uneven pieces do not reorder otherwise equal steps; an axis of unknown size
// counts 1024): all-gather (g-1)·B, all-reduce 2(g-1)/g·B,
// reduce-scatter and all-to-all (g-1)/g·B, a slice nothing. Then the number of collectives.
struct PlanCost {
  double bytes = 0;
  int collectives = 0;
  bool operator<(const PlanCost& o) const {
    return bytes != o.bytes ? bytes < o.bytes : collectives < o.collectives;
  }
};

double BlockElements(const Layout& layout, const std::vector<int64_t>& shape) {
  double n = 1;
  for (int i = 0; i < layout.rank() && i < static_cast<int>(shape.size()); ++i) {
    const int64_t shards = std::max<int64_t>(1, layout.NumShards(i));
    const double size = shape[i] < 0 ? 1024.0 : static_cast<double>(shape[i]);
    n *= size / static_cast<double>(shards);
  }
  return n;
}

PlanCost StepCost(const RelayoutStep& step, const std::vector<int64_t>& shape) {
  using Kind = RelayoutStep::Kind;
  const double block = BlockElements(step.from, shape);
  double g = 1;
  switch (step.kind) {
    case Kind::kAllReduce:
    case Kind::kReduceScatter:
      for (int d : step.mesh_dims) g *= step.from.mesh().DimSize(d);
      return {(step.kind == Kind::kAllReduce ? 2 : 1) * (g - 1) / g * block, 1};
    case Kind::kAllToAll:
      g = static_cast<double>(step.from.NumShards(step.axis));
      return {(g - 1) / g * block, 1};
    case Kind::kAllGather:
      g = static_cast<double>(step.from.NumShards(step.axis));
      return {(g - 1) * block, 1};
    default:
      return {0, 0};
  }
}

PlanCost StepsCost(const std::vector<RelayoutStep>& steps, const std::vector<int64_t>& shape) {
  PlanCost total;
  for (const RelayoutStep& step : steps) {
    const PlanCost one = StepCost(step, shape);
    total.bytes += one.bytes;
    total.collectives += one.collectives;
  }
  return total;
}

// The cheapest steps from `source` to `goal` (same mesh, kind and rank; `goal` keeps a
// subset of `source`'s pending reductions, whose kinds commute), by a shortest-path search
// over the layouts on the way. Each step moves toward the goal: a reduction the goal does
// not keep done (an all-reduce over one such mesh dimension or over all those of one kind,
// or a reduce-scatter onto an axis the goal shards over it), an axis the goal shards
// otherwise gathered, a mesh dimension moved onto the axis the goal shards over it
// (all-to-all), an axis sliced as the goal shards it. It finds orders the fixed order
// misses:
//   [*,x] -> [y,*]: slice axis 0 over y, then all-gather axis 1 (a quarter of the block)
//   [x,y] -> [y,x]: all-gather axis 0, all-to-all y onto axis 0, slice axis 1 over x
//   [*,x] +partial(y:sum) -> [x,y]: all-to-all x onto axis 0, then reduce-scatter over y
// None where the search gives up (more than 4096 layouts on the way).
std::optional<std::vector<RelayoutStep>> SearchSteps(const Layout& source, const Layout& goal,
                                                     const std::vector<int64_t>& shape) {
  if (source == goal || source.mesh() != goal.mesh() || source.rank() != goal.rank() ||
      source.type() != goal.type()) {
    return std::nullopt;
  }
  struct Node {
    Layout layout;
    PlanCost cost;
    int parent;
    std::optional<RelayoutStep> step;
  };
  std::vector<Node> nodes{{source, {}, -1, std::nullopt}};
  std::map<std::string, int> seen{{source.ToString(), 0}};
  // Entries (cost when queued, node); an entry whose node has since become cheaper or been
  // finished is skipped.
  using Entry = std::pair<PlanCost, int>;
  auto later = [](const Entry& a, const Entry& b) {
    return b.first < a.first || (!(a.first < b.first) && b.second < a.second);
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(later)> open(later);
  open.push({PlanCost{}, 0});
  std::set<int> done;
  const int rank = goal.rank();
  while (!open.empty()) {
    const auto [queued, at] = open.top();
    open.pop();
    if (nodes[at].cost < queued || !done.insert(at).second) continue;
    const Layout here = nodes[at].layout;
    if (here == goal) {
      std::vector<RelayoutStep> steps;
      for (int n = at; nodes[n].parent >= 0; n = nodes[n].parent) steps.push_back(*nodes[n].step);
      std::reverse(steps.begin(), steps.end());
      return steps;
    }
    std::vector<StatusOr<RelayoutStep>> moves;
    ReductionGroups by_op;
    for (const PartialSpec& p : here.partial()) {
      if (Contains(goal.partial(), p)) continue;
      AddToGroup(by_op, p);
      moves.push_back(AllReduceStep(here, {p.mesh_dim}, p.op));
      for (int i = 0; i < rank; ++i) {
        if (goal.spec(i) == DimSpec::Sharded(p.mesh_dim) && !here.spec(i).sharded()) {
          moves.push_back(ReduceScatterStep(here, i, p.mesh_dim, p.op));
        }
      }
    }
    for (auto& [op, dims] : by_op) {
      if (dims.size() < 2) continue;
      std::sort(dims.begin(), dims.end());
      moves.push_back(AllReduceStep(here, dims, op));
    }
    for (int i = 0; i < rank; ++i) {
      const DimSpec& spec = here.spec(i);
      if (spec.sharded() && spec != goal.spec(i)) {
        moves.push_back(AllGatherStep(here, i));
        for (int j = 0; j < rank && !spec.multi(); ++j) {
          if (j != i && goal.spec(j) == spec && !here.spec(j).sharded()) {
            moves.push_back(AllToAllStep(here, i, j));
          }
        }
      }
      if (!spec.sharded() && goal.spec(i).sharded()) {
        moves.push_back(SliceStep(here, i, goal.spec(i)));
      }
    }
    for (StatusOr<RelayoutStep>& move : moves) {
      if (!move.ok()) continue;  // a step into an invalid layout (a mesh dimension in use)
      const PlanCost one = StepCost(*move, shape);
      PlanCost cost{nodes[at].cost.bytes + one.bytes,
                    nodes[at].cost.collectives + one.collectives};
      const std::string key = move->to.ToString();
      auto found = seen.find(key);
      if (found != seen.end()) {
        Node& old = nodes[found->second];
        if (done.count(found->second) || !(cost < old.cost)) continue;
        old.cost = cost;
        old.parent = at;
        old.step = *std::move(move);
        open.push({cost, found->second});
        continue;
      }
      if (nodes.size() >= 4096) return std::nullopt;
      seen.emplace(key, static_cast<int>(nodes.size()));
      Layout to = move->to;
      nodes.push_back({std::move(to), cost, at, *std::move(move)});
      open.push({cost, static_cast<int>(nodes.size()) - 1});
    }
  }
  return std::nullopt;
}

// The search's answers by (source, goal, shape): eager relayouts plan at every call, and the
// same few pairs recur. A bounded cache, locked: eager ops plan from several threads.
struct SearchKey {
  Layout source;
  Layout goal;
  std::vector<int64_t> shape;
  bool operator==(const SearchKey& o) const {
    return shape == o.shape && source == o.source && goal == o.goal;
  }
};

struct SearchKeyHash {
  size_t operator()(const SearchKey& k) const {
    size_t h = k.source.Hash() * 31 + k.goal.Hash();
    for (int64_t d : k.shape) h = h * 1000003 + std::hash<int64_t>()(d);
    return h;
  }
};

// The search's steps where they move fewer bytes than `fixed` (the fixed order's), else none.
std::optional<std::vector<RelayoutStep>> CheaperSteps(const Layout& source, const Layout& goal,
                                                      const std::vector<int64_t>& shape,
                                                      const std::vector<RelayoutStep>& fixed) {
  static std::mutex mu;
  static LruCache<SearchKey, std::optional<std::vector<RelayoutStep>>, SearchKeyHash> cache(1024);
  SearchKey key{source, goal, shape};
  {
    std::lock_guard<std::mutex> lock(mu);
    if (const auto* found = cache.Find(key)) return *found;
  }
  std::optional<std::vector<RelayoutStep>> cheaper = SearchSteps(source, goal, shape);
  if (cheaper && !(StepsCost(*cheaper, shape).bytes < StepsCost(fixed, shape).bytes)) {
    cheaper.reset();
  }
  std::lock_guard<std::mutex> lock(mu);
  cache.Insert(std::move(key), cheaper);
  return cheaper;
}

}  // namespace

StatusOr<std::vector<RelayoutStep>> PlanRelayout(const Layout& source, const Layout& target,
                                                 const std::vector<int64_t>& shape,
                                                 const std::string& what,
                                                 bool variable_handle) {
  std::vector<RelayoutStep> steps;
  if (source == target) return steps;
  const int rank = static_cast<int>(shape.size());
  if (source.mesh() != target.mesh()) {
    // [x,*] @ A -> [*,y] @ B: whole on A (all-gathers), handed to every device of B, then
    // sliced there. Values cross meshes only whole, so any pair of layouts works.
    if (variable_handle) {
      return InvalidArgument("Cannot move " + what + " (a variable handle on " +
                             source.ShortString() + ") to another mesh (" +
                             target.ShortString() + "); read its value and move that.");
    }
    TFD_RETURN_IF_ERROR(target.LocalShape(shape, what).status());
    const Layout whole = Layout::Replicated(source.mesh(), rank);
    TFD_ASSIGN_OR_RETURN(steps, PlanRelayout(source, whole, shape, what));
    TFD_ASSIGN_OR_RETURN(RelayoutStep move, MoveToMeshStep(whole, target.mesh(), rank));
    TFD_ASSIGN_OR_RETURN(std::vector<RelayoutStep> there,
                         PlanRelayout(move.to, target, shape, what));
    steps.push_back(std::move(move));
    steps.insert(steps.end(), there.begin(), there.end());
    return steps;
  }
  if (source.rank() != target.rank()) {
    return InvalidArgument("Cannot relayout " + what + " of rank " +
                           std::to_string(source.rank()) + " to layout " + target.ShortString() +
                           " of rank " + std::to_string(target.rank()) + ".");
  }
  TFD_RETURN_IF_ERROR(target.LocalShape(shape, what).status());
  Layout current = source;
  auto add = [&](StatusOr<RelayoutStep> step) -> Status {
    if (!step.ok()) return step.status();
    current = step->to;
    steps.push_back(*std::move(step));
    return Status::Ok();
  };
  // Pending reductions the target does not keep are done first, where the target shards
  // an axis over the same mesh dimension as a reduce-scatter (first: the all-reduces then
  // move the smaller blocks), the others as one all-reduce per reduction over all their
  // mesh dimensions (one collective over x+y moves 2(g-1)/g of a block, where one per
  // dimension moves 2(gx-1)/gx + 2(gy-1)/gy of it):
  //   [*] +partial(x:sum) -> [x]: reduce-scatter     [*] +partial(x:sum) -> [*]: all-reduce
  // Reductions of kinds that do not commute (a sum over x, a max over y) apply in mesh
  // dimension order, the first dimension first, as `full_tensor` does: the terms' value is
  // the max over y of the sums over x. They are all done, one at a time, and the target's
  // added again after (a kept max over y would otherwise be reduced before the sum over x).
  auto kind = [](ReduceOp op) { return op == ReduceOp::kMean ? ReduceOp::kSum : op; };
  bool mixed = false;
  for (const PartialSpec& p : source.partial()) {
    mixed = mixed || kind(p.op) != kind(source.partial()[0].op);
  }
  for (const PartialSpec& p : mixed ? source.partial() : std::vector<PartialSpec>{}) {
    TFD_RETURN_IF_ERROR(add(AllReduceStep(current, {p.mesh_dim}, p.op)));
  }
  ReductionGroups all_reduces;
  for (const PartialSpec& p : mixed ? std::vector<PartialSpec>{} : source.partial()) {
    if (Contains(target.partial(), p)) continue;
    int scatter_axis = -1;
    for (int i = 0; i < target.rank(); ++i) {
      if (target.spec(i) == DimSpec::Sharded(p.mesh_dim) && !current.spec(i).sharded()) {
        scatter_axis = i;
      }
    }
    if (scatter_axis >= 0) {
      TFD_RETURN_IF_ERROR(add(ReduceScatterStep(current, scatter_axis, p.mesh_dim, p.op)));
      continue;
    }
    AddToGroup(all_reduces, p);
  }
  for (auto& [op, mesh_dims] : all_reduces) {
    std::sort(mesh_dims.begin(), mesh_dims.end());
    TFD_RETURN_IF_ERROR(add(AllReduceStep(current, mesh_dims, op)));
  }
  // Pairs [a at i] -> [a at j]: the mesh dimension moves between axes: one all-to-all.
  for (int i = 0; i < source.rank(); ++i) {
    const DimSpec from = current.spec(i);
    if (!from.sharded() || from.multi() || from == target.spec(i)) continue;
    for (int j = 0; j < target.rank(); ++j) {
      if (j != i && target.spec(j) == from && !current.spec(j).sharded()) {
        TFD_RETURN_IF_ERROR(add(AllToAllStep(current, i, j)));
        break;
      }
    }
  }
  // Unshard every axis whose sharding differs from the target.
  for (int i = 0; i < target.rank(); ++i) {
    if (current.spec(i).sharded() && current.spec(i) != target.spec(i)) {
      TFD_RETURN_IF_ERROR(add(AllGatherStep(current, i)));
    }
  }
  // Shard the axes the target shards.
  for (int i = 0; i < target.rank(); ++i) {
    if (target.spec(i).sharded() && !current.spec(i).sharded()) {
      TFD_RETURN_IF_ERROR(add(SliceStep(current, i, target.spec(i))));
    }
  }
  // The steps above are made in a fixed order; some pairs are cheaper in another
  // (SearchSteps): where a search over the same kinds of steps finds fewer bytes to move,
  // its steps are taken instead. One step is as cheap as it gets (each step moves toward
  // the target); the search runs for plans of two or more, once per pair of layouts and
  // shape (CheaperSteps caches it).
  if (!mixed && steps.size() >= 2) {
    std::optional<std::vector<RelayoutStep>> cheaper = CheaperSteps(source, current, shape, steps);
    if (cheaper) steps = *std::move(cheaper);
  }
  // Pending reductions the target adds: [*] -> [*] +partial(x:sum) keeps the value on the
  // first device along x and zeros elsewhere.
  for (const PartialSpec& q : target.partial()) {
    if (Contains(current.partial(), q)) continue;
    TFD_RETURN_IF_ERROR(add(ToPartialStep(current, {q.mesh_dim}, q.op)));
  }
  return steps;
}

std::vector<std::string> DescribeRelayout(const Layout& source, const Layout& target,
                                          const std::vector<int64_t>& shape,
                                          const std::string& what, bool variable_handle) {
  StatusOr<std::vector<RelayoutStep>> steps =
      PlanRelayout(source, target, shape, what, variable_handle);
  if (!steps.ok()) return {"cannot relayout: " + steps.status().message()};
  std::vector<std::string> lines;
  for (const RelayoutStep& step : *steps) lines.push_back(step.ToString());
  return lines;
}

namespace {

// The builder collective that carries out `step` on `value`.
StatusOr<ValueId> EmitStep(Builder& builder, ValueId value, const RelayoutStep& step) {
  using Kind = RelayoutStep::Kind;
  switch (step.kind) {
    case Kind::kAllReduce: return builder.AllReduce(value, step.mesh_dims, step.op);
    case Kind::kReduceScatter:
      return builder.ReduceScatter(value, step.axis, step.mesh_dims[0], step.op);
    case Kind::kAllToAll: return builder.AllToAll(value, step.axis, step.to_axis);
    case Kind::kAllGather: return builder.AllGather(value, step.axis);
    case Kind::kSlice: return builder.SliceOver(value, step.axis, step.spec);
    case Kind::kToPartial: return builder.ToPartial(value, step.mesh_dims, step.op);
    case Kind::kMoveToMesh: return builder.MoveToMesh(value, step.to.mesh());
  }
  return Internal("Unknown relayout step.");
}

}  // namespace

Status CheckReductionsFit(const Layout& layout, int dtype, const std::string& what) {
  for (const PartialSpec& p : layout.partial()) {
    const bool fits = dtype == TF_STRING ? false
                      : dtype == TF_COMPLEX64 || dtype == TF_COMPLEX128
                          ? p.op != ReduceOp::kMax && p.op != ReduceOp::kMin
                      : dtype == TF_BOOL ? p.op != ReduceOp::kMean
                                         : true;
    if (!fits) {
      return InvalidArgument(what + ": layout " + layout.ShortString() + " leaves a pending " +
                             ReduceOpName(p.op) + " over mesh dimension '" +
                             layout.mesh().dims()[p.mesh_dim].name + "', which " +
                             DataTypeName(dtype) + " values cannot be reduced by. Use a "
                             "layout without it" + (dtype == TF_STRING ? "" :
                             ", or another reduction (sum or prod)") + ".");
    }
  }
  return Status::Ok();
}

StatusOr<ValueId> EmitRelayout(Builder& builder, ValueId value,
                               const std::vector<RelayoutStep>& steps) {
  ValueId current = value;
  for (const RelayoutStep& step : steps) {
    TFD_ASSIGN_OR_RETURN(current, EmitStep(builder, current, step));
  }
  return current;
}

StatusOr<ValueId> Relayout(Builder& builder, ValueId value, const Layout& target,
                           const std::string& what) {
  const std::optional<Layout>& source = builder.layout(value);
  if (!source) return Internal("Relayout of a host value.");
  if (std::optional<ValueId> done = builder.ReusableRelayout(value, target)) return *done;
  TFD_ASSIGN_OR_RETURN(std::vector<RelayoutStep> steps,
                       PlanRelayout(*source, target, builder.shape(value), what,
                                    builder.resource(value).has_value()));
  TFD_ASSIGN_OR_RETURN(ValueId result, EmitRelayout(builder, value, steps));
  if (!steps.empty()) builder.NoteRelayout(value, target, result);
  return result;
}

}  // namespace tf_dtensor
