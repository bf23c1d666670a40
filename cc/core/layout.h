// Layout: for each axis of a tensor, the mesh dimension that shards it or none.
// An immutable value type; an invalid layout cannot be constructed.
#ifndef TF_DTENSOR_CC_CORE_LAYOUT_H_
#define TF_DTENSOR_CC_CORE_LAYOUT_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cc/core/mesh.h"
#include "cc/core/status.h"

namespace tf_dtensor {

inline constexpr char kUnsharded[] = "unsharded";

// One tensor axis: sharded over a mesh dimension (its index), or replicated.
struct DimSpec {
  static DimSpec Replicated() { return DimSpec{-1}; }
  static DimSpec Sharded(int mesh_dim) { return DimSpec{mesh_dim}; }
  bool sharded() const { return mesh_dim >= 0; }
  bool operator==(const DimSpec& o) const { return mesh_dim == o.mesh_dim; }
  bool operator!=(const DimSpec& o) const { return mesh_dim != o.mesh_dim; }
  int mesh_dim;
};

class Layout {
 public:
  // From sharding spec strings ("x", "unsharded"), checked against the mesh.
  static StatusOr<Layout> Create(const std::vector<std::string>& sharding_specs, Mesh mesh);
  static StatusOr<Layout> FromSpecs(std::vector<DimSpec> specs, Mesh mesh);
  static Layout Replicated(Mesh mesh, int rank);
  // Parses TF DTensor's form "sharding_specs:x,unsharded, mesh:|x=2|0,1|0,1|/job:...".
  static StatusOr<Layout> FromString(std::string_view text);

  std::string ToString() const;     // TF DTensor's form; FromString(ToString()) == *this.
  std::string ShortString() const;  // "[x,*] @ mesh(x=2,y=4)", for messages and test ids.
  std::string SpecString() const;   // "[x,*]".

  const Mesh& mesh() const { return mesh_; }
  int rank() const { return static_cast<int>(specs_.size()); }
  const std::vector<DimSpec>& specs() const { return specs_; }
  const DimSpec& spec(int dim) const { return specs_[dim]; }
  std::vector<std::string> sharding_specs() const;
  // Number of pieces tensor axis `dim` is cut into.
  int64_t NumShards(int dim) const {
    return specs_[dim].sharded() ? mesh_.DimSize(specs_[dim].mesh_dim) : 1;
  }
  int64_t TotalShards() const;
  bool IsFullyReplicated() const;
  // Which piece of axis `dim` the i-th local device of the mesh holds.
  int64_t ShardIndex(int local_device, int dim) const {
    return specs_[dim].sharded() ? mesh_.LocalCoord(local_device, specs_[dim].mesh_dim) : 0;
  }
  // Mesh dimensions that shard some axis.
  std::vector<int> ShardedMeshDims() const;

  // Checks `global_shape` against this layout (rank, divisibility) and returns the shape
  // of one component. `what` names the tensor in error messages ("input 1 of 'MatMul'").
  StatusOr<std::vector<int64_t>> LocalShape(const std::vector<int64_t>& global_shape,
                                            const std::string& what) const;
  std::vector<int64_t> GlobalShape(const std::vector<int64_t>& local_shape) const;

  // A layout of another rank over the same mesh, e.g. after a reduction.
  Layout WithSpecs(std::vector<DimSpec> specs) const { return Layout(mesh_, std::move(specs)); }

  bool operator==(const Layout& other) const {
    return specs_ == other.specs_ && mesh_ == other.mesh_;
  }
  bool operator!=(const Layout& other) const { return !(*this == other); }
  size_t Hash() const;

 private:
  Layout(Mesh mesh, std::vector<DimSpec> specs) : mesh_(std::move(mesh)), specs_(std::move(specs)) {}
  Mesh mesh_;
  std::vector<DimSpec> specs_;
};

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_CORE_LAYOUT_H_
