#include "cc/tf/attrs.h"

#include <algorithm>
#include <cstring>

#include "cc/core/wire.h"

namespace tf_dtensor {
namespace {

Status Malformed() { return Internal("Cannot decode the attributes of an operation."); }

// Repeated scalar fields may be packed (wire type 2) or not (wire type 0).
template <typename T>
bool ReadRepeatedVarint(WireReader& reader, int wire_type, std::vector<T>* out) {
  uint64_t value;
  if (wire_type == 0) {
    if (!reader.ReadVarint(&value)) return false;
    out->push_back(static_cast<T>(value));
    return true;
  }
  std::string_view packed;
  if (!reader.ReadBytes(&packed)) return false;
  WireReader inner(packed);
  while (!inner.done()) {
    if (!inner.ReadVarint(&value)) return false;
    out->push_back(static_cast<T>(value));
  }
  return true;
}

Status ParseShape(std::string_view bytes, AttrValue* value) {
  WireReader reader(bytes);
  std::vector<int64_t> dims;
  int field, wire_type;
  while (!reader.done()) {
    if (!reader.ReadTag(&field, &wire_type)) return Malformed();
    if (field == 2 && wire_type == 2) {  // Dim
      std::string_view dim_bytes;
      if (!reader.ReadBytes(&dim_bytes)) return Malformed();
      WireReader dim_reader(dim_bytes);
      int64_t size = 0;
      int f, w;
      while (!dim_reader.done()) {
        if (!dim_reader.ReadTag(&f, &w)) return Malformed();
        uint64_t v;
        if (f == 1 && w == 0) {
          if (!dim_reader.ReadVarint(&v)) return Malformed();
          size = static_cast<int64_t>(v);
        } else if (!dim_reader.Skip(w)) {
          return Malformed();
        }
      }
      dims.push_back(size);
    } else if (field == 3 && wire_type == 0) {
      uint64_t v;
      if (!reader.ReadVarint(&v)) return Malformed();
      value->unknown_rank = v != 0;
    } else if (!reader.Skip(wire_type)) {
      return Malformed();
    }
  }
  value->shape = std::move(dims);
  return Status::Ok();
}

Status ParseList(std::string_view bytes, AttrValue* value) {
  WireReader reader(bytes);
  int field, wire_type;
  while (!reader.done()) {
    if (!reader.ReadTag(&field, &wire_type)) return Malformed();
    bool ok = true;
    if (field == 2 && wire_type == 2) {
      std::string_view s;
      ok = reader.ReadBytes(&s);
      value->list_s.emplace_back(s);
    } else if (field == 3) {
      ok = ReadRepeatedVarint(reader, wire_type, &value->list_i);
    } else if (field == 6) {
      ok = ReadRepeatedVarint(reader, wire_type, &value->list_type);
    } else {
      ok = reader.Skip(wire_type);
    }
    if (!ok) return Malformed();
  }
  return Status::Ok();
}

Status ParseAttrValue(std::string_view bytes, AttrValue* value) {
  WireReader reader(bytes);
  int field, wire_type;
  while (!reader.done()) {
    if (!reader.ReadTag(&field, &wire_type)) return Malformed();
    uint64_t v;
    std::string_view sub;
    uint32_t fixed;
    switch (field) {
      case 1:
        if (!reader.ReadBytes(&sub)) return Malformed();
        TFD_RETURN_IF_ERROR(ParseList(sub, value));
        break;
      case 2:
        if (!reader.ReadBytes(&sub)) return Malformed();
        value->s = std::string(sub);
        break;
      case 3:
        if (!reader.ReadVarint(&v)) return Malformed();
        value->i = static_cast<int64_t>(v);
        break;
      case 4:
        if (!reader.ReadFixed32(&fixed)) return Malformed();
        value->f = 0;
        std::memcpy(&*value->f, &fixed, 4);
        break;
      case 5:
        if (!reader.ReadVarint(&v)) return Malformed();
        value->b = v != 0;
        break;
      case 6:
        if (!reader.ReadVarint(&v)) return Malformed();
        value->type = static_cast<int>(v);
        break;
      case 7:
        if (!reader.ReadBytes(&sub)) return Malformed();
        TFD_RETURN_IF_ERROR(ParseShape(sub, value));
        break;
      default:
        if (!reader.Skip(wire_type)) return Malformed();
    }
  }
  return Status::Ok();
}

}  // namespace

StatusOr<AttrMap> AttrMap::Parse(std::string_view bytes) {
  AttrMap map;
  // Each attribute's entry as encoded, by name: the canonical bytes (see Bytes).
  std::vector<std::pair<std::string, std::string_view>> entries;
  WireReader reader(bytes);
  int field, wire_type;
  while (!reader.done()) {
    if (!reader.ReadTag(&field, &wire_type)) return Malformed();
    if (field != 2 || wire_type != 2) {
      if (!reader.Skip(wire_type)) return Malformed();
      continue;
    }
    std::string_view entry;
    if (!reader.ReadBytes(&entry)) return Malformed();
    WireReader entry_reader(entry);
    std::string key;
    AttrValue value;
    int f, w;
    while (!entry_reader.done()) {
      if (!entry_reader.ReadTag(&f, &w)) return Malformed();
      std::string_view sub;
      if (f == 1 && w == 2) {
        if (!entry_reader.ReadBytes(&sub)) return Malformed();
        key = std::string(sub);
      } else if (f == 2 && w == 2) {
        if (!entry_reader.ReadBytes(&sub)) return Malformed();
        TFD_RETURN_IF_ERROR(ParseAttrValue(sub, &value));
      } else if (!entry_reader.Skip(w)) {
        return Malformed();
      }
    }
    map.values_[key] = std::move(value);
    entries.emplace_back(std::move(key), entry);
  }
  std::sort(entries.begin(), entries.end());
  for (const auto& [key, entry] : entries) {
    map.bytes_ += std::to_string(entry.size());
    map.bytes_ += ':';
    map.bytes_ += entry;
  }
  return map;
}

AttrMap AttrMap::Lazy(std::function<std::string()> loader) {
  AttrMap map;
  map.loader_ = std::move(loader);
  return map;
}

void AttrMap::Load() const {
  std::function<std::string()> loader = std::move(loader_);
  loader_ = nullptr;
  bytes_ = loader();
  StatusOr<AttrMap> parsed = Parse(bytes_);
  // Undecodable attributes read as absent; rules then report what they miss.
  if (parsed.ok()) {
    values_ = std::move(parsed->values_);
    bytes_ = std::move(parsed->bytes_);
  }
}

const std::string& AttrMap::Bytes() const {
  if (loader_) Load();
  return bytes_;
}

const AttrValue* AttrMap::Find(const std::string& name) const {
  used_ = true;
  if (loader_) Load();
  auto it = values_.find(name);
  return it == values_.end() ? nullptr : &it->second;
}

bool AttrMap::GetBool(const std::string& name, bool fallback) const {
  const AttrValue* v = Find(name);
  return v && v->b ? *v->b : fallback;
}

int64_t AttrMap::GetInt(const std::string& name, int64_t fallback) const {
  const AttrValue* v = Find(name);
  return v && v->i ? *v->i : fallback;
}

std::optional<int> AttrMap::GetType(const std::string& name) const {
  const AttrValue* v = Find(name);
  if (!v || !v->type) return std::nullopt;
  return v->type;
}

std::vector<int64_t> AttrMap::GetIntList(const std::string& name) const {
  const AttrValue* v = Find(name);
  return v ? v->list_i : std::vector<int64_t>{};
}

std::optional<std::string> AttrMap::GetString(const std::string& name) const {
  const AttrValue* v = Find(name);
  if (!v) return std::nullopt;
  return v->s;
}

}  // namespace tf_dtensor
