// How an abstract collective (builder.h) runs on a mesh's devices: a CollectiveLowering.
//
// A lowering turns AllReduce, AllGather, AllToAll, ReduceScatter and ToPartial into local
// ops and TF collective ops on each device, through a small per-device runner that the
// builders implement (ComponentBuilder: eager handles or graph nodes). One lowering per
// file, all plain .cc code:
//   shared_buffer_lowering.cc   virtual CPUs of one process: devices read their peers'
//                               results (AddN / ConcatV2 over shared buffers);
//   collective_ops_lowering.cc  TF's CollectiveReduceV2 / GatherV2 / AllToAllV2, which
//                               also work across devices that share nothing (GPUs,
//                               other processes).
// A new lowering (NCCL, XLA, ...) is one new file plus one line in Lowerings()
// (lowering.cc). The lowering of a mesh is chosen once per mesh and policy (cached next
// to the CollectiveGroups), and `shares_buffers()` is what every other decision that
// depends on buffer sharing asks (matmul's plan choice, the graph's host device, eager
// result sharing, LocalLeaders).
#ifndef TF_DTENSOR_CC_SPMD_LOWERING_H_
#define TF_DTENSOR_CC_SPMD_LOWERING_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cc/core/mesh.h"
#include "cc/core/status.h"
#include "cc/spmd/builder.h"
#include "cc/spmd/collectives.h"

namespace tf_dtensor {

// A tensor on one device (or on the host) as a lowering sees it: an index into the
// runner's table of the builder's handles (eager tensor handles, graph node outputs).
// Valid while the collective that made the runner runs.
using LocalHandle = int;

// What a lowering needs of a builder. ComponentBuilder implements it over its Handle
// type, so the lowerings are compiled once and not into every includer.
class CollectiveRunner {
 public:
  virtual ~CollectiveRunner() = default;

  // The builder the collective belongs to: values' layouts, shapes and dtypes, host
  // constants, and the composite collectives (Builder::AllToAll: gather, then slice).
  virtual Builder& builder() = 0;
  // The mesh the collective runs on (its value's).
  virtual const Mesh& mesh() const = 0;
  // Device `device`'s handle of `value`; the host handle for a host value.
  virtual LocalHandle Local(ValueId value, int device) = 0;
  // Runs one local op on `device`; `num_outputs` as ComponentBuilder::RunOn.
  virtual StatusOr<std::vector<LocalHandle>> RunOn(const std::string& op_type,
                                                   const std::vector<LocalHandle>& inputs,
                                                   const LocalOpOptions& options, int device,
                                                   int num_outputs) = 0;
  // RunOn for several: `inputs[i]` on `devices[i]`, one op type and options, each of
  // `num_outputs` outputs; at once where eager kernels hold the host (accelerators). On
  // failure nothing it made is kept.
  virtual StatusOr<std::vector<std::vector<LocalHandle>>> RunOnEach(
      const std::string& op_type, const std::vector<std::vector<LocalHandle>>& inputs,
      const std::vector<int>& devices, const LocalOpOptions& options, int num_outputs) = 0;
  // Runs one TF collective op on every local device at once (`inputs[d]` on device d);
  // each device's single output.
  virtual StatusOr<std::vector<LocalHandle>> RunCollective(
      const std::string& op_type, const std::vector<std::vector<LocalHandle>>& inputs,
      const LocalOpOptions& options) = 0;
  // Device `device`'s handle of a result `leader` computed: shared, or copied over.
  virtual StatusOr<LocalHandle> Share(LocalHandle leader, int device) = 0;
  // Share for several: device `devices[i]`'s handle of `leaders[i]`. Where a copy blocks
  // until it is done (eager copies between accelerators) they are made at once. On
  // failure nothing it made is kept.
  virtual StatusOr<std::vector<LocalHandle>> ShareAll(const std::vector<LocalHandle>& leaders,
                                                      const std::vector<int>& devices) = 0;
  // Drops a handle the lowering made and no value keeps.
  virtual void Discard(LocalHandle handle) = 0;
  // Whether every local participant has finished a collective when RunCollective
  // returns (eagerly), so its instance key may serve a later step of the same signature.
  virtual bool collectives_done_on_return() const { return false; }
  // The local shape of `handle` where the builder knows it.
  virtual std::optional<std::vector<int64_t>> LocalShape(LocalHandle handle) = 0;
  // Tells a graph the local shape of a collective's result, which TF's shape inference
  // leaves partly unknown (CollectiveGatherV2's first axis). Nothing eagerly.
  virtual void SetLocalShape(LocalHandle handle, const std::vector<int64_t>& shape) = 0;
  // A new value of `layout` (global `shape`) whose device d holds `handles[d]`, which it
  // owns from now on.
  virtual ValueId AddValue(Layout layout, std::vector<int64_t> shape, int dtype,
                           const std::vector<LocalHandle>& handles) = 0;

