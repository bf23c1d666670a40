#include "cc/spmd/collectives.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "cc/spmd/lowering.h"

namespace tf_dtensor {
namespace {

uint64_t DimsMask(const std::vector<int>& dims) {
  uint64_t mask = 0;
  for (int d : dims) mask |= uint64_t{1} << d;
  return mask;
}

// 64-bit FNV-1a.
uint64_t Fnv(uint64_t hash, std::string_view text) {
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return hash;
}

// (job, replica, task, device index) of a full device name, for TF's group ranking.
std::tuple<std::string, int64_t, int64_t, int64_t> RankKey(const std::string& device,
                                                           int64_t fallback) {
  auto number_after = [&](std::string_view tag) -> int64_t {
    size_t pos = device.find(tag);
    if (pos == std::string::npos) return -1;
    return std::atoll(device.c_str() + pos + tag.size());
  };
  size_t job = device.find("/job:");
  std::string job_name;
  if (job != std::string::npos) {
    size_t end = device.find('/', job + 1);
    job_name = device.substr(job + 5, end == std::string::npos ? end : end - job - 5);
  }
  size_t last = device.rfind(':');
  int64_t index = last == std::string::npos ? fallback : std::atoll(device.c_str() + last + 1);
  return {job_name, number_after("/replica:"), number_after("/task:"), index};
}

// The name of another client's device in a distributed mesh, where global ids run task
// by task with the same number of devices on each (create_distributed_mesh, as in TF's
// DTensor): this client's first device with the task and index of `id`. TF ranks the
// members of a collective group by these names, so every client must derive them alike.
std::string DistributedDeviceName(const Mesh& mesh, int64_t id) {
  const int64_t per_task = mesh.num_local_devices();
  const std::string task = DistributedTaskName(mesh, DistributedTaskOf(mesh, id));
  if (per_task <= 0 || task.empty()) return std::string();
  const std::string& local = mesh.local_devices()[0];
  size_t device = local.find("/device:");
  size_t index = local.rfind(':');
  if (device == std::string::npos || index == std::string::npos || index < device) {
    return std::string();
  }
  return task + local.substr(device, index + 1 - device) + std::to_string(id % per_task);
}

}  // namespace

namespace {
// Above the keys tf.distribute's CollectiveKeys hands out in this process.
constexpr int32_t kFirstInstanceKey = 1 << 24;
std::atomic<int32_t> next_instance_key{kFirstInstanceKey};
}  // namespace

std::string DistributedTaskName(const Mesh& mesh, int64_t task) {
  if (mesh.local_devices().empty()) return std::string();
  const std::string& local = mesh.local_devices()[0];
  const size_t at = local.find("/task:");
  return at == std::string::npos ? std::string()
                                 : local.substr(0, at) + "/task:" + std::to_string(task);
}

int64_t DistributedTaskOf(const Mesh& mesh, int64_t id) {
  const int64_t per_task = mesh.num_local_devices();
  return per_task > 0 ? id / per_task : 0;
}

int32_t NextInstanceKey() { return next_instance_key.fetch_add(1); }

int32_t NextInstanceKeys(int32_t count) { return next_instance_key.fetch_add(count); }

int64_t InstanceKeysIssued() { return next_instance_key.load() - kFirstInstanceKey; }

namespace {
struct KeyPool {
  std::mutex mutex;
  std::unordered_map<std::string, std::vector<int32_t>> free;  // signature -> keys
};
KeyPool& Pool() {
  static KeyPool* pool = new KeyPool;
  return *pool;
}
}  // namespace

int32_t TakeInstanceKey(const std::string& signature) {
  {
    KeyPool& pool = Pool();
    std::lock_guard<std::mutex> lock(pool.mutex);
    auto it = pool.free.find(signature);
    if (it != pool.free.end() && !it->second.empty()) {
      const int32_t key = it->second.back();
      it->second.pop_back();
      return key;
    }
  }
  return NextInstanceKey();
}

void ReturnInstanceKey(const std::string& signature, int32_t key) {
  KeyPool& pool = Pool();
  std::lock_guard<std::mutex> lock(pool.mutex);
  pool.free[signature].push_back(key);
}

const char* CollectiveMergeOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "Add";
    case ReduceOp::kMax: return "Max";
    case ReduceOp::kMin: return "Min";
    case ReduceOp::kProd: return "Mul";
    case ReduceOp::kMean: return "Add";  // then final_op Div (by the group size)
  }
  return "Add";
}

