// The one dispatch path (eager and tf.function): the policy for ops without a rule, host
// data joining the mesh, and the plan cache, recorded with RecordingBuilder.
#include "cc/rules/dispatch.h"

#include "cc/tf/attrs.h"
#include "cc/rules/plan.h"
#include "cc/rules/registry.h"
#include "cc/spmd/lowering.h"
#include "cc/spmd/recording_builder.h"
#include "tensorflow/c/tf_datatype.h"
#include "tests/cc/testing.h"

namespace tf_dtensor {
namespace {

using testing::MakeLayout;
using testing::MakeMesh;

struct Case {
  Case(const std::string& op, const Mesh& mesh) : ctx(op, &attrs, mesh) {}
  // An input: a DTensor of `spec`, or a host tensor when `spec` is empty.
  Case& In(const std::string& spec, std::vector<int64_t> shape) {
    InputInfo info;
    if (!spec.empty()) info.layout = MakeLayout(spec, ctx.mesh);
    info.shape = shape;
    info.dtype = TF_FLOAT;
    inputs.push_back(builder.AddInput(info.layout, std::move(shape), TF_FLOAT));
    ctx.inputs.push_back(std::move(info));
    return *this;
  }
  StatusOr<std::vector<ValueId>> Run(const DispatchOptions& options) {
    return Dispatch(RuleRegistry::Global().Find(ctx.op_name), ctx, inputs, builder, options);
  }
  AttrMap attrs;
  OpContext ctx;
  RecordingBuilder builder;
  std::vector<ValueId> inputs;
};

TEST(Dispatch, OpsWithoutARuleRunReplicatedAndStatefulOnesOnce) {
  Mesh gpu = MakeMesh({{"x", 2}}, "GPU");
  {
    Case op("NoSuchOpHasARule", gpu);
    op.In("[x]", {8});
    ASSERT_OK(op.Run({}).status());
    EXPECT_LINES(op.builder.steps(), {"all-gather axis 0 [x] -> [*]",
                                      "local NoSuchOpHasARule [*] -> replicated"});
  }
  {
    // A stateful op (a shuffle, a random draw) runs once, so replicas agree on GPUs too.
    Case op("RandomShuffle", gpu);
    op.In("[*]", {8});
    DispatchOptions options;
    options.stateful = true;
    ASSERT_OK(op.Run(options).status());
    EXPECT_LINES(op.builder.steps(), {"local RandomShuffle [*] -> replicated (once)"});
  }
  {
    Case op("NoSuchOpHasARule", gpu);
    op.In("[x]", {8});
    DispatchOptions options;
    options.policy.strict = true;
    EXPECT_ERROR(op.Run(options), kUnimplemented,
                 {"'NoSuchOpHasARule' has no tf_dtensor rule", "[x] @ mesh(x=2)", "strict mode"});
    EXPECT_LINES(op.builder.steps(), {});
  }
}

TEST(Dispatch, HostDataJoinsTheMeshAndErrorsNameTheNode) {
  Mesh mesh = MakeMesh({{"x", 2}});
  Case op("AddV2", mesh);
  op.In("[x]", {8}).In("", {8});
  ASSERT_OK(op.Run({}).status());
  ASSERT_TRUE(!op.builder.steps().empty());
  EXPECT_EQ(op.builder.steps().back(), "local AddV2 [x] [x] -> [x]");
  EXPECT_TRUE(op.ctx.inputs[1].from_host);

  Case bad("AddV2", mesh);
  bad.In("[x]", {8}).In("[x]", {3, 5});
  DispatchOptions options;
  options.where = " (node 'add' of tf.function 'f')";
  EXPECT_ERROR(bad.Run(options), kInvalidArgument, {"DTensor op 'AddV2'", "node 'add'"});
}

TEST(Dispatch, PlanCacheServesRepeatedOps) {
  Mesh mesh = MakeMesh({{"x", 2}});
  PlanCache cache;
  DispatchOptions options;
  options.cache = &cache;
  for (int i = 0; i < 3; ++i) {
    Case op("Relu", mesh);
    op.In("[x]", {8});
    ASSERT_OK(op.Run(options).status());
  }
  EXPECT_EQ(cache.size(), 1u);
  Case other("Relu", mesh);
  other.In("[*]", {8});
  ASSERT_OK(other.Run(options).status());
  EXPECT_EQ(cache.size(), 2u);
}

// Plans depend on the collective lowering (matmul's gather-or-reduce choice, a local-only
// run's leaders): a change of the lowering policy starts the cache over.
TEST(Dispatch, PlanCacheStartsOverWhenTheLoweringChanges) {
  Mesh mesh = MakeMesh({{"x", 2}});
  PlanCache cache;
  DispatchOptions options;
  options.cache = &cache;
  Case op("Relu", mesh);
  op.In("[x]", {8});
  ASSERT_OK(op.Run(options).status());
  EXPECT_EQ(cache.size(), 1u);
  ASSERT_OK(SetCollectiveLoweringPolicy("ops"));
  Case again("Relu", mesh);
  again.In("[x]", {8});
  ASSERT_OK(again.Run(options).status());
  ASSERT_OK(SetCollectiveLoweringPolicy("auto"));
  // The entry made under "auto" went; the one made under "ops" is the only one.
  EXPECT_EQ(cache.size(), 1u);
}

// The cache keys on the values of the host arguments the op's traits declare (a
// permutation here), and on nothing else an input happens to carry.
TEST(Dispatch, PlanCacheKeysOnDeclaredHostInputs) {
  Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}});
  const RegisteredRule* transpose = RuleRegistry::Global().Find("Transpose");
  const RegisteredRule* add = RuleRegistry::Global().Find("AddV2");
  ASSERT_TRUE(transpose != nullptr && add != nullptr);
  AttrMap attrs;
  auto context = [&](const char* op, std::vector<int64_t> value) {
    OpContext ctx(op, &attrs, mesh);
    InputInfo data;
    data.shape = {4, 8};
    data.layout = MakeLayout("[x,y]", mesh);
    InputInfo second;
    second.shape = {2};
    second.int_value = std::move(value);
    if (std::string(op) == "AddV2") {
      second.shape = {4, 8};
      second.layout = MakeLayout("[x,y]", mesh);
    }
    ctx.inputs = {data, second};
    return ctx;
  };
  PlanCache cache;
  OpContext swap = context("Transpose", {1, 0});
  StatusOr<Plan> plan = PlanOp(*transpose->rule, transpose->traits, swap);
  ASSERT_OK(plan.status());
  cache.Insert(*transpose, swap, std::make_shared<const Plan>(*plan));
  EXPECT_TRUE(cache.Find(*transpose, context("Transpose", {1, 0})) != nullptr);
  EXPECT_TRUE(cache.Find(*transpose, context("Transpose", {0, 1})) == nullptr);
  // A value on a data input is not part of the key: AddV2 declares no host inputs.
  OpContext sum = context("AddV2", {1});
  plan = PlanOp(*add->rule, add->traits, sum);
  ASSERT_OK(plan.status());
  cache.Insert(*add, sum, std::make_shared<const Plan>(*plan));
  EXPECT_TRUE(cache.Find(*add, context("AddV2", {2})) != nullptr);
  EXPECT_EQ(cache.size(), 2u);
}

