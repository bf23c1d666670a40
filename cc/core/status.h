// A small status type for tf_dtensor's C++ core.
//
// The core (Mesh, Layout, rules) must build and run without a TensorFlow runtime, and
// absl's Status is not exported from the TensorFlow wheel, so the core carries its own
// status with the same code space as TF_Code. Each layer adds context with
// WithContext(); the binding layer maps codes to Python exceptions in one table.
#ifndef TF_DTENSOR_CC_CORE_STATUS_H_
#define TF_DTENSOR_CC_CORE_STATUS_H_

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace tf_dtensor {

// Same numbering as TF_Code / absl::StatusCode.
enum class Code {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kFailedPrecondition = 9,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
};

class Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string message) {
  return Status(Code::kInvalidArgument, std::move(message));
}
inline Status Unimplemented(std::string message) {
  return Status(Code::kUnimplemented, std::move(message));
}
inline Status Internal(std::string message) { return Status(Code::kInternal, std::move(message)); }
inline Status FailedPrecondition(std::string message) {
  return Status(Code::kFailedPrecondition, std::move(message));
}
inline Status DeadlineExceeded(std::string message) {
  return Status(Code::kDeadlineExceeded, std::move(message));
}

// Prefixes `context` to a failed status: "expanding MatMul: <message>".
inline Status WithContext(const Status& status, const std::string& context) {
  if (status.ok()) return status;
  return Status(status.code(), context + ": " + status.message());
}

template <typename T>
class StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit like absl::StatusOr
  StatusOr(Status status) : status_(std::move(status)) {}  // NOLINT
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace tf_dtensor

#define TFD_CONCAT_INNER(a, b) a##b
#define TFD_CONCAT(a, b) TFD_CONCAT_INNER(a, b)

// Returns early with the status if it failed.
#define TFD_RETURN_IF_ERROR(expr)                   \
  do {                                              \
    ::tf_dtensor::Status tfd_status_ = (expr);      \
    if (!tfd_status_.ok()) return tfd_status_;      \
  } while (0)

#define TFD_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

// `TFD_ASSIGN_OR_RETURN(auto x, Foo());` unwraps a StatusOr or returns its status.
#define TFD_ASSIGN_OR_RETURN(lhs, expr) \
  TFD_ASSIGN_OR_RETURN_IMPL(TFD_CONCAT(tfd_statusor_, __LINE__), lhs, expr)

#endif  // TF_DTENSOR_CC_CORE_STATUS_H_
