// Mesh: a named Cartesian grid of devices. An immutable value type.
#ifndef TF_DTENSOR_CC_CORE_MESH_H_
#define TF_DTENSOR_CC_CORE_MESH_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cc/core/status.h"

namespace tf_dtensor {

struct MeshDim {
  std::string name;
  int64_t size;
  bool operator==(const MeshDim& o) const { return name == o.name && size == o.size; }
};

class Mesh {
 public:
  // Validates and builds a mesh. Devices are full names
  // ("/job:localhost/replica:0/task:0/device:CPU:0"); `global_device_ids` are laid out
  // row-major over `dims` (first dimension outermost).
  static StatusOr<Mesh> Create(std::vector<MeshDim> dims, std::vector<int64_t> global_device_ids,
                               std::vector<int64_t> local_device_ids,
                               std::vector<std::string> local_devices, std::string name = "",
                               std::vector<std::string> global_devices = {},
                               bool use_xla_spmd = false);

  // A single-device mesh: no mesh dimensions over one device. The runtime sees it as a
  // one-device mesh (size() == 1, one local device with id 0, coordinates []); TF
  // DTensor's public values for it (size 0, no device ids) are the Reported* accessors.
  // `device` may be short ("CPU:0") and is stored in full form.
  static StatusOr<Mesh> FromDevice(std::string_view device);

  // Parses TF DTensor's string form:
  // "<name>|x=3,y=2|0,1,...|0,1,...|/job:localhost/.../device:CPU:0,...[|<global devices>]",
  // or a device name ("/job:localhost/replica:0/task:0/device:CPU:0") for a single-device mesh.
  static StatusOr<Mesh> FromString(std::string_view text);
  // Parses a serialized `tensorflow.dtensor.MeshProto`.
  static StatusOr<Mesh> FromProto(std::string_view serialized);

  std::string ToString() const;     // TF DTensor's form; FromString(ToString()) == *this.
  std::string ShortString() const;  // "mesh(x=3,y=2)" or "mesh(CPU:0)", for messages.
  // A serialized `tensorflow.dtensor.MeshProto` with the fields TF DTensor sets.
  std::string ToProto() const;

  bool is_single_device() const { return !rep_->single_device.empty(); }
  // The device of a single-device mesh, else "".
  const std::string& single_device() const { return rep_->single_device; }
  // TF DTensor's public view, which differs from the runtime view only on a single-device
  // mesh: there TF reports size 0 and no local device ids or devices (its MeshProto holds
  // only the device name).
  int64_t ReportedSize() const { return is_single_device() ? 0 : size(); }
  std::vector<int64_t> ReportedLocalDeviceIds() const;
  std::vector<std::string> ReportedLocalDevices() const;
  // The global device ids, or an error on a single-device mesh, which has none to report.
  StatusOr<std::vector<int64_t>> ReportedGlobalDeviceIds() const;
  StatusOr<int64_t> MinGlobalDeviceId() const;
  // Size of the mesh dimension called `name`, or an error naming the dimensions there are.
  StatusOr<int64_t> DimSizeByName(std::string_view name) const;
  // Row-major strides of the grid: [b*c, c, 1] for shape [a, b, c]; [] without dimensions.
  std::vector<int64_t> Strides() const;
  // Coordinates of the device at row-major `offset` in [0, size).
  StatusOr<std::vector<int64_t>> DeviceLocation(int64_t offset) const;
  // The same grid over the host CPUs of the same tasks ("GPU:1" -> "CPU:1"); a CPU mesh is
  // its own host mesh.
  StatusOr<Mesh> HostMesh() const;

