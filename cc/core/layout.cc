#include "cc/core/layout.h"

#include <algorithm>

#include "cc/core/strings.h"
#include "cc/core/wire.h"

namespace tf_dtensor {

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kProd: return "prod";
    case ReduceOp::kMean: return "mean";
  }
  return "?";
}

std::optional<ReduceOp> ReduceOpFromName(std::string_view name) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kProd,
                      ReduceOp::kMean}) {
    if (name == ReduceOpName(op)) return op;
  }
  return std::nullopt;
}

StatusOr<Layout> Layout::Create(const std::vector<std::string>& sharding_specs, Mesh mesh,
                                LayoutType type) {
  if (type == LayoutType::kSingleDevice && sharding_specs.empty()) {
    return FromSingleDeviceMesh(std::move(mesh));
  }
  std::vector<DimSpec> specs;
  for (size_t i = 0; i < sharding_specs.size(); ++i) {
    const std::string& name = sharding_specs[i];
    if (name == kUnsharded || name == "*") {
      specs.push_back(DimSpec::Replicated());
      continue;
    }
    // "x" shards over one mesh dimension; "x+y" over x, then each piece over y (a name
    // that is itself a mesh dimension, "+" included, means that dimension).
    std::vector<std::string> parts{name};
    if (mesh.DimIndex(name) < 0 && name.find('+') != std::string::npos) parts = Split(name, '+');
    std::vector<int> dims;
    for (const std::string& part : parts) {
      int index = mesh.DimIndex(part);
      if (index < 0) {
        std::vector<std::string> names;
        for (const MeshDim& d : mesh.dims()) names.push_back("`" + d.name + "`");
        return InvalidArgument("Layout axis " + std::to_string(i) + " names mesh dimension `" +
                               part + "`, which " + mesh.ShortString() +
                               " does not have (A dimension sharding must either be a valid mesh "
                               "dimension or UNSHARDED.). Use one of " + Join(names, ", ") +
                               ", several joined by `+` (e.g. `x+y`), or `unsharded`.");
      }
      dims.push_back(index);
    }
    specs.push_back(DimSpec::ShardedOver(dims));
  }
  return FromSpecs(std::move(specs), std::move(mesh), type);
}

StatusOr<Layout> Layout::FromSpecs(std::vector<DimSpec> specs, Mesh mesh, LayoutType type,
                                   std::vector<PartialSpec> partial) {
  if (!partial.empty()) {
    TFD_ASSIGN_OR_RETURN(Layout plain, FromSpecs(std::move(specs), std::move(mesh), type));
    return plain.WithPartial(std::move(partial));
  }
  if (type == LayoutType::kSingleDevice) {
    if (!specs.empty()) {
      return InvalidArgument("A single-device layout has no sharding specs, but " +
                             std::to_string(specs.size()) + " were given for " +
                             mesh.ShortString() + ". Use `Layout.from_single_device_mesh(mesh)`.");
    }
    return FromSingleDeviceMesh(std::move(mesh));
  }
  if (mesh.is_single_device()) {
    return InvalidArgument("A static or parted layout cannot use single-device " +
                           mesh.ShortString() + ", which has no mesh dimensions to shard over. Use "
                           "`Layout.from_single_device_mesh(mesh)` or `Layout.from_device(" +
                           "device)`.");
  }
  std::vector<int> used_by(mesh.num_dims(), -1);
  for (size_t i = 0; i < specs.size(); ++i) {
    for (int d : specs[i].mesh_dims()) {
      if (d < 0 || d >= mesh.num_dims()) {
        return InvalidArgument("Layout names a mesh dimension out of range.");
      }
      if (used_by[d] >= 0) {
        Layout bad(mesh, specs);
        const std::string axes = used_by[d] == static_cast<int>(i)
                                     ? "axis " + std::to_string(i) + " twice"
                                     : "axes " + std::to_string(used_by[d]) + " and " +
                                           std::to_string(i);
        return InvalidArgument("Layout " + bad.SpecString() + " shards " + axes +
                               " over the same mesh dimension `" + mesh.dims()[d].name +
                               "`; a mesh dimension can shard at most one axis, once (Mesh "
                               "dimensions must be unique.). Use `unsharded` for one of them.");
      }
      used_by[d] = static_cast<int>(i);
    }
  }
  return Layout(std::move(mesh), std::move(specs), type);
}

