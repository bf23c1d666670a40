// Local-only replays of repeated eager ops (PlanCache::SetLocalOnly).
//
// Many ops expand to the op itself on each device's own components: no relayout, no
// collective. The first time such an op runs it is expanded as any op is, and the builder
// watches the expansion (EagerBuilder::WatchLocalOnly); when it turned out local-only,
// the run is recorded with the plan. The same op on the same inputs (layouts, shapes,
// host argument values, and attributes where the plan read them) then runs those local
// ops directly, without building the expansion again:
//   AddV2([x,*], [x,*]) -> on each leading device, AddV2 of its two components
#ifndef TF_DTENSOR_CC_EAGER_LOCAL_ONLY_H_
#define TF_DTENSOR_CC_EAGER_LOCAL_ONLY_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "cc/eager/executor.h"
#include "cc/eager/kernel_cache.h"
#include "cc/eager/tensor_with_layout.h"
#include "cc/rules/plan_cache.h"
#include "cc/rules/rule.h"

namespace tf_dtensor {

// An eager op as the replays see it: the TFE op, its inputs as TF gives them (`handles`)
// and, for each, its DTensor record or null (a host tensor).
struct EagerOp {
  const TFE_Op* op;
  TFE_Context* context;
  const std::string& name;
  const AttrMap& attrs;
  const std::vector<TFE_TensorHandle*>& handles;
  const std::vector<const TensorWithLayout*>& dtensors;
};

class LocalOnlyReplays {
 public:
  LocalOnlyReplays(PlanCache& plans, OpPool& pool, KernelCache& kernels)
      : plans_(plans), pool_(pool), kernels_(kernels) {}

  // The mesh on which `op` may be replayed (or recorded), else null: it has a rule (null:
  // none), no layout is requested of it, and every input is a DTensor of that one mesh
  // (no resource, no parts, nothing partial, each axis over one mesh dimension) where the
  // rule reads data, and a host tensor where it reads a host argument (an axis, a
  // permutation: its value is part of the plan). (Where results are copied to devices
  // rather than shared, GPUs, a replicated op is not recorded: EagerBuilder::LocalOnly
  // sees the copies.)
  static const Mesh* MeshOf(const RegisteredRule* rule,
                            const std::vector<const TensorWithLayout*>& dtensors,
                            bool layout_requested);

  // Runs `op` by the run recorded for it on `mesh` (the others sharing each leading
  // device's results) and wraps the outputs as DTensors of `device_name`. False when none
  // is recorded, or the run failed and nothing was made: the caller expands the op, which
  // reports the error.
  bool Replay(const EagerOp& op, const RegisteredRule* rule, const Mesh& mesh,
              const std::string& device_name, int* num_outputs, TFE_TensorHandle** outputs);

  // After the expansion of an op on MeshOf's mesh, which `builder` watched
  // (EagerBuilder::WatchLocalOnly), with its results: records the run when the expansion
  // was local-only and no layout was requested of it.
  void Record(const EagerBuilder& builder, const RegisteredRule* rule, const OpContext& ctx,
              const std::vector<ValueId>& outputs);

  // Ops run by a replay, for tests.
  int64_t num_runs() const { return runs_.load(std::memory_order_relaxed); }

 private:
  // The replay itself: false, with nothing handed out, when a local op failed.
  bool Run(const EagerOp& op, const Mesh& mesh, const LocalOnlyRun& run,
           const std::string& device_name, int* num_outputs, TFE_TensorHandle** outputs);

  PlanCache& plans_;
  OpPool& pool_;
  KernelCache& kernels_;
  std::atomic<int64_t> runs_{0};
};

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_EAGER_LOCAL_ONLY_H_
