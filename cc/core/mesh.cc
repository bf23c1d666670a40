#include "cc/core/mesh.h"

#include <algorithm>
#include <cctype>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>

#include "cc/core/strings.h"
#include "cc/core/wire.h"

namespace tf_dtensor {
namespace {

// Names that mean something else in a sharding spec and so cannot name a mesh dimension.
bool IsReservedName(const std::string& name) {
  return name == "unsharded" || name == "match" || name == "any" || name == "*";
}

// The first character of `name` that the text forms use as a separator, or '\0'. In
// "|x=2,y=2|...", "sharding_specs:x+y,unsharded, mesh:..." and "[x+y,*] +partial(z:sum)" a
// name holding one of them would not parse back: "a+b" reads as a and b, "a,b" as two dims.
// Whitespace is trimmed around every field, so it cannot be part of a name either.
char SeparatorIn(const std::string& name) {
  for (char c : name) {
    if (c == ',' || c == '|' || c == '=' || c == '+' || c == ':' ||
        std::isspace(static_cast<unsigned char>(c))) {
      return c;
    }
  }
  return '\0';
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
  // Every form TensorFlow's device specs take: "CPU:0", "cpu:0", "/device:CPU:0",
  // "/CPU:0", "job:localhost/replica:0/task:0/TPU:0" (no leading slash, legacy type),
  // "/job:w/task:1/device:GPU:0" (fields left out take job localhost, replica 0, task 0).
  const std::string name(Trim(device));
  std::string job = "localhost", replica = "0", task = "0", type_index;
  for (const std::string& part : Split(name, '/')) {
    if (part.empty()) continue;
    auto value = [&](std::string_view key) -> std::optional<std::string> {
      if (part.rfind(key, 0) != 0) return std::nullopt;
      return part.substr(key.size());
    };
    if (auto v = value("job:")) {
      job = *v;
    } else if (auto v = value("replica:")) {
      replica = *v;
    } else if (auto v = value("task:")) {
      task = *v;
    } else if (auto v = value("device:")) {
      type_index = *v;
    } else {
      type_index = part;  // "CPU:0", the legacy form without "device:"
    }
  }
  if (type_index.empty()) return name;  // refused by the caller's checks, as written
  // "cpu:0" and "CPU:0" both name the first CPU.
  for (char& c : type_index) {
    if (c == ':') break;
    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return "/job:" + job + "/replica:" + replica + "/task:" + task + "/device:" + type_index;
}

bool IsFullDeviceName(std::string_view device) {
  // "/job:<job>/replica:<n>/task:<n>/device:<TYPE>:<n>"
  std::vector<std::string> parts = Split(device, '/');
  if (parts.size() != 5 || !parts[0].empty()) return false;
  auto field = [&](int i, std::string_view key) -> std::string_view {
    std::string_view part = parts[i];
    if (part.substr(0, key.size()) != key) return {};
    return part.substr(key.size());
  };
  if (field(1, "job:").empty()) return false;
  if (!ParseInt(field(2, "replica:")) || !ParseInt(field(3, "task:"))) return false;
  std::string_view type_and_index = field(4, "device:");
  size_t colon = type_and_index.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return false;
  return ParseInt(type_and_index.substr(colon + 1)).has_value();
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
      return InvalidArgument("Mesh dimension names must be non-empty; a dimension of size " +
                             std::to_string(d.size) + " in (" + DimsString(dims) +
                             ") has none. Name every dimension, e.g. (\"x\", " +
                             std::to_string(d.size) + ").");
    }
    if (IsReservedName(d.name)) {
      return InvalidArgument("Mesh dimension name `" + d.name +
                             "` is reserved for sharding specs; choose another name.");
    }
    if (char c = SeparatorIn(d.name); c != '\0') {
      const std::string shown = std::isspace(static_cast<unsigned char>(c))
                                    ? std::string("whitespace")
                                    : "`" + std::string(1, c) + "`";
      return InvalidArgument("Mesh dimension name `" + d.name + "` contains " + shown +
                             ", which the text forms of meshes and layouts use as a separator "
                             "(`x+y` shards one axis over two mesh dimensions), so layouts on "
                             "it would not parse back. Use letters, digits, `_`, `-` or `.`, "
                             "e.g. (\"" + "dim_0" + "\", " + std::to_string(d.size) + ").");
    }
    if (!names.insert(d.name).second) {
      return InvalidArgument("Mesh dimension name `" + d.name + "` appears twice in (" +
                             DimsString(dims) +
                             "); names of mesh dimensions must be unique, e.g. rename one "
                             "of them.");
    }
    if (d.size <= 0) {
      return InvalidArgument("Mesh dimension `" + d.name + "` has size " +
                             std::to_string(d.size) + "; sizes must be positive (a dimension "
                             "of size 1 keeps a name with no split), e.g. (\"" + d.name +
                             "\", 2).");
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
                           IdsString(global_device_ids) +
                           ". Give each position of the grid its own id, e.g. 0..n-1 "
                           "(np.arange(n).reshape(sizes)).");
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
                             IdsString(global_device_ids) +
                             ". Local device ids name the positions of the grid this process "
                             "holds: take them from the global ids.");
    }
    if (!local_set.insert(id).second) {
      return InvalidArgument("Mesh local device ids contain " + std::to_string(id) + " twice.");
    }
  }
  std::set<std::string> device_set;
  // A name that does not parse is named as written: "foo" and "bar" (or one letter of a
  // string passed for a list) read as a mesh that "mixes device types FOO and BAR", and "0"
  // (devices=[0, 1]) as a device of type "0".
  auto unparsable = [](const std::string& written) {
    return InvalidArgument("Device `" + written + "` of the mesh is not a device name: "
                           "expected a type and an index, such as `CPU:0` or "
                           "`/job:localhost/replica:0/task:0/device:CPU:0`. Name each device, "
                           "e.g. devices=[f\"CPU:{i}\" for i in range(n)].");
  };
  for (std::string& device : local_devices) {
    std::string written = device;
    device = CanonicalDeviceName(device);
    if (!IsFullDeviceName(device)) return unparsable(written);
    if (!device_set.insert(device).second) {
      return InvalidArgument("Device `" + device + "` appears twice in the mesh (Duplicate "
                             "devices found in mesh specification); each device may hold one "
                             "position of the grid. List each device once, e.g. "
                             "devices=[f\"CPU:{i}\" for i in range(n)].");
    }
    std::string type = DeviceType(device);
    if (rep->device_type.empty()) rep->device_type = type;
    if (type != rep->device_type) {
      return InvalidArgument("Mesh mixes device types " + rep->device_type + " and " + type +
                             " (`" + device + "`; Devices containing multiple device_types); all devices of a "
                             "mesh must be of one type. "
                             "Build one mesh per device type (a tensor moves between meshes "
                             "with `copy_to_mesh` or `relayout`).");
    }
  }
  for (std::string& device : global_devices) {
    std::string written = device;
    device = CanonicalDeviceName(device);
    if (!IsFullDeviceName(device)) return unparsable(written);
  }
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
  return Interned(std::move(rep));
}