StatusOr<Layout> Layout::FromSingleDeviceMesh(Mesh mesh) {
  if (!mesh.is_single_device()) {
    return InvalidArgument("A single-device layout needs a single-device mesh, but got " +
                           mesh.ShortString() + ". Make one with `Mesh.from_device(device)`, "
                           "or use `Layout.from_device(device)`.");
  }
  return Layout(std::move(mesh), {}, LayoutType::kSingleDevice);
}

Layout Layout::Replicated(Mesh mesh, int rank) {
  if (mesh.is_single_device()) return Layout(std::move(mesh), {}, LayoutType::kSingleDevice);
  return Layout(std::move(mesh), std::vector<DimSpec>(rank, DimSpec::Replicated()));
}

StatusOr<Layout> Layout::FromString(std::string_view text) {
  text = Trim(text);
  constexpr std::string_view kSpecsPrefix = "sharding_specs:";
  constexpr std::string_view kPartedPrefix = "parted:";
  constexpr std::string_view kSingleDevicePrefix = "maximal:true,";
  constexpr std::string_view kMeshMarker = "mesh:";
  size_t mesh_pos = text.find(kMeshMarker);
  std::string_view prefix;
  LayoutType type = LayoutType::kStatic;
  for (auto [candidate, candidate_type] :
       {std::pair{kSpecsPrefix, LayoutType::kStatic}, std::pair{kPartedPrefix, LayoutType::kParted},
        std::pair{kSingleDevicePrefix, LayoutType::kSingleDevice}}) {
    if (text.substr(0, candidate.size()) == candidate) {
      prefix = candidate;
      type = candidate_type;
    }
  }
  if (prefix.empty() || mesh_pos == std::string_view::npos || mesh_pos < prefix.size()) {
    return InvalidArgument("Cannot parse layout '" + std::string(text) +
                           "': expected 'sharding_specs:x,unsharded, mesh:|x=2|...', "
                           "'parted:x,unsharded, mesh:|x=2|...' or 'maximal:true, "
                           "mesh:/job:localhost/replica:0/task:0/device:CPU:0'.");
  }
  std::string_view specs_text = Trim(text.substr(prefix.size(), mesh_pos - prefix.size()));
  if (!specs_text.empty() && specs_text.back() == ',') specs_text.remove_suffix(1);
  TFD_ASSIGN_OR_RETURN(Mesh mesh, Mesh::FromString(text.substr(mesh_pos + kMeshMarker.size())));
  if (type == LayoutType::kSingleDevice) {
    if (!Trim(specs_text).empty()) {
      return InvalidArgument("Cannot parse layout '" + std::string(text) +
                             "': a single-device layout has no sharding specs.");
    }
    return FromSingleDeviceMesh(std::move(mesh));
  }
  // "x,unsharded, partial:y=sum,z=max" -> specs, then pending reductions.
  std::vector<PartialSpec> partial;
  constexpr std::string_view kPartialMarker = "partial:";
  size_t partial_pos = specs_text.find(kPartialMarker);
  if (partial_pos != std::string_view::npos) {
    std::string_view pending = Trim(specs_text.substr(partial_pos + kPartialMarker.size()));
    specs_text = Trim(specs_text.substr(0, partial_pos));
    if (!specs_text.empty() && specs_text.back() == ',') specs_text.remove_suffix(1);
    for (const std::string& item : Split(pending, ',')) {
      std::string_view entry = Trim(item);
      if (entry.empty()) continue;
      size_t eq = entry.find('=');
      std::optional<ReduceOp> op =
          eq == std::string_view::npos ? std::nullopt : ReduceOpFromName(Trim(entry.substr(eq + 1)));
      int dim = eq == std::string_view::npos ? -1 : mesh.DimIndex(std::string(Trim(entry.substr(0, eq))));
      if (!op || dim < 0) {
        return InvalidArgument("Cannot parse layout '" + std::string(text) + "': partial entry '" +
                               std::string(entry) + "' must be `<mesh dimension>=<sum|mean|max|"
                               "min|prod>` with a dimension of " + mesh.ShortString() + ".");
      }
      partial.push_back({dim, *op});
    }
  }
  std::vector<std::string> names;
  if (!Trim(specs_text).empty()) {
    for (const std::string& s : Split(specs_text, ',')) names.emplace_back(Trim(s));
  }
  TFD_ASSIGN_OR_RETURN(Layout layout, Create(names, std::move(mesh), type));
  if (partial.empty()) return layout;
  return layout.WithPartial(std::move(partial));
}

