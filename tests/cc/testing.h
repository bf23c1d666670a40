// A small test framework for tf_dtensor's C++ unit tests (no downloads, no gtest).
//
//   TEST(Layout, ShortStringRoundTrips) {
//     ASSERT_OK_AND_ASSIGN(Layout layout, Layout::FromString(text));
//     EXPECT_EQ(layout.ShortString(), "[x,*] @ mesh(x=2)");
//   }
//
// EXPECT_* records a failure and goes on; ASSERT_* also returns from the test. Failures
// print both sides. Each *_test.cc links testing_main.cc, whose main runs every test (or
// those whose "Suite.Name" matches a pattern given on the command line, '*' a wildcard;
// --list prints the names) and exits nonzero when one failed.
#ifndef TF_DTENSOR_TESTS_CC_TESTING_H_
#define TF_DTENSOR_TESTS_CC_TESTING_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cc/core/layout.h"
#include "cc/core/mesh.h"
#include "cc/core/status.h"

namespace tf_dtensor {
namespace testing {

struct TestCase {
  std::string name;  // "Suite.Name"
  std::function<void()> body;
};

std::vector<TestCase>& Registry();
bool RegisterTest(std::string name, std::function<void()> body);
// Marks the running test failed and prints `message` with its source location.
void Fail(const char* file, int line, const std::string& message);
// Context lines (SCOPED_TRACE) printed with each failure, e.g. the row of a table.
std::vector<std::string>& Traces();

struct ScopedTrace {
  explicit ScopedTrace(std::string text) { Traces().push_back(std::move(text)); }
  ~ScopedTrace() { Traces().pop_back(); }
};

// Printing any value a test compares: strings quoted, vectors as [a, b], Mesh/Layout/
// Status in their short forms, optional as nullopt or its value.
template <typename T, typename = void>
struct IsStreamable : std::false_type {};
template <typename T>
struct IsStreamable<T, std::void_t<decltype(std::declval<std::ostream&>() << std::declval<T>())>>
    : std::true_type {};

std::string CodeName(Code code);

template <typename T>
std::string Print(const T& value);

inline std::string PrintOne(const std::string& value) { return "\"" + value + "\""; }
inline std::string PrintOne(const char* value) { return PrintOne(std::string(value)); }
inline std::string PrintOne(bool value) { return value ? "true" : "false"; }
inline std::string PrintOne(const Mesh& mesh) { return mesh.ShortString(); }
inline std::string PrintOne(const Layout& layout) { return layout.ShortString(); }
inline std::string PrintOne(const DimSpec& spec) {
  return spec.sharded() ? "sharded(" + std::to_string(spec.mesh_dim) + ")" : "replicated";
}
inline std::string PrintOne(const Status& status) {
  return status.ok() ? "OK" : CodeName(status.code()) + ": " + status.message();
}
template <typename T>
std::string PrintOne(const std::vector<T>& values) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i) text += (i ? ", " : "") + Print(values[i]);
  return text + "]";
}
template <typename T>
std::string PrintOne(const std::optional<T>& value) {
  return value ? Print(*value) : "nullopt";
}
template <typename A, typename B>
std::string PrintOne(const std::pair<A, B>& value) {
  return "(" + Print(value.first) + ", " + Print(value.second) + ")";
}
template <typename T>
std::string PrintOne(const T& value) {
  if constexpr (IsStreamable<T>::value) {
    std::ostringstream out;
    out << value;
    return out.str();
  } else {
    return "<unprintable>";
  }
}
template <typename T>
std::string Print(const T& value) {
  return PrintOne(value);
}

// A mesh over `type` devices of this host, numbered from 0 ("GPU" for a GPU-typed mesh;
// nothing checks that they exist): MakeMesh({{"x", 2}, {"y", 2}}, "GPU").
// Aborts on an invalid mesh, a mistake in the test itself.
Mesh MakeMesh(std::vector<MeshDim> dims, const std::string& type = "CPU", int first_device = 0);
// A layout from its spec string on `mesh`: "[x,*]", "[*,y,x]", "[]". Aborts when invalid.
Layout MakeLayout(const std::string& spec, const Mesh& mesh);

// A golden list of strings compared line by line, so a failure shows the first line
// that differs and both lists in full.
void ExpectLines(const char* file, int line, const std::vector<std::string>& actual,
                 const std::vector<std::string>& expected, const char* expression);

}  // namespace testing
}  // namespace tf_dtensor

#define TFD_TEST_NAME(suite, name) tfd_test_##suite##_##name

