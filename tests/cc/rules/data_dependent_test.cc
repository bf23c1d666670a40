// Where and Unique: the input is gathered, every device computes the whole result.
#include "tests/cc/rules/rule_testing.h"

namespace tf_dtensor {
namespace {

using testing::CheckRuleTable;
using testing::H;
using testing::MakeMesh;
using testing::T;

TEST(DataDependentRules, Plans) {
  for (const char* type : {"CPU", "GPU"}) {
    SCOPED_TRACE(type);
    CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}, type),
                   {
                       {"Where", {T("[x,y]", {5, 6})},
                        "[*,*] -> [*,*]",
                        {"all-gather axis 0 [x,y] -> [*,y]", "all-gather axis 1 [*,y] -> [*,*]",
                         "local Where [*,*] -> [*,*]"}},
                       {"Where", {T("[*]", {7})}, "[*] -> [*,*]", {"local Where [*] -> [*,*]"}},
                       {"Unique", {T("[x]", {8})},
                        "[*] -> [*] [*]",
                        {"all-gather axis 0 [x] -> [*]", "local Unique [*] -> [*] [*]"}},
                       {"UniqueWithCounts", {T("[y]", {8})},
                        "[*] -> [*] [*] [*]",
                        {"all-gather axis 0 [y] -> [*]",
                         "local UniqueWithCounts [*] -> [*] [*] [*]"}},
                       {"UniqueV2", {T("[x,y]", {4, 2}), H({0})},
                        "[*,*] host -> [*,*] [*]",
                        {"all-gather axis 0 [x,y] -> [*,y]", "all-gather axis 1 [*,y] -> [*,*]",
                         "local UniqueV2 [*,*] host [1] -> [*,*] [*]"}},
                       {"Unique", {T("[]", {})}, "error", {"rank 1 or more"}},
                   });
  }
}

}  // namespace
}  // namespace tf_dtensor