StatusOr<Mesh> Mesh::FromDevice(std::string_view device) {
  if (Trim(device).empty()) {
    return InvalidArgument("A single-device mesh needs a device name; got an empty one. Pass "
                           "one such as `/job:localhost/replica:0/task:0/device:CPU:0`.");
  }
  std::string name = CanonicalDeviceName(device);
  if (!IsFullDeviceName(name)) {
    return InvalidArgument("Cannot make a single-device mesh from `" + std::string(device) +
                           "`: expected a device name such as "
                           "`/job:localhost/replica:0/task:0/device:CPU:0` or `CPU:0`.");
  }
  TFD_ASSIGN_OR_RETURN(Mesh one_device, Create({}, {0}, {0}, {name}));
  auto rep = std::make_shared<Rep>(*one_device.rep_);
  rep->single_device = name;
  return Interned(std::move(rep));
}

Mesh Mesh::Interned(std::shared_ptr<Rep> rep) {
  rep->key = Mesh(rep).ToString();
  rep->hash = std::hash<std::string>()(rep->key);
  static std::mutex* mutex = new std::mutex();
  static auto* alive = new std::unordered_map<std::string, std::weak_ptr<const Rep>>();
  std::lock_guard<std::mutex> lock(*mutex);
  auto it = alive->find(rep->key);
  if (it != alive->end()) {
    if (std::shared_ptr<const Rep> existing = it->second.lock()) return Mesh(existing);
  }
  // Forget the meshes no longer alive now and then, so the table stays small.
  if (alive->size() >= 64) {
    for (auto e = alive->begin(); e != alive->end();) {
      e = e->second.expired() ? alive->erase(e) : std::next(e);
    }
  }
  (*alive)[rep->key] = rep;
  return Mesh(std::move(rep));
}

StatusOr<Mesh> Mesh::FromString(std::string_view text) {
  if (Trim(text).find('|') == std::string_view::npos) {
    // TF DTensor prints a single-device mesh as its device name.
    StatusOr<Mesh> single = FromDevice(text);
    if (single.ok()) return single;
    return InvalidArgument("Cannot parse mesh '" + std::string(text) +
                           "': expected 'name|x=2,y=4|global ids|local ids|local devices', or a "
                           "device name such as `/job:localhost/replica:0/task:0/device:CPU:0` "
                           "for a single-device mesh.");
  }
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
  if (is_single_device()) return rep_->single_device;
  std::string out = rep_->name + "|" + DimsString(rep_->dims) + "|" +
                    IdsString(rep_->global_device_ids) + "|" + IdsString(rep_->local_device_ids) +
                    "|" + Join(rep_->local_devices, ",");
  if (!rep_->global_devices.empty()) out += "|" + Join(rep_->global_devices, ",");
  if (rep_->use_xla_spmd) out += "|use_xla_spmd";
  return out;
}

