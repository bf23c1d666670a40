// The request solver: a layout asked of a value travels back through each rule's
// Backward to the ops that produce it.
#include "cc/propagation/propagate.h"

#include "cc/tf/attrs.h"
#include "cc/rules/registry.h"
#include "tensorflow/c/tf_datatype.h"
#include "tests/cc/testing.h"

namespace tf_dtensor {
namespace {

using testing::MakeLayout;
using testing::MakeMesh;

std::shared_ptr<OpContext> Context(const std::string& op, const AttrMap* attrs, const Mesh& mesh,
                                   std::vector<InputInfo> inputs) {
  auto ctx = std::make_shared<OpContext>(op, attrs, mesh);
  ctx->inputs = std::move(inputs);
  return ctx;
}

InputInfo Data(const Layout& layout, std::vector<int64_t> shape) {
  InputInfo info;
  info.layout = layout;
  info.shape = std::move(shape);
  info.dtype = TF_FLOAT;
  return info;
}

InputInfo HostInts(std::vector<int64_t> value) {
  InputInfo info;
  info.shape = {static_cast<int64_t>(value.size())};
  info.dtype = TF_INT32;
  info.int_value = std::move(value);
  return info;
}

TEST(Propagate, RequestTravelsBackThroughMatmulAndTranspose) {
  for (const char* type : {"CPU", "GPU"}) {
    SCOPED_TRACE(type);
    Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}}, type);
    const Layout rep = MakeLayout("[*,*]", mesh);
    AttrMap none;
    // t = transpose(w [8,4]) -> [4,8];  y = matmul(a [2,4], t) -> [2,8], asked [*,x].
    SolverNode transpose;
    transpose.rule = RuleRegistry::Global().Find("Transpose");
    transpose.ctx = Context("Transpose", &none, mesh, {Data(rep, {8, 4}), HostInts({1, 0})});
    transpose.inputs = {{-1, 0}, {-1, 0}};
    SolverNode matmul;
    matmul.rule = RuleRegistry::Global().Find("MatMul");
    matmul.ctx = Context("MatMul", &none, mesh, {Data(rep, {2, 4}), Data(rep, {4, 8})});
    matmul.inputs = {{-1, 0}, {0, 0}};
    matmul.seeds = {MakeLayout("[*,x]", mesh)};
    std::vector<std::vector<std::optional<Layout>>> requests =
        SolveRequests({transpose, matmul});
    ASSERT_EQ(requests.size(), 2u);
    // matmul's b carries n: [*,x]; the transpose is asked for it and would ask w for [x,*].
    ASSERT_TRUE(requests[0][0].has_value());
    EXPECT_EQ(*requests[0][0], MakeLayout("[*,x]", mesh));
    ASSERT_TRUE(transpose.rule != nullptr);
    std::vector<std::optional<Layout>> back =
        transpose.rule->rule->Backward(*transpose.ctx, {MakeLayout("[*,x]", mesh)});
    ASSERT_TRUE(back[0].has_value());
    EXPECT_EQ(*back[0], MakeLayout("[x,*]", mesh));
  }
}

TEST(Propagate, NoRequestWithoutSeeds) {
  Mesh mesh = MakeMesh({{"x", 2}});
  AttrMap none;
  SolverNode relu;
  relu.rule = RuleRegistry::Global().Find("Relu");
  relu.ctx = Context("Relu", &none, mesh, {Data(MakeLayout("[*]", mesh), {4})});
  relu.inputs = {{-1, 0}};
  std::vector<std::vector<std::optional<Layout>>> requests = SolveRequests({relu});
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_TRUE(!requests[0][0].has_value());
}

}  // namespace
}  // namespace tf_dtensor
