// Plans already made on the eager path, so a repeated op (same rule, inputs, layouts,
// shapes, request, the values of the host arguments its traits declare and, when its
// Forward read any, attributes) skips Forward.
// PyTorch's sharding propagator keeps such a cache keyed by its op schema. Forward is
// pure, so a cached plan is the plan Forward would make.
#ifndef TF_DTENSOR_CC_RULES_PLAN_CACHE_H_
#define TF_DTENSOR_CC_RULES_PLAN_CACHE_H_

#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cc/rules/registry.h"

namespace tf_dtensor {

class PlanCache {
 public:
  // The plan made before for the same op and inputs, or null.
  std::shared_ptr<const Plan> Find(const RegisteredRule& rule, const OpContext& ctx);
  // Remembers `plan`, made for `ctx` (call after planning, once ctx.attrs shows what
  // Forward read). Old entries go when the cache is full.
  void Insert(const RegisteredRule& rule, const OpContext& ctx,
              std::shared_ptr<const Plan> plan);
  size_t size() const;

  // Local-only plans. Many ops expand to the op itself on each device's own components:
  // no relayout, no collective, no attribute of its own; on virtual CPUs devices that hold
  // the same shard share one result (a replicated op runs once). The eager executor
  // records that outcome for the plan once an expansion turned out so (for `ctx` as
  // planned: after Dispatch); a repeated op then runs those local ops directly, without
  // building the expansion again. Whether it is so is the rule's answer, not a guess: only
  // an expansion that did exactly this is recorded, and only for the inputs (host
  // argument values included), request and (when the plan read them) attributes it was
  // made for.
  void SetLocalOnly(const RegisteredRule& rule, const OpContext& ctx,
                    std::shared_ptr<const LocalOnlyRun> run);
  // An input as the eager executor holds it, to look a plan up without an OpContext: a
  // DTensor (its layout) or a host argument (its integer value).
  struct InputView {
    const Layout* layout;
    const std::vector<int64_t>* shape;
    int dtype;
    const std::vector<int64_t>* int_value = nullptr;
  };
  // The local-only run recorded for these inputs (DTensors with no resource and nothing
  // partial, host arguments; no request), or null. `attrs` are read only if the plan
  // read attributes.
  std::shared_ptr<const LocalOnlyRun> FindLocalOnly(const RegisteredRule& rule,
                                                    const std::string& op_name,
                                                    const Mesh& mesh, int num_outputs,
                                                    const std::vector<InputView>& inputs,
                                                    const AttrMap& attrs);

  static constexpr size_t kMaxEntries = 4096;

 private:
  struct Entry {
    const RegisteredRule* rule;
    std::string op_name;
    Mesh mesh;
    std::vector<InputInfo> inputs;
    std::optional<Layout> requested;
    int num_outputs;
    bool keep_partial;
    bool uses_attrs;
    std::string attrs;
    std::shared_ptr<const Plan> plan;
    std::shared_ptr<const LocalOnlyRun> local_only;  // see SetLocalOnly
    bool Matches(const RegisteredRule& r, const OpContext& ctx) const;
  };
  static size_t Hash(const RegisteredRule& rule, const OpContext& ctx);
  Entry* FindLocked(const RegisteredRule& rule, const OpContext& ctx);
  // Plans depend on the collective lowering (a rule's cost choice, the leaders of a
  // local-only run): a change of the lowering policy starts the cache over.
  void DropIfStaleLocked();

  mutable std::mutex mutex_;
  std::unordered_map<size_t, std::vector<Entry>> entries_;
  size_t count_ = 0;
  uint64_t generation_ = 0;  // CollectiveLoweringGeneration() the entries were made under
};

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_RULES_PLAN_CACHE_H_
