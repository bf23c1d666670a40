#include "cc/rules/plan_cache.h"

#include <functional>

namespace tf_dtensor {
namespace {

size_t Mix(size_t h, size_t v) { return h * 1000003u ^ v; }

bool SameResource(const std::optional<ResourceInfo>& a, const std::optional<ResourceInfo>& b) {
  if (a.has_value() != b.has_value()) return false;
  return !a || (a->value_layout == b->value_layout && a->value_shape == b->value_shape &&
                a->value_dtype == b->value_dtype);
}

bool SameInput(const InputInfo& a, const InputInfo& b) {
  return a.shape == b.shape && a.dtype == b.dtype && a.layout == b.layout &&
         a.int_value == b.int_value && a.from_host == b.from_host &&
         SameResource(a.resource, b.resource);
}

}  // namespace

size_t PlanCache::Hash(const Rule* rule, const OpContext& ctx) {
  size_t h = std::hash<const void*>()(rule);
  h = Mix(h, std::hash<std::string>()(ctx.op_name));
  h = Mix(h, ctx.mesh.Hash());
  h = Mix(h, static_cast<size_t>(ctx.num_outputs) * 2 + (ctx.keep_partial ? 1 : 0));
  if (ctx.requested) h = Mix(h, ctx.requested->Hash());
  for (const InputInfo& in : ctx.inputs) {
    h = Mix(h, in.layout ? in.layout->Hash() : 17);
    h = Mix(h, static_cast<size_t>(in.dtype));
    for (int64_t d : in.shape) h = Mix(h, static_cast<size_t>(d));
    if (in.int_value) {
      for (int64_t v : *in.int_value) h = Mix(h, static_cast<size_t>(v) + 31);
    }
  }
  return h;
}

bool PlanCache::Entry::Matches(const Rule* r, const OpContext& ctx) const {
  if (r != rule || ctx.op_name != op_name || ctx.mesh != mesh ||
      ctx.num_outputs != num_outputs || ctx.keep_partial != keep_partial ||
      ctx.requested != requested || ctx.inputs.size() != inputs.size()) {
    return false;
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!SameInput(inputs[i], ctx.inputs[i])) return false;
  }
  // A plan that read attributes holds only for the same attributes.
  return !uses_attrs || (ctx.attrs && ctx.attrs->Bytes() == attrs);
}

std::shared_ptr<const Plan> PlanCache::Find(const Rule* rule, const OpContext& ctx) {
  const size_t h = Hash(rule, ctx);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(h);
  if (it == entries_.end()) return nullptr;
  for (const Entry& e : it->second) {
    if (e.Matches(rule, ctx)) return e.plan;
  }
  return nullptr;
}

void PlanCache::Insert(const Rule* rule, const OpContext& ctx, std::shared_ptr<const Plan> plan) {
  Entry e{rule, ctx.op_name, ctx.mesh, ctx.inputs, ctx.requested, ctx.num_outputs,
          ctx.keep_partial, ctx.attrs && ctx.attrs->used(), "", std::move(plan)};
  if (e.uses_attrs) e.attrs = ctx.attrs->Bytes();
  const size_t h = Hash(rule, ctx);
  std::lock_guard<std::mutex> lock(mutex_);
  // A full cache starts over: plans are cheap to remake, and a program's working set of
  // (op, layouts, shapes) is far smaller than the bound.
  if (count_ >= kMaxEntries) {
    entries_.clear();
    count_ = 0;
  }
  entries_[h].push_back(std::move(e));
  ++count_;
}

size_t PlanCache::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return count_;
}

}  // namespace tf_dtensor