namespace {

// LayoutProto's enum numbers its types differently from TF's Python `LayoutType`.
constexpr int kProtoStatic = 1;
constexpr int kProtoParted = 2;
constexpr int kProtoSingleDevice = 3;

}  // namespace

// LayoutProto fields: 1 sharding_specs {2 sharding_spec}, 2 mesh_config, 3 type.
StatusOr<std::string> Layout::ToProto() const {
  if (is_partial()) {
    return InvalidArgument("Layout " + ShortString() + " has pending reductions, which a "
                           "LayoutProto cannot hold. Relayout to " + WithoutPartial().SpecString() +
                           " first.");
  }
  WireWriter out;
  for (const std::string& name : sharding_specs()) {
    WireWriter spec;
    spec.Bytes(2, name);
    out.Bytes(1, spec.str());
  }
  out.Bytes(2, mesh_.ToProto());
  int type = type_ == LayoutType::kParted         ? kProtoParted
             : type_ == LayoutType::kSingleDevice ? kProtoSingleDevice
                                                  : kProtoStatic;
  out.Varint(3, static_cast<uint64_t>(type));
  return out.Take();
}

StatusOr<Layout> Layout::FromProto(std::string_view serialized) {
  std::vector<std::string> names;
  std::string_view mesh_bytes;
  bool has_mesh = false;
  uint64_t type = 0;
  WireReader reader(serialized);
  bool ok = true;
  while (ok && !reader.done()) {
    int field, wire_type;
    std::string_view bytes;
    if (!reader.ReadTag(&field, &wire_type)) {
      ok = false;
    } else if (field == 1 && wire_type == 2) {
      ok = reader.ReadBytes(&bytes);
      WireReader spec(bytes);
      std::string name;
      while (ok && !spec.done()) {
        int spec_field, spec_wire_type;
        std::string_view text;
        if (!spec.ReadTag(&spec_field, &spec_wire_type)) {
          ok = false;
        } else if (spec_field == 2 && spec_wire_type == 2) {
          ok = spec.ReadBytes(&text);
          name = std::string(text);
        } else {
          ok = spec.Skip(spec_wire_type);
        }
      }
      names.push_back(name);
    } else if (field == 2 && wire_type == 2) {
      ok = reader.ReadBytes(&mesh_bytes);
      has_mesh = true;
    } else if (field == 3 && wire_type == 0) {
      ok = reader.ReadVarint(&type);
    } else {
      ok = reader.Skip(wire_type);
    }
  }
  if (!ok) return InvalidArgument("Cannot parse a LayoutProto: the serialized bytes are malformed.");
  if (!has_mesh) {
    return InvalidArgument("The LayoutProto has no `mesh_config`; every layout needs a mesh.");
  }
  TFD_ASSIGN_OR_RETURN(Mesh mesh, Mesh::FromProto(mesh_bytes));
  switch (static_cast<int>(type)) {
    case kProtoStatic: return Create(names, std::move(mesh), LayoutType::kStatic);
    case kProtoParted: return Create(names, std::move(mesh), LayoutType::kParted);
    case kProtoSingleDevice:
      if (!names.empty()) {
        return InvalidArgument("The LayoutProto has type SINGLE_DEVICE and " +
                               std::to_string(names.size()) +
                               " sharding specs; a single-device layout has none.");
      }
      return FromSingleDeviceMesh(std::move(mesh));
    default:
      return InvalidArgument("The LayoutProto has type " + std::to_string(type) +
                             " (UNKNOWN or unset); set it to STATIC, PARTED or SINGLE_DEVICE.");
  }
}

