// Small arithmetic on the shards, for rules whose expansion is more than one local op
// (synchronised batch norm, vocab-parallel softmax): each call runs one TF op on every
// shard with its type attributes set, so the same code serves the eager and the graph
// builder. Values keep the layouts the caller names; collectives stay with the caller.
#ifndef TF_DTENSOR_CC_RULES_LOCAL_MATH_H_
#define TF_DTENSOR_CC_RULES_LOCAL_MATH_H_

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "cc/rules/rule.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {

class LocalMath {
 public:
  // `type`: the TF_DataType of the arithmetic (the "T" of every op).
  LocalMath(Builder& builder, Mesh mesh, int type)
      : builder_(builder), mesh_(std::move(mesh)), type_(type) {}

  int type() const { return type_; }
  Builder& builder() const { return builder_; }
  const Mesh& mesh() const { return mesh_; }

  // `op` on the shards with only the given attributes; one output with layout `out`, and
  // global shape `global` where given (a view whose global shape no input tells: the
  // recording builder of `explain` and the golden tables reads its rank from it).
  StatusOr<ValueId> Op(const std::string& op, const std::vector<ValueId>& inputs,
                       std::vector<AttrOverride> attrs, const Layout& out,
                       std::optional<std::vector<int64_t>> global = std::nullopt) {
    LocalOpOptions options;
    options.copy_attrs = false;
    options.overrides = std::move(attrs);
    if (global) options.global_shapes = {std::move(global)};
    return builder_.LocalOpValue(op, inputs, options, out);
  }
  // An elementwise op of type T; the result has `out` (the layout of the broadcast shape).
  StatusOr<ValueId> Apply(const std::string& op, const std::vector<ValueId>& inputs,
                          const Layout& out) {
    return Op(op, inputs, {AttrOverride::Type("T", type_)}, out);
  }
  StatusOr<ValueId> Apply(const std::string& op, ValueId x) {
    return Apply(op, {x}, Layout(*builder_.layout(x)));
  }
  // Sum/Max of `x` over `axes` (host values) with keep_dims; the result has layout `out`.
  StatusOr<ValueId> Reduce(const std::string& op, ValueId x, const std::vector<int64_t>& axes,
                           const Layout& out, bool keep_dims = true) {
    TFD_ASSIGN_OR_RETURN(ValueId host,
                         builder_.HostConstant(axes, {static_cast<int64_t>(axes.size())},
                                               TF_INT32));
    return Op(op, {x, host},
              {AttrOverride::Type("T", type_), AttrOverride::Type("Tidx", TF_INT32),
               Bool("keep_dims", keep_dims)},
              out);
  }
  // `x` with the local shape `shape` (one -1 allowed), as layout `out` (of global shape
  // `global` where given, as for Op).
  StatusOr<ValueId> Reshape(ValueId x, const std::vector<int64_t>& shape, const Layout& out,
                            std::optional<std::vector<int64_t>> global = std::nullopt) {
    TFD_ASSIGN_OR_RETURN(ValueId host,
                         builder_.HostConstant(shape, {static_cast<int64_t>(shape.size())},
                                               TF_INT32));
    return Op("Reshape", {x, host},
              {AttrOverride::Type("T", type_), AttrOverride::Type("Tshape", TF_INT32)}, out,
              std::move(global));
  }
  StatusOr<ValueId> Cast(ValueId x, int from, int to) {
    if (from == to) return x;
    return Op("Cast", {x}, {AttrOverride::Type("SrcT", from), AttrOverride::Type("DstT", to)},
              Layout(*builder_.layout(x)));
  }
  // A replicated float32 scalar with exactly `value` (its bits, bitcast: no rounding).
  StatusOr<ValueId> Float(float value) {
    int32_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    TFD_ASSIGN_OR_RETURN(ValueId host, builder_.HostConstant({bits}, {}, TF_INT32));
    TFD_ASSIGN_OR_RETURN(ValueId f, Op("Bitcast", {host},
                                        {AttrOverride::Type("T", TF_INT32),
                                         AttrOverride::Type("type", TF_FLOAT)},
                                        Layout::Replicated(mesh_, 0)));
    return Cast(f, TF_FLOAT, type_);
  }
  // A replicated scalar of type T holding the integer `value` (a count).
  StatusOr<ValueId> Count(int64_t value) {
    TFD_ASSIGN_OR_RETURN(ValueId host, builder_.HostConstant({value}, {}, TF_INT64));
    return Op("Cast", {host},
              {AttrOverride::Type("SrcT", TF_INT64), AttrOverride::Type("DstT", type_)},
              Layout::Replicated(mesh_, 0));
  }

  static AttrOverride Bool(const std::string& name, bool value) {
    return AttrOverride::Bool(name, value);
  }

 private:
  Builder& builder_;
  Mesh mesh_;
  int type_;
};

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_RULES_LOCAL_MATH_H_
