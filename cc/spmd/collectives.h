// Abstract collectives: who communicates with whom, and how a collective is lowered.
//
// A collective over mesh dimensions `mesh_dims` runs within groups: the devices that
// agree on every other mesh coordinate. On mesh(x=2,y=4) an all-reduce over y has two
// groups, {0,1,2,3} and {4,5,6,7} (global ids), each ordered by the coordinate along y.
// The groups, each local device's place in them and the leader tables of the
// shared-buffer lowering are computed once per (mesh, dims) and cached process-wide.
//
// A CollectiveLowering (lowering.h) carries a collective step out over these groups; the
// lowering of a mesh is cached here with its groups.
#ifndef TF_DTENSOR_CC_SPMD_COLLECTIVES_H_
#define TF_DTENSOR_CC_SPMD_COLLECTIVES_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cc/core/mesh.h"
#include "cc/core/status.h"
#include "cc/spmd/builder.h"

namespace tf_dtensor {

class CollectiveLowering;  // lowering.h

// Whether collectives may count on processes other than this one to run the devices the
// mesh does not hold locally. tf_dtensor runs one client per process today, so this is
// false and a mesh with fewer local than global devices is refused at its first
// collective (rather than hanging or summing only the local part).
void SetMultiClientCollectives(bool enabled);
bool MultiClientCollectives();

// The groups of a collective over `mesh_dims` on `mesh`.
class CollectiveGroups {
 public:
  // Cached per (mesh, set of dims); the reference stays valid for the process.
  static const CollectiveGroups& For(const Mesh& mesh, const std::vector<int>& mesh_dims);

  // groups()[g]: the global device ids of group g, ordered by their coordinates along
  // the dims (row-major over `mesh_dims` in mesh order).
  const std::vector<std::vector<int64_t>>& groups() const { return groups_; }
  int group_size() const { return groups_.empty() ? 1 : static_cast<int>(groups_[0].size()); }
  // The group and the position in it of local device `local`.
  int group_of(int local) const { return group_of_[local]; }
  int rank_of(int local) const { return rank_of_[local]; }
  // members(g)[r]: the local index of the device at position r of group g, or -1 when
  // another process owns it.
  const std::vector<int>& local_members(int g) const { return local_members_[g]; }
  // A key for group g, the same in every process: a hash of the group's device names
  // (or ids).
  int32_t group_key(int g) const { return group_keys_[g]; }
  // tf_order(g)[k]: the position in group g of the k-th participant in the order TF's
  // collectives rank a group (by task, then device index); CollectiveGatherV2 stacks
  // the pieces in that order. Identity in the common case.
  const std::vector<int>& tf_order(int g) const { return tf_order_[g]; }
  bool tf_order_is_identity() const { return tf_order_identity_; }
  // Whether every group ranks its positions alike (tf_order(g) the same for every g).
  // Where not (a mesh on a permuted device list: [3,1,7,5 | 0,2,6,4]), a ring reduction
  // adds the same terms in another order in each group, and the replicas of a result that
  // several groups compute differ in the last bits.
  bool tf_orders_agree() const { return tf_orders_agree_; }
  // Whether every member of every group with a local device is local.
  bool all_local() const { return all_local_; }

 private:
  friend class CollectiveCache;
  std::vector<std::vector<int64_t>> groups_;
  std::vector<int> group_of_, rank_of_;
  std::vector<std::vector<int>> local_members_;
  std::vector<int32_t> group_keys_;
  std::vector<std::vector<int>> tf_order_;
  bool tf_order_identity_ = true;
  bool tf_orders_agree_ = true;
  bool all_local_ = true;
};

// leader[d]: the first local device that agrees with local device d on every mesh
// coordinate in `key_dims` (d itself where the mesh's lowering does not share buffers).
// Cached per (mesh, set of dims, sharing).
const std::vector<int>& LocalLeaders(const Mesh& mesh, const std::vector<int>& key_dims);
// The same grouping whatever the lowering: the first local device agreeing on `key_dims`
// leads (a collective computed once per group and handed to the others, shared or copied).
const std::vector<int>& GroupLeaders(const Mesh& mesh, const std::vector<int>& key_dims);

// The lowering of `mesh` chosen under policy generation `generation`, cached with the
// mesh's groups (CollectiveLowering::For asks, behind a thread-local hit).
const CollectiveLowering& CachedLowering(const Mesh& mesh, uint64_t generation);

// A fresh instance key for one collective step. Every participant of the step uses the
// same key. Keys come from a process-wide counter, so processes that issue the same
// collectives in the same order (SPMD programs do) derive the same keys.
int32_t NextInstanceKey();
// `count` consecutive fresh instance keys at once; returns the first.
int32_t NextInstanceKeys(int32_t count);
// The task (client) holding global device `id` of a distributed mesh: ids run task by task
// with the same number of devices on each (create_distributed_mesh, as in TF's DTensor).
int64_t DistributedTaskOf(const Mesh& mesh, int64_t id);
// "/job:<job>/replica:<n>/task:<task>", the task of that name in this client's job (from
// the name of its first device of `mesh`); empty where that name has no task.
std::string DistributedTaskName(const Mesh& mesh, int64_t task);
// How many instance keys NextInstanceKey has handed out so far.
int64_t InstanceKeysIssued();
// How many groups, leader tables and lowerings the process-wide cache holds (tests: the
// entries of meshes no longer held elsewhere are dropped as the cache grows).
size_t CollectiveCacheEntries();

// Instance keys that eager collectives hand back for reuse. TensorFlow's collective
// runtime keeps a record for every (group key, instance key) it has seen, for the life of
// the context (about 1.6 KB each): a fresh key per eager step grew memory without bound
// in a long eager loop. An eager step of one `signature` (op, layouts, shapes, dtype:
// everything TF's record holds) takes a key that an earlier step of that signature has
// finished with, or a fresh one; a graph's collectives keep fresh keys (they may run at
// once within one function call). A key is returned only after every local participant
// has finished with it, and only when the step succeeded.
int32_t TakeInstanceKey(const std::string& signature);
void ReturnInstanceKey(const std::string& signature, int32_t key);

// Refuses a collective on a mesh some of whose devices belong to other processes when
// they cannot take part: names the mesh, the local and global device counts and the fix.
Status CheckCollectiveParticipants(const Mesh& mesh, const CollectiveGroups& groups,
                                   const std::string& what);

// The merge_op of CollectiveReduceV2 for `op` ("Add", "Max", "Min", "Mul").
const char* CollectiveMergeOp(ReduceOp op);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_SPMD_COLLECTIVES_H_
