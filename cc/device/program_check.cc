#include "cc/device/program_check.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>

#include "cc/spmd/collectives.h"
#include "cc/tf/handles.h"
#include "tensorflow/c/c_api_experimental.h"
#include "tensorflow/c/eager/c_api_experimental.h"

namespace tf_dtensor {
namespace {

// The tasks holding devices of `mesh`.
std::set<int> TasksOf(const Mesh& mesh) {
  std::set<int> tasks;
  for (int64_t id : mesh.global_device_ids()) {
    tasks.insert(static_cast<int>(DistributedTaskOf(mesh, id)));
  }
  return tasks;
}

int64_t TimeoutMs() {
  const char* value = std::getenv("TF_DTENSOR_PROGRAM_CHECK_TIMEOUT_S");
  const int64_t seconds = value ? std::atoll(value) : 300;
  return (seconds > 0 ? seconds : 300) * 1000;
}

// `text` for an error message: whole when short, else its head (what runs, on which
// inputs) and the part where it first differs from the other client's, at `at` (a step
// issuing many collectives would bury the difference).
// Cuts fall after a "; " (between two collectives) where there is one.
std::string AroundDifference(const std::string& text, size_t at) {
  constexpr size_t kWhole = 600, kHead = 200, kBefore = 100, kAfter = 300;
  if (text.size() <= kWhole) return text;
  if (at < kHead + kBefore) return text.substr(0, kWhole) + " ...";
  size_t head = text.rfind("; ", kHead);
  head = head == std::string::npos ? kHead : head + 1;
  size_t from = text.rfind("; ", at - kBefore);
  from = from == std::string::npos || from < head ? at - kBefore : from + 2;
  return text.substr(0, head) + " ... " + text.substr(from, at + kAfter - from) +
         (at + kAfter < text.size() ? " ..." : "");
}

// Checked steps per key-value directory (see CheckSameProgram).
constexpr int64_t kStepsPerEpoch = 16;

// Program steps per set of clients, in this process's order.
std::mutex steps_mutex;
std::map<std::set<int>, int64_t> steps;

}  // namespace

Status CheckSameProgram(TFE_Context* context, const Mesh& mesh, const std::string& description) {
  if (!mesh.spans_processes() || mesh.local_device_ids().empty()) return Status::Ok();
  const int me = static_cast<int>(DistributedTaskOf(mesh, mesh.local_device_ids()[0]));
  const std::set<int> tasks = TasksOf(mesh);
  int64_t step;
  {
    std::lock_guard<std::mutex> lock(steps_mutex);
    step = steps[tasks]++;
  }
  std::string group;
  for (int t : tasks) group += (group.empty() ? "" : "_") + std::to_string(t);
  // Steps come in epochs of kStepsPerEpoch, one key-value directory each, so that the
  // steps everyone has read are dropped a directory at a time (below).
  const std::string epochs = "tf_dtensor/program/" + group + "/";
  const std::string prefix =
      epochs + std::to_string(step / kStepsPerEpoch) + "/" + std::to_string(step) + "/";
  StatusPtr status(TF_NewStatus());
  TFE_InsertConfigKeyValue(context, (prefix + std::to_string(me)).c_str(), description.c_str(),
                           status.get());
  TFD_RETURN_IF_TF_ERROR(status.get(), "publishing this client's program step " +
                                           std::to_string(step + 1));
  const int64_t timeout = TimeoutMs();
  for (int other : tasks) {
    if (other == me) continue;
    // Read in slices of a second: a wait in the coordination service's key-value store
    // does not end when the client it waits for is lost, so after each slice the client is
    // asked whether it is alive (TF's collective health check): a lost client fails this
    // one at once, naming it, instead of after the whole timeout.
    const std::string task = DistributedTaskName(mesh, other);
    TF_Buffer* buffer = TF_NewBuffer();
    for (int64_t waited = 0;;) {
      const int64_t slice = std::min<int64_t>(1000, timeout - waited);
      TFE_GetConfigKeyValue(context, (prefix + std::to_string(other)).c_str(), slice, buffer,
                            status.get());
      waited += slice;
      if (TF_GetCode(status.get()) != TF_DEADLINE_EXCEEDED || waited >= timeout) break;
      if (task.empty()) continue;
      StatusPtr health(TF_NewStatus());
      TFE_CollectiveOpsCheckPeerHealth(context, task.c_str(), 1000, health.get());
      if (TF_GetCode(health.get()) != TF_OK) {
        TF_DeleteBuffer(buffer);
        return FromTF(health.get(), "waiting for client " + std::to_string(other) + " (" +
                                        task + ") at checked program step " +
                                        std::to_string(step + 1) + ": it is lost");
      }
    }
    std::string theirs;
    if (TF_GetCode(status.get()) == TF_OK) {
      theirs.assign(static_cast<const char*>(buffer->data), buffer->length);
    }
    TF_DeleteBuffer(buffer);
    const std::string where = "checked program step " + std::to_string(step + 1) + " on " +
                              mesh.ShortString();
    if (TF_GetCode(status.get()) == TF_DEADLINE_EXCEEDED) {
      return DeadlineExceeded(
          "Client " + std::to_string(other) + " did not reach its " + where + " within " +
          std::to_string(timeout / 1000) + " s, where this client (" + std::to_string(me) +
          ") runs " + description + ". Every client must run the same program; client " +
          std::to_string(other) + " runs another (fewer or other tf.function calls, or "
          "eager collectives this one does not make) or is stuck. "
          "TF_DTENSOR_PROGRAM_CHECK_TIMEOUT_S sets the wait.");
    }
    TFD_RETURN_IF_TF_ERROR(status.get(), "reading client " + std::to_string(other) +
                                             "'s program step " + std::to_string(step + 1));
    if (theirs != description) {
      size_t at = 0;
      while (at < theirs.size() && at < description.size() && theirs[at] == description[at]) ++at;
      return FailedPrecondition(
          "The clients run different programs at their " + where + ": this client (" +
          std::to_string(me) + ") runs " + AroundDifference(description, at) + "; client " +
          std::to_string(other) + " runs " + AroundDifference(theirs, at) +
          ". Every client must run the same tf.functions (and eager "
          "collectives) on the same input shapes and layouts, in the same order (make "
          "data-dependent choices the same on every client).");
    }
  }
  // Every other client has now published this step, which it does only after reading every
  // key of its earlier steps: at the start of an epoch, the lowest client of the group
  // drops the directory of the epoch before last (one round trip per kStepsPerEpoch steps),
  // so that the leader's key-value store holds at most three epochs of descriptions instead
  // of one per checked step for the whole run (every eager all-reduce of a long eager loop
  // added one, about 0.5 KB each).
  if (me == *tasks.begin() && step % kStepsPerEpoch == 0 && step >= 2 * kStepsPerEpoch) {
    StatusPtr dropped(TF_NewStatus());
    TFE_DeleteConfigKeyValue(
        context, (epochs + std::to_string(step / kStepsPerEpoch - 2)).c_str(), dropped.get());
  }
  return Status::Ok();
}

}  // namespace tf_dtensor
