// The SPMD program a rule writes: local ops on every shard plus collectives.
//
// Rules never touch devices. They describe the local program in terms of values with
// layouts, and a Builder carries it out: the eager builder runs each step at once on
// the mesh's devices; a graph builder (tf.function expansion) emits the same steps as
// nodes. This keeps one rule per op for both paths.
#ifndef TF_DTENSOR_CC_SPMD_BUILDER_H_
#define TF_DTENSOR_CC_SPMD_BUILDER_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cc/core/layout.h"
#include "cc/core/status.h"

namespace tf_dtensor {

// A value in the program under construction. Host values (shapes, axes) have no layout.
using ValueId = int;


// One attribute of a local op that differs from the original op's.
struct AttrOverride {
  enum class Kind { kShape, kType, kInt, kBool, kString, kIntList };
  std::string name;
  Kind kind;
  std::vector<int64_t> ints;  // kShape dims, kIntList values, or the single kInt value
  int type = 0;               // kType (a TF_DataType)
  bool boolean = false;
  std::string text;
  static AttrOverride Shape(std::string name, std::vector<int64_t> dims) {
    return {std::move(name), Kind::kShape, std::move(dims)};
  }
  static AttrOverride Type(std::string name, int type) {
    AttrOverride a{std::move(name), Kind::kType, {}};
    a.type = type;
    return a;
  }
  static AttrOverride Int(std::string name, int64_t value) {
    return {std::move(name), Kind::kInt, {value}};
  }
  static AttrOverride IntList(std::string name, std::vector<int64_t> values) {
    return {std::move(name), Kind::kIntList, std::move(values)};
  }
  static AttrOverride Bool(std::string name, bool value) {
    AttrOverride a{std::move(name), Kind::kBool, {}};
    a.boolean = value;
    return a;
  }
  static AttrOverride String(std::string name, std::string value) {
    AttrOverride a{std::move(name), Kind::kString, {}};
    a.text = std::move(value);
    return a;
  }
};

struct LocalOpOptions {
  // Start from the attributes of the op being expanded (true) or from none (false).
  bool copy_attrs = true;
  std::vector<AttrOverride> overrides;
  // Run once and share the result with every device (stateful ops such as RandomUniform
  // whose replicas must agree). Only for fully replicated outputs.
  bool run_once = false;
  // Mesh dimensions along which the results differ although no layout says so: the
  // per-device variables a VarHandleOp creates for a sharded DVariable.
  std::vector<int> distinct_over;
  // Per output, its global shape where the rule knows it better than the local op's shape
  // inference (a TensorList element of uneven blocks: one element_shape argument serves
  // every device, so it leaves those sizes open; a popped element, whose shape TF infers
  // from handle data alone). Fills the sizes inference leaves unknown; each device's
  // result then gets its block's shape.
  std::vector<std::optional<std::vector<int64_t>>> global_shapes;
  // A device whose block of some data input is empty does not run the op: each output
  // is zeros of its block of `global_shapes[j]` (which must name every output), of the
  // first data input's dtype. For kernels that mishandle empty blocks, which uneven
  // shards make (TF's CPU convolutions return their input, refuse an empty filter, or
  // return uninitialised memory; max pooling gradients abort). Right only for ops where
  // an empty input block makes either an empty output block or a sum over the empty
  // axis (a contraction), which is zero.
  bool zeros_for_empty_blocks = false;
  // Per output, sizes added to every device's block of its global shape for those zeros
  // (the local op of a halo exchange makes its block extended by the halo rows).
  std::vector<std::vector<int64_t>> zeros_grow;
};

// An expansion that was the op itself on each device's own components (the eager executor
// records it with the op's plan: PlanCache::SetLocalOnly).
struct LocalOnlyRun {
  // leaders[d]: the device whose results device d shares (d itself: it runs the op).
  std::vector<int> leaders;
  // The outputs' layouts. A replicated plan adapts to the rank the kernel gives (as
  // ComponentBuilder::LocalOp does).
  std::vector<Layout> outputs;
};

// Metadata for a resource (variable) handle: the layout and shape of the value it holds.
struct ResourceInfo {
  Layout value_layout;
  std::vector<int64_t> value_shape;
  int value_dtype;
  // A variable's with replicas (devices holding the same block; not a TensorList's):
  // whether it was made under a lowering whose devices share buffers, the replicas then
  // sharing one variable. Only reads
  // may run under a lowering that stores replicas the other way (an update would go to
  // the one variable once per device, or to one device's copy only).
  std::optional<bool> shared_storage;
  // A TensorList's: the integer value every element holds, known while planning (a list
  // only TensorListPushBack wrote, each time the same constant: the Shape that a while
  // loop's gradient accumulates per iteration for its BroadcastGradientArgs, when the
  // traced shapes have unknown sizes). TensorListPopBack reads it as that constant.
  std::optional<std::vector<int64_t>> element_value;
  // A TensorList's element_shape as the op that made it declared it, which
  // TensorListElementShape answers (global sizes, -1 where unknown; nullopt inside: an
  // unknown rank): TensorListFromTensor(t [3,2], element_shape=-1) declares an unknown
  // rank, though its elements are [2]. Unset where it is not known while planning (a list
  // made before its element layout was set: the first write records the elements alone).
  std::optional<std::optional<std::vector<int64_t>>> declared_element_shape;

  // Whether `other` describes the same value to plan for: its layout, shape and dtype, and
  // a list's element value and declared element shape. Expansions and plans are keyed on
  // these. `shared_storage` is
  // not among them: dispatch checks it against the lowering in force before any plan is
  // looked up, and a read (the only op it allows across lowerings) plans alike.
  bool SameValue(const ResourceInfo& other) const {
    return value_layout == other.value_layout && value_shape == other.value_shape &&
           value_dtype == other.value_dtype && element_value == other.element_value &&
           declared_element_shape == other.declared_element_shape;
  }
};

class Builder {
 public:
  virtual ~Builder() = default;

