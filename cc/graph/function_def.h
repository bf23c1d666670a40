// FunctionDef and OpDef, decoded from their serialized form.
//
// The C API hands a function over only as a serialized FunctionDef
// (TFE_ContextGetFunctionDef). These are the parts expansion reads: the signature, the
// nodes with their inputs and raw attribute values, and the returns. Attribute values stay
// serialized: they go back into the expanded graph unchanged (TF_SetAttrValueProto).
#ifndef TF_DTENSOR_CC_GRAPH_FUNCTION_DEF_H_
#define TF_DTENSOR_CC_GRAPH_FUNCTION_DEF_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cc/core/status.h"
#include "cc/tf/attrs.h"

namespace tf_dtensor {

// (name, serialized AttrValue) pairs, in the order they were read.
using RawAttrs = std::vector<std::pair<std::string, std::string>>;

struct ArgSpec {
  std::string name;
  int type = 0;  // a fixed TF_DataType, or 0 when `type_attr` names it
  std::string type_attr;
  std::string number_attr;     // a list of `number_attr` tensors
  std::string type_list_attr;  // a list typed by `type_list_attr`
};

struct OpSpec {
  std::string name;
  std::vector<ArgSpec> inputs;
  std::vector<ArgSpec> outputs;
  std::vector<std::string> attrs;  // attribute names
  bool is_stateful = false;
};

struct NodeSpec {
  std::string name;
  std::string op;
  std::string device;
  std::vector<std::string> inputs;  // "arg", "node:out_arg:index" or "^node"
  RawAttrs attrs;
};

struct FunctionSpec {
  OpSpec signature;
  RawAttrs attrs;  // the function's own attributes (`_XlaMustCompile` of jit_compile=True)
  std::vector<NodeSpec> nodes;
  std::vector<std::pair<std::string, std::string>> ret;          // output arg -> tensor
  std::vector<std::pair<std::string, std::string>> control_ret;  // name -> node
};

StatusOr<OpSpec> ParseOpDef(std::string_view bytes);
StatusOr<FunctionSpec> ParseFunctionDef(std::string_view bytes);

// The attributes as a serialized NameAttrList (what AttrMap::Parse reads).
std::string EncodeNameAttrList(const RawAttrs& attrs);
// Decoded attributes of a node.
AttrMap DecodeAttrs(const RawAttrs& attrs);
const std::string* FindRawAttr(const RawAttrs& attrs, const std::string& name);

// The function an AttrValue names (`func`), e.g. PartitionedCall's `f`.
std::optional<std::string> FunctionNameOf(std::string_view attr_value);
// The functions a list AttrValue names (`list.func`), e.g. Case's `branches`.
std::optional<std::vector<std::string>> FunctionNamesOf(std::string_view attr_value);
// Serialized AttrValues.
std::string FunctionAttr(const std::string& name);
std::string FunctionListAttr(const std::vector<std::string>& names);
std::string TypeListAttr(const std::vector<int>& types);
std::string BoolAttr(bool value);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_GRAPH_FUNCTION_DEF_H_