StatusOr<Layout> Layout::ToParted() const {
  if (is_single_device()) {
    return InvalidArgument("Cannot make a parted layout from the single-device layout on " +
                           mesh_.ShortString() + ": it has no sharding specs to part.");
  }
  return Layout(mesh_, specs_, LayoutType::kParted);
}

std::vector<std::string> Layout::sharding_specs() const {
  std::vector<std::string> out;
  for (const DimSpec& s : specs_) out.push_back(s.sharded() ? SpecName(s) : kUnsharded);
  return out;
}

std::string Layout::SpecName(const DimSpec& spec) const {
  std::vector<std::string> names;
  for (int m : spec.mesh_dims()) names.push_back(mesh_.dims()[m].name);
  return Join(names, "+");
}

namespace {

// "y=sum,z=max" (separator "=") or "y:sum,z:max" (separator ":").
std::string PartialText(const Mesh& mesh, const std::vector<PartialSpec>& partial,
                        const char* separator) {
  std::vector<std::string> parts;
  for (const PartialSpec& p : partial) {
    parts.push_back(mesh.dims()[p.mesh_dim].name + separator + ReduceOpName(p.op));
  }
  return Join(parts, ",");
}

}  // namespace

std::string Layout::ToString() const {
  if (is_single_device()) return "maximal:true, mesh:" + mesh_.ToString();
  std::string specs = Join(sharding_specs(), ",");
  std::string pending = partial_.empty() ? "" : " partial:" + PartialText(mesh_, partial_, "=") + ",";
  return std::string(is_parted() ? "parted:" : "sharding_specs:") + specs +
         (specs.empty() ? "" : ",") + pending + " mesh:" + mesh_.ToString();
}

std::string Layout::SpecString() const {
  std::vector<std::string> parts;
  for (const DimSpec& s : specs_) parts.push_back(s.sharded() ? SpecName(s) : "*");
  std::string text = std::string(is_parted() ? "parted" : "") + "[" + Join(parts, ",") + "]";
  if (!partial_.empty()) text += " +partial(" + PartialText(mesh_, partial_, ":") + ")";
  return text;
}

std::vector<int> Layout::PartialMeshDims() const {
  std::vector<int> dims;
  for (const PartialSpec& p : partial_) dims.push_back(p.mesh_dim);
  return dims;
}

StatusOr<Layout> Layout::WithPartial(std::vector<PartialSpec> partial) const {
  std::vector<PartialSpec> all = partial_;
  for (const PartialSpec& p : partial) {
    if (p.mesh_dim < 0 || p.mesh_dim >= mesh_.num_dims()) {
      return InvalidArgument("A partial mesh dimension is out of range for " +
                             mesh_.ShortString() + ".");
    }
    const std::string& name = mesh_.dims()[p.mesh_dim].name;
    if (is_single_device() || is_parted()) {
      return InvalidArgument("Layout " + ShortString() + " cannot be partial over `" + name +
                             "`: only static layouts carry pending reductions.");
    }
    for (const DimSpec& s : specs_) {
      const std::vector<int> dims = s.mesh_dims();
      if (std::find(dims.begin(), dims.end(), p.mesh_dim) != dims.end()) {
        return InvalidArgument("Layout " + ShortString() + " cannot be partial over `" + name +
                               "`: that mesh dimension already shards an axis, and a mesh "
                               "dimension either shards an axis or holds partial values. Use "
                               "another mesh dimension, or relayout the axis first.");
      }
    }
    for (const PartialSpec& q : all) {
      if (q.mesh_dim == p.mesh_dim) {
        return InvalidArgument("Layout " + ShortString() + " names `" + name +
                               "` as partial twice; give each mesh dimension one reduction.");
      }
    }
    all.push_back(p);
  }
  std::sort(all.begin(), all.end(),
            [](const PartialSpec& a, const PartialSpec& b) { return a.mesh_dim < b.mesh_dim; });
  return Layout(mesh_, specs_, type_, std::move(all));
}