#define TEST(suite, name)                                                             \
  static void TFD_TEST_NAME(suite, name)();                                           \
  static const bool TFD_CONCAT(tfd_test_registered_##suite##_##name, __LINE__) =      \
      ::tf_dtensor::testing::RegisterTest(#suite "." #name, TFD_TEST_NAME(suite, name)); \
  static void TFD_TEST_NAME(suite, name)()

// Both sides are evaluated in one full expression, so `*StatusOrReturningCall()` is safe.
#define TFD_EXPECT_BINARY(a, b, op, on_failure)                                        \
  do {                                                                                 \
    if (!::tf_dtensor::testing::Compare(                                               \
            (a), (b), [](const auto& x, const auto& y) { return x op y; },             \
            "Expected " #a " " #op " " #b, __FILE__, __LINE__)) {                      \
      on_failure;                                                                      \
    }                                                                                  \
  } while (0)

#define EXPECT_EQ(a, b) TFD_EXPECT_BINARY(a, b, ==, (void)0)
#define EXPECT_NE(a, b) TFD_EXPECT_BINARY(a, b, !=, (void)0)
#define EXPECT_LT(a, b) TFD_EXPECT_BINARY(a, b, <, (void)0)
#define ASSERT_EQ(a, b) TFD_EXPECT_BINARY(a, b, ==, return)

#define TFD_EXPECT_BOOL(cond, want, on_failure)                                        \
  do {                                                                                 \
    if (static_cast<bool>(cond) != (want)) {                                           \
      ::tf_dtensor::testing::Fail(__FILE__, __LINE__,                                  \
                                  "Expected " #cond " to be " #want);                  \
      on_failure;                                                                      \
    }                                                                                  \
  } while (0)

#define EXPECT_TRUE(cond) TFD_EXPECT_BOOL(cond, true, (void)0)
#define EXPECT_FALSE(cond) TFD_EXPECT_BOOL(cond, false, (void)0)
#define ASSERT_TRUE(cond) TFD_EXPECT_BOOL(cond, true, return)

// For a Status or a StatusOr.
#define TFD_STATUS_OF(expr) ::tf_dtensor::testing::StatusOf(expr)
#define TFD_EXPECT_OK(expr, on_failure)                                                \
  do {                                                                                 \
    const ::tf_dtensor::Status tfd_status_ = TFD_STATUS_OF(expr);                      \
    if (!tfd_status_.ok()) {                                                           \
      ::tf_dtensor::testing::Fail(__FILE__, __LINE__,                                  \
                                  "Expected " #expr " to be OK\n    got: " +           \
                                      ::tf_dtensor::testing::Print(tfd_status_));      \
      on_failure;                                                                      \
    }                                                                                  \
  } while (0)
#define EXPECT_OK(expr) TFD_EXPECT_OK(expr, (void)0)
#define ASSERT_OK(expr) TFD_EXPECT_OK(expr, return)

// `ASSERT_OK_AND_ASSIGN(Layout layout, Layout::FromString(text));`
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  ASSERT_OK_AND_ASSIGN_IMPL(TFD_CONCAT(tfd_statusor_, __LINE__), lhs, expr)
#define ASSERT_OK_AND_ASSIGN_IMPL(tmp, lhs, expr)                                      \
  auto tmp = (expr);                                                                   \
  if (!tmp.ok()) {                                                                     \
    ::tf_dtensor::testing::Fail(__FILE__, __LINE__,                                    \
                                "Expected " #expr " to be OK\n    got: " +             \
                                    ::tf_dtensor::testing::Print(tmp.status()));       \
    return;                                                                            \
  }                                                                                    \
  lhs = std::move(tmp).value()

// Expects a failed status with `code` whose message contains each of `parts`:
//   EXPECT_ERROR(Mesh::Create(...), kInvalidArgument, {"`x`", "twice"});
#define EXPECT_ERROR(expr, code, ...)                                                  \
  ::tf_dtensor::testing::ExpectError(__FILE__, __LINE__, #expr, TFD_STATUS_OF(expr),   \
                                     ::tf_dtensor::Code::code, __VA_ARGS__)

#define EXPECT_LINES(actual, ...) \
  ::tf_dtensor::testing::ExpectLines(__FILE__, __LINE__, actual, __VA_ARGS__, #actual)

#define SCOPED_TRACE(text) \
  ::tf_dtensor::testing::ScopedTrace TFD_CONCAT(tfd_trace_, __LINE__)(text)

namespace tf_dtensor {
namespace testing {

template <typename A, typename B, typename Op>
bool Compare(const A& a, const B& b, Op op, const char* what, const char* file, int line) {
  if (op(a, b)) return true;
  Fail(file, line, std::string(what) + "\n    left:  " + Print(a) + "\n    right: " + Print(b));
  return false;
}

inline Status StatusOf(const Status& status) { return status; }
template <typename T>
Status StatusOf(const StatusOr<T>& value) {
  return value.status();
}

void ExpectError(const char* file, int line, const char* expression, const Status& status,
                 Code code, const std::vector<std::string>& parts);

}  // namespace testing
}  // namespace tf_dtensor

#endif  // TF_DTENSOR_TESTS_CC_TESTING_H_