// PrepareContext, the front half Dispatch and debug.explain share: host arguments get
// their values, host data joins the mesh replicated, an axis over several mesh dimensions
// is seen over its major one, and partial inputs keep results pending.
TEST(Dispatch, PrepareContextFollowsTheTraits) {
  Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}});
  AttrMap attrs;
  const RegisteredRule* sum = RuleRegistry::Global().Find("Sum");
  ASSERT_TRUE(sum != nullptr);
  OpContext ctx("Sum", &attrs, mesh);
  ctx.inputs.resize(2);
  ctx.inputs[0].shape = {8, 4};
  ctx.inputs[1].shape = {1};
  std::vector<int> asked;
  ASSERT_OK(PrepareContext(sum->traits, ctx, /*in_function=*/false, "",
                           [&](int i) -> std::optional<std::vector<int64_t>> {
                             asked.push_back(i);
                             return std::vector<int64_t>{0};
                           }));
  EXPECT_TRUE(asked == std::vector<int>{1});  // only the declared host input is read
  EXPECT_TRUE(ctx.inputs[1].int_value == std::vector<int64_t>{0});
  EXPECT_TRUE(!ctx.inputs[1].layout);
  EXPECT_TRUE(ctx.inputs[0].from_host);
  EXPECT_EQ(ctx.inputs[0].layout->SpecString(), "[*,*]");
  EXPECT_TRUE(!ctx.keep_partial);

  const RegisteredRule* relu = RuleRegistry::Global().Find("Relu");
  const RegisteredRule* identity = RuleRegistry::Global().Find("Identity");
  ASSERT_TRUE(relu != nullptr && identity != nullptr);
  const Layout both = MakeLayout("[x+y,*]", mesh);
  for (const RegisteredRule* rule : {relu, identity}) {
    OpContext op("Relu", &attrs, mesh);
    op.inputs.resize(1);
    op.inputs[0].shape = {8, 4};
    op.inputs[0].layout = both;
    ASSERT_OK(PrepareContext(rule->traits, op, /*in_function=*/true, "",
                             [](int) { return std::nullopt; }));
    // Identity takes multi-dimension axes as they are; Relu sees the major dimension.
    EXPECT_EQ(op.inputs[0].layout->SpecString(), rule == relu ? "[x,*]" : "[x+y,*]");
    EXPECT_TRUE(op.keep_partial);
  }
}

// A serialized NameAttrList holding `entries` (name, serialized AttrValue) in that order.
std::string NameAttrList(const std::vector<std::pair<std::string, std::string>>& entries) {
  auto field = [](int number, const std::string& bytes) {
    return std::string(1, static_cast<char>(number << 3 | 2)) +
           std::string(1, static_cast<char>(bytes.size())) + bytes;
  };
  std::string out = field(1, "MatMul");
  for (const auto& [name, value] : entries) out += field(2, field(1, name) + field(2, value));
  return out;
}

TEST(Dispatch, AttributeKeysDoNotDependOnTheirOrder) {
  // TF serializes an op's attribute map in no fixed order; plans keyed by the attributes
  // must be found again whatever order they come in.
  const std::string yes("\x28\x01", 2), no("\x28\x00", 2), f32("\x30\x01", 2);
  StatusOr<AttrMap> a = AttrMap::Parse(NameAttrList({{"transpose_a", yes}, {"T", f32}}));
  StatusOr<AttrMap> b = AttrMap::Parse(NameAttrList({{"T", f32}, {"transpose_a", yes}}));
  StatusOr<AttrMap> c = AttrMap::Parse(NameAttrList({{"T", f32}, {"transpose_a", no}}));
  ASSERT_OK(a.status());
  ASSERT_OK(b.status());
  ASSERT_OK(c.status());
  EXPECT_TRUE(a->GetBool("transpose_a", false));
  EXPECT_EQ(a->Bytes(), b->Bytes());
  EXPECT_NE(a->Bytes(), c->Bytes());
}

}  // namespace
}  // namespace tf_dtensor