  // A host constant (int32 or int64) as a handle.
  StatusOr<LocalHandle> Host(const std::vector<int64_t>& values, const std::vector<int64_t>& shape,
                             int dtype);
  // Runs `op_type` of one output on every local device with its own inputs; discards what
  // it made on failure.
  StatusOr<std::vector<LocalHandle>> RunEach(const std::string& op_type,
                                             const std::vector<std::vector<LocalHandle>>& inputs,
                                             const LocalOpOptions& options);
  void DiscardAll(const std::vector<LocalHandle>& handles);
  // Whether local devices `a` and `b` agree on every mesh coordinate in `mesh_dims`.
  bool SameCoords(int a, int b, const std::vector<int>& mesh_dims) const;
};

// `value`'s blocks as they are, under `out_layout` (an axis sharded over mesh dimensions
// of size 1 is whole on every device): each device's own handle, shared or copied in
// place. Gathers over such an axis take it instead of a one-input concatenation, which TF
// refuses ("attr 'N' of 1 must be at least minimum 2").
StatusOr<ValueId> SameBlocks(CollectiveRunner& run, ValueId value, const Layout& out_layout);

class CollectiveLowering {
 public:
  virtual ~CollectiveLowering() = default;

  // The policy name that forces this lowering (`config.set_collective_lowering`).
  virtual std::string_view name() const = 0;
  // Whether devices hand results to each other as shared buffers (virtual CPUs of one
  // process). Then devices that hold the same block compute it once and the others share
  // it (LocalLeaders), and a gather is one concatenation every device shares, which makes
  // gathering cheaper than reducing (matmul's plan choice).
  virtual bool shares_buffers() const = 0;
  // Whether this lowering can run the collectives of `mesh`; "auto" takes the first of
  // Lowerings() that can. `multi_client`: other processes run the devices this one does
  // not hold.
  virtual bool Serves(const Mesh& mesh, bool multi_client) const = 0;

  // The collectives of Builder (builder.h), on the runner's mesh, after the builder has
  // checked that every participant is local or can take part.
  virtual StatusOr<ValueId> AllReduce(CollectiveRunner& run, ValueId value,
                                      const std::vector<int>& mesh_dims, ReduceOp op) const = 0;
  virtual StatusOr<ValueId> AllGather(CollectiveRunner& run, ValueId value, int dim) const = 0;
  virtual StatusOr<ValueId> AllToAll(CollectiveRunner& run, ValueId value, int from_dim,
                                     int to_dim) const = 0;
  // Default, for lowerings without a native one: all-reduce, then slice.
  virtual StatusOr<ValueId> ReduceScatter(CollectiveRunner& run, ValueId value, int dim,
                                          int mesh_dim, ReduceOp op) const;
  // Default: local ops only (identity fillers on all but the first device of a group),
  // right for any lowering whose Share works.
  virtual StatusOr<ValueId> ToPartial(CollectiveRunner& run, ValueId value,
                                      const std::vector<int>& mesh_dims, ReduceOp op) const;

  // The lowering collectives on `mesh` use under the current policy. Chosen once per mesh
  // and policy generation; cheap enough to ask per collective (a thread-local hit).
  static const CollectiveLowering& For(const Mesh& mesh);
};

// The process-wide lowering policy: "auto" (the first lowering in Lowerings() that serves
// the mesh: shared buffer for meshes of local virtual CPUs, collective ops otherwise) or a
// lowering's name, "ops" or "shared", which then comes first for every mesh of more than
// one device that it serves (the ops on CPUs, to test them). The default comes from the
// environment variable TF_DTENSOR_COLLECTIVES, read once; "" resets to that default.
Status SetCollectiveLoweringPolicy(std::string_view policy);
std::string CollectiveLoweringPolicy();
// Changes each time the policy (or SetMultiClientCollectives) changes, so that caches of
// choices made under a lowering (plans, expanded functions) can tell they are stale.
uint64_t CollectiveLoweringGeneration();

// Chooses the lowering of `mesh` under the current policy (no cache: see
// CollectiveLowering::For).
const CollectiveLowering& ChooseCollectiveLowering(const Mesh& mesh);

// The physical GPU behind a local device name, or nullopt where unknown; the device layer
// gives TF's (SetPhysicalDeviceLookup), tests their own. None set: every answer unknown.
using PhysicalDeviceLookup = std::function<std::optional<int>(const std::string& device)>;
void SetPhysicalDeviceLookup(PhysicalDeviceLookup lookup);

// Whether collectives on `mesh` go over NCCL: asked for with TensorFlow DTensor's switch,
// DTENSOR_GPU_USE_NCCL_COMMUNICATION=1, and possible, on a GPU mesh whose local devices are
// distinct physical GPUs. Logical GPUs of one physical GPU cannot use NCCL ("duplicate GPU"),
// so they keep the copies in one process and TF's ring across processes. Where NCCL serves,
// "auto" takes the collective-ops lowering over it instead of the copies.
bool UsesNccl(const Mesh& mesh);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_SPMD_LOWERING_H_
