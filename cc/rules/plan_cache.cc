#include "cc/rules/plan_cache.h"

#include <functional>

#include "cc/spmd/lowering.h"

namespace tf_dtensor {
namespace {

size_t Mix(size_t h, size_t v) { return h * 1000003u ^ v; }

bool SameResource(const std::optional<ResourceInfo>& a, const std::optional<ResourceInfo>& b) {
  if (a.has_value() != b.has_value()) return false;
  return !a || a->SameValue(*b);
}

// `host`: the input is a declared host argument, whose value is part of the key.
bool SameInput(const InputInfo& a, const InputInfo& b, bool host) {
  return a.shape == b.shape && a.dtype == b.dtype && a.layout == b.layout &&
         (!host || a.int_value == b.int_value) && a.from_host == b.from_host &&
         SameResource(a.resource, b.resource);
}

// The parts of the key both lookups hash: the op, and each input's layout, dtype, shape.
size_t HashOp(const RegisteredRule* rule, const std::string& op_name, const Mesh& mesh,
              int num_outputs, bool keep_partial) {
  size_t h = std::hash<const void*>()(rule);
  h = Mix(h, std::hash<std::string>()(op_name));
  h = Mix(h, mesh.Hash());
  return Mix(h, static_cast<size_t>(num_outputs) * 2 + (keep_partial ? 1 : 0));
}

size_t MixInput(size_t h, const Layout* layout, int dtype, const std::vector<int64_t>& shape,
                const std::vector<int64_t>* int_value) {
  h = Mix(h, layout ? layout->Hash() : 17);
  h = Mix(h, static_cast<size_t>(dtype));
  for (int64_t d : shape) h = Mix(h, static_cast<size_t>(d));
  if (int_value) {
    for (int64_t v : *int_value) h = Mix(h, static_cast<size_t>(v) + 31);
  }
  return h;
}

}  // namespace

size_t PlanCache::Hash(const RegisteredRule& rule, const OpContext& ctx) {
  size_t h = HashOp(&rule, ctx.op_name, ctx.mesh, ctx.num_outputs, ctx.keep_partial);
  if (ctx.requested) h = Mix(h, ctx.requested->Hash());
  const int n = static_cast<int>(ctx.inputs.size());
  for (int i = 0; i < n; ++i) {
    const InputInfo& in = ctx.inputs[i];
    const bool host = rule.traits.IsHostInput(i, n) && in.int_value;
    h = MixInput(h, in.layout ? &*in.layout : nullptr, in.dtype, in.shape,
                 host ? &*in.int_value : nullptr);
  }
  return h;
}

bool PlanCache::Entry::Matches(const RegisteredRule& r, const OpContext& ctx) const {
  if (&r != rule || ctx.op_name != op_name || ctx.mesh != mesh ||
      ctx.num_outputs != num_outputs || ctx.keep_partial != keep_partial ||
      ctx.requested != requested || ctx.inputs.size() != inputs.size()) {
    return false;
  }
  const int n = static_cast<int>(inputs.size());
  for (int i = 0; i < n; ++i) {
    if (!SameInput(inputs[i], ctx.inputs[i], r.traits.IsHostInput(i, n))) return false;
  }
  // A plan that read attributes holds only for the same attributes.
  return !uses_attrs || (ctx.attrs && ctx.attrs->Bytes() == attrs);
}

PlanCache::Entry* PlanCache::FindLocked(const RegisteredRule& rule, const OpContext& ctx) {
  auto it = entries_.find(Hash(rule, ctx));
  if (it == entries_.end()) return nullptr;
  for (Entry& e : it->second) {
    if (e.Matches(rule, ctx)) return &e;
  }
  return nullptr;
}

std::shared_ptr<const Plan> PlanCache::Find(const RegisteredRule& rule, const OpContext& ctx) {
  std::lock_guard<std::mutex> lock(mutex_);
  DropIfStaleLocked();
  const Entry* e = FindLocked(rule, ctx);
  return e ? e->plan : nullptr;
}

void PlanCache::SetLocalOnly(const RegisteredRule& rule, const OpContext& ctx,
                             std::shared_ptr<const LocalOnlyRun> run) {
  std::lock_guard<std::mutex> lock(mutex_);
  DropIfStaleLocked();
  if (Entry* e = FindLocked(rule, ctx)) e->local_only = std::move(run);
}

std::shared_ptr<const LocalOnlyRun> PlanCache::FindLocalOnly(const RegisteredRule& rule,
                                                             const std::string& op_name,
                                                             const Mesh& mesh, int num_outputs,
                                                             const std::vector<InputView>& inputs,
                                                             const AttrMap& attrs) {
  size_t h = HashOp(&rule, op_name, mesh, num_outputs, /*keep_partial=*/false);
  for (const InputView& in : inputs) h = MixInput(h, in.layout, in.dtype, *in.shape, in.int_value);
  std::lock_guard<std::mutex> lock(mutex_);
  DropIfStaleLocked();
  auto it = entries_.find(h);
  if (it == entries_.end()) return nullptr;
  for (const Entry& e : it->second) {
    if (!e.local_only || e.rule != &rule || e.op_name != op_name || e.mesh != mesh ||
        e.num_outputs != num_outputs || e.keep_partial || e.requested ||
        e.inputs.size() != inputs.size()) {
      continue;
    }
    bool same = true;
    for (size_t i = 0; i < inputs.size() && same; ++i) {
      const InputInfo& a = e.inputs[i];
      const InputView& b = inputs[i];
      same = a.shape == *b.shape && a.dtype == b.dtype && !a.from_host && !a.resource &&
             (b.layout ? a.layout && *a.layout == *b.layout && !a.int_value
                       : !a.layout && a.int_value && b.int_value && *a.int_value == *b.int_value);
    }
    // A plan that read attributes holds only for the same attributes.
    if (same && (!e.uses_attrs || attrs.Bytes() == e.attrs)) return e.local_only;
  }
  return nullptr;
}

void PlanCache::Insert(const RegisteredRule& rule, const OpContext& ctx,
                       std::shared_ptr<const Plan> plan) {
  Entry e{&rule, ctx.op_name, ctx.mesh, ctx.inputs, ctx.requested, ctx.num_outputs,
          ctx.keep_partial, ctx.attrs && ctx.attrs->used(), "", std::move(plan)};
  if (e.uses_attrs) e.attrs = ctx.attrs->Bytes();
  const size_t h = Hash(rule, ctx);
  std::lock_guard<std::mutex> lock(mutex_);
  DropIfStaleLocked();
  // A full cache starts over: plans are cheap to remake, and a program's working set of
  // (op, layouts, shapes) is far smaller than the bound.
  if (count_ >= kMaxEntries) {
    entries_.clear();
    count_ = 0;
  }
  entries_[h].push_back(std::move(e));
  ++count_;
}

void PlanCache::DropIfStaleLocked() {
  const uint64_t now = CollectiveLoweringGeneration();
  if (generation_ == now) return;
  entries_.clear();
  count_ = 0;
  generation_ = now;
}

size_t PlanCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return count_;
}

}  // namespace tf_dtensor
