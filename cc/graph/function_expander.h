// tf.function SPMD expansion: a function traced with global shapes becomes one
// multi-device function over the mesh.
//
// The pass pipeline, run once per (function, input layouts and shapes, requested layout)
// and cached:
//   1. parse the FunctionDef and order its nodes (data and control edges);
//   2. forward, in topological order: each node's rule (the eager path's registry)
//      plans the output layouts from the input layouts (and the layout requested of it),
//      and expands the node into local ops on each device plus collectives, with local
//      shapes for Reshape, Fill, random ops and constants. A DAG visited in order is at
//      its fixed point after one pass. Each node's context is recorded for step 3;
//   3. layout requests, backward (cc/propagation/propagate.h): a `relayout` inside the
//      function, or call_with_layout around it, asks the producer of that value for the
//      layout; every rule's Backward sends the request on to its inputs' producers, back
//      to the ops that create values (Fill, random ops, variables), which then make their
//      blocks directly in that layout. When the solution changes how some op expands,
//      step 2 runs again with it (a few rounds at most). Merge rule: the layout computed
//      forward from the inputs wins; a request that disagrees is met by a relayout where
//      it was made;
//   4. the outputs go to their devices, and the graph becomes a function whose
//      components run on every device of the mesh in one call.
// Nested calls (PartitionedCall, direct calls) are expanded recursively with the layouts
// of their arguments. Control edges keep their order: every op a node expands into waits
// for the ops its control inputs expanded into (on its own device where devices share no
// buffers, on every device where they do), so an assign followed by a read of the same
// variable reads the new value.
//
// FunctionExpander holds the expansions made (a bounded cache); one expansion of one body
// is a FunctionExpansion (function_expansion.h).
#ifndef TF_DTENSOR_CC_GRAPH_FUNCTION_EXPANDER_H_
#define TF_DTENSOR_CC_GRAPH_FUNCTION_EXPANDER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cc/core/layout.h"
#include "cc/core/lru_cache.h"
#include "cc/core/status.h"
#include "cc/graph/cost.h"
#include "cc/rules/dispatch.h"
#include "cc/rules/rule.h"
#include "cc/spmd/builder.h"
#include "cc/spmd/ledger.h"
#include "tensorflow/c/eager/c_api.h"

namespace tf_dtensor {

// The most elements of an integer argument whose constant value a call passes on (shapes,
// axes and bounds are small; larger tensors would only lengthen the expansion's key).
inline constexpr int64_t kKnownArgumentElements = 64;

// A function argument or result: a DTensor (with layout) or a host tensor.
struct ValueMeta {
  std::optional<Layout> layout;  // nullopt: a host tensor
  std::vector<int64_t> shape;    // global shape
  int dtype = 0;
  std::optional<ResourceInfo> resource;
  // A callee's argument whose value the caller knows (a small integer constant of its graph:
  // a shape, axes, a slice's bounds, passed into a branch or a called function): the
  // callee reads it as that constant, as the caller would. Part of the expansion's key.
  std::optional<std::vector<int64_t>> int_value;
  // Flat inputs or outputs it takes in the expanded function: one per local device of its
  // mesh, or one (a host tensor).
  int num_flat() const { return layout ? layout->mesh().num_local_devices() : 1; }
  bool operator==(const ValueMeta& other) const;
};

struct ExpandedFunction {
  std::string name;  // registered with the context
  std::vector<ValueMeta> inputs;
  std::vector<ValueMeta> outputs;  // DTensors, unless host outputs were requested
  std::vector<std::string> output_names;  // the original function's result names
  // Per result: its components are parts (a relayout to `Layout.to_parted()` made it).
  std::vector<bool> parted_outputs;
  int num_nodes = 0;               // nodes of the expanded graph, for debugging
  // The collectives one call issues (ledger.h), in the order emitted.
  std::vector<CollectiveRecord> collectives;
  // What one call costs each device: memory, FLOPs (cost.h; `debug.estimate`).
  FunctionCost cost;
  // On a mesh spanning clients: whether the clients have compared this expansion before
  // its first run (cc/device/program_check.h). It lives with the expansion: a new one, even
  // at a freed one's address, is compared anew, as on every other client.
  mutable std::atomic<bool> program_checked{false};
  // Whether it runs TF collective ops (the `ops` lowering): their instance keys are fixed
  // in the graph, so two calls at once from two threads would meet at the same keys ("Second
  // consumer arrived") and abort the process's collectives. Such calls take `run_mutex`.
  mutable std::atomic<bool> uses_instance_keys{false};
  mutable std::mutex run_mutex;
  // The expansions its graph calls (nested functions, branches, loop bodies): they live
  // as long as it does. One with TF collective ops is expanded anew at each call site and
  // cached nowhere else, so it leaves the context with its caller (RemoveFromContext).
  std::vector<std::shared_ptr<const ExpandedFunction>> callees;
};

// Removes `expanded`'s SPMD function from the context, and those of its callees that no
// one else holds (best effort: a name the context no longer has is skipped).
void RemoveFromContext(TFE_Context* context, const ExpandedFunction& expanded);

// What the caller asks of the results: call_with_layout's (or `_default_layout`'s) layout
// for the first result, as TensorFlow's DTensor gives it,
// and/or an exact layout per result (loop bodies, branches).
struct OutputRequest {
  std::optional<Layout> single;
  std::vector<std::optional<Layout>> each;
  // Results leave as one host tensor each (a While condition's predicate); DTensor results
  // are gathered to replicated first.
  bool host_outputs = false;
  // Per result: it leaves as a host tensor (a loop variable that entered as one).
  std::vector<bool> host_each;
  bool host(size_t i) const { return host_outputs || (i < host_each.size() && host_each[i]); }
  bool operator==(const OutputRequest& other) const;
};

// What an expansion depends on, and so what the cache is keyed by: the function, the mesh
// it runs from, its inputs (layouts, shapes, dtypes, resources), what is asked of its
// results and the fallback policy's strictness.
struct FunctionKey {
  std::string function;
  Mesh mesh;
  std::vector<ValueMeta> inputs;
  OutputRequest request;
  bool strict = false;
  // CollectiveLoweringGeneration() when expanded: a policy change starts the cache over.
  uint64_t lowering_generation = 0;
  // The caller was traced with jit_compile=True (a loop body, branch or nested call of
  // such a function): this function's ops are marked for XLA as its caller's are.
  bool xla_compile = false;
  bool operator==(const FunctionKey& other) const;
  struct Hash {
    size_t operator()(const FunctionKey& key) const;
  };
};

class FunctionExpander {
 public:
  // Expansions the cache keeps; the least recently used goes first. A training loop calls
  // a handful of functions with fixed signatures; a program that traces anew (new shapes,
  // new functions) would otherwise hold every expansion it ever made.
  // Expansions on a mesh that spans clients are kept apart and never dropped for room,
  // only once their function is deleted: an expansion takes the collectives' instance keys
  // in program order, so a client that dropped one and expanded it again would take new
  // keys its peers do not (whether the room ran out can differ between clients, with
  // garbage collection).
  static constexpr size_t kMaxCachedFunctions = 256;

