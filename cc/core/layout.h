// Layout: for each axis of a tensor, the mesh dimension that shards it or none.
// An immutable value type; an invalid layout cannot be constructed.
#ifndef TF_DTENSOR_CC_CORE_LAYOUT_H_
#define TF_DTENSOR_CC_CORE_LAYOUT_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cc/core/mesh.h"
#include "cc/core/status.h"

namespace tf_dtensor {

inline constexpr char kUnsharded[] = "unsharded";

// How pending (partial) values along a mesh dimension combine into the tensor's value.
// kMean is the sum divided by the number of devices along the dimension.
enum class ReduceOp { kSum, kMax, kMin, kProd, kMean };

const char* ReduceOpName(ReduceOp op);
// "sum", "mean", "max", "min", "prod" -> the op; nullopt for anything else.
std::optional<ReduceOp> ReduceOpFromName(std::string_view name);

// A pending reduction: every device along `mesh_dim` holds a term, and the tensor is the
// reduction of the terms (PyTorch's `Partial`, JAX's `unreduced`).
struct PartialSpec {
  int mesh_dim;
  ReduceOp op;
  bool operator==(const PartialSpec& o) const { return mesh_dim == o.mesh_dim && op == o.op; }
  bool operator!=(const PartialSpec& o) const { return !(*this == o); }
};

// Where one device's block sits in the global tensor: its shape and the index of its first
// element. Axes split like `torch.chunk`: ceil(n / k)-sized pieces, so with n % k != 0 the
// trailing pieces are smaller or empty ([5] over 4 devices -> 2, 2, 1, 0).
struct ShardGeometry {
  std::vector<int64_t> shape;
  std::vector<int64_t> offset;
};

// One tensor axis: sharded over a mesh dimension (its index), or replicated. An axis may
// also be sharded over several mesh dimensions, as PyTorch's `[Shard(0), Shard(0)]` does:
// `mesh_dim` is the major one and `minor` the others, in order; the axis is cut like
// nested `torch.chunk`s (over the major dimension, then each piece over the next), and its
// spec reads "x+y". Such an axis is a storage layout: op rules never see it, dispatch
// relayouts it first (rules/dispatch.cc); relayouts, pack/unpack and variables hold it.
struct DimSpec {
  static DimSpec Replicated() { return DimSpec{-1, {}}; }
  static DimSpec Sharded(int mesh_dim) { return DimSpec{mesh_dim, {}}; }
  // Over `mesh_dims` (major first; at least one).
  static DimSpec ShardedOver(const std::vector<int>& mesh_dims) {
    return DimSpec{mesh_dims[0], std::vector<int>(mesh_dims.begin() + 1, mesh_dims.end())};
  }
  bool sharded() const { return mesh_dim >= 0; }
  bool multi() const { return !minor.empty(); }
  // Every mesh dimension sharding the axis, major first (empty when replicated).
  std::vector<int> mesh_dims() const {
    if (!sharded()) return {};
    std::vector<int> dims{mesh_dim};
    dims.insert(dims.end(), minor.begin(), minor.end());
    return dims;
  }
  bool operator==(const DimSpec& o) const { return mesh_dim == o.mesh_dim && minor == o.minor; }
  bool operator!=(const DimSpec& o) const { return !(*this == o); }
  int mesh_dim;
  std::vector<int> minor;
};

// TF DTensor's layout kinds, with the values of its Python `LayoutType` enum.
//   kStatic:       the ordinary layout: each axis sharded over a mesh dimension or not.
//   kSingleDevice: the whole tensor on the one device of a single-device mesh; no specs.
//   kParted:       a static layout whose shards are independent tensors ("parts") that
//                  SPMD expansion does not reassemble; same specs and shard geometry.
enum class LayoutType { kStatic = 1, kSingleDevice = 2, kParted = 3 };

class Layout {
 public:
  // From sharding spec strings ("x", "unsharded"), checked against the mesh.
  static StatusOr<Layout> Create(const std::vector<std::string>& sharding_specs, Mesh mesh,
                                 LayoutType type = LayoutType::kStatic);
  static StatusOr<Layout> FromSpecs(std::vector<DimSpec> specs, Mesh mesh,
                                    LayoutType type = LayoutType::kStatic,
                                    std::vector<PartialSpec> partial = {});
  // The layout of a tensor on the one device of a single-device mesh.
  static StatusOr<Layout> FromSingleDeviceMesh(Mesh mesh);
  // All axes replicated; on a single-device mesh, the single-device layout (any rank).
  static Layout Replicated(Mesh mesh, int rank);
  // Parses TF DTensor's forms: "sharding_specs:x,unsharded, mesh:|x=2|0,1|0,1|/job:...",
  // with an optional "partial:y=sum," before "mesh:" for pending reductions,
  // "parted:x,unsharded, mesh:..." and "maximal:true, mesh:/job:.../device:CPU:0".
  static StatusOr<Layout> FromString(std::string_view text);
  // Parses a serialized `tensorflow.dtensor.LayoutProto`.
  static StatusOr<Layout> FromProto(std::string_view serialized);

