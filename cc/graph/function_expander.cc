#include "cc/graph/function_expander.h"

#include <atomic>
#include <set>

#include "cc/graph/function_expansion.h"
#include "cc/graph/graph_builder.h"
#include "cc/spmd/collectives.h"
#include "cc/spmd/lowering.h"
#include "cc/tf/handles.h"

namespace tf_dtensor {
namespace {

constexpr int kMaxDepth = 32;

// Rounds of expansion a function gets at most: each round's layout requests come from
// the solver run over the previous round (cc/propagation/propagate.h); two suffice unless
// a request turns a host op into a DTensor op that passes requests further back.
constexpr int kMaxRounds = 4;

size_t Mix(size_t h, size_t value) { return h * 1000003 ^ value; }

size_t HashOf(const std::optional<Layout>& layout) { return layout ? layout->Hash() : 1; }

size_t HashOf(const std::vector<int64_t>& shape) {
  size_t h = shape.size();
  for (int64_t d : shape) h = Mix(h, std::hash<int64_t>()(d));
  return h;
}

}  // namespace

bool ValueMeta::operator==(const ValueMeta& other) const {
  if (layout != other.layout || shape != other.shape || dtype != other.dtype ||
      int_value != other.int_value || resource.has_value() != other.resource.has_value()) {
    return false;
  }
  return !resource || resource->SameValue(*other.resource);
}

bool OutputRequest::operator==(const OutputRequest& other) const {
  return single == other.single && each == other.each && host_outputs == other.host_outputs &&
         host_each == other.host_each;
}

bool FunctionKey::operator==(const FunctionKey& other) const {
  return function == other.function && mesh == other.mesh && strict == other.strict &&
         lowering_generation == other.lowering_generation &&
         xla_compile == other.xla_compile && inputs == other.inputs &&
         request == other.request;
}

size_t FunctionKey::Hash::operator()(const FunctionKey& key) const {
  size_t h = Mix(std::hash<std::string>()(key.function), key.mesh.Hash());
  h = Mix(Mix(Mix(h, key.strict), key.lowering_generation), key.xla_compile);
  for (const ValueMeta& m : key.inputs) {
    h = Mix(Mix(Mix(h, HashOf(m.layout)), HashOf(m.shape)), static_cast<size_t>(m.dtype));
    if (m.int_value) h = Mix(h, HashOf(*m.int_value));
    if (m.resource) {
      h = Mix(Mix(h, m.resource->value_layout.Hash()), HashOf(m.resource->value_shape));
      if (m.resource->element_value) h = Mix(h, HashOf(*m.resource->element_value));
    }
  }
  h = Mix(Mix(h, HashOf(key.request.single)), key.request.host_outputs);
  for (const std::optional<Layout>& l : key.request.each) h = Mix(h, HashOf(l));
  for (bool host : key.request.host_each) h = Mix(h, host);
  return h;
}

StatusOr<std::shared_ptr<const ExpandedFunction>> FunctionExpander::Expand(
    TFE_Context* context, const std::string& function, const Mesh& mesh,
    const std::vector<ValueMeta>& inputs, const OutputRequest& request,
    const FallbackPolicy& policy, int depth, bool xla_compile) {
  // An expansion holds the collective lowering it was made under.
  return ExpandKey(context,
                   FunctionKey{function, mesh, inputs, request, policy.strict,
                               CollectiveLoweringGeneration(), xla_compile},
                   policy, depth);
}

StatusOr<std::shared_ptr<const ExpandedFunction>> FunctionExpander::ExpandKey(
    TFE_Context* context, const FunctionKey& key, const FallbackPolicy& policy, int depth) {
  std::string name;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (const std::shared_ptr<const ExpandedFunction>* cached = FindLocked(key)) {
      ++num_hits_;
      return *cached;
    }
    ++num_misses_;
    DropDeletedLocked(context);
    // Unique in the process, not per expander: a device re-created after a context
    // reset must not reuse a name TensorFlow still knows with another definition.
    static std::atomic<int64_t> counter{0};
    name = key.function + "_tfd_spmd_" + std::to_string(counter.fetch_add(1));
  }
  const int64_t keys_before = InstanceKeysIssued();
  TFD_ASSIGN_OR_RETURN(std::shared_ptr<const ExpandedFunction> expanded,
                       ExpandUncached(context, key.function, key.mesh, key.inputs, key.request,
                                      policy, name, depth, key.xla_compile));
  // A nested function with TF collective ops is expanded anew at each call site: two
  // calls in one step must not share instance keys.
  if (InstanceKeysIssued() != keys_before) expanded->uses_instance_keys.store(true);
  if (depth > 0 && InstanceKeysIssued() != keys_before) return expanded;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!FindLocked(key)) ++num_cached_;
  if (key.mesh.spans_processes()) {
    across_clients_[key] = expanded;
  } else {
    // An expansion dropped from the full cache leaves the context too (each has a name of
    // its own: a function called with more input shapes than the cache holds registered
    // a new one per call, without bound). One still held by a caller stays.
    std::optional<std::shared_ptr<const ExpandedFunction>> dropped =
        cache_.Insert(key, expanded);
    if (dropped && *dropped && dropped->use_count() == 1) RemoveFromContext(context, **dropped);
  }
  return expanded;
}

