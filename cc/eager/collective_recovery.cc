#include "cc/eager/collective_recovery.h"

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>

#include "tensorflow/c/eager/tfe_context_internal.h"
#include "tensorflow/core/common_runtime/base_collective_executor.h"
#include "tensorflow/core/common_runtime/collective_executor_mgr.h"
#include "tensorflow/core/common_runtime/eager/context.h"
#include "tensorflow/core/nccl/collective_communicator.h"

namespace tf_dtensor {

namespace tf = ::tensorflow;

namespace {

// Runs issuing TF collective ops hold it shared; a renewal holds it alone.
std::shared_mutex& RunsMutex() {
  static auto* mutex = new std::shared_mutex;
  return *mutex;
}

thread_local int run_depth = 0;
std::atomic<int64_t> renewals{0};

// The managers made here, one per context (the last one given to it): a context does not
// own a manager it is given, and the one it used before is deleted when it takes the next.
// A context's entry outlives the context (no hook tells its end) until a context at the
// same address renews: one idle manager per such context.
std::map<const tf::EagerContext*, std::unique_ptr<tf::CollectiveExecutorMgrInterface>>&
Renewed() {
  static auto* renewed =
      new std::map<const tf::EagerContext*, std::unique_ptr<tf::CollectiveExecutorMgrInterface>>;
  return *renewed;
}

// Reads the abort status TF keeps in a protected member of its executor. A pointer to a
// member named through a derived class is a pointer to the base's member, so the read needs
// no object of this type.
struct AbortStatus : tf::BaseCollectiveExecutor {
  static bool Aborted(tf::CollectiveExecutor* executor) {
    // TF's local and RPC managers both make BaseCollectiveExecutors.
    auto* base = static_cast<tf::BaseCollectiveExecutor*>(executor);
    tf::mutex& mu = base->*(&AbortStatus::status_mu_);
    tf::mutex_lock lock(mu);
    return !(base->*(&AbortStatus::status_)).ok();
  }
};

tf::EagerContext* Eager(TFE_Context* context) {
  return tf::ContextFromInterface(tf::unwrap(context));
}

// Whether the context is one TF made for this process alone (no cluster, no server).
bool Local(tf::EagerContext& context) {
  return context.GetServer() == nullptr && context.remote_device_mgr() == nullptr;
}

bool Aborted(tf::EagerContext& context) {
  tf::CollectiveExecutorMgrInterface* manager = context.collective_executor_mgr();
  if (manager == nullptr) return false;
  tf::CollectiveExecutor* executor = manager->FindOrCreate(0);  // eager steps are step 0
  const bool aborted = AbortStatus::Aborted(executor);
  executor->Unref();
  return aborted;
}

// Renews the context's collectives (header): always after a failed run, else only when
// they are aborted. The caller holds no share of RunsMutex.
void Renew(tf::EagerContext& context, bool always) {
  std::unique_lock<std::shared_mutex> alone(RunsMutex());
  if (!always && !Aborted(context)) return;  // another thread renewed it meanwhile
  // Its kernels and their executor handles go first; the old manager is deleted when the
  // context takes the new one, with no run left in flight to use it.
  context.ClearCachesAndThreadExecutors();
  const tf::ConfigProto& config = context.session_options().config;
  std::unique_ptr<tf::CollectiveExecutorMgrInterface> manager =
      tf::CreateProdLocalCollectiveExecutorMgr(config, context.local_device_mgr(),
                                               tf::MaybeCreateNcclCommunicator(config));
  // Deletes the context's own manager (TF's, at the first renewal); ours, from the renewal
  // before, is deleted below. Each holds a work queue whose threads end with it.
  context.SetCollectiveExecutorMgr(manager.get());
  std::swap(Renewed()[&context], manager);
  manager.reset();
  context.ResetGlobalRendezvousForFunction();
  renewals.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

CollectiveRun::CollectiveRun(TFE_Context* context)
    : context_(context), outermost_(run_depth++ == 0) {
  if (!outermost_) return;
  tf::EagerContext* eager = Eager(context);
  if (eager != nullptr && Local(*eager) && Aborted(*eager)) Renew(*eager, /*always=*/false);
  RunsMutex().lock_shared();
}

CollectiveRun::~CollectiveRun() {
  --run_depth;
  if (!outermost_) {
    // The outermost run fails with this one's error, and renews then.
    return;
  }
  RunsMutex().unlock_shared();
  if (!failed_) return;
  tf::EagerContext* eager = Eager(context_);
  if (eager != nullptr && Local(*eager)) Renew(*eager, /*always=*/true);
}

bool CollectivesAborted(TFE_Context* context) {
  tf::EagerContext* eager = Eager(context);
  return eager != nullptr && Aborted(*eager);
}

int64_t CollectiveRenewals() { return renewals.load(std::memory_order_relaxed); }

}  // namespace tf_dtensor
