// The collective ledger: every collective the builders issue, as the user's
// `tf_dtensor.debug.collectives()` reports it.
//
// A collective is noted where a builder hands it to the lowering (ComponentBuilder's
// AllReduce, ReduceScatter, AllGather, AllToAll), with the op being expanded (Dispatch
// sets it, per thread) and whether the user asked for it (a relayout op) or a rule implied
// it. Eagerly the note goes to the ledger at once, while one is open. A function's
// expansion keeps its notes with the expanded function, and each call of it adds them to
// the open ledger (once per call; a loop body's once, marked `in_loop`; both branches of
// a conditional, marked `in_branch`).
//
// Bytes are per device, in the ring model of each collective over a group of g devices
// and an input block of B bytes on each (what each device receives, whatever the
// lowering): all-gather (g-1)*B, all-reduce 2*(g-1)/g*B, reduce-scatter and all-to-all
// (g-1)/g*B.
#ifndef TF_DTENSOR_CC_SPMD_LEDGER_H_
#define TF_DTENSOR_CC_SPMD_LEDGER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cc/core/layout.h"

namespace tf_dtensor {

struct CollectiveRecord {
  std::string kind;       // "all-reduce", "all-gather", "all-to-all", "reduce-scatter"
  std::string reduction;  // "sum", "max", ... for reductions; "" otherwise
  std::string mesh;       // the mesh, short: "mesh(x=2,y=2)"
  std::vector<std::string> mesh_dims;  // the dimensions the collective runs over
  int group_size = 1;                  // devices per group (product of their sizes)
  std::string layout_in;               // the value's layout, short: "[x,*]"
  std::string layout_out;              // after the collective
  std::vector<int64_t> shape;          // the value's global shape
  int dtype = 0;                       // TF_DataType
  int64_t block_bytes = 0;             // one device's input block
  int64_t bytes_per_device = 0;        // what each device receives (ring model)
  std::string op;                      // the op being expanded ("" outside one)
  bool requested = false;              // the user's relayout asked for it
  bool combined = false;               // joined with other all-reduces into one (graphs)
  bool in_loop = false;                // in a loop body: issued once per iteration
  bool in_branch = false;              // in one branch of a conditional: maybe not issued
  // Which branch: "<If node> then", "<If node> else" or "<Case node> branch k", outer
  // conditionals first ("outer then / inner else"); "" outside one.
  std::string branch;
  std::string where;                   // "eager" or the tf.function's name
  // The user's source line that issued it ("train.py:42"): the line of the eager op, or
  // of the tf.function call; "" where unknown (no line source, or not a Python thread).
  std::string line;
};

// Bytes per element of a fixed-size TF_DataType; 0 for others (strings, variants,
// resources).
size_t DTypeBytes(int dtype);

// A record of `kind` on `layout` (global `shape`, `dtype`) over `mesh_dims`, its output
// layout `out`; the op and requested flag come from the current OpScope.
CollectiveRecord MakeCollectiveRecord(const std::string& kind, const std::string& reduction,
                                      const Layout& layout, const std::vector<int64_t>& shape,
                                      int dtype, const std::vector<int>& mesh_dims,
                                      const Layout& out);

namespace ledger {

// Whether a ledger is open (cheap: one atomic load).
bool Active();
// Opens a ledger: returns the position its records start at.
int64_t Begin();
// Closes the ledger opened at `start` (on this thread): its records, those noted since on
// this thread or on a thread with no ledger open (TensorFlow's executor threads). A
// collective issued on another thread that has a ledger open belongs to that thread's
// ledgers. The last one to close drops the records.
std::vector<CollectiveRecord> End(int64_t start);
// Adds a record while a ledger is open; an empty `line` is filled from the line source.
void Record(CollectiveRecord record);

// Names the user's source line of what is being recorded (the Python bindings set one
// that reads the calling Python frames). Called by Record only while a ledger is open,
// and never with the ledger's lock held.
void SetLineSource(std::function<std::string()> source);

// The op being expanded on this thread, for the records noted meanwhile; `relayout`: it
// is the user's relayout (its collectives were asked for).
class OpScope {
 public:
  OpScope(const std::string& op, bool relayout);
  ~OpScope();
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  const std::string* saved_;
  bool saved_relayout_;
};
// The current op's name ("" outside any), and whether it is the user's relayout.
const std::string& CurrentOp();
bool CurrentOpIsRelayout();

// Fault injection for tests of `debug.check`: while set, the all-reduces that op `op`'s
// expansion asks for are dropped (its result keeps each device's partial value as if it
// were the sum: a wrong answer, as a broken rule would give). "" turns it off.
void SetDroppedAllReduceForTesting(const std::string& op);
bool DropsAllReduceForTesting(const std::string& op);

}  // namespace ledger
}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_SPMD_LEDGER_H_