StatusOr<std::shared_ptr<const ExpandedFunction>> FunctionExpander::ExpandEagerCall(
    TFE_Context* context, const std::string& function, const Mesh& mesh,
    const std::vector<ValueMeta>& inputs, const std::vector<TFE_TensorHandle*>& value_handles,
    const OutputRequest& request, const FallbackPolicy& policy) {
  auto foldable = [&](size_t i) {
    const ValueMeta& m = inputs[i];
    int64_t elements = 1;
    for (int64_t d : m.shape) elements *= d;
    return i < value_handles.size() && value_handles[i] && !m.resource &&
           (!m.layout || m.layout->IsFullyReplicated()) &&
           (m.dtype == TF_INT32 || m.dtype == TF_INT64) && elements >= 0 &&
           elements <= kKnownArgumentElements;
  };
  bool any = false;
  for (size_t i = 0; i < inputs.size(); ++i) any = any || foldable(i);
  if (!any) return Expand(context, function, mesh, inputs, request, policy);
  // Whether the function keys on its inputs' values, and the cached expansion of a call
  // without them, under one lock: a call with a step counter costs what one without does.
  FunctionKey key{function, mesh, inputs, request, policy.strict, CollectiveLoweringGeneration()};
  bool needs = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    needs = needs_input_values_.count(function) > 0;
    if (!needs) {
      if (const std::shared_ptr<const ExpandedFunction>* cached = FindLocked(key)) {
        ++num_hits_;
        return *cached;
      }
    }
  }
  std::optional<Status> without;
  if (!needs) {
    const int64_t unknown_before = UnknownValuesMet();
    StatusOr<std::shared_ptr<const ExpandedFunction>> expanded =
        ExpandKey(context, key, policy, /*depth=*/0);
    // An expansion that met no value it could not know fails the same with the inputs'
    // values: the error is the function's own (a layout, an unsupported op), not expanded
    // a second time.
    if (expanded.ok() || UnknownValuesMet() == unknown_before) return expanded;
    without = expanded.status();
  }
  // The function's graph reads an input as a value it plans with (`tf.reduce_sum(x, axis)`
  // with `axis` an argument): each call's value is a constant of its expansion.
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (foldable(i)) key.inputs[i].int_value = ReadIntValue(value_handles[i]);
  }
  StatusOr<std::shared_ptr<const ExpandedFunction>> folded =
      ExpandKey(context, key, policy, /*depth=*/0);
  if (folded.ok() && without) {
    std::lock_guard<std::mutex> lock(mutex_);
    needs_input_values_.insert(function);
  }
  return folded;
}

