// TopKV2 and InTopKV2: batch-parallel over the leading axes, the ranked axis gathered.
#include "tests/cc/rules/rule_testing.h"

namespace tf_dtensor {
namespace {

using testing::CheckRuleTable;
using testing::H;
using testing::HScalar;
using testing::MakeMesh;
using testing::T;

TEST(TopkRules, Plans) {
  for (const char* type : {"CPU", "GPU"}) {
    SCOPED_TRACE(type);
    CheckRuleTable(MakeMesh({{"x", 2}, {"y", 2}}, type),
                   {
                       {"TopKV2", {T("[x,y]", {4, 6}), HScalar(3)},
                        "[x,*] host -> [x,*] [x,*]",
                        {"all-gather axis 1 [x,y] -> [x,*]",
                         "local TopKV2 [x,*] host [] -> [x,*] [x,*]"}},
                       {"TopKV2", {T("[*,x,y]", {2, 4, 6}), HScalar(2)},
                        "[*,x,*] host -> [*,x,*] [*,x,*]",
                        {"all-gather axis 2 [*,x,y] -> [*,x,*]",
                         "local TopKV2 [*,x,*] host [] -> [*,x,*] [*,x,*]"}},
                       {"InTopKV2", {T("[x,y]", {4, 6}), T("[*]", {4}), HScalar(2)},
                        "[x,*] [x] host -> [x]",
                        {"all-gather axis 1 [x,y] -> [x,*]", "slice axis 0 over x [*] -> [x]",
                         "local InTopKV2 [x,*] [x] host [] -> [x]"}},
                       {"TopKV2", {T("[]", {}), HScalar(1)}, "error", {"rank 1 or more"}},
                   });
  }
}

}  // namespace
}  // namespace tf_dtensor