std::string Layout::ShortString() const { return SpecString() + " @ " + mesh_.ShortString(); }

int64_t Layout::TotalShards() const {
  int64_t total = 1;
  for (int d = 0; d < rank(); ++d) total *= NumShards(d);
  return total;
}

StatusOr<int64_t> Layout::NumShardsChecked(int dim) const {
  if (dim < 0 || dim >= rank()) {
    return InvalidArgument("Axis " + std::to_string(dim) + " is out of range for layout " +
                           ShortString() + " of rank " + std::to_string(rank()) +
                           "; axes run from 0 to rank - 1.");
  }
  return NumShards(dim);
}

bool Layout::IsBatchParallel() const {
  if (specs_.empty() || !specs_[0].sharded()) return false;
  for (int d = 1; d < rank(); ++d) {
    if (specs_[d].sharded()) return false;
  }
  return true;
}

std::vector<std::vector<int64_t>> Layout::OffsetToShard() const {
  std::vector<std::vector<int64_t>> shards;
  for (int64_t offset = 0; offset < mesh_.size(); ++offset) {
    shards.push_back(ShardIndexOfCoords(mesh_.DeviceLocation(offset).value()));
  }
  return shards;
}

std::vector<int64_t> Layout::ShardIndexOfCoords(const std::vector<int64_t>& coords) const {
  std::vector<int64_t> shard;
  for (const DimSpec& s : specs_) {
    int64_t index = 0;
    for (int m : s.mesh_dims()) index = index * mesh_.DimSize(m) + coords[m];
    shard.push_back(index);
  }
  return shard;
}

StatusOr<int64_t> Layout::OffsetTupleToGlobalIndex(const std::vector<int64_t>& shard_index) const {
  if (static_cast<int>(shard_index.size()) != rank()) {
    return InvalidArgument("Shard index " + ShapeString(shard_index) + " has " +
                           std::to_string(shard_index.size()) + " entries but layout " +
                           ShortString() + " has rank " + std::to_string(rank()) +
                           "; give one shard index per axis.");
  }
  int64_t index = 0;
  for (int d = 0; d < rank(); ++d) {
    int64_t n = NumShards(d);
    if (shard_index[d] < 0 || shard_index[d] >= n) {
      return InvalidArgument("Shard index " + ShapeString(shard_index) + " is out of range for "
                             "layout " + ShortString() + ": axis " + std::to_string(d) +
                             " has " + std::to_string(n) + " shard(s), numbered from 0.");
    }
    index = index * n + shard_index[d];
  }
  return index;
}

bool Layout::IsFullyReplicated() const {
  if (is_single_device() || is_partial()) return false;
  for (const DimSpec& s : specs_) {
    if (s.sharded()) return false;
  }
  return true;
}

std::vector<int> Layout::ShardedMeshDims() const {
  std::vector<int> dims;
  for (const DimSpec& s : specs_) {
    for (int m : s.mesh_dims()) dims.push_back(m);
  }
  return dims;
}

std::vector<int> Layout::FirstDeviceOfPieces(int dim) const {
  if (!specs_[dim].multi()) {
    return specs_[dim].sharded() ? mesh_.FirstDeviceAlong(specs_[dim].mesh_dim)
                                 : std::vector<int>{0};
  }
  std::vector<int> first(NumShards(dim), -1);
  for (int d = 0; d < mesh_.num_local_devices(); ++d) {
    int64_t piece = ShardIndex(d, dim);
    if (first[piece] < 0) first[piece] = d;
  }
  first.erase(std::remove(first.begin(), first.end(), -1), first.end());
  return first;
}

bool Layout::HasMultiDimAxis() const {
  for (const DimSpec& s : specs_) {
    if (s.multi()) return true;
  }
  return false;
}

