#include "cc/graph/function_def.h"

#include "cc/core/wire.h"

namespace tf_dtensor {
namespace {

Status Malformed(const char* what) {
  return Internal(std::string("Cannot decode a serialized ") + what + ".");
}

// Reads a map<string, string-or-message> entry: key = 1, value = 2.
bool ReadEntry(std::string_view entry, std::string* key, std::string* value) {
  WireReader reader(entry);
  int field, wire_type;
  while (!reader.done()) {
    if (!reader.ReadTag(&field, &wire_type)) return false;
    std::string_view bytes;
    if ((field == 1 || field == 2) && wire_type == 2) {
      if (!reader.ReadBytes(&bytes)) return false;
      (field == 1 ? key : value)->assign(bytes);
    } else if (!reader.Skip(wire_type)) {
      return false;
    }
  }
  return true;
}

bool ParseArg(std::string_view bytes, ArgSpec* arg) {
  WireReader reader(bytes);
  int field, wire_type;
  while (!reader.done()) {
    if (!reader.ReadTag(&field, &wire_type)) return false;
    std::string_view s;
    uint64_t v;
    if (wire_type == 2 && (field == 1 || field == 4 || field == 5 || field == 6)) {
      if (!reader.ReadBytes(&s)) return false;
      std::string* target = field == 1   ? &arg->name
                            : field == 4 ? &arg->type_attr
                            : field == 5 ? &arg->number_attr
                                         : &arg->type_list_attr;
      target->assign(s);
    } else if (field == 3 && wire_type == 0) {
      if (!reader.ReadVarint(&v)) return false;
      arg->type = static_cast<int>(v);
    } else if (!reader.Skip(wire_type)) {
      return false;
    }
  }
  return true;
}

bool ParseNode(std::string_view bytes, NodeSpec* node) {
  WireReader reader(bytes);
  int field, wire_type;
  while (!reader.done()) {
    if (!reader.ReadTag(&field, &wire_type)) return false;
    std::string_view s;
    if (wire_type != 2 || field < 1 || field > 5) {
      if (!reader.Skip(wire_type)) return false;
      continue;
    }
    if (!reader.ReadBytes(&s)) return false;
    switch (field) {
      case 1: node->name.assign(s); break;
      case 2: node->op.assign(s); break;
      case 3: node->inputs.emplace_back(s); break;
      case 4: node->device.assign(s); break;
      case 5: {
        std::string key, value;
        if (!ReadEntry(s, &key, &value)) return false;
        node->attrs.emplace_back(std::move(key), std::move(value));
        break;
      }
    }
  }
  return true;
}

}  // namespace

StatusOr<OpSpec> ParseOpDef(std::string_view bytes) {
  OpSpec spec;
  WireReader reader(bytes);
  int field, wire_type;
  while (!reader.done()) {
    if (!reader.ReadTag(&field, &wire_type)) return Malformed("OpDef");
    std::string_view s;
    uint64_t v;
    if (wire_type == 2 && field >= 1 && field <= 4) {
      if (!reader.ReadBytes(&s)) return Malformed("OpDef");
      if (field == 1) {
        spec.name.assign(s);
      } else if (field == 4) {  // AttrDef: name = 1
        WireReader attr(s);
        int f, w;
        while (!attr.done()) {
          std::string_view name;
          if (!attr.ReadTag(&f, &w)) return Malformed("OpDef");
          if (f == 1 && w == 2) {
            if (!attr.ReadBytes(&name)) return Malformed("OpDef");
            spec.attrs.emplace_back(name);
          } else if (!attr.Skip(w)) {
            return Malformed("OpDef");
          }
        }
      } else {
        ArgSpec arg;
        if (!ParseArg(s, &arg)) return Malformed("OpDef");
        (field == 2 ? spec.inputs : spec.outputs).push_back(std::move(arg));
      }
    } else if (field == 17 && wire_type == 0) {
      if (!reader.ReadVarint(&v)) return Malformed("OpDef");
      spec.is_stateful = v != 0;
    } else if (!reader.Skip(wire_type)) {
      return Malformed("OpDef");
    }
  }
  return spec;
}

StatusOr<FunctionSpec> ParseFunctionDef(std::string_view bytes) {
  FunctionSpec fn;
  WireReader reader(bytes);
  int field, wire_type;
  while (!reader.done()) {
    if (!reader.ReadTag(&field, &wire_type)) return Malformed("FunctionDef");
    std::string_view s;
    if (wire_type != 2 || (field != 1 && field != 3 && field != 4 && field != 5 && field != 6)) {
      if (!reader.Skip(wire_type)) return Malformed("FunctionDef");
      continue;
    }
    if (!reader.ReadBytes(&s)) return Malformed("FunctionDef");
    if (field == 1) {
      TFD_ASSIGN_OR_RETURN(fn.signature, ParseOpDef(s));
    } else if (field == 3) {
      NodeSpec node;
      if (!ParseNode(s, &node)) return Malformed("FunctionDef node");
      fn.nodes.push_back(std::move(node));
    } else {
      std::string key, value;
      if (!ReadEntry(s, &key, &value)) return Malformed("FunctionDef");
      (field == 4 ? fn.ret : field == 5 ? fn.attrs : fn.control_ret)
          .emplace_back(std::move(key), std::move(value));
    }
  }
  return fn;
}

std::string EncodeNameAttrList(const RawAttrs& attrs) {
  WireWriter list;
  for (const auto& [name, value] : attrs) {
    WireWriter entry;
    entry.Bytes(1, name);
    entry.Bytes(2, value);
    list.Bytes(2, entry.str());
  }
  return list.Take();
}

AttrMap DecodeAttrs(const RawAttrs& attrs) {
  StatusOr<AttrMap> map = AttrMap::Parse(EncodeNameAttrList(attrs));
  return map.ok() ? std::move(map).value() : AttrMap();
}

const std::string* FindRawAttr(const RawAttrs& attrs, const std::string& name) {
  for (const auto& [key, value] : attrs) {
    if (key == name) return &value;
  }
  return nullptr;
}

namespace {

// The name of a serialized NameAttrList (name = 1).
std::optional<std::string> NameOfNameAttrList(std::string_view bytes) {
  WireReader func(bytes);
  int f, w;
  while (!func.done()) {
    std::string_view name;
    if (!func.ReadTag(&f, &w)) return std::nullopt;
    if (f == 1 && w == 2) {
      if (!func.ReadBytes(&name)) return std::nullopt;
      return std::string(name);
    }
    if (!func.Skip(w)) return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> FunctionNameOf(std::string_view attr_value) {
  WireReader reader(attr_value);
  int field, wire_type;
  while (!reader.done()) {
    if (!reader.ReadTag(&field, &wire_type)) return std::nullopt;
    std::string_view s;
    if (field == 10 && wire_type == 2) {  // AttrValue.func: NameAttrList
      if (!reader.ReadBytes(&s)) return std::nullopt;
      return NameOfNameAttrList(s);
    } else if (!reader.Skip(wire_type)) {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

std::optional<std::vector<std::string>> FunctionNamesOf(std::string_view attr_value) {
  WireReader reader(attr_value);
  int field, wire_type;
  std::vector<std::string> names;
  while (!reader.done()) {
    if (!reader.ReadTag(&field, &wire_type)) return std::nullopt;
    std::string_view s;
    if (field != 1 || wire_type != 2) {  // AttrValue.list: ListValue
      if (!reader.Skip(wire_type)) return std::nullopt;
      continue;
    }
    if (!reader.ReadBytes(&s)) return std::nullopt;
    WireReader list(s);
    int f, w;
    while (!list.done()) {
      if (!list.ReadTag(&f, &w)) return std::nullopt;
      std::string_view func;
      if (f == 9 && w == 2) {  // ListValue.func: repeated NameAttrList
        if (!list.ReadBytes(&func)) return std::nullopt;
        std::optional<std::string> name = NameOfNameAttrList(func);
        if (!name) return std::nullopt;
        names.push_back(*std::move(name));
      } else if (!list.Skip(w)) {
        return std::nullopt;
      }
    }
  }
  return names;
}

std::string FunctionAttr(const std::string& name) {
  WireWriter func;
  func.Bytes(1, name);
  WireWriter value;
  value.Bytes(10, func.str());
  return value.Take();
}

std::string FunctionListAttr(const std::vector<std::string>& names) {
  WireWriter list;
  for (const std::string& name : names) {
    WireWriter func;
    func.Bytes(1, name);
    list.Bytes(9, func.str());
  }
  WireWriter value;
  value.Bytes(1, list.str());
  return value.Take();
}

std::string TypeListAttr(const std::vector<int>& types) {
  WireWriter list;
  for (int t : types) list.Varint(6, static_cast<uint64_t>(t));
  WireWriter value;
  value.Bytes(1, list.str());
  return value.Take();
}

std::string BoolAttr(bool b) {
  WireWriter value;
  value.Varint(5, b ? 1 : 0);
  return value.Take();
}

}  // namespace tf_dtensor
