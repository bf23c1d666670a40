#include "cc/core/mesh.h"

#include <functional>
#include <set>

#include "cc/core/strings.h"

namespace tf_dtensor {
namespace {

// Names that mean something else in a sharding spec and so cannot name a mesh dimension.
bool IsReservedName(const std::string& name) {
  return name == "unsharded" || name == "match" || name == "any" || name == "*";
}

std::string DimsString(const std::vector<MeshDim>& dims) {
  std::vector<std::string> parts;
  for (const MeshDim& d : dims) parts.push_back(d.name + "=" + std::to_string(d.size));
  return Join(parts, ",");
}

std::string IdsString(const std::vector<int64_t>& ids) {
  std::vector<std::string> parts;
  for (int64_t id : ids) parts.push_back(std::to_string(id));
  return Join(parts, ",");
}

StatusOr<std::vector<int64_t>> ParseIds(const std::string& text, const char* what) {
  std::vector<int64_t> ids;
  if (Trim(text).empty()) return ids;
  for (const std::string& part : Split(text, ',')) {
    std::optional<int64_t> id = ParseInt(part);
    if (!id) return InvalidArgument(std::string("Cannot parse ") + what + " '" + text + "'.");
    ids.push_back(*id);
  }
  return ids;
}

std::vector<std::string> ParseDevices(const std::string& text) {
  std::vector<std::string> devices;
  if (Trim(text).empty()) return devices;
  for (const std::string& part : Split(text, ',')) devices.push_back(std::string(Trim(part)));
  return devices;
}

}  // namespace

std::string CanonicalDeviceName(std::string_view device) {
  std::string name(Trim(device));
  if (name.rfind("/job:", 0) == 0) return name;
  if (name.rfind("/device:", 0) == 0) name = name.substr(8);
  // "cpu:0" and "CPU:0" both name the first CPU.
  for (char& c : name) {
    if (c == ':') break;
    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return "/job:localhost/replica:0/task:0/device:" + name;
}

std::string ShortDeviceName(std::string_view device) {
  size_t pos = device.rfind("device:");
  if (pos == std::string_view::npos) return std::string(device);
  return std::string(device.substr(pos + 7));
}

std::string DeviceType(std::string_view device) {
  std::string short_name = ShortDeviceName(device);
  return short_name.substr(0, short_name.find(':'));
}

StatusOr<Mesh> Mesh::Create(std::vector<MeshDim> dims, std::vector<int64_t> global_device_ids,
                            std::vector<int64_t> local_device_ids,
                            std::vector<std::string> local_devices, std::string name,
                            std::vector<std::string> global_devices, bool use_xla_spmd) {
  auto rep = std::make_shared<Rep>();
  std::set<std::string> names;
  for (const MeshDim& d : dims) {
    if (d.name.empty()) {
      return InvalidArgument("Mesh dimension names must be non-empty; got dims " +
                             DimsString(dims) + ".");
    }
    if (IsReservedName(d.name)) {
      return InvalidArgument("Mesh dimension name `" + d.name +
                             "` is reserved for sharding specs; choose another name.");
    }
    if (!names.insert(d.name).second) {
      return InvalidArgument("Mesh dimension name `" + d.name + "` appears twice in (" +
                             DimsString(dims) +
                             "); names of mesh dimensions must be unique, e.g. rename one "
                             "of them.");
    }
    if (d.size <= 0) {
      return InvalidArgument("Mesh dimension `" + d.name + "` has size " +
                             std::to_string(d.size) + "; sizes must be positive.");
    }
    rep->size *= d.size;
  }
  if (static_cast<int64_t>(global_device_ids.size()) != rep->size) {
    return InvalidArgument("Mesh (" + DimsString(dims) + ") has " + std::to_string(rep->size) +
                           " devices but " + std::to_string(global_device_ids.size()) +
                           " global device ids were given; the product of the dimension "
                           "sizes must equal the number of devices.");
  }
  std::set<int64_t> global_set(global_device_ids.begin(), global_device_ids.end());
  if (global_set.size() != global_device_ids.size()) {
    return InvalidArgument("Mesh global device ids contain duplicates: " +
                           IdsString(global_device_ids) + ".");
  }
  if (local_device_ids.size() != local_devices.size()) {
    return InvalidArgument("Mesh has " + std::to_string(local_device_ids.size()) +
                           " local device ids but " + std::to_string(local_devices.size()) +
                           " local devices; each local device needs one id.");
  }
  std::set<int64_t> local_set;
  for (int64_t id : local_device_ids) {
    if (!global_set.count(id)) {
      return InvalidArgument("Local device id " + std::to_string(id) +
                             " is not among the mesh's global device ids " +
                             IdsString(global_device_ids) + ".");
    }
    if (!local_set.insert(id).second) {
      return InvalidArgument("Mesh local device ids contain " + std::to_string(id) + " twice.");
    }
  }
  std::set<std::string> device_set;
  for (std::string& device : local_devices) {
    device = CanonicalDeviceName(device);
    if (!device_set.insert(device).second) {
      return InvalidArgument("Device `" + device + "` appears twice in the mesh; each device "
                             "may hold one position of the grid.");
    }
    std::string type = DeviceType(device);
    if (rep->device_type.empty()) rep->device_type = type;
    if (type != rep->device_type) {
      return InvalidArgument("Mesh mixes device types " + rep->device_type + " and " + type +
                             "; all devices of a mesh must be of one type.");
    }
  }
  for (std::string& device : global_devices) device = CanonicalDeviceName(device);
  if (!global_devices.empty() && static_cast<int64_t>(global_devices.size()) != rep->size) {
    return InvalidArgument("Mesh has " + std::to_string(rep->size) + " devices but " +
                           std::to_string(global_devices.size()) + " global devices were given.");
  }
  rep->name = std::move(name);
  rep->dims = std::move(dims);
  rep->global_device_ids = std::move(global_device_ids);
  rep->local_device_ids = std::move(local_device_ids);
  rep->local_devices = std::move(local_devices);
  rep->global_devices = std::move(global_devices);
  rep->use_xla_spmd = use_xla_spmd;
  Mesh mesh(rep);
  for (int64_t id : rep->local_device_ids) rep->local_coords.push_back(mesh.Coords(id));
  rep->hash = std::hash<std::string>()(mesh.ToString());
  return mesh;
}

StatusOr<Mesh> Mesh::FromString(std::string_view text) {
  std::vector<std::string> parts = Split(Trim(text), '|');
  // A trailing '|' leaves an empty last part.
  if (parts.size() > 5 && Trim(parts.back()).empty()) parts.pop_back();
  if (parts.size() < 5 || parts.size() > 7) {
    return InvalidArgument("Cannot parse mesh '" + std::string(text) +
                           "': expected 'name|x=2,y=4|global ids|local ids|local devices'.");
  }
  std::vector<MeshDim> dims;
  if (!Trim(parts[1]).empty()) {
    for (const std::string& dim : Split(parts[1], ',')) {
      std::vector<std::string> kv = Split(dim, '=');
      std::optional<int64_t> size = kv.size() == 2 ? ParseInt(kv[1]) : std::nullopt;
      if (!size) {
        return InvalidArgument("Cannot parse mesh dimension '" + dim + "' in '" +
                               std::string(text) + "': expected name=size.");
      }
      dims.push_back({std::string(Trim(kv[0])), *size});
    }
  }
  TFD_ASSIGN_OR_RETURN(std::vector<int64_t> global_ids, ParseIds(parts[2], "global device ids"));
  TFD_ASSIGN_OR_RETURN(std::vector<int64_t> local_ids, ParseIds(parts[3], "local device ids"));
  std::vector<std::string> local_devices = ParseDevices(parts[4]);
  std::vector<std::string> global_devices;
  bool use_xla_spmd = false;
  for (size_t i = 5; i < parts.size(); ++i) {
    if (Trim(parts[i]) == "use_xla_spmd") {
      use_xla_spmd = true;
    } else {
      global_devices = ParseDevices(parts[i]);
    }
  }
  return Create(std::move(dims), std::move(global_ids), std::move(local_ids),
                std::move(local_devices), parts[0], std::move(global_devices), use_xla_spmd);
}

std::string Mesh::ToString() const {
  std::string out = rep_->name + "|" + DimsString(rep_->dims) + "|" +
                    IdsString(rep_->global_device_ids) + "|" + IdsString(rep_->local_device_ids) +
                    "|" + Join(rep_->local_devices, ",");
  if (!rep_->global_devices.empty()) out += "|" + Join(rep_->global_devices, ",");
  if (rep_->use_xla_spmd) out += "|use_xla_spmd";
  return out;
}

std::string Mesh::ShortString() const { return "mesh(" + DimsString(rep_->dims) + ")"; }

int Mesh::DimIndex(std::string_view name) const {
  for (size_t i = 0; i < rep_->dims.size(); ++i) {
    if (rep_->dims[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

std::vector<int64_t> Mesh::Coords(int64_t device_id) const {
  // Position of the id in the row-major grid of global ids.
  int64_t position = 0;
  for (size_t i = 0; i < rep_->global_device_ids.size(); ++i) {
    if (rep_->global_device_ids[i] == device_id) position = static_cast<int64_t>(i);
  }
  std::vector<int64_t> coords(rep_->dims.size());
  for (int d = static_cast<int>(rep_->dims.size()) - 1; d >= 0; --d) {
    coords[d] = position % rep_->dims[d].size;
    position /= rep_->dims[d].size;
  }
  return coords;
}

bool Mesh::operator==(const Mesh& other) const {
  if (rep_ == other.rep_) return true;
  return rep_->hash == other.rep_->hash && ToString() == other.ToString();
}

}  // namespace tf_dtensor