class CollectiveCache {
 public:
  static CollectiveCache& Get() {
    static CollectiveCache* cache = new CollectiveCache();
    return *cache;
  }

  // The lowering chosen for `mesh` under policy generation `generation`.
  const CollectiveLowering& Lowering(const Mesh& mesh, uint64_t generation) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Entry& e : entries_[Key(mesh, kLoweringBit)]) {
      if (e.mesh != mesh || e.mask != kLoweringBit) continue;
      if (e.generation != generation) {
        e.lowering = &ChooseCollectiveLowering(mesh);
        e.generation = generation;
      }
      return *e.lowering;
    }
    const CollectiveLowering& lowering = ChooseCollectiveLowering(mesh);
    Entry entry{mesh, kLoweringBit, nullptr, nullptr, &lowering, generation};
    entries_[Key(mesh, kLoweringBit)].push_back(std::move(entry));
    Added();
    return lowering;
  }

  const CollectiveGroups& Groups(const Mesh& mesh, const std::vector<int>& dims) {
    const uint64_t mask = DimsMask(dims);
    std::lock_guard<std::mutex> lock(mutex_);
    for (Entry& e : entries_[Key(mesh, mask)]) {
      if (e.mesh == mesh && e.mask == mask && e.groups) return *e.groups;
    }
    auto groups = std::make_unique<CollectiveGroups>(Build(mesh, mask));
    const CollectiveGroups& result = *groups;
    entries_[Key(mesh, mask)].push_back(Entry{mesh, mask, std::move(groups), nullptr, nullptr, 0});
    Added();
    return result;
  }

  const std::vector<int>& Leaders(const Mesh& mesh, const std::vector<int>& dims, bool share) {
    const uint64_t mask = DimsMask(dims) | kLeadersBit | (share ? kSharingBit : 0);
    std::lock_guard<std::mutex> lock(mutex_);
    for (Entry& e : entries_[Key(mesh, mask)]) {
      if (e.mesh == mesh && e.mask == mask) return *e.leaders;
    }
    const int n = mesh.num_local_devices();
    auto leaders = std::make_unique<std::vector<int>>(n);
    // Devices agreeing on `dims` get the first of them as leader: one map lookup each.
    std::map<std::vector<int64_t>, int> first;
    for (int d = 0; d < n; ++d) {
      (*leaders)[d] = d;
      if (!share) continue;
      std::vector<int64_t> coords;
      for (int k = 0; k < mesh.num_dims(); ++k) {
        if (mask & (uint64_t{1} << k)) coords.push_back(mesh.LocalCoord(d, k));
      }
      auto [it, inserted] = first.emplace(std::move(coords), d);
      (*leaders)[d] = it->second;
    }
    const std::vector<int>& result = *leaders;
    Entry entry{mesh, mask, nullptr, std::move(leaders), nullptr, 0};
    entries_[Key(mesh, mask)].push_back(std::move(entry));
    Added();
    return result;
  }

  size_t size() {
    std::lock_guard<std::mutex> lock(mutex_);
    return size_;
  }

 private:
  // Mesh dimensions are bits 0..60 of an entry's mask; these mark the other kinds.
  static constexpr uint64_t kLeadersBit = uint64_t{1} << 63;
  static constexpr uint64_t kSharingBit = uint64_t{1} << 62;
  static constexpr uint64_t kLoweringBit = uint64_t{1} << 61;
  // One of: the groups of (mesh, dims), the leaders of (mesh, dims, sharing), or the
  // lowering of the mesh with the policy generation it was chosen under.
  struct Entry {
    Mesh mesh;
    uint64_t mask;
    std::unique_ptr<CollectiveGroups> groups;
    std::unique_ptr<std::vector<int>> leaders;
    const CollectiveLowering* lowering;
    uint64_t generation;
  };
  static size_t Key(const Mesh& mesh, uint64_t mask) {
    return mesh.Hash() * 31 + std::hash<uint64_t>()(mask);
  }

  static CollectiveGroups Build(const Mesh& mesh, uint64_t mask) {
    CollectiveGroups g;
    const int n = mesh.num_local_devices();
    const std::vector<int64_t>& ids = mesh.global_device_ids();
    std::map<int64_t, int> local_of;  // global id -> local index
    for (int i = 0; i < n && i < static_cast<int>(mesh.local_device_ids().size()); ++i) {
      local_of[mesh.local_device_ids()[i]] = i;
    }
    // The name TF ranks a device by: from the global device list when the mesh has one,
    // else from the local devices; unknown for other processes' devices.
    auto name_of = [&](size_t position, int64_t id) -> std::string {
      if (position < mesh.global_devices().size()) return mesh.global_devices()[position];
      auto it = local_of.find(id);
      if (it != local_of.end()) return mesh.local_devices()[it->second];
      return DistributedDeviceName(mesh, id);
    };
    std::map<std::vector<int64_t>, int> group_index;  // coords off the dims -> group
    std::vector<std::vector<std::string>> names;
    const int64_t size = mesh.is_single_device() ? 1 : mesh.size();
    for (int64_t p = 0; p < size; ++p) {
      std::vector<int64_t> coords =
          mesh.is_single_device() ? std::vector<int64_t>{} : mesh.DeviceLocation(p).value();
      std::vector<int64_t> outer;
      for (int k = 0; k < static_cast<int>(coords.size()); ++k) {
        if (!(mask & (uint64_t{1} << k))) outer.push_back(coords[k]);
      }
      auto [it, inserted] = group_index.emplace(outer, static_cast<int>(g.groups_.size()));
      if (inserted) {
        g.groups_.emplace_back();
        g.local_members_.emplace_back();
        names.emplace_back();
      }
      // Row-major enumeration visits a group's members in order of their coordinates
      // along the dims.
      const int64_t id = mesh.is_single_device() ? 0 : ids[p];
      g.groups_[it->second].push_back(id);
      auto local = local_of.find(id);
      g.local_members_[it->second].push_back(local == local_of.end() ? -1 : local->second);
      names[it->second].push_back(name_of(static_cast<size_t>(p), id));
    }
    const bool name_keys =
        !mesh.global_devices().empty() || mesh.num_local_devices() == mesh.size();
    g.group_of_.assign(n, 0);
    g.rank_of_.assign(n, 0);
    for (size_t gi = 0; gi < g.groups_.size(); ++gi) {
      bool has_local = false, has_remote = false;
      uint64_t hash = Fnv(14695981039346656037ull, mesh.device_type());
      std::vector<std::tuple<std::string, int64_t, int64_t, int64_t>> rank_keys;
      for (size_t r = 0; r < g.groups_[gi].size(); ++r) {
        const int local = g.local_members_[gi][r];
        if (local >= 0) {
          g.group_of_[local] = static_cast<int>(gi);
          g.rank_of_[local] = static_cast<int>(r);
          has_local = true;
        } else {
          has_remote = true;
        }
        const std::string& name = names[gi][r];
        // Every process must derive the same key: names only where every process knows
        // them all (a global device list, or a mesh held by this process alone).
        hash = Fnv(hash, name_keys ? name : std::to_string(g.groups_[gi][r]));
        hash = Fnv(hash, ",");
        rank_keys.push_back(RankKey(name, g.groups_[gi][r]));
      }
      if (has_local && has_remote) g.all_local_ = false;
      // Keys in [2^30, 2^31): clear of the small keys tf.distribute uses.
      g.group_keys_.push_back(static_cast<int32_t>((hash % (1u << 30)) + (1u << 30)));
      std::vector<int> order(g.groups_[gi].size());
      for (size_t r = 0; r < order.size(); ++r) order[r] = static_cast<int>(r);
      std::stable_sort(order.begin(), order.end(),
                       [&](int a, int b) { return rank_keys[a] < rank_keys[b]; });
      for (size_t r = 0; r < order.size(); ++r) {
        if (order[r] != static_cast<int>(r)) g.tf_order_identity_ = false;
      }
      if (!g.tf_order_.empty() && order != g.tf_order_.front()) g.tf_orders_agree_ = false;
      g.tf_order_.push_back(std::move(order));
    }
    return g;
  }

  // Counts a new entry; when the entries have doubled since the last sweep, drops those
  // of the meshes nothing but this cache holds any more. A program that makes a new mesh
  // per step (new names, another device order) kept about 3 KB of groups, leaders and
  // mesh text per mesh for good. A reference handed out stays valid while its caller
  // holds the mesh, which every caller does while it uses it. Called with mutex_ held.
  void Added() {
    if (++size_ < sweep_at_) return;
    std::unordered_map<const void*, long> entries_of;  // mesh representation -> entries
    for (const auto& [key, bucket] : entries_) {
      for (const Entry& e : bucket) ++entries_of[e.mesh.representation()];
    }
    // Decided before any is dropped: dropping an entry lowers its mesh's count.
    std::unordered_set<const void*> unheld;
    for (const auto& [key, bucket] : entries_) {
      for (const Entry& e : bucket) {
        if (e.mesh.representation_holders() == entries_of[e.mesh.representation()]) {
          unheld.insert(e.mesh.representation());
        }
      }
    }
    size_ = 0;
    for (auto it = entries_.begin(); it != entries_.end();) {
      std::vector<Entry>& bucket = it->second;
      bucket.erase(std::remove_if(bucket.begin(), bucket.end(),
                                  [&](const Entry& e) {
                                    return unheld.count(e.mesh.representation()) > 0;
                                  }),
                   bucket.end());
      size_ += bucket.size();
      it = bucket.empty() ? entries_.erase(it) : std::next(it);
    }
    sweep_at_ = std::max<size_t>(kFirstSweep, 2 * size_);
  }

  static constexpr size_t kFirstSweep = 256;
  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<Entry>> entries_;
  size_t size_ = 0;
  size_t sweep_at_ = kFirstSweep;
};