  const std::string& name() const { return rep_->name; }
  const std::vector<MeshDim>& dims() const { return rep_->dims; }
  int num_dims() const { return static_cast<int>(rep_->dims.size()); }
  int64_t size() const { return rep_->size; }
  // Index of the mesh dimension called `name`, or -1.
  int DimIndex(std::string_view name) const;
  int64_t DimSize(int index) const { return rep_->dims[index].size; }
  const std::vector<int64_t>& global_device_ids() const { return rep_->global_device_ids; }
  const std::vector<int64_t>& local_device_ids() const { return rep_->local_device_ids; }
  const std::vector<std::string>& local_devices() const { return rep_->local_devices; }
  const std::vector<std::string>& global_devices() const { return rep_->global_devices; }
  bool use_xla_spmd() const { return rep_->use_xla_spmd; }
  int num_local_devices() const { return static_cast<int>(rep_->local_devices.size()); }
  // Whether other processes (clients) hold some of its devices: a multi-client mesh.
  bool spans_processes() const { return !is_single_device() && num_local_devices() < size(); }
  // "CPU", "GPU" or "TPU": the type of the local devices.
  const std::string& device_type() const { return rep_->device_type; }
  // Coordinates of the device with the given global id (row-major, first dim outermost).
  std::vector<int64_t> Coords(int64_t device_id) const;
  // Coordinate along mesh dimension `dim` of the i-th local device.
  int64_t LocalCoord(int local_index, int dim) const {
    return rep_->local_coords[local_index][dim];
  }
  // For each coordinate along mesh dimension `dim` (0, 1, ...), the first local device
  // that has it: one device per piece of an axis sharded over `dim`.
  std::vector<int> FirstDeviceAlong(int dim) const {
    std::vector<int> first(DimSize(dim), -1);
    int found = 0;
    for (int d = 0; d < num_local_devices() && found < static_cast<int>(first.size()); ++d) {
      int64_t c = LocalCoord(d, dim);
      if (first[c] < 0) {
        first[c] = d;
        ++found;
      }
    }
    first.erase(std::remove(first.begin(), first.end(), -1), first.end());
    return first;
  }
  // Whether all local devices share one host memory (virtual CPUs): then replicas can
  // share one buffer and each distinct shard is computed once.
  bool shares_host_memory() const { return rep_->device_type == "CPU"; }

  bool operator==(const Mesh& other) const;
  bool operator!=(const Mesh& other) const { return !(*this == other); }
  size_t Hash() const { return rep_->hash; }
  // Whether both are one object. Equal meshes made while one of them is alive always are
  // (see Interned), so the equality above is a pointer comparison on hot paths.
  bool SharesRepresentation(const Mesh& other) const { return rep_ == other.rep_; }
  // The shared object behind this mesh and how many Mesh values hold it: a cache keyed by
  // mesh can tell the meshes only it still holds (and drop them).
  const void* representation() const { return rep_.get(); }
  long representation_holders() const { return rep_.use_count(); }

 private:
  struct Rep {
    std::string name;
    std::vector<MeshDim> dims;
    std::vector<int64_t> global_device_ids;
    std::vector<int64_t> local_device_ids;
    std::vector<std::string> local_devices;
    std::vector<std::string> global_devices;
    bool use_xla_spmd = false;
    int64_t size = 1;
    std::string device_type;
    std::vector<std::vector<int64_t>> local_coords;
    std::string single_device;
    size_t hash = 0;
    std::string key;  // ToString(), kept: equality compares it without building it
  };
  explicit Mesh(std::shared_ptr<const Rep> rep) : rep_(std::move(rep)) {}
  // Fills in `rep`'s hash and key and returns the mesh of the equal rep already alive, if
  // any, so that equal meshes share one rep and compare by pointer (a layout parsed from
  // text, a mesh made twice in Python) and caches keyed by mesh stay cheap.
  static Mesh Interned(std::shared_ptr<Rep> rep);
  std::shared_ptr<const Rep> rep_;
};

// Expands a short device name ("CPU:0", "/device:GPU:1") to the full form used in
// meshes ("/job:localhost/replica:0/task:0/device:CPU:0").
std::string CanonicalDeviceName(std::string_view device);
// Whether `device` is a full device name "/job:<job>/replica:<n>/task:<n>/device:<TYPE>:<n>".
bool IsFullDeviceName(std::string_view device);
// "CPU" for "/job:localhost/replica:0/task:0/device:CPU:3".
std::string DeviceType(std::string_view device);
// "CPU:3" for "/job:localhost/replica:0/task:0/device:CPU:3".
std::string ShortDeviceName(std::string_view device);
// An error unless this process holds a device of `mesh` (a mesh of other processes alone,
// `Mesh.is_remote()`, has nothing here to run `what` on).
Status CheckRunsHere(const Mesh& mesh, const std::string& what);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_CORE_MESH_H_
