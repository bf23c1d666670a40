// The main of every C++ test executable: runs the registered tests, optionally filtered.
//   core_layout_test                  every test
//   core_layout_test 'Layout.Short*'  tests whose "Suite.Name" matches a pattern
//   core_layout_test --list           the names
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "tests/cc/testing.h"

namespace tf_dtensor {
namespace testing {
namespace {

bool g_failed = false;

// '*' matches any run of characters; everything else matches itself.
bool Matches(const char* pattern, const char* text) {
  if (*pattern == '\0') return *text == '\0';
  if (*pattern == '*') return Matches(pattern + 1, text) || (*text && Matches(pattern, text + 1));
  return *pattern == *text && Matches(pattern + 1, text + 1);
}

}  // namespace

std::vector<TestCase>& Registry() {
  static auto* tests = new std::vector<TestCase>();
  return *tests;
}

std::vector<std::string>& Traces() {
  static auto* traces = new std::vector<std::string>();
  return *traces;
}

bool RegisterTest(std::string name, std::function<void()> body) {
  Registry().push_back({std::move(name), std::move(body)});
  return true;
}

void Fail(const char* file, int line, const std::string& message) {
  g_failed = true;
  std::cout << file << ":" << line << ": Failure\n  " << message << "\n";
  for (auto it = Traces().rbegin(); it != Traces().rend(); ++it) {
    std::cout << "  while: " << *it << "\n";
  }
}

std::string CodeName(Code code) {
  switch (code) {
    case Code::kOk: return "OK";
    case Code::kCancelled: return "CANCELLED";
    case Code::kUnknown: return "UNKNOWN";
    case Code::kInvalidArgument: return "INVALID_ARGUMENT";
    case Code::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case Code::kNotFound: return "NOT_FOUND";
    case Code::kAlreadyExists: return "ALREADY_EXISTS";
    case Code::kFailedPrecondition: return "FAILED_PRECONDITION";
    case Code::kOutOfRange: return "OUT_OF_RANGE";
    case Code::kUnimplemented: return "UNIMPLEMENTED";
    case Code::kInternal: return "INTERNAL";
  }
  return "CODE(" + std::to_string(static_cast<int>(code)) + ")";
}

void ExpectError(const char* file, int line, const char* expression, const Status& status,
                 Code code, const std::vector<std::string>& parts) {
  std::string problem;
  if (status.ok()) {
    problem = "it succeeded";
  } else if (status.code() != code) {
    problem = "its code is " + CodeName(status.code());
  } else {
    for (const std::string& part : parts) {
      if (status.message().find(part) == std::string::npos) {
        problem = "its message lacks " + Print(part);
        break;
      }
    }
  }
  if (problem.empty()) return;
  Fail(file, line,
       std::string("Expected ") + expression + " to fail with " + CodeName(code) +
           " and a message containing " + Print(parts) + ", but " + problem + "\n    got: " +
           Print(status));
}

Mesh MakeMesh(std::vector<MeshDim> dims, const std::string& type, int first_device) {
  int64_t size = 1;
  for (const MeshDim& d : dims) size *= d.size;
  std::vector<int64_t> ids;
  std::vector<std::string> devices;
  for (int64_t i = 0; i < size; ++i) {
    ids.push_back(i);
    devices.push_back("/job:localhost/replica:0/task:0/device:" + type + ":" +
                      std::to_string(first_device + i));
  }
  StatusOr<Mesh> mesh = Mesh::Create(std::move(dims), ids, ids, devices);
  if (!mesh.ok()) {
    std::cout << "MakeMesh: " << Print(mesh.status()) << std::endl;
    std::abort();
  }
  return *mesh;
}

Layout MakeLayout(const std::string& spec, const Mesh& mesh) {
  std::vector<std::string> names;
  if (spec.size() < 2 || spec.front() != '[' || spec.back() != ']') {
    std::cout << "MakeLayout: expected a spec such as [x,*]; got " << spec << std::endl;
    std::abort();
  }
  const std::string inner = spec.substr(1, spec.size() - 2);
  size_t start = 0;
  while (!inner.empty() && start <= inner.size()) {
    size_t end = inner.find(',', start);
    if (end == std::string::npos) end = inner.size();
    std::string name = inner.substr(start, end - start);
    names.push_back(name == "*" ? std::string(kUnsharded) : name);
    start = end + 1;
  }
  StatusOr<Layout> layout = Layout::Create(names, mesh);
  if (!layout.ok()) {
    std::cout << "MakeLayout(" << spec << "): " << Print(layout.status()) << std::endl;
    std::abort();
  }
  return *layout;
}

void ExpectLines(const char* file, int line, const std::vector<std::string>& actual,
                 const std::vector<std::string>& expected, const char* expression) {
  if (actual == expected) return;
  std::string text = std::string("Lines of ") + expression + " differ";
  for (size_t i = 0; i < std::max(actual.size(), expected.size()); ++i) {
    const std::string a = i < actual.size() ? actual[i] : "<none>";
    const std::string e = i < expected.size() ? expected[i] : "<none>";
    if (a != e) {
      text += " first at line " + std::to_string(i) + "\n    actual:   " + a +
              "\n    expected: " + e;
      break;
    }
  }
  text += "\n  actual (" + std::to_string(actual.size()) + " lines):";
  for (const std::string& a : actual) text += "\n    " + a;
  text += "\n  expected (" + std::to_string(expected.size()) + " lines):";
  for (const std::string& e : expected) text += "\n    " + e;
  Fail(file, line, text);
}

}  // namespace testing
}  // namespace tf_dtensor

int main(int argc, char** argv) {
  using tf_dtensor::testing::Registry;
  std::vector<const char*> patterns;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--list") == 0) {
      for (const auto& test : Registry()) std::cout << test.name << "\n";
      return 0;
    }
    patterns.push_back(argv[i]);
  }
  int run = 0;
  std::vector<std::string> failed;
  for (const auto& test : Registry()) {
    bool selected = patterns.empty();
    for (const char* pattern : patterns) {
      selected = selected || tf_dtensor::testing::Matches(pattern, test.name.c_str());
    }
    if (!selected) continue;
    ++run;
    std::cout << "[ RUN  ] " << test.name << std::endl;
    tf_dtensor::testing::g_failed = false;
    test.body();
    if (tf_dtensor::testing::g_failed) failed.push_back(test.name);
    std::cout << (tf_dtensor::testing::g_failed ? "[ FAIL ] " : "[  OK  ] ") << test.name
              << std::endl;
  }
  std::cout << run << " tests run, " << failed.size() << " failed.\n";
  for (const std::string& name : failed) std::cout << "  FAILED " << name << "\n";
  if (run == 0) {
    std::cout << "No test matches the given patterns.\n";
    return 1;
  }
  return failed.empty() ? 0 : 1;
}
