#include "cc/spmd/lowering.h"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <set>
#include <string>

namespace tf_dtensor {

// The lowerings, one file each. "auto" takes the first that serves a mesh.
const CollectiveLowering& SharedBufferLowering();   // shared_buffer_lowering.cc
const CollectiveLowering& DeviceCopyLowering();     // shared_buffer_lowering.cc ("copies")
const CollectiveLowering& CollectiveOpsLowering();  // collective_ops_lowering.cc

namespace {

const std::vector<const CollectiveLowering*>& Lowerings() {
  static const std::vector<const CollectiveLowering*> lowerings = {
      &SharedBufferLowering(),
      &DeviceCopyLowering(),
      &CollectiveOpsLowering(),
  };
  return lowerings;
}

// The forced lowering, or null for "auto".
StatusOr<const CollectiveLowering*> Named(std::string_view policy) {
  if (policy == "auto") return static_cast<const CollectiveLowering*>(nullptr);
  std::string names = "`auto`";
  for (size_t i = 0; i < Lowerings().size(); ++i) {
    const CollectiveLowering* lowering = Lowerings()[i];
    if (lowering->name() == policy) return lowering;
    names += (i + 1 == Lowerings().size() ? " or `" : ", `") + std::string(lowering->name()) + "`";
  }
  return InvalidArgument("Unknown collective lowering `" + std::string(policy) +
                         "`; expected " + names + ".");
}

const CollectiveLowering* DefaultPolicy() {
  const char* env = std::getenv("TF_DTENSOR_COLLECTIVES");
  StatusOr<const CollectiveLowering*> named = Named(env && *env ? env : "auto");
  // An unknown name in the environment is refused when the policy is set, not here.
  return named.ok() ? *named : nullptr;
}

std::atomic<const CollectiveLowering*>& Forced() {
  static std::atomic<const CollectiveLowering*> forced{DefaultPolicy()};
  return forced;
}

std::atomic<uint64_t> generation{1};

}  // namespace

Status SetCollectiveLoweringPolicy(std::string_view policy) {
  std::string value(policy);
  if (value.empty()) {
    const char* env = std::getenv("TF_DTENSOR_COLLECTIVES");
    value = env && *env ? env : "auto";
  }
  TFD_ASSIGN_OR_RETURN(const CollectiveLowering* forced, Named(value));
  // Setting the policy in force again keeps every plan and expanded function.
  if (Forced().exchange(forced) != forced) generation.fetch_add(1);
  return Status::Ok();
}

std::string CollectiveLoweringPolicy() {
  const CollectiveLowering* forced = Forced().load();
  return forced ? std::string(forced->name()) : "auto";
}

uint64_t CollectiveLoweringGeneration() { return generation.load(); }

namespace {
std::atomic<bool> multi_client{false};

std::mutex& LookupMutex() {
  static std::mutex mutex;
  return mutex;
}

PhysicalDeviceLookup& Lookup() {
  static PhysicalDeviceLookup lookup;
  return lookup;
}
}  // namespace

void SetPhysicalDeviceLookup(PhysicalDeviceLookup lookup) {
  {
    std::lock_guard<std::mutex> lock(LookupMutex());
    Lookup() = std::move(lookup);
  }
  generation.fetch_add(1);
}

bool UsesNccl(const Mesh& mesh) {
  if (mesh.device_type() != "GPU") return false;
  const char* env = std::getenv("DTENSOR_GPU_USE_NCCL_COMMUNICATION");
  // As TensorFlow's DTensor (and config.gpu_use_nccl_communication) reads it: any value
  // but "0".
  if (env == nullptr || std::string_view(env) == "0") return false;
  // Asked per collective op: the answer for this thread's last mesh is kept until the
  // lookup (or the policy) changes, as CollectiveLowering::For keeps its choice.
  struct Last {
    std::optional<Mesh> mesh;
    uint64_t generation = 0;
    bool uses = false;
  };
  thread_local Last last;
  const uint64_t now = generation.load();
  if (last.mesh && last.generation == now && last.mesh->SharesRepresentation(mesh)) {
    return last.uses;
  }
  bool uses = true;
  {
    std::lock_guard<std::mutex> lock(LookupMutex());
    std::set<int> physical;
    for (const std::string& device : mesh.local_devices()) {
      std::optional<int> id = Lookup() ? Lookup()(device) : std::nullopt;
      if (!id || !physical.insert(*id).second) {
        uses = false;
        break;
      }
    }
  }
  last.mesh = mesh;
  last.generation = now;
  last.uses = uses;
  return uses;
}

void SetMultiClientCollectives(bool enabled) {
  multi_client = enabled;
  generation.fetch_add(1);
}

bool MultiClientCollectives() { return multi_client; }

const CollectiveLowering& ChooseCollectiveLowering(const Mesh& mesh) {
  // A forced lowering comes first where it can work at all (shared buffers only between
  // devices that share memory). A single-device mesh has no collectives to lower; it
  // keeps what "auto" gives it.
  const CollectiveLowering* forced = Forced().load();
  if (forced && !mesh.is_single_device() && forced->Serves(mesh, multi_client)) return *forced;
  for (const CollectiveLowering* lowering : Lowerings()) {
    if (lowering->Serves(mesh, multi_client)) return *lowering;
  }
  return *Lowerings().back();
}

const CollectiveLowering& CollectiveLowering::For(const Mesh& mesh) {
  // The last mesh this thread asked about: collectives and shares come in runs on one mesh.
  struct Last {
    std::optional<Mesh> mesh;
    uint64_t generation = 0;
    const CollectiveLowering* lowering = nullptr;
  };
  thread_local Last last;
  const uint64_t now = generation.load();
  if (last.lowering && last.generation == now && last.mesh->SharesRepresentation(mesh)) {
    return *last.lowering;
  }
  const CollectiveLowering& lowering = CachedLowering(mesh, now);
  last.mesh = mesh;
  last.generation = now;
  last.lowering = &lowering;
  return lowering;
}

StatusOr<ValueId> SameBlocks(CollectiveRunner& run, ValueId value, const Layout& out_layout) {
  Builder& b = run.builder();
  std::vector<LocalHandle> out;
  for (int d = 0; d < run.mesh().num_local_devices(); ++d) {
    StatusOr<LocalHandle> h = run.Share(run.Local(value, d), d);
    if (!h.ok()) {
      run.DiscardAll(out);
      return h.status();
    }
    out.push_back(*h);
  }
  return run.AddValue(out_layout, b.shape(value), b.dtype(value), out);
}

StatusOr<LocalHandle> CollectiveRunner::Host(const std::vector<int64_t>& values,
                                             const std::vector<int64_t>& shape, int dtype) {
  TFD_ASSIGN_OR_RETURN(ValueId value, builder().HostConstant(values, shape, dtype));
  return Local(value, 0);
}

StatusOr<std::vector<LocalHandle>> CollectiveRunner::RunEach(
    const std::string& op_type, const std::vector<std::vector<LocalHandle>>& inputs,
    const LocalOpOptions& options) {
  std::vector<LocalHandle> outputs;
  for (int d = 0; d < static_cast<int>(inputs.size()); ++d) {
    StatusOr<std::vector<LocalHandle>> r = RunOn(op_type, inputs[d], options, d, 1);
    if (!r.ok()) {
      DiscardAll(outputs);
      return r.status();
    }
    outputs.push_back(r.value()[0]);
  }
  return outputs;
}

void CollectiveRunner::DiscardAll(const std::vector<LocalHandle>& handles) {
  for (LocalHandle h : handles) Discard(h);
}

bool CollectiveRunner::SameCoords(int a, int b, const std::vector<int>& mesh_dims) const {
  for (int k : mesh_dims) {
    if (mesh().LocalCoord(a, k) != mesh().LocalCoord(b, k)) return false;
  }
  return true;
}

StatusOr<ValueId> CollectiveLowering::ReduceScatter(CollectiveRunner& run, ValueId value, int dim,
                                                    int mesh_dim, ReduceOp op) const {
  return run.builder().Builder::ReduceScatter(value, dim, mesh_dim, op);
}

StatusOr<ValueId> CollectiveLowering::ToPartial(CollectiveRunner& run, ValueId value,
                                                const std::vector<int>& mesh_dims,
                                                ReduceOp op) const {
  Builder& b = run.builder();
  const Mesh& mesh = run.mesh();
  const Layout layout = *b.layout(value);
  const int dtype = b.dtype(value);
  std::vector<PartialSpec> added;
  for (int k : mesh_dims) added.push_back({k, op});
  TFD_ASSIGN_OR_RETURN(Layout out_layout, layout.WithPartial(added));
  const int n = mesh.num_local_devices();
  // Sum and product: the first device of each group (coordinate 0 along `mesh_dims`) keeps
  // the value, the others hold the identity (zeros, ones). Max, min, mean: every device
  // keeps the value (max(v, v) = v, mean(v, v) = v).
  const char* filler = op == ReduceOp::kSum ? "ZerosLike" : op == ReduceOp::kProd ? "OnesLike"
                                                                                  : nullptr;
  std::vector<int> key_dims = layout.DistinctMeshDims();
  for (int k : mesh_dims) key_dims.push_back(k);
  const std::vector<int>& leaders = LocalLeaders(mesh, key_dims);
  LocalOpOptions options;
  options.copy_attrs = false;
  options.overrides = {AttrOverride::Type("T", dtype)};
  std::vector<LocalHandle> out;
  for (int d = 0; d < n; ++d) {
    bool first = true;
    for (int k : mesh_dims) first = first && mesh.LocalCoord(d, k) == 0;
    Status status;
    if (leaders[d] != d) {
      StatusOr<LocalHandle> h = run.Share(out[leaders[d]], d);
      status = h.status();
      if (h.ok()) out.push_back(*h);
    } else if (first || filler == nullptr) {
      StatusOr<LocalHandle> h = run.Share(run.Local(value, d), d);
      status = h.status();
      if (h.ok()) out.push_back(*h);
    } else {
      StatusOr<std::vector<LocalHandle>> r =
          run.RunOn(filler, {run.Local(value, d)}, options, d, 1);
      status = r.status();
      if (r.ok()) out.push_back((*r)[0]);
    }
    if (!status.ok()) {
      run.DiscardAll(out);
      return status;
    }
  }
  return run.AddValue(out_layout, b.shape(value), dtype, out);
}

}  // namespace tf_dtensor