  // The values of the op's inputs, set once they are all on the builder.
  virtual void SetInputs(std::vector<ValueId> inputs) = 0;
  virtual int num_inputs() const = 0;
  virtual ValueId input(int index) const = 0;
  virtual const std::optional<Layout>& layout(ValueId value) const = 0;
  virtual const std::vector<int64_t>& shape(ValueId value) const = 0;
  virtual int dtype(ValueId value) const = 0;
  virtual const std::optional<ResourceInfo>& resource(ValueId value) const = 0;
  virtual void set_resource(ValueId value, ResourceInfo info) = 0;
  // The value of a small integer tensor that is on the host or replicated (a shape, an
  // axis), when it can be known while planning; nullopt otherwise.
  virtual std::optional<std::vector<int64_t>> IntValue(ValueId value) = 0;

  // Runs `op_name` on every shard with the local parts of `inputs` (host values go to
  // every shard unchanged). Output i gets `out_layouts[i]`; its global shape is the local
  // shape scaled by that layout.
  virtual StatusOr<std::vector<ValueId>> LocalOp(const std::string& op_name,
                                                 const std::vector<ValueId>& inputs,
                                                 const LocalOpOptions& options,
                                                 const std::vector<Layout>& out_layouts) = 0;
  // LocalOp of one output, with layout `out_layout`: that output's value.
  StatusOr<ValueId> LocalOpValue(const std::string& op_name, const std::vector<ValueId>& inputs,
                                 const LocalOpOptions& options, const Layout& out_layout) {
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> out,
                         LocalOp(op_name, inputs, options, {out_layout}));
    return out[0];
  }

  // Combines the partial values held along `mesh_dims` (e.g. after a contraction over a
  // sharded axis): every device ends with the reduction of its group. Keeps the sharding;
  // the layout's pending reductions over `mesh_dims`, if any, are done.
  virtual StatusOr<ValueId> AllReduce(ValueId value, const std::vector<int>& mesh_dims,
                                      ReduceOp op) = 0;
  // Reduces the pending values along `mesh_dim` and leaves each device its piece of axis
  // `dim`: [*] +partial(x:sum) -> [x]. Default: all-reduce, then slice.
  virtual StatusOr<ValueId> ReduceScatter(ValueId value, int dim, int mesh_dim, ReduceOp op);
  // The inverse of an all-reduce: a value that is whole along `mesh_dims` becomes pending
  // reductions `op` over them ([*] -> [*] +partial(x:sum)): for a sum the first device of
  // each group keeps the value and the others hold zeros; max, min and mean keep it.
  virtual StatusOr<ValueId> ToPartial(ValueId value, const std::vector<int>& mesh_dims,
                                      ReduceOp op) = 0;
  // Unshards tensor axis `dim`: [x,*] -> [*,*] by concatenating the pieces along `dim`
  // (over several mesh dimensions too: [x+y,*] -> [*,*]).
  virtual StatusOr<ValueId> AllGather(ValueId value, int dim) = 0;
  // Shards replicated tensor axis `dim` over `mesh_dim`: [*,*] -> [x,*]; no communication.
  virtual StatusOr<ValueId> Slice(ValueId value, int dim, int mesh_dim) = 0;
  // Slice with any sharding of the axis, also over several mesh dimensions ([*] -> [x+y]).
  // Default: a single mesh dimension only.
  virtual StatusOr<ValueId> SliceOver(ValueId value, int dim, const DimSpec& spec);
  // SliceOver of an operand that broadcasts where its size is 1: an elementwise op's
  // replicated operand whose size along `dim` is known only at run time, beside a sharded
  // one. When it runs with size 1 every device keeps that one row (TF broadcasts it
  // against each block); otherwise each device keeps its block. Default: SliceOver (a
  // builder whose sizes are all known).
  virtual StatusOr<ValueId> SliceMayBroadcast(ValueId value, int dim, const DimSpec& spec) {
    return SliceOver(value, dim, spec);
  }
  // Moves an unsharded-on-`dim` value to sharding over `mesh_dim`, and a sharded axis
  // `from_dim` to unsharded, in one exchange: [x,*] -> [*,x]. Default: gather + slice.
  virtual StatusOr<ValueId> AllToAll(ValueId value, int from_dim, int to_dim);

  // A relayout of `value` to `target` that this builder already emitted and may hand out
  // again: in a graph values never change, so a second consumer that needs the same
  // layout (two ops reading one pending sum) reads the first relayout's result instead of
  // running the collective twice. nullopt eagerly (each op's relayout runs at once).
  virtual std::optional<ValueId> ReusableRelayout(ValueId value, const Layout& target) {
    return std::nullopt;
  }
  virtual void NoteRelayout(ValueId value, const Layout& target, ValueId result) {}

  // A host constant (int32 or int64), e.g. a local shape for Reshape.
  virtual StatusOr<ValueId> HostConstant(const std::vector<int64_t>& values,
                                         const std::vector<int64_t>& shape, int dtype) = 0;
  // A replicated value on `mesh` built from host data (an int constant), e.g. tf.shape.
  virtual StatusOr<ValueId> Broadcast(ValueId host_value, const Mesh& mesh) = 0;
  // Hands a value that is whole on every device of its mesh (replicated, or on a
  // single-device mesh) to another mesh, replicated there: device 0's component goes to
  // every device of `mesh`. The builder's later ops run on `mesh`.
  virtual StatusOr<ValueId> MoveToMesh(ValueId value, const Mesh& mesh) = 0;
};

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_SPMD_BUILDER_H_