Layout Layout::MajorOnly() const {
  std::vector<DimSpec> specs = specs_;
  for (DimSpec& s : specs) s.minor.clear();
  return Layout(mesh_, std::move(specs), type_, partial_);
}

// The nested cut of a multi-dimension axis: `index` (mixed-radix over `sizes`, major
// first) picks a piece at each level, e.g. 5 over (2,2): [0:3] -> [0:2],[2:3]; [3:5] ->
// [3:4],[4:5], as PyTorch's [Shard(0), Shard(0)] cuts it.
static std::pair<int64_t, int64_t> NestedPiece(int64_t size, const std::vector<int64_t>& sizes,
                                               int64_t index) {
  std::vector<int64_t> coords(sizes.size());
  for (size_t k = sizes.size(); k-- > 0;) {
    coords[k] = index % sizes[k];
    index /= sizes[k];
  }
  int64_t offset = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    auto [piece, start] = Layout::Piece(size, sizes[k], coords[k]);
    size = piece;
    offset += start;
  }
  return {size, offset};
}

std::pair<int64_t, int64_t> Layout::AxisPiece(int dim, int64_t size, int64_t index) const {
  const DimSpec& s = specs_[dim];
  if (!s.multi()) return Piece(size, NumShards(dim), index);
  if (size < 0) return {size, 0};
  std::vector<int64_t> sizes;
  for (int m : s.mesh_dims()) sizes.push_back(mesh_.DimSize(m));
  return NestedPiece(size, sizes, index);
}

std::pair<int64_t, int64_t> Layout::Piece(int64_t size, int64_t pieces, int64_t index) {
  if (pieces <= 1 || size < 0) return {size, 0};
  const int64_t chunk = (size + pieces - 1) / pieces;
  const int64_t begin = std::min(size, chunk * index);
  const int64_t end = std::min(size, begin + chunk);
  return {end - begin, begin};
}

ShardGeometry Layout::GeometryOfShard(const std::vector<int64_t>& global_shape,
                                      const std::vector<int64_t>& shard_index) const {
  ShardGeometry g{global_shape, std::vector<int64_t>(global_shape.size(), 0)};
  if (is_single_device()) return g;
  for (int d = 0; d < rank() && d < static_cast<int>(global_shape.size()); ++d) {
    auto [size, offset] = AxisPiece(d, global_shape[d], shard_index[d]);
    g.shape[d] = size;
    g.offset[d] = offset;
  }
  return g;
}

ShardGeometry Layout::GeometryOfDevice(const std::vector<int64_t>& global_shape,
                                       int local_device) const {
  std::vector<int64_t> index(specs_.size());
  for (int d = 0; d < rank(); ++d) index[d] = ShardIndex(local_device, d);
  return GeometryOfShard(global_shape, index);
}

std::vector<int64_t> Layout::PieceSizes(const std::vector<int64_t>& global_shape, int dim) const {
  std::vector<int64_t> sizes;
  for (int64_t i = 0; i < NumShards(dim); ++i) {
    sizes.push_back(AxisPiece(dim, global_shape[dim], i).first);
  }
  return sizes;
}

bool Layout::IsEven(const std::vector<int64_t>& global_shape) const {
  if (is_single_device()) return true;
  for (int d = 0; d < rank() && d < static_cast<int>(global_shape.size()); ++d) {
    if (global_shape[d] >= 0 && global_shape[d] % NumShards(d) != 0) return false;
  }
  return true;
}

Layout Layout::EvenPart(const std::vector<int64_t>& global_shape) const {
  if (IsEven(global_shape)) return *this;
  std::vector<DimSpec> specs = specs_;
  for (int d = 0; d < rank() && d < static_cast<int>(global_shape.size()); ++d) {
    if (global_shape[d] >= 0 && global_shape[d] % NumShards(d) != 0) {
      specs[d] = DimSpec::Replicated();
    }
  }
  return Layout(mesh_, std::move(specs), type_, partial_);
}

