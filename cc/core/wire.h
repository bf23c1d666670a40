// Protobuf wire format, read and written by hand.
//
// The C API hands attributes and function definitions over only as serialized protos;
// including TensorFlow's generated protobuf headers would tie every translation unit to
// its internal protobuf build. These few fields are all tf_dtensor needs.
#ifndef TF_DTENSOR_CC_CORE_WIRE_H_
#define TF_DTENSOR_CC_CORE_WIRE_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace tf_dtensor {

class WireReader {
 public:
  explicit WireReader(std::string_view bytes) : data_(bytes) {}
  bool done() const { return pos_ >= data_.size(); }

  bool ReadVarint(uint64_t* value) {
    *value = 0;
    for (int shift = 0; shift < 64 && pos_ < data_.size(); shift += 7) {
      uint8_t byte = static_cast<uint8_t>(data_[pos_++]);
      *value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return true;
    }
    return false;
  }
  bool ReadTag(int* field, int* wire_type) {
    uint64_t tag;
    if (!ReadVarint(&tag)) return false;
    *field = static_cast<int>(tag >> 3);
    *wire_type = static_cast<int>(tag & 7);
    return true;
  }
  bool ReadBytes(std::string_view* out) {
    uint64_t length;
    if (!ReadVarint(&length) || pos_ + length > data_.size()) return false;
    *out = data_.substr(pos_, length);
    pos_ += length;
    return true;
  }
  bool ReadFixed32(uint32_t* out) {
    if (pos_ + 4 > data_.size()) return false;
    std::memcpy(out, data_.data() + pos_, 4);
    pos_ += 4;
    return true;
  }
  bool Skip(int wire_type) {
    uint64_t ignored;
    std::string_view bytes;
    uint32_t fixed;
    switch (wire_type) {
      case 0: return ReadVarint(&ignored);
      case 1: pos_ += 8; return pos_ <= data_.size();
      case 2: return ReadBytes(&bytes);
      case 5: return ReadFixed32(&fixed);
      default: return false;
    }
  }

 private:
  std::string_view data_;
  size_t pos_ = 0;
};

// Appends fields to a serialized message.
class WireWriter {
 public:
  void Varint(int field, uint64_t value) {
    Tag(field, 0);
    Raw(value);
  }
  void Bytes(int field, std::string_view bytes) {
    Tag(field, 2);
    Raw(bytes.size());
    out_.append(bytes.data(), bytes.size());
  }
  const std::string& str() const { return out_; }
  std::string Take() { return std::move(out_); }

 private:
  void Tag(int field, int wire_type) { Raw((static_cast<uint64_t>(field) << 3) | wire_type); }
  void Raw(uint64_t value) {
    while (value >= 0x80) {
      out_.push_back(static_cast<char>((value & 0x7f) | 0x80));
      value >>= 7;
    }
    out_.push_back(static_cast<char>(value));
  }
  std::string out_;
};

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_CORE_WIRE_H_
