// Reads the attributes of an eager op.
//
// The C API hands attributes over only as a serialized NameAttrList; including the
// generated protobuf headers would tie every translation unit to TensorFlow's internal
// protobuf build, so this decodes the few wire-format fields that rules need.
#ifndef TF_DTENSOR_CC_TF_ATTRS_H_
#define TF_DTENSOR_CC_TF_ATTRS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cc/core/status.h"

namespace tf_dtensor {

struct AttrValue {
  std::optional<std::string> s;
  std::optional<int64_t> i;
  std::optional<float> f;
  std::optional<bool> b;
  std::optional<int> type;  // TF_DataType
  // A shape attr: dims (-1 unknown); unknown_rank when the rank itself is unknown.
  std::optional<std::vector<int64_t>> shape;
  bool unknown_rank = false;
  std::vector<int64_t> list_i;
  std::vector<int> list_type;
  std::vector<std::string> list_s;
};

class AttrMap {
 public:
  AttrMap() = default;
  // Decodes a serialized NameAttrList.
  static StatusOr<AttrMap> Parse(std::string_view bytes);
  // Defers reading: `loader` returns the serialized attributes on first access (most
  // elementwise ops never look at theirs, and serializing costs on the per-op path).
  static AttrMap Lazy(std::function<std::string()> loader);

  void Set(const std::string& name, AttrValue value) { values_[name] = std::move(value); }
  bool Has(const std::string& name) const { return Find(name) != nullptr; }
  const AttrValue* Find(const std::string& name) const;
  bool GetBool(const std::string& name, bool fallback) const;
  int64_t GetInt(const std::string& name, int64_t fallback) const;
  std::optional<int> GetType(const std::string& name) const;
  std::vector<int64_t> GetIntList(const std::string& name) const;
  std::optional<std::string> GetString(const std::string& name) const;

  // Whether any attribute was read (a plan that read none holds for any attributes).
  bool used() const { return used_; }
  // The attributes as one string (read now if they were lazy), for keys: each attribute's
  // encoded entry, sorted by name. Equal bytes, equal attributes; TF serializes its
  // attribute map in no fixed order, so its own bytes differ for equal attributes (plans
  // keyed by them were missed on most repeats).
  const std::string& Bytes() const;

 private:
  void Load() const;
  mutable std::map<std::string, AttrValue> values_;
  mutable std::function<std::string()> loader_;
  mutable std::string bytes_;
  mutable bool used_ = false;
};

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_TF_ATTRS_H_