const CollectiveGroups& CollectiveGroups::For(const Mesh& mesh,
                                              const std::vector<int>& mesh_dims) {
  return CollectiveCache::Get().Groups(mesh, mesh_dims);
}

const std::vector<int>& LocalLeaders(const Mesh& mesh, const std::vector<int>& key_dims) {
  return CollectiveCache::Get().Leaders(mesh, key_dims,
                                        CollectiveLowering::For(mesh).shares_buffers());
}

const std::vector<int>& GroupLeaders(const Mesh& mesh, const std::vector<int>& key_dims) {
  return CollectiveCache::Get().Leaders(mesh, key_dims, /*share=*/true);
}

size_t CollectiveCacheEntries() { return CollectiveCache::Get().size(); }

const CollectiveLowering& CachedLowering(const Mesh& mesh, uint64_t generation) {
  return CollectiveCache::Get().Lowering(mesh, generation);
}

Status CheckCollectiveParticipants(const Mesh& mesh, const CollectiveGroups& groups,
                                   const std::string& what) {
  if (groups.all_local()) return Status::Ok();
  if (MultiClientCollectives() && !CollectiveLowering::For(mesh).shares_buffers()) {
    return Status::Ok();
  }
  return FailedPrecondition(
      "Cannot " + what + ": this process holds " + std::to_string(mesh.num_local_devices()) +
      " of the " + std::to_string(mesh.size()) + " devices of " + mesh.ShortString() +
      (mesh.name().empty() ? std::string() : " ('" + mesh.name() + "')") +
      ", and the devices of other processes cannot take part (tf_dtensor runs one client "
      "per process). Use a mesh of this process's devices only, e.g. "
      "`create_mesh(..., devices=<local devices>)`, or run every client of a multi-client "
      "setup.");
}

}  // namespace tf_dtensor