  std::string ToString() const;     // TF DTensor's form; FromString(ToString()) == *this.
  std::string ShortString() const;  // "[x,*] @ mesh(x=2,y=4)", for messages and test ids.
  // "[x,*]", "parted[x,*]", "[]" (single device), "[x,*] +partial(y:sum)".
  std::string SpecString() const;
  // A serialized `tensorflow.dtensor.LayoutProto` with the fields TF DTensor sets. The
  // proto cannot say Partial: an error for a partial layout.
  StatusOr<std::string> ToProto() const;

  LayoutType type() const { return type_; }
  bool is_single_device() const { return type_ == LayoutType::kSingleDevice; }
  bool is_parted() const { return type_ == LayoutType::kParted; }
  // This layout as parted (same specs and mesh); an error for a single-device layout.
  StatusOr<Layout> ToParted() const;

  // Pending reductions, sorted by mesh dimension; disjoint from the sharded dimensions.
  const std::vector<PartialSpec>& partial() const { return partial_; }
  bool is_partial() const { return !partial_.empty(); }
  std::vector<int> PartialMeshDims() const;
  // This layout with pending reductions added (checked: no sharded or repeated mesh dim).
  StatusOr<Layout> WithPartial(std::vector<PartialSpec> partial) const;
  // The same sharding with nothing pending: the layout after the reductions.
  Layout WithoutPartial() const { return Layout(mesh_, specs_, type_); }

  const Mesh& mesh() const { return mesh_; }
  int rank() const { return static_cast<int>(specs_.size()); }
  const std::vector<DimSpec>& specs() const { return specs_; }
  const DimSpec& spec(int dim) const { return specs_[dim]; }
  std::vector<std::string> sharding_specs() const;
  // "x", or "x+y" for an axis over several mesh dimensions.
  std::string SpecName(const DimSpec& spec) const;
  // Number of pieces tensor axis `dim` is cut into.
  int64_t NumShards(int dim) const {
    int64_t n = 1;
    for (int m : specs_[dim].mesh_dims()) n *= mesh_.DimSize(m);
    return n;
  }
  // NumShards with `dim` checked against the rank.
  StatusOr<int64_t> NumShardsChecked(int dim) const;
  int64_t TotalShards() const;
  // No axis sharded and nothing pending: every device holds the whole value. As in TF
  // DTensor, a single-device layout is not fully replicated.
  bool IsFullyReplicated() const;
  // Axis 0 sharded and every other axis replicated (TF DTensor's batch-parallel layout).
  bool IsBatchParallel() const;
  // For each device offset of the mesh (row-major), the index of the shard it holds along
  // each axis: [x,*] on mesh(x=2) -> [(0,0), (1,0)]. One empty tuple on a single device.
  std::vector<std::vector<int64_t>> OffsetToShard() const;
  // The row-major position of a shard index among all shards: (1,0) of [x,y] on
  // mesh(x=2,y=2) -> 2. Checks one index per axis, each within that axis's shard count.
  // The shard index (one piece per axis) held by the device at mesh `coords`.
  std::vector<int64_t> ShardIndexOfCoords(const std::vector<int64_t>& coords) const;
  StatusOr<int64_t> OffsetTupleToGlobalIndex(const std::vector<int64_t>& shard_index) const;
  // Which piece of axis `dim` the i-th local device of the mesh holds.
  // Over several mesh dimensions the index is mixed-radix, the major dimension first.
  int64_t ShardIndex(int local_device, int dim) const {
    const DimSpec& s = specs_[dim];
    if (!s.multi()) return s.sharded() ? mesh_.LocalCoord(local_device, s.mesh_dim) : 0;
    int64_t index = 0;
    for (int m : s.mesh_dims()) index = index * mesh_.DimSize(m) + mesh_.LocalCoord(local_device, m);
    return index;
  }
  // For each piece of axis `dim` (0, 1, ...), the first local device that holds it.
  std::vector<int> FirstDeviceOfPieces(int dim) const;
  // Some axis is sharded over more than one mesh dimension (see DimSpec).
  bool HasMultiDimAxis() const;
  // This layout with each such axis sharded over its major mesh dimension only: the
  // layout op rules see (dispatch relayouts to it).
  Layout MajorOnly() const;
  // Mesh dimensions that shard some axis (all of them for a multi-dimension axis).
  std::vector<int> ShardedMeshDims() const;
  // Mesh dimensions along which devices hold different data: the sharded ones and the
  // partial ones. Devices that agree on these coordinates hold the same block.
  std::vector<int> DistinctMeshDims() const {
    std::vector<int> dims = ShardedMeshDims();
    for (const PartialSpec& p : partial_) dims.push_back(p.mesh_dim);
    return dims;
  }

