// Ids into an axis that is sharded by blocks (an embedding table's rows), made local to
// each device's block without gathering the table:
//   ids [B] (whole on every device), table [V,D] [x,*] with x's blocks [lo_i, hi_i):
//     in_block = lo_i <= ids < hi_i        local = in_block ? ids - lo_i : fill
// A gather then reads its own rows (out-of-block ids read a clamped row that the mask
// zeroes: a partial sum over x); a scatter or segment reduction applies only its rows.
// Blocks follow the shard geometry, so uneven blocks are right.
#ifndef TF_DTENSOR_CC_RULES_ROW_BLOCKS_H_
#define TF_DTENSOR_CC_RULES_ROW_BLOCKS_H_

#include <vector>

#include "cc/core/layout.h"
#include "cc/core/status.h"
#include "cc/spmd/builder.h"

namespace tf_dtensor {

struct BlockIds {
  int mesh_dim = -1;   // the mesh dimension the blocks are sharded over
  ValueId local = -1;  // ids relative to the device's block, `fill` outside it
  ValueId in_block = -1;  // bool, the shape of the ids
};

// Whether some device's block of `axis` is empty (fewer rows than shards, or ceil-sized
// uneven pieces that run out): such a device has no row to clamp ids to.
bool HasEmptyBlock(const Layout& layout, const std::vector<int64_t>& shape, int axis);

// Whether cutting an axis of `size` into `pieces` (as blocks are cut) leaves some piece
// empty (3 over 4), or the size is unknown (< 0): rules whose kernels refuse an empty
// block keep such an axis whole.
bool HasEmptyPiece(int64_t size, int64_t pieces);

// `layout` with any axis sharded over `mesh_dim` unsharded: the ids and results of a
// row-block op, which are whole along the blocks' mesh dimension.
Layout UnshardedOver(const Layout& layout, int mesh_dim);

// Local-op options for a value that differs along `mesh_dim` although its layout does
// not say so (each device's block ids): attributes only from `overrides`.
LocalOpOptions DistinctOver(int mesh_dim, std::vector<AttrOverride> overrides,
                            bool copy_attrs = false);

// Which ids one device's kernel refuses (on CPUs; GPU kernels skip bad ids silently):
// none checked, ids outside [0, rows) (gathers, scatters), or ids >= rows (segment
// reductions, which drop negative ids).
enum class IdRange { kUnchecked, kInRange, kBelowRows };

// `ids` checked as one device's kernel checks them against `rows`: InvalidArgumentError
// naming `op_name` now when their values are known, else `local` (a value derived from
// the ids, distinct along `mesh_dim` unless it is -1) returned made to depend on a
// CheckNumerics that fails on a bad id. `table`: the indexed layout, for the message.
StatusOr<ValueId> CheckIds(Builder& builder, ValueId ids, ValueId local, int64_t rows,
                           IdRange check, const std::string& op_name, const Layout& table,
                           int mesh_dim);

// `ids` (int32/int64, whole along table's sharding of `axis`) made local to each device's
// block of `axis` of a table of `table_shape` laid out as `table`. With `check`, on a mesh
// of CPUs, an id the one-device kernel would refuse raises InvalidArgumentError naming
// `op_name` and the range (eagerly when the ids' values are known, else by a CheckNumerics
// the local ids depend on), where the masks alone would read it as a row of another block
// or of none (zeros).
StatusOr<BlockIds> LocalizeIds(Builder& builder, ValueId ids, const Layout& table,
                               const std::vector<int64_t>& table_shape, int axis, int64_t fill,
                               const std::string& op_name = "",
                               IdRange check = IdRange::kUnchecked);

// The ids (from LocalizeIds) that fall in each device's block, for ops that run on
// those alone: `where`, their positions ([n, r] int64, r the ids' rank; one id counts
// as a list of one, r = 1, `listed`), and `local`, those ids made local to the block
// ([n]). `listed(value)` puts a value of a single id in a list of one (ExpandDims).
struct InBlockIds {
  ValueId where = -1;
  ValueId local = -1;
  bool listed = false;
  // The mesh dimensions along which `where` and `local` differ: the block's, and those
  // that shard the ids (their layouts, replicated, do not say so).
  std::vector<int> distinct;
};
StatusOr<InBlockIds> KeepInBlock(Builder& builder, const BlockIds& ids);
// `value` with an axis of 1 in front, distinct along `mesh_dim` as it is.
StatusOr<ValueId> ListOfOne(Builder& builder, ValueId value, int mesh_dim);
// GatherNd(value, where) of an InBlockIds: the entries of the kept ids, its first
// `id_axes` axes (those of the ids) become one; the rest keep their layout. The result
// differs along `distinct` (InBlockIds::distinct) and `value`'s sharded dimensions.
StatusOr<ValueId> GatherInBlock(Builder& builder, ValueId value, ValueId where, int id_axes,
                                const std::vector<int>& distinct);

// `mask` (bool, one entry per id) broadcast against a result whose axes are the mask's
// with `inner` axes inserted after its first `at` axes and `trailing` axes appended:
// ExpandDims, so that SelectV2 broadcasts it.
StatusOr<ValueId> ExpandMask(Builder& builder, ValueId mask, int mesh_dim, int at, int inner,
                             int trailing);

// where(mask, value, fill) with `fill` a like-shaped value (zeros: ZerosLike; ones:
// OnesLike; or any value); the result has `out` as its layout.
StatusOr<ValueId> Select(Builder& builder, ValueId mask, ValueId value, ValueId fill,
                         int mesh_dim, const Layout& out);
// ZerosLike / OnesLike of `value`, distinct along `mesh_dim` as it is.
StatusOr<ValueId> FillLike(Builder& builder, const char* op, ValueId value, int mesh_dim);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_RULES_ROW_BLOCKS_H_