  // The SPMD function of `function` called with `inputs` on `mesh`: the cached one for
  // the same key (FunctionKey), else expanded now and cached. `depth`: how many calls deep
  // `function` is (FunctionExpansion expands callees, branches and loop bodies here);
  // `xla_compile`: its caller's ops are marked for XLA (FunctionKey::xla_compile).
  StatusOr<std::shared_ptr<const ExpandedFunction>> Expand(TFE_Context* context,
                                                           const std::string& function,
                                                           const Mesh& mesh,
                                                           const std::vector<ValueMeta>& inputs,
                                                           const OutputRequest& request,
                                                           const FallbackPolicy& policy,
                                                           int depth = 0,
                                                           bool xla_compile = false);
  // The SPMD function of a call from eager code: `Expand`, with the values of the call's
  // small integer inputs, host tensors or replicated DTensors (`value_handles[i]` holds
  // input i's whole value, or is null), read only where the function cannot be expanded
  // without them: a function that takes a reduction's axes, a permutation or a shape as an
  // argument (tf.autodiff.ForwardAccumulator's eager JVPs are such functions, and the
  // backward function of such a function, which gets the shapes it saved as replicated
  // DTensors). Those values then join the key of every later call of the function, as
  // TensorFlow's DTensor folds them into all; other functions' keys stay shapes and
  // layouts, so a step counter passed in does not expand them again at each new value,
  // and such a call costs what one without it does (one lookup). A function that fails
  // without the values is expanded with them only if it met a value it could not know
  // (UnknownValuesMet): another error is returned as it is.
  StatusOr<std::shared_ptr<const ExpandedFunction>> ExpandEagerCall(
      TFE_Context* context, const std::string& function, const Mesh& mesh,
      const std::vector<ValueMeta>& inputs, const std::vector<TFE_TensorHandle*>& value_handles,
      const OutputRequest& request, const FallbackPolicy& policy);
  // Expansions made and cached so far: a repeated call adds none, and an expansion the
  // cache drops later still counts (for tests and debugging).
  int64_t num_cached() const;
  size_t cache_size() const;
  // Calls that found their expansion cached (hits), calls that expanded (misses), and the
  // expansions kept now: what TensorFlow's DTensor reports as `_get_stats()`.
  struct Stats {
    int64_t hits = 0;
    int64_t misses = 0;
    size_t size = 0;
  };
  Stats stats() const;
  // Drops the expansions of functions `context` no longer has (a tf.function that was
  // garbage-collected), so the cache holds only what can be called again, as TensorFlow's
  // DTensor does. Expand sweeps on each miss; the device's stats sweep before counting.
  void DropDeleted(TFE_Context* context);

 private:
  // `Expand` by its key.
  StatusOr<std::shared_ptr<const ExpandedFunction>> ExpandKey(TFE_Context* context,
                                                              const FunctionKey& key,
                                                              const FallbackPolicy& policy,
                                                              int depth);
  // Expands `function` (no cache): rounds of FunctionExpansion until the layout requests
  // settle, then the SPMD function registered as `name`.
  StatusOr<std::shared_ptr<const ExpandedFunction>> ExpandUncached(
      TFE_Context* context, const std::string& function, const Mesh& mesh,
      const std::vector<ValueMeta>& inputs, const OutputRequest& request,
      const FallbackPolicy& policy, const std::string& name, int depth, bool xla_compile);

  // The cached expansion of `key`, from the cache its mesh goes to; null when none.
  const std::shared_ptr<const ExpandedFunction>* FindLocked(const FunctionKey& key);
  void DropDeletedLocked(TFE_Context* context);

  mutable std::mutex mutex_;
  LruCache<FunctionKey, std::shared_ptr<const ExpandedFunction>, FunctionKey::Hash> cache_{
      kMaxCachedFunctions};
  std::unordered_map<FunctionKey, std::shared_ptr<const ExpandedFunction>, FunctionKey::Hash>
      across_clients_;  // meshes spanning clients (above)
  // Functions whose calls from eager code fold their small integer host inputs' values
  // into the key (ExpandEagerCall); a deleted function's name leaves with its expansions.
  std::unordered_set<std::string> needs_input_values_;
  int64_t num_cached_ = 0;
  int64_t num_hits_ = 0;
  int64_t num_misses_ = 0;
};

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_GRAPH_FUNCTION_EXPANDER_H_