std::string Mesh::ShortString() const {
  if (is_single_device()) return "mesh(" + ShortDeviceName(rep_->single_device) + ")";
  return "mesh(" + DimsString(rep_->dims) + ")";
}

// MeshProto fields: 1 mesh_dimensions {1 name, 2 size}, 2 global_device_ids, 3 name,
// 4 local_device_ids, 5 local_devices, 6 global_devices, 7 use_xla_spmd, 8 single_device.
std::string Mesh::ToProto() const {
  WireWriter out;
  if (is_single_device()) {
    out.Bytes(8, rep_->single_device);
    return out.Take();
  }
  for (const MeshDim& d : rep_->dims) {
    WireWriter dim;
    dim.Bytes(1, d.name);
    dim.Varint(2, static_cast<uint64_t>(d.size));
    out.Bytes(1, dim.str());
  }
  for (int64_t id : rep_->global_device_ids) out.Varint(2, static_cast<uint64_t>(id));
  if (!rep_->name.empty()) out.Bytes(3, rep_->name);
  for (int64_t id : rep_->local_device_ids) out.Varint(4, static_cast<uint64_t>(id));
  for (const std::string& device : rep_->local_devices) out.Bytes(5, device);
  for (const std::string& device : rep_->global_devices) out.Bytes(6, device);
  if (rep_->use_xla_spmd) out.Varint(7, 1);
  return out.Take();
}

namespace {

// Reads a repeated int64 field, packed (wire type 2) or not (wire type 0).
bool ReadInts(WireReader& reader, int wire_type, std::vector<int64_t>* out) {
  uint64_t value;
  if (wire_type == 0) {
    if (!reader.ReadVarint(&value)) return false;
    out->push_back(static_cast<int64_t>(value));
    return true;
  }
  std::string_view packed;
  if (wire_type != 2 || !reader.ReadBytes(&packed)) return false;
  WireReader values(packed);
  while (!values.done()) {
    if (!values.ReadVarint(&value)) return false;
    out->push_back(static_cast<int64_t>(value));
  }
  return true;
}

bool ReadString(WireReader& reader, int wire_type, std::string* out) {
  std::string_view bytes;
  if (wire_type != 2 || !reader.ReadBytes(&bytes)) return false;
  *out = std::string(bytes);
  return true;
}

bool ReadMeshDim(std::string_view bytes, MeshDim* dim) {
  WireReader reader(bytes);
  dim->size = 0;
  int field, wire_type;
  while (!reader.done()) {
    if (!reader.ReadTag(&field, &wire_type)) return false;
    uint64_t size;
    if (field == 1) {
      if (!ReadString(reader, wire_type, &dim->name)) return false;
    } else if (field == 2 && wire_type == 0) {
      if (!reader.ReadVarint(&size)) return false;
      dim->size = static_cast<int64_t>(size);
    } else if (!reader.Skip(wire_type)) {
      return false;
    }
  }
  return true;
}

}  // namespace

StatusOr<Mesh> Mesh::FromProto(std::string_view serialized) {
  std::vector<MeshDim> dims;
  std::vector<int64_t> global_ids, local_ids;
  std::vector<std::string> local_devices, global_devices;
  std::string name, single_device;
  bool use_xla_spmd = false;
  WireReader reader(serialized);
  bool ok = true;
  while (ok && !reader.done()) {
    int field, wire_type;
    if (!reader.ReadTag(&field, &wire_type)) {
      ok = false;
      break;
    }
    std::string text;
    std::string_view bytes;
    uint64_t flag;
    switch (field) {
      case 1:
        dims.emplace_back();
        ok = wire_type == 2 && reader.ReadBytes(&bytes) && ReadMeshDim(bytes, &dims.back());
        break;
      case 2: ok = ReadInts(reader, wire_type, &global_ids); break;
      case 3: ok = ReadString(reader, wire_type, &name); break;
      case 4: ok = ReadInts(reader, wire_type, &local_ids); break;
      case 5:
        ok = ReadString(reader, wire_type, &text);
        local_devices.push_back(text);
        break;
      case 6:
        ok = ReadString(reader, wire_type, &text);
        global_devices.push_back(text);
        break;
      case 7:
        ok = wire_type == 0 && reader.ReadVarint(&flag);
        use_xla_spmd = flag != 0;
        break;
      case 8: ok = ReadString(reader, wire_type, &single_device); break;
      default: ok = reader.Skip(wire_type); break;
    }
  }
  if (!ok) return InvalidArgument("Cannot parse a MeshProto: the serialized bytes are malformed.");
  if (!single_device.empty()) {
    if (!dims.empty() || !global_ids.empty()) {
      return InvalidArgument("MeshProto names single device `" + single_device +
                             "` and also has mesh dimensions or device ids; a single-device "
                             "mesh has neither.");
    }
    return FromDevice(single_device);
  }
  if (dims.empty() && global_ids.empty()) {
    return InvalidArgument("The MeshProto is empty: it has no mesh dimensions and no single "
                           "device. Fill `mesh_dimensions` and the device ids, or "
                           "`single_device`.");
  }
  return Create(std::move(dims), std::move(global_ids), std::move(local_ids),
                std::move(local_devices), std::move(name), std::move(global_devices),
                use_xla_spmd);
}

