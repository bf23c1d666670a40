// The rule registry: lookups, and duplicate registrations refused loudly.
#include "cc/rules/registry.h"

#include "tests/cc/testing.h"

namespace tf_dtensor {
namespace {

TEST(RuleRegistry, RegisteringAnOpTwiceIsAnErrorNamingTheOp) {
  RuleRegistry registry;
  std::shared_ptr<const Rule> first = Pointwise();
  EXPECT_OK(registry.Register({"Foo", first, Traits().Linear(Linearity::kEachInput)}));
  EXPECT_ERROR(registry.Register({"Foo", Replicated()}), kAlreadyExists,
               {"'Foo'", "registered twice"});
  // The first rule stays, with its traits.
  ASSERT_TRUE(registry.Find("Foo") != nullptr);
  EXPECT_TRUE(registry.Find("Foo")->rule == first);
  EXPECT_TRUE(registry.Find("Foo")->traits.linearity == Linearity::kEachInput);
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

// A registered op's traits are what its row says: linearity, the host arguments and what
// they hold (negative positions count from the end), and the flags.
TEST(RuleRegistry, TraitsAreTheRegistrationRows) {
  const RuleRegistry& registry = RuleRegistry::Global();
  auto traits = [&](const char* op) { return registry.Find(op)->traits.Describe(); };
  EXPECT_EQ(traits("MatMul"), "linear(one input)");
  EXPECT_EQ(traits("Relu"), "none");
  EXPECT_EQ(traits("Transpose"), "linear(structural), host inputs 1 (a permutation)");
  EXPECT_EQ(traits("Sum"), "linear(sum), host inputs 1 (an axis)");
  EXPECT_EQ(traits("ConcatV2"), "host inputs last (an axis)");
  EXPECT_EQ(traits("Fill"), "host inputs 0 (a shape), host inputs 1 (a value), reads the request");
  EXPECT_EQ(traits("Empty"), "host inputs 0 (a shape), reads the request");
  EXPECT_EQ(traits("TensorListReserve"),
            "host inputs 0 (a shape), host inputs 1 (a count), makes a mesh value");
  EXPECT_EQ(traits("TfDTensorRelayout"), "multi-dimension axes");
  EXPECT_EQ(traits("_EagerConst"), "host inputs 0..last (a value), python constant");

  const RuleTraits& concat = registry.Find("ConcatV2")->traits;
  EXPECT_TRUE(concat.IsHostInput(3, 4));  // ConcatV2(a, b, c, axis)
  EXPECT_TRUE(!concat.IsHostInput(2, 4));
  EXPECT_TRUE(concat.IsHostInput(2, 3));  // ConcatV2(a, b, axis)
  const RuleTraits& slice = registry.Find("StridedSlice")->traits;
  EXPECT_TRUE(!slice.IsHostInput(0, 4));
  EXPECT_TRUE(slice.HostInput(3, 4) == HostValue::kBounds);
  // Ops without a rule read every input whole.
  EXPECT_TRUE(FallbackRule(false).traits.IsHostInput(0, 2));
  EXPECT_TRUE(FallbackRule(true).traits.IsHostInput(1, 2));
}

}  // namespace
}  // namespace tf_dtensor
