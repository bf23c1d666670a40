// Plans already made on the eager path, so a repeated op (same rule, inputs, layouts,
// shapes, host values, request and, when its Forward read any, attributes) skips Forward.
// PyTorch's sharding propagator keeps such a cache keyed by its op schema. Forward is
// pure, so a cached plan is the plan Forward would make.
#ifndef TF_DTENSOR_CC_RULES_PLAN_CACHE_H_
#define TF_DTENSOR_CC_RULES_PLAN_CACHE_H_

#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cc/rules/rule.h"

namespace tf_dtensor {

class PlanCache {
 public:
  // The plan made before for the same op and inputs, or null.
  std::shared_ptr<const Plan> Find(const Rule* rule, const OpContext& ctx);
  // Remembers `plan`, made for `ctx` (call after planning, once ctx.attrs shows what
  // Forward read). Old entries go when the cache is full.
  void Insert(const Rule* rule, const OpContext& ctx, std::shared_ptr<const Plan> plan);
  size_t size() const;

  static constexpr size_t kMaxEntries = 4096;

 private:
  struct Entry {
    const Rule* rule;
    std::string op_name;
    Mesh mesh;
    std::vector<InputInfo> inputs;
    std::optional<Layout> requested;
    int num_outputs;
    bool keep_partial;
    bool uses_attrs;
    std::string attrs;
    std::shared_ptr<const Plan> plan;
    bool Matches(const Rule* r, const OpContext& ctx) const;
  };
  static size_t Hash(const Rule* rule, const OpContext& ctx);

  mutable std::mutex mutex_;
  std::unordered_map<size_t, std::vector<Entry>> entries_;
  size_t count_ = 0;
};

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_RULES_PLAN_CACHE_H_
