#include "cc/core/layout.h"

#include "cc/core/strings.h"

namespace tf_dtensor {

StatusOr<Layout> Layout::Create(const std::vector<std::string>& sharding_specs, Mesh mesh) {
  std::vector<DimSpec> specs;
  for (size_t i = 0; i < sharding_specs.size(); ++i) {
    const std::string& name = sharding_specs[i];
    if (name == kUnsharded || name == "*") {
      specs.push_back(DimSpec::Replicated());
      continue;
    }
    int index = mesh.DimIndex(name);
    if (index < 0) {
      std::vector<std::string> names;
      for (const MeshDim& d : mesh.dims()) names.push_back("`" + d.name + "`");
      return InvalidArgument("Layout axis " + std::to_string(i) + " names mesh dimension `" +
                             name + "`, which " + mesh.ShortString() +
                             " does not have. Use one of " + Join(names, ", ") +
                             " or `unsharded`.");
    }
    specs.push_back(DimSpec::Sharded(index));
  }
  return FromSpecs(std::move(specs), std::move(mesh));
}

StatusOr<Layout> Layout::FromSpecs(std::vector<DimSpec> specs, Mesh mesh) {
  std::vector<int> used_by(mesh.num_dims(), -1);
  for (size_t i = 0; i < specs.size(); ++i) {
    if (!specs[i].sharded()) continue;
    int d = specs[i].mesh_dim;
    if (d >= mesh.num_dims()) return InvalidArgument("Layout names a mesh dimension out of range.");
    if (used_by[d] >= 0) {
      Layout bad(mesh, specs);
      return InvalidArgument("Layout " + bad.SpecString() + " shards axes " +
                             std::to_string(used_by[d]) + " and " + std::to_string(i) +
                             " over the same mesh dimension `" + mesh.dims()[d].name +
                             "`; a mesh dimension can shard at most one axis. Use `unsharded` "
                             "for one of them.");
    }
    used_by[d] = static_cast<int>(i);
  }
  return Layout(std::move(mesh), std::move(specs));
}

Layout Layout::Replicated(Mesh mesh, int rank) {
  return Layout(std::move(mesh), std::vector<DimSpec>(rank, DimSpec::Replicated()));
}

StatusOr<Layout> Layout::FromString(std::string_view text) {
  text = Trim(text);
  constexpr std::string_view kSpecsPrefix = "sharding_specs:";
  constexpr std::string_view kMeshMarker = "mesh:";
  size_t mesh_pos = text.find(kMeshMarker);
  if (text.substr(0, kSpecsPrefix.size()) != kSpecsPrefix || mesh_pos == std::string_view::npos) {
    return InvalidArgument("Cannot parse layout '" + std::string(text) +
                           "': expected 'sharding_specs:x,unsharded, mesh:|x=2|...'.");
  }
  std::string_view specs_text = Trim(text.substr(kSpecsPrefix.size(), mesh_pos - kSpecsPrefix.size()));
  if (!specs_text.empty() && specs_text.back() == ',') specs_text.remove_suffix(1);
  TFD_ASSIGN_OR_RETURN(Mesh mesh, Mesh::FromString(text.substr(mesh_pos + kMeshMarker.size())));
  std::vector<std::string> names;
  if (!Trim(specs_text).empty()) {
    for (const std::string& s : Split(specs_text, ',')) names.emplace_back(Trim(s));
  }
  return Create(names, std::move(mesh));
}

std::vector<std::string> Layout::sharding_specs() const {
  std::vector<std::string> out;
  for (const DimSpec& s : specs_) {
    out.push_back(s.sharded() ? mesh_.dims()[s.mesh_dim].name : kUnsharded);
  }
  return out;
}

std::string Layout::ToString() const {
  std::string specs = Join(sharding_specs(), ",");
  return "sharding_specs:" + specs + (specs.empty() ? "" : ",") + " mesh:" + mesh_.ToString();
}

std::string Layout::SpecString() const {
  std::vector<std::string> parts;
  for (const DimSpec& s : specs_) parts.push_back(s.sharded() ? mesh_.dims()[s.mesh_dim].name : "*");
  return "[" + Join(parts, ",") + "]";
}

std::string Layout::ShortString() const { return SpecString() + " @ " + mesh_.ShortString(); }

int64_t Layout::TotalShards() const {
  int64_t total = 1;
  for (int d = 0; d < rank(); ++d) total *= NumShards(d);
  return total;
}

bool Layout::IsFullyReplicated() const {
  for (const DimSpec& s : specs_) {
    if (s.sharded()) return false;
  }
  return true;
}

std::vector<int> Layout::ShardedMeshDims() const {
  std::vector<int> dims;
  for (const DimSpec& s : specs_) {
    if (s.sharded()) dims.push_back(s.mesh_dim);
  }
  return dims;
}

StatusOr<std::vector<int64_t>> Layout::LocalShape(const std::vector<int64_t>& global_shape,
                                                  const std::string& what) const {
  if (static_cast<int>(global_shape.size()) != rank()) {
    return InvalidArgument("Layout " + ShortString() + " has rank " + std::to_string(rank()) +
                           " but " + what + " has rank " + std::to_string(global_shape.size()) +
                           " (shape " + ShapeString(global_shape) +
                           "). Give one sharding spec per tensor axis.");
  }
  std::vector<int64_t> local = global_shape;
  for (int d = 0; d < rank(); ++d) {
    int64_t n = NumShards(d);
    if (n == 1 || global_shape[d] < 0) continue;
    if (global_shape[d] % n != 0) {
      const MeshDim& m = mesh_.dims()[specs_[d].mesh_dim];
      return InvalidArgument("Cannot shard dim " + std::to_string(d) + " (size " +
                             std::to_string(global_shape[d]) + ") of " + what + " over axis '" +
                             m.name + "' (size " + std::to_string(m.size) + "): " +
                             std::to_string(global_shape[d]) + " is not divisible by " +
                             std::to_string(m.size) + ". Leave that axis `unsharded` or pad it.");
    }
    local[d] = global_shape[d] / n;
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

size_t Layout::Hash() const {
  size_t h = mesh_.Hash();
  for (const DimSpec& s : specs_) h = h * 31 + static_cast<size_t>(s.mesh_dim + 2);
  return h;
}

}  // namespace tf_dtensor
