// The steps the collective-ops lowering (collective_ops_lowering.cc) builds its
// collectives from: one TF collective op per local device with its group and instance
// keys (RunCollectiveStep; pieces whose sizes are known only at run time take a key per
// size bucket), the dtypes those ops take and how others travel (Wire), and the per-device
// chains around them: conversions, padding and trimming of uneven or empty blocks,
// reordering TF's ranking of a group into mesh order, and the all-gather of pieces of
// run-time size (GatherRunTimeSizes).
#ifndef TF_DTENSOR_CC_SPMD_COLLECTIVE_OPS_STEPS_H_
#define TF_DTENSOR_CC_SPMD_COLLECTIVE_OPS_STEPS_H_

#include <string>
#include <vector>

#include "cc/spmd/lowering.h"

namespace tf_dtensor {
namespace collective_ops {

using Handles = std::vector<LocalHandle>;

// The attributes every V2 collective op takes besides its own.
LocalOpOptions CollectiveOptions(const Mesh& mesh, int dtype);

// How a dtype the collective ops do not take travels: converted to `wire` (by Cast, or
// by Bitcast, which gives complex numbers a trailing axis of 2) and back.
struct Wire {
  int wire;
  bool bitcast;
  bool supported = true;
};

// CollectiveGatherV2 takes float, half, double, int32 and int64.
Wire GatherWire(int dtype);

// CollectiveReduceV2 reduces float, half, double, int32 and int64 (bfloat16 goes as
// float: not every device has a bfloat16 kernel). On GPUs it refuses int32 ("does not
// support datatype DT_INT32 on DEVICE_GPU": TF keeps int32 in host memory there), so the
// small integers and bool travel as int64; a sum cast back wraps as int32 arithmetic does.
Wire ReduceWire(const Mesh& mesh, int dtype, ReduceOp op);

// The error for a dtype TF's collective ops cannot carry, naming the lowering that can.
Status UnsupportedCollectiveType(const char* collective, int dtype);

// Every device's handle converted to `to` (Cast, or Bitcast when `bitcast`); the inputs
// stay the caller's.
StatusOr<Handles> ConvertEach(CollectiveRunner& run, const Handles& handles, int from, int to,
                              bool bitcast);

// Runs `op_type` on every device with inputs {handles[d], extra}, `extra` a host argument
// every device reads (an axis, a permutation); the inputs stay the caller's.
StatusOr<Handles> RunEachWith(CollectiveRunner& run, const std::string& op_type,
                              const Handles& handles, LocalHandle extra,
                              const LocalOpOptions& options);

// One TF collective step: `op_type` on every device d with {values[d], group size,
// group key(d's group), instance key}. The instance key is fresh, or, eagerly, one an
// earlier successful step of the same signature has finished with (collectives.h:
// TakeInstanceKey; TF keeps a record per key for the life of the context).
StatusOr<Handles> RunCollectiveStep(CollectiveRunner& run, const std::string& op_type,
                                    const Handles& values, const CollectiveGroups& groups,
                                    const LocalOpOptions& options);

// Puts the `pieces` equal chunks along axis 0 of every device's handle in the order
// `order(device)[j]` names for chunk j (Split + ConcatV2); temporaries go to `made`.
StatusOr<Handles> PermuteChunks(CollectiveRunner& run, const Handles& handles, int64_t pieces,
                                const CollectiveGroups& groups, bool to_tf_order, int dtype,
                                Handles& made);

// Whether every block of `value` is empty (a known axis of size 0). TF's collective ops
// are not run on those: CollectiveGatherV2 of empty pieces crashes the process.
bool IsEmpty(Builder& b, ValueId value);

// The result of a collective of an empty value: each device's own (empty) block reshaped
// to its block of `out_layout`; no data moves, as none exists.
StatusOr<ValueId> EmptyResult(CollectiveRunner& run, ValueId value, const Layout& out_layout);

// Each device's handle padded with zeros after each axis by `padding[device][axis]`.
StatusOr<Handles> PadEach(CollectiveRunner& run, const Handles& handles,
                          const std::vector<std::vector<int64_t>>& padding, int dtype);

// Blocks that are empty where the value is not: uneven pieces can leave a device nothing
// along an axis ([3,1] over y=2 gives blocks of 1 and 0 columns). TF's collective ops
// crash the process on an input without elements, so such a block goes in padded to one
// row along each empty axis other than `keep` (-1: none kept), and the padding is cut off
// the result (TrimToBlocks). Every device of a group holds blocks of the same size along
// the axes its collective does not combine, so the group's devices agree on the padded
// shape. Returns, per device, the padding after each axis (all zero where nothing is).
std::vector<std::vector<int64_t>> EmptyAxisPadding(const Layout& layout,
                                                   const std::vector<int64_t>& global,
                                                   int devices, int keep);

bool AnyPadding(const std::vector<std::vector<int64_t>>& padding);

// Each device's handle sliced to its block of `layout` (the padding EmptyAxisPadding added
// taken off again); the padded handles go to `made`.
StatusOr<Handles> TrimToBlocks(CollectiveRunner& run, const Handles& handles,
                               const Layout& layout, const std::vector<int64_t>& global,
                               int dtype, Handles& made);

// The all-gather along axis 0 of pieces whose sizes are known only at run time (inside a
// tf.function: a batch of a tf.data iterator, the last one partial). CollectiveGatherV2
// needs pieces of one shape, so each device's row count goes round first (a gather of one
// int64 each), every piece is padded with zeros to the largest (at least one row: TF's
// collective ops crash the process on a piece without elements), the padded pieces are
// gathered, and each device keeps the real rows of every chunk in piece order (RaggedRange
// of the chunks' row spans, then GatherV2). `current[d]` is device d's piece with the
// gathered axis first, of dtype `dtype` (a wire type); `position_of[c]` is the group
// position holding piece c. What it makes and does not hand on goes to `made`.
StatusOr<Handles> GatherRunTimeSizes(CollectiveRunner& run, const Handles& current, int rank,
                                     const CollectiveGroups& groups, int dtype,
                                     const std::vector<int64_t>& position_of, Handles& made);

}  // namespace collective_ops
}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_SPMD_COLLECTIVE_OPS_STEPS_H_
