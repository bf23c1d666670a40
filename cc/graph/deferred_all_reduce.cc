// The deferred all-reduces of a tf.function's graph (GraphBuilder::AllReduce) and their
// combining (GraphBuilder::CombineAllReduces): each small all-reduce of a replicated
// result is held as a stand-in per device until the function is built, and those of one
// mesh, reduction, dtype and phase that do not depend on each other are joined into one
// collective over a concat of their values, as TensorFlow's DTensor combines them.

#include "cc/graph/graph_builder.h"

#include <algorithm>
#include <set>
#include <unordered_map>

#include "cc/tf/handles.h"

namespace tf_dtensor {

namespace {

// The inputs that read `output`, taken before any of them is rewired.
std::vector<TF_Input> Consumers(TF_Output output) {
  std::vector<TF_Input> consumers(TF_OperationOutputNumConsumers(output));
  const int count =
      TF_OperationOutputConsumers(output, consumers.data(), static_cast<int>(consumers.size()));
  consumers.resize(count);
  return consumers;
}

}  // namespace

StatusOr<ValueId> GraphBuilder::AllReduce(ValueId value, const std::vector<int>& mesh_dims,
                                          ReduceOp op) {
  const Value& v = values_[value];
  if (combine_limit_bytes_ <= 0 || !v.layout || v.resource || DTypeBytes(v.dtype) == 0 ||
      v.layout->is_single_device() || !v.layout->ShardedMeshDims().empty() ||
      v.layout->HasMultiDimAxis()) {
    return ComponentBuilder::AllReduce(value, mesh_dims, op);
  }
  for (const PartialSpec& p : v.layout->partial()) {
    if (std::find(mesh_dims.begin(), mesh_dims.end(), p.mesh_dim) == mesh_dims.end()) {
      return ComponentBuilder::AllReduce(value, mesh_dims, op);  // stays partial elsewhere
    }
  }
  int64_t elements = 1;
  for (int64_t d : v.shape) {
    if (d < 0) return ComponentBuilder::AllReduce(value, mesh_dims, op);
    elements *= d;
  }
  const Layout layout = *v.layout;
  mesh_ = layout.mesh();
  if (lowering().shares_buffers() ||
      elements * static_cast<int64_t>(DTypeBytes(v.dtype)) > combine_limit_bytes_) {
    return ComponentBuilder::AllReduce(value, mesh_dims, op);
  }
  TFD_RETURN_IF_ERROR(CheckParticipants(
      mesh_dims, std::string("all-reduce (") + ReduceOpName(op) + ") a " + layout.ShortString() +
                     " value"));
  const size_t noted = collectives_.size();
  TFD_RETURN_IF_ERROR(Note("all-reduce", op, true, value, mesh_dims, layout.specs(), {}));
  PendingAllReduce pending{layout, v.shape, v.dtype, mesh_dims, op, v.handles, {},
                           collectives_.size() > noted ? static_cast<int>(noted) : -1};
  LocalOpOptions options;
  options.copy_attrs = false;
  Value out{layout.WithoutPartial(), v.shape, v.dtype};
  // The stand-ins hold the partial values until CombineAllReduces: never read as values.
  out.int_value_read = true;
  for (int d = 0; d < mesh_.num_local_devices(); ++d) {
    TFD_ASSIGN_OR_RETURN(TF_Operation * stand_in,
                         Emit("Identity", {pending.inputs[d]}, options, mesh_.local_devices()[d]));
    pending.stand_ins.push_back(stand_in);
    out.handles.push_back(TF_Output{stand_in, 0});
    // Its readers come after the all-reduce (cluster_phases.h).
    phases_.AddMember(stand_in, -1 - static_cast<int64_t>(pending_.size()));
  }
  pending_.push_back(std::move(pending));
  return Add(std::move(out));
}

StatusOr<std::map<TF_Operation*, TF_Output>> GraphBuilder::CombineAllReduces() {
  std::map<TF_Operation*, TF_Output> replaced;
  if (pending_.empty()) return replaced;
  const size_t n = pending_.size();
  const size_t words = (n + 63) / 64;
  // Ops that read only a tensor's shape and dtype (gradients start with OnesLike of the
  // loss) read the stand-in's input instead, which has the result's shape (replicated,
  // so local = global): otherwise they would order everything after them behind this
  // all-reduce and keep the gradients' all-reduces from joining the loss's.
  for (PendingAllReduce& p : pending_) {
    for (size_t d = 0; d < p.stand_ins.size(); ++d) {
      for (const TF_Input& c : Consumers(TF_Output{p.stand_ins[d], 0})) {
        const std::string_view type = TF_OperationOpType(c.oper);
        if (type == "OnesLike" || type == "ZerosLike" || type == "Shape" || type == "ShapeN" ||
            type == "Size" || type == "Rank") {
          TF_UpdateEdge(graph_, p.inputs[d], c, status_);
          TFD_RETURN_IF_ERROR(FromTF(status_, "reading a shape before an all-reduce"));
        }
      }
    }
  }
  // Which deferred all-reduces each op depends on: ops come in creation order, after
  // their inputs (the graph only grows until here), so one pass sees every ancestor.
  std::unordered_map<TF_Operation*, int> stand_in_of;
  for (size_t p = 0; p < n; ++p) {
    for (TF_Operation* op : pending_[p].stand_ins) stand_in_of[op] = static_cast<int>(p);
  }
  std::unordered_map<TF_Operation*, std::vector<uint64_t>> after;  // op -> pending bits
  auto bits_of = [&](TF_Operation* op, std::vector<uint64_t>& into) {
    auto it = after.find(op);
    if (it != after.end()) {
      for (size_t w = 0; w < words; ++w) into[w] |= it->second[w];
    }
    auto s = stand_in_of.find(op);
    if (s != stand_in_of.end()) into[s->second / 64] |= uint64_t{1} << (s->second % 64);
  };
  size_t pos = 0;
  TF_Operation* op;
  std::vector<TF_Operation*> controls;
  while ((op = TF_GraphNextOperation(graph_, &pos)) != nullptr) {
    std::vector<uint64_t> bits(words, 0);
    const int num_inputs = TF_OperationNumInputs(op);
    for (int i = 0; i < num_inputs; ++i) bits_of(TF_OperationInput(TF_Input{op, i}).oper, bits);
    controls.resize(TF_OperationNumControlInputs(op));
    if (!controls.empty()) {
      TF_OperationGetControlInputs(op, controls.data(), static_cast<int>(controls.size()));
      for (TF_Operation* c : controls) bits_of(c, bits);
    }
    bool any = false;
    for (uint64_t w : bits) any = any || w;
    if (any) after[op] = std::move(bits);
  }
  // Level: 0 for an all-reduce that depends on none, else one more than the deepest it
  // depends on. All-reduces of one level never depend on each other's results.
  std::vector<int> level(n, 0);
  for (size_t p = 0; p < n; ++p) {
    std::vector<uint64_t> deps(words, 0);
    for (const TF_Output& in : pending_[p].inputs) bits_of(in.oper, deps);
    for (size_t q = 0; q < p; ++q) {
      if (deps[q / 64] >> (q % 64) & 1) level[p] = std::max(level[p], level[q] + 1);
    }
  }
  // Under TF's collective ops, all-reduces whose readers sit in different XLA cluster
  // phases stay apart: joined, a reader would wait for a later phase than its scope says.
  std::vector<int> phase(n, 0);
  for (size_t p = 0; p < n; ++p) {
    if (CollectiveLowering::For(pending_[p].layout.mesh()).name() == "ops" &&
        !pending_[p].stand_ins.empty()) {
      phase[p] = phases_.Of({TF_Output{pending_[p].stand_ins[0], 0}}, {});
    }
  }
  // Groups: same level, phase, mesh, reduction, dtype and partial layout; up to the size
  // limit.
  std::vector<std::vector<size_t>> groups;
  std::vector<int64_t> group_bytes;
  for (size_t p = 0; p < n; ++p) {
    const PendingAllReduce& a = pending_[p];
    int64_t bytes = static_cast<int64_t>(DTypeBytes(a.dtype));
    for (int64_t d : a.shape) bytes *= d;
    bool placed = false;
    for (size_t g = 0; g < groups.size() && !placed; ++g) {
      const PendingAllReduce& b = pending_[groups[g][0]];
      if (level[groups[g][0]] == level[p] && phase[groups[g][0]] == phase[p] &&
          b.op == a.op && b.dtype == a.dtype &&
          b.mesh_dims == a.mesh_dims && b.layout.mesh() == a.layout.mesh() &&
          b.layout.partial() == a.layout.partial() &&
          group_bytes[g] + bytes <= combine_limit_bytes_) {
        groups[g].push_back(p);
        group_bytes[g] += bytes;
        placed = true;
      }
    }
    if (!placed) {
      groups.push_back({p});
      group_bytes.push_back(bytes);
    }
  }
  // Lower levels first (a later group's inputs may read an earlier group's results).
  std::stable_sort(groups.begin(), groups.end(), [&](const auto& a, const auto& b) {
    return level[a[0]] < level[b[0]];
  });
  BeginNode("tfd_all_reduce", "", nullptr, {});
  LocalOpOptions plain;
  plain.copy_attrs = false;
  for (const std::vector<size_t>& group : groups) {
    const PendingAllReduce& first = pending_[group[0]];
    mesh_ = first.layout.mesh();
    const int devices = mesh_.num_local_devices();
    std::vector<int64_t> sizes;
    int64_t total = 0;
    for (size_t p : group) {
      int64_t e = 1;
      for (int64_t d : pending_[p].shape) e *= d;
      sizes.push_back(e);
      total += e;
    }
    // Each device's parts, flattened and concatenated (a single part goes as it is).
    Value joined{Layout::Replicated(mesh_, group.size() == 1 ? first.layout.rank() : 1)
                     .WithPartial(first.layout.partial())
                     .value(),
                 group.size() == 1 ? first.shape : std::vector<int64_t>{total}, first.dtype};
    TFD_ASSIGN_OR_RETURN(ValueId flat_shape, HostConstant({-1}, {1}, TF_INT32));
    TFD_ASSIGN_OR_RETURN(ValueId axis, HostConstant({0}, {}, TF_INT32));
    for (int d = 0; d < devices; ++d) {
      if (group.size() == 1) {
        joined.handles.push_back(first.inputs[d]);
        continue;
      }
      std::vector<TF_Output> parts;
      for (size_t p : group) {
        if (pending_[p].shape.size() == 1) {  // already flat: no Reshape to run per call
          parts.push_back(pending_[p].inputs[d]);
          continue;
        }
        LocalOpOptions reshape = plain;
        reshape.overrides = {AttrOverride::Type("T", first.dtype),
                             AttrOverride::Type("Tshape", TF_INT32)};
        TFD_ASSIGN_OR_RETURN(std::vector<TF_Output> r,
                             RunOn("Reshape", {pending_[p].inputs[d], values_[flat_shape].host},
                                   reshape, d, 1));
        parts.push_back(r[0]);
      }
      parts.push_back(values_[axis].host);
      LocalOpOptions concat = plain;
      concat.overrides = {AttrOverride::Type("T", first.dtype),
                          AttrOverride::Type("Tidx", TF_INT32),
                          AttrOverride::Int("N", static_cast<int64_t>(group.size()))};
      TFD_ASSIGN_OR_RETURN(std::vector<TF_Output> c, RunOn("ConcatV2", parts, concat, d, 1));
      SetLocalShape(c[0], {total});
      joined.handles.push_back(c[0]);
    }
    const ValueId joined_id = Add(std::move(joined));
    for (size_t p : group) {
      if (pending_[p].record >= 0) collectives_[pending_[p].record].combined = group.size() > 1;
    }
    // Each part was noted when it was deferred; the joined all-reduce is theirs.
    NestedCollectives parts_noted(collective_depth_);
    TFD_ASSIGN_OR_RETURN(ValueId reduced,
                         ComponentBuilder::AllReduce(joined_id, first.mesh_dims, first.op));
    const int size_type = total <= INT32_MAX ? TF_INT32 : TF_INT64;
    TFD_ASSIGN_OR_RETURN(ValueId split_sizes,
                         HostConstant(sizes, {static_cast<int64_t>(sizes.size())}, size_type));
    for (int d = 0; d < devices; ++d) {
      std::vector<TF_Output> results;
      const TF_Output whole = values_[reduced].handles[d];
      if (group.size() == 1) {
        results.push_back(whole);
      } else {
        LocalOpOptions split = plain;
        split.overrides = {AttrOverride::Type("T", first.dtype),
                           AttrOverride::Type("Tlen", size_type),
                           AttrOverride::Int("num_split", static_cast<int64_t>(group.size()))};
        TFD_ASSIGN_OR_RETURN(
            std::vector<TF_Output> pieces,
            RunOn("SplitV", {whole, values_[split_sizes].host, values_[axis].host}, split, d,
                  static_cast<int>(group.size())));
        for (size_t k = 0; k < group.size(); ++k) {
          const std::vector<int64_t>& shape = pending_[group[k]].shape;
          if (shape.size() == 1) {
            results.push_back(pieces[k]);
            continue;
          }
          TFD_ASSIGN_OR_RETURN(ValueId target,
                               HostConstant(shape, {static_cast<int64_t>(shape.size())},
                                            TF_INT32));
          LocalOpOptions reshape = plain;
          reshape.overrides = {AttrOverride::Type("T", first.dtype),
                               AttrOverride::Type("Tshape", TF_INT32)};
          TFD_ASSIGN_OR_RETURN(std::vector<TF_Output> r,
                               RunOn("Reshape", {pieces[k], values_[target].host}, reshape, d, 1));
          SetLocalShape(r[0], shape);
          results.push_back(r[0]);
        }
      }
      // Every consumer of a stand-in reads the result instead.
      for (size_t k = 0; k < group.size(); ++k) {
        TF_Operation* stand_in = pending_[group[k]].stand_ins[d];
        for (const TF_Input& c : Consumers(TF_Output{stand_in, 0})) {
          TF_UpdateEdge(graph_, results[k], c, status_);
          TFD_RETURN_IF_ERROR(FromTF(status_, "wiring a combined all-reduce's result"));
        }
        replaced[stand_in] = results[k];
      }
    }
  }
  pending_.clear();
  return replaced;
}

}  // namespace tf_dtensor
