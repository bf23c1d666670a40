// Cutting blocks into pieces and joining pieces into blocks, at every device of a group at
// once (block_pieces.cc), for the lowerings that compute collectives from local ops
// (shared_buffer_lowering.cc).
#ifndef TF_DTENSOR_CC_SPMD_BLOCK_PIECES_H_
#define TF_DTENSOR_CC_SPMD_BLOCK_PIECES_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cc/spmd/lowering.h"

namespace tf_dtensor {
namespace pieces {

// The product of dims[begin, end).
int64_t Product(const std::vector<int64_t>& dims, size_t begin, size_t end);
// Whether the copies lowering cuts and joins with a Transpose and a DynamicStitch where
// it can ("transpose", the default) or with SplitV and ConcatV2 ("split"):
// TF_DTENSOR_COPIES_PIECES, read per collective.
bool FoldedPieces();
// Every source in `sources` cuts its block of `value` along `dim` into the pieces of
// `out_layout`, all at once: transposed where `fold` and that form applies, else SplitV;
// each source's pieces, in their block shape, or, `as_rows` where the transposed form
// applies, as rows of one shape [1, ...] that only a stacked join takes (JoinStacks).
StatusOr<std::vector<std::vector<LocalHandle>>> CutEach(CollectiveRunner& run, ValueId value,
                                                        const std::vector<int>& sources,
                                                        int dim, const Layout& out_layout,
                                                        bool fold, bool as_rows = false);
// Whether JoinEach with `fold` stacks the `pieces` parts of every target in `targets`
// (blocks of `out_layout` of global shape `global`, joined along `dim`).
bool JoinStacks(const std::vector<int>& targets, const Layout& out_layout,
                const std::vector<int64_t>& global, int dim, int64_t pieces, int dtype);
// Every target in `targets` joins its parts (`parts[t]`, in order along `dim`) into its
// block of `out_layout` (global shape `global`), all at once: stacked where `fold` and that
// form applies, else one ConcatV2; each target's block.
StatusOr<std::vector<LocalHandle>> JoinEach(CollectiveRunner& run, int dtype,
                                            const std::vector<std::vector<LocalHandle>>& parts,
                                            const std::vector<int>& targets,
                                            const Layout& out_layout,
                                            const std::vector<int64_t>& global, int dim,
                                            bool fold);

}  // namespace pieces
}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_SPMD_BLOCK_PIECES_H_