  // The one shard-geometry function: the block of `global_shape` at `shard_index` (one
  // piece index per axis) or held by the `local_device`-th local device of the mesh.
  // Everything that needs block shapes or offsets asks these.
  static std::pair<int64_t, int64_t> Piece(int64_t size, int64_t pieces, int64_t index);
  ShardGeometry GeometryOfShard(const std::vector<int64_t>& global_shape,
                                const std::vector<int64_t>& shard_index) const;
  ShardGeometry GeometryOfDevice(const std::vector<int64_t>& global_shape,
                                 int local_device) const;
  // Sizes of the pieces of axis `dim` (one per shard along it).
  // The (size, offset) of piece `index` of axis `dim` of size `size` (nested for an axis
  // over several mesh dimensions).
  std::pair<int64_t, int64_t> AxisPiece(int dim, int64_t size, int64_t index) const;
  std::vector<int64_t> PieceSizes(const std::vector<int64_t>& global_shape, int dim) const;
  // Every sharded axis divides evenly (all blocks have one shape).
  bool IsEven(const std::vector<int64_t>& global_shape) const;
  // This layout with the axes that `global_shape` does not divide evenly replicated.
  Layout EvenPart(const std::vector<int64_t>& global_shape) const;

  // Checks `global_shape` against this layout (rank) and returns the shape of the first
  // block (the largest). `what` names the tensor in error messages ("input 1 of 'MatMul'").
  StatusOr<std::vector<int64_t>> LocalShape(const std::vector<int64_t>& global_shape,
                                            const std::string& what) const;
  // LocalShape, but an error when the axes do not divide evenly: for ops that give every
  // device one local shape (an attribute such as Reshape's shape).
  StatusOr<std::vector<int64_t>> UniformLocalShape(const std::vector<int64_t>& global_shape,
                                                   const std::string& what) const;
  // The global shape from an evenly sharded block's shape.
  std::vector<int64_t> GlobalShape(const std::vector<int64_t>& local_shape) const;
  // GlobalShape with the rank of `local_shape` checked. A single-device layout holds the
  // whole tensor, so both shape conversions return any shape unchanged.
  StatusOr<std::vector<int64_t>> GlobalShapeChecked(const std::vector<int64_t>& local_shape,
                                                    const std::string& what) const;
  // The inverse of the shard geometry: the global shape that a tensor's blocks add up to,
  // `block(d)` giving the shape of the block on local device d (a size of -1: unknown).
  // Along a sharded axis the global size is the sum of its pieces, one per shard (uneven
  // shards are valid), and -1 when a piece is unknown; elsewhere it is device 0's size.
  // `block` is asked only for device 0 and the first device holding each piece. Where
  // another client holds some pieces, the blocks are taken as even (as TF DTensor does):
  // this client cannot see the others' sizes. A single-device layout, or device 0's block
  // of another rank, gives device 0's block unchanged.
  //   [x,*] @ mesh(x=2), blocks [9,2] and [8,2] -> [17,2]
  std::vector<int64_t> GlobalShapeOfBlocks(
      const std::function<std::vector<int64_t>(int local_device)>& block) const;

  // A layout of another rank over the same mesh, e.g. after a reduction. Keeps the type;
  // a single-device layout stays the single-device layout (it has no specs).
  // Pending reductions are dropped: they belong to a value, not to a sharding pattern.
  Layout WithSpecs(std::vector<DimSpec> specs) const {
    if (is_single_device()) return Layout(mesh_, {}, type_);
    return Layout(mesh_, std::move(specs), type_);
  }

  bool operator==(const Layout& other) const {
    return type_ == other.type_ && specs_ == other.specs_ && mesh_ == other.mesh_ &&
           partial_ == other.partial_;
  }
  bool operator!=(const Layout& other) const { return !(*this == other); }
  size_t Hash() const;

 private:
  Layout(Mesh mesh, std::vector<DimSpec> specs, LayoutType type = LayoutType::kStatic,
         std::vector<PartialSpec> partial = {})
      : mesh_(std::move(mesh)),
        specs_(std::move(specs)),
        type_(type),
        partial_(std::move(partial)) {}
  Mesh mesh_;
  std::vector<DimSpec> specs_;
  LayoutType type_ = LayoutType::kStatic;
  std::vector<PartialSpec> partial_;
};

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_CORE_LAYOUT_H_