StatusOr<std::vector<int64_t>> Layout::LocalShape(const std::vector<int64_t>& global_shape,
                                                  const std::string& what) const {
  if (is_single_device()) return global_shape;
  if (static_cast<int>(global_shape.size()) != rank()) {
    return InvalidArgument("Layout " + ShortString() + " has rank " + std::to_string(rank()) +
                           " but " + what + " has rank " + std::to_string(global_shape.size()) +
                           " (shape " + ShapeString(global_shape) +
                           "). Give one sharding spec per tensor axis.");
  }
  return GeometryOfShard(global_shape, std::vector<int64_t>(global_shape.size(), 0)).shape;
}

StatusOr<std::vector<int64_t>> Layout::UniformLocalShape(const std::vector<int64_t>& global_shape,
                                                         const std::string& what) const {
  TFD_ASSIGN_OR_RETURN(std::vector<int64_t> local, LocalShape(global_shape, what));
  if (is_single_device()) return local;
  for (int d = 0; d < rank(); ++d) {
    int64_t n = NumShards(d);
    if (n == 1 || global_shape[d] < 0) continue;
    if (global_shape[d] % n != 0) {
      return InvalidArgument("Cannot shard dim " + std::to_string(d) + " (size " +
                             std::to_string(global_shape[d]) + ") of " + what + " over axis '" +
                             SpecName(specs_[d]) + "' (size " + std::to_string(n) + "): " +
                             std::to_string(global_shape[d]) + " is not divisible by " +
                             std::to_string(n) + ". Leave that axis `unsharded` or pad it.");
    }
  }
  return local;
}

std::vector<int64_t> Layout::GlobalShape(const std::vector<int64_t>& local_shape) const {
  std::vector<int64_t> global = local_shape;
  for (int d = 0; d < rank() && d < static_cast<int>(global.size()); ++d) {
    if (global[d] >= 0) global[d] *= NumShards(d);
  }
  return global;
}

StatusOr<std::vector<int64_t>> Layout::GlobalShapeChecked(const std::vector<int64_t>& local_shape,
                                                          const std::string& what) const {
  if (is_single_device()) return local_shape;
  if (static_cast<int>(local_shape.size()) != rank()) {
    return InvalidArgument("Layout " + ShortString() + " has rank " + std::to_string(rank()) +
                           " but " + what + " has rank " + std::to_string(local_shape.size()) +
                           " (shape " + ShapeString(local_shape) +
                           "). Give one sharding spec per tensor axis.");
  }
  return GlobalShape(local_shape);
}

std::vector<int64_t> Layout::GlobalShapeOfBlocks(
    const std::function<std::vector<int64_t>(int local_device)>& block) const {
  const std::vector<int64_t> first = block(0);
  std::vector<int64_t> global = first;
  if (is_single_device() || static_cast<int>(global.size()) != rank()) return global;
  for (int axis = 0; axis < rank(); ++axis) {
    if (!specs_[axis].sharded() || global[axis] < 0) continue;
    const std::vector<int> firsts = FirstDeviceOfPieces(axis);
    if (static_cast<int64_t>(firsts.size()) < NumShards(axis)) {
      global[axis] *= NumShards(axis);
      continue;
    }
    int64_t total = 0;
    for (int device : firsts) {
      const std::vector<int64_t> piece = device == 0 ? first : block(device);
      if (static_cast<int>(piece.size()) <= axis || piece[axis] < 0) {
        total = -1;
        break;
      }
      total += piece[axis];
    }
    global[axis] = total;
  }
  return global;
}

size_t Layout::Hash() const {
  size_t h = mesh_.Hash() * 7 + static_cast<size_t>(type_);
  for (const DimSpec& s : specs_) {
    h = h * 31 + static_cast<size_t>(s.mesh_dim + 2);
    for (int m : s.minor) h = h * 17 + static_cast<size_t>(m + 1);
  }
  for (const PartialSpec& p : partial_) {
    h = h * 37 + static_cast<size_t>(p.mesh_dim) * 8 + static_cast<size_t>(p.op);
  }
  return h;
}

}  // namespace tf_dtensor