StatusOr<std::shared_ptr<const ExpandedFunction>> FunctionExpander::ExpandUncached(
    TFE_Context* context, const std::string& function, const Mesh& mesh,
    const std::vector<ValueMeta>& inputs, const OutputRequest& request,
    const FallbackPolicy& policy, const std::string& name, int depth, bool xla_compile) {
  if (depth > kMaxDepth) {
    return InvalidArgument("tf.function '" + function + "' nests calls deeper than " +
                           std::to_string(kMaxDepth) + " levels (recursion?).");
  }
  // Expand, solve the layout requests backward over what the expansion saw, and expand
  // again while the solution changes how some op expands (propagate.h).
  // Partial values a reader reduced are reduced where they are made in the next round,
  // once for all readers (FunctionExpansion::ReducedByReaders).
  std::unique_ptr<FunctionExpansion> expansion;
  std::optional<RequestMap> requests;
  std::set<std::pair<std::string, int>> reduce_at_source;
  for (int round = 0;; ++round) {
    expansion = std::make_unique<FunctionExpansion>(this, context, mesh, policy, depth);
    expansion->ReduceAtSource(reduce_at_source);
    expansion->InheritXlaCompile(xla_compile);
    TFD_RETURN_IF_ERROR(
        expansion->Build(function, inputs, request, requests ? &*requests : nullptr));
    RequestMap solved = expansion->Solve();
    const bool changes = expansion->Changes(solved);
    bool more = false;
    for (const auto& output : expansion->ReducedByReaders()) {
      more = reduce_at_source.insert(output).second || more;
    }
    if (round + 1 >= kMaxRounds || (!changes && !more)) break;
    if (changes) requests = std::move(solved);
  }
  return expansion->Finish(inputs, request, name);
}

const std::shared_ptr<const ExpandedFunction>* FunctionExpander::FindLocked(
    const FunctionKey& key) {
  if (!key.mesh.spans_processes()) return cache_.Find(key);
  auto it = across_clients_.find(key);
  return it == across_clients_.end() ? nullptr : &it->second;
}

void RemoveFromContext(TFE_Context* context, const ExpandedFunction& expanded) {
  if (TFE_ContextHasFunction(context, expanded.name.c_str())) {
    StatusPtr status(TF_NewStatus());
    TFE_ContextRemoveFunction(context, expanded.name.c_str(), status.get());  // best effort
  }
  for (const std::shared_ptr<const ExpandedFunction>& callee : expanded.callees) {
    // Held by `expanded` alone: cached nowhere (nor by another caller) and called by no
    // one else. A cached callee leaves with its own cache entry.
    if (callee.use_count() == 1) RemoveFromContext(context, *callee);
  }
}

void FunctionExpander::DropDeletedLocked(TFE_Context* context) {
  // The SPMD functions of a deleted function go from the context too, as TensorFlow
  // removes a tf.function's own when it is garbage-collected: a program that makes a new
  // tf.function per step would otherwise leave every expansion's graph in the context.
  // Nothing calls them again: their function (and every caller of it) is gone.
  std::vector<std::shared_ptr<const ExpandedFunction>> gone;
  auto deleted = [context, &gone](const FunctionKey& key,
                                  const std::shared_ptr<const ExpandedFunction>& expanded) {
    if (TFE_ContextHasFunction(context, key.function.c_str())) return false;
    if (expanded) gone.push_back(expanded);
    return true;
  };
  cache_.EraseIf(deleted);
  for (auto it = across_clients_.begin(); it != across_clients_.end();) {
    it = deleted(it->first, it->second) ? across_clients_.erase(it) : std::next(it);
  }
  for (auto it = needs_input_values_.begin(); it != needs_input_values_.end();) {
    it = TFE_ContextHasFunction(context, it->c_str()) ? std::next(it)
                                                      : needs_input_values_.erase(it);
  }
  for (const std::shared_ptr<const ExpandedFunction>& expanded : gone) {
    RemoveFromContext(context, *expanded);
  }
}

void FunctionExpander::DropDeleted(TFE_Context* context) {
  std::lock_guard<std::mutex> lock(mutex_);
  DropDeletedLocked(context);
}

int64_t FunctionExpander::num_cached() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return num_cached_;
}

FunctionExpander::Stats FunctionExpander::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return Stats{num_hits_, num_misses_, cache_.size() + across_clients_.size()};
}

size_t FunctionExpander::cache_size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cache_.size() + across_clients_.size();
}

}  // namespace tf_dtensor