std::vector<int64_t> Mesh::ReportedLocalDeviceIds() const {
  return is_single_device() ? std::vector<int64_t>{} : rep_->local_device_ids;
}

std::vector<std::string> Mesh::ReportedLocalDevices() const {
  return is_single_device() ? std::vector<std::string>{} : rep_->local_devices;
}

StatusOr<std::vector<int64_t>> Mesh::ReportedGlobalDeviceIds() const {
  if (is_single_device()) {
    return InvalidArgument("Single-device " + ShortString() + " has no global device ids; its "
                           "one device is `single_device` (" + rep_->single_device + ").");
  }
  return rep_->global_device_ids;
}

StatusOr<int64_t> Mesh::MinGlobalDeviceId() const {
  TFD_ASSIGN_OR_RETURN(std::vector<int64_t> ids, ReportedGlobalDeviceIds());
  return *std::min_element(ids.begin(), ids.end());
}

StatusOr<int64_t> Mesh::DimSizeByName(std::string_view name) const {
  int index = DimIndex(name);
  if (index < 0) {
    std::vector<std::string> names;
    for (const MeshDim& d : rep_->dims) names.push_back("`" + d.name + "`");
    return InvalidArgument("Dimension `" + std::string(name) + "` does not exist in " +
                           ShortString() + "; its dimensions are " +
                           (names.empty() ? std::string("none") : Join(names, ", ")) + ".");
  }
  return rep_->dims[index].size;
}

std::vector<int64_t> Mesh::Strides() const {
  std::vector<int64_t> strides(rep_->dims.size(), 1);
  for (int d = static_cast<int>(rep_->dims.size()) - 2; d >= 0; --d) {
    strides[d] = strides[d + 1] * rep_->dims[d + 1].size;
  }
  return strides;
}

StatusOr<std::vector<int64_t>> Mesh::DeviceLocation(int64_t offset) const {
  if (offset < 0 || offset >= rep_->size) {
    return InvalidArgument("Device offset " + std::to_string(offset) + " is out of range for " +
                           ShortString() + " with " + std::to_string(rep_->size) +
                           " devices; offsets run from 0 to " + std::to_string(rep_->size - 1) +
                           ".");
  }
  std::vector<int64_t> location;
  std::vector<int64_t> strides = Strides();
  for (size_t d = 0; d < rep_->dims.size(); ++d) {
    location.push_back((offset / strides[d]) % rep_->dims[d].size);
  }
  return location;
}

StatusOr<Mesh> Mesh::HostMesh() const {
  if (rep_->device_type == "CPU") return *this;
  auto to_host = [&](const std::string& device) {
    size_t pos = device.rfind("device:");
    size_t colon = device.rfind(':');
    return device.substr(0, pos + 7) + "CPU" + device.substr(colon);
  };
  if (is_single_device()) return FromDevice(to_host(rep_->single_device));
  std::vector<std::string> local_devices, global_devices;
  for (const std::string& d : rep_->local_devices) local_devices.push_back(to_host(d));
  for (const std::string& d : rep_->global_devices) global_devices.push_back(to_host(d));
  return Create(rep_->dims, rep_->global_device_ids, rep_->local_device_ids,
                std::move(local_devices), rep_->name, std::move(global_devices));
}

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
  return rep_->hash == other.rep_->hash && rep_->key == other.rep_->key;
}

Status CheckRunsHere(const Mesh& mesh, const std::string& what) {
  if (mesh.is_single_device() || mesh.num_local_devices() > 0) return Status::Ok();
  return InvalidArgument(what + " runs on " + mesh.ShortString() + ", whose devices all "
                         "belong to other processes (the mesh is remote here): this process "
                         "has no component of its values. Use a mesh with this process's "
                         "devices (`dtensor.create_distributed_mesh` gives each process its "
                         "own).");
}

}  // namespace tf_dtensor
