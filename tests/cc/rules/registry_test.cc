// The rule registry: lookups, and duplicate registrations refused loudly.
#include "cc/rules/registry.h"

#include "tests/cc/testing.h"

namespace tf_dtensor {
namespace {

TEST(RuleRegistry, RegisteringAnOpTwiceIsAnErrorNamingTheOp) {
  RuleRegistry registry;
  std::shared_ptr<const Rule> first = Pointwise();
  EXPECT_OK(registry.Register("Foo", first));
  EXPECT_ERROR(registry.Register("Foo", Replicated()), kAlreadyExists,
               {"'Foo'", "registered twice"});
  EXPECT_TRUE(registry.Find("Foo") == first.get());  // the first rule stays
  EXPECT_TRUE(registry.Find("Bar") == nullptr);
  EXPECT_EQ(registry.OpNames(), std::vector<std::string>{"Foo"});
}

TEST(RuleRegistry, RegisterAllKeepsEveryRefusal) {
  RuleRegistry registry;
  registry.RegisterAll({{"A", Pointwise()}, {"B", Pointwise()}});
  EXPECT_TRUE(registry.registration_errors().empty());
  registry.RegisterAll({{"C", Pointwise()}, {"A", Replicated()}, {"C", Replicated()}});
  ASSERT_EQ(registry.registration_errors().size(), 2);
  EXPECT_ERROR(registry.registration_errors()[0], kAlreadyExists, {"'A'", "registered twice"});
  EXPECT_ERROR(registry.registration_errors()[1], kAlreadyExists, {"'C'", "registered twice"});
  EXPECT_EQ(registry.OpNames(), (std::vector<std::string>{"A", "B", "C"}));
}

// Every family's block registered without a clash (else importing tf_dtensor fails).
TEST(RuleRegistry, GlobalRegistryHasNoDuplicates) {
  const RuleRegistry& registry = RuleRegistry::Global();
  EXPECT_EQ(registry.registration_errors().size(), 0);
  for (const Status& error : registry.registration_errors()) EXPECT_OK(error);
  for (const char* op : {"MatMul", "AddV2", "Sum", "ConcatV2", "Transpose"}) {
    SCOPED_TRACE(op);
    EXPECT_TRUE(registry.Find(op) != nullptr);
  }
}

}  // namespace
}  // namespace tf_dtensor
