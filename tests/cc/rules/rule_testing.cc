#include "tests/cc/rules/rule_testing.h"

#include "cc/core/strings.h"
#include "cc/propagation/propagate.h"
#include "cc/rules/plan.h"
#include "cc/spmd/recording_builder.h"

namespace tf_dtensor {
namespace testing {

OpCase& OpCase::In(const std::string& spec, std::vector<int64_t> shape, int dtype) {
  InputInfo info;
  info.layout = MakeLayout(spec, mesh_);
  info.shape = std::move(shape);
  info.dtype = dtype;
  ctx_.inputs.push_back(std::move(info));
  return *this;
}

OpCase& OpCase::Resource(const std::string& spec, std::vector<int64_t> shape, int dtype) {
  InputInfo info;
  info.layout = Layout::Replicated(mesh_, 0);
  info.dtype = TF_RESOURCE;
  info.resource = ResourceInfo{MakeLayout(spec, mesh_), std::move(shape), dtype};
  ctx_.inputs.push_back(std::move(info));
  return *this;
}

OpCase& OpCase::Elements(const std::string& spec, std::vector<int64_t> shape, int dtype) {
  ctx_.inputs.back().resource = ResourceInfo{MakeLayout(spec, mesh_), std::move(shape), dtype};
  return *this;
}

OpCase& OpCase::Pending(std::vector<PartialSpec> partial) {
  ctx_.inputs.back().layout = ctx_.inputs.back().layout->WithPartial(std::move(partial)).value();
  return *this;
}

OpCase& OpCase::KeepPartial() {
  ctx_.keep_partial = true;
  return *this;
}

OpCase& OpCase::Host(std::vector<int64_t> value, int dtype) {
  InputInfo info;
  info.shape = {static_cast<int64_t>(value.size())};
  info.dtype = dtype;
  info.int_value = std::move(value);
  ctx_.inputs.push_back(std::move(info));
  return *this;
}

OpCase& OpCase::HostScalar(int64_t value, int dtype) {
  Host({value}, dtype);
  ctx_.inputs.back().shape = {};
  return *this;
}

OpCase& OpCase::Bool(const std::string& name, bool value) {
  AttrValue v;
  v.b = value;
  attrs_.Set(name, std::move(v));
  return *this;
}

OpCase& OpCase::Type(const std::string& name, int dtype) {
  AttrValue v;
  v.type = dtype;
  attrs_.Set(name, std::move(v));
  return *this;
}

OpCase& OpCase::Int(const std::string& name, int64_t value) {
  AttrValue v;
  v.i = value;
  attrs_.Set(name, std::move(v));
  return *this;
}

OpCase& OpCase::Ints(const std::string& name, std::vector<int64_t> values) {
  AttrValue v;
  v.list_i = std::move(values);
  attrs_.Set(name, std::move(v));
  return *this;
}

OpCase& OpCase::Str(const std::string& name, std::string value) {
  AttrValue v;
  v.s = std::move(value);
  attrs_.Set(name, std::move(v));
  return *this;
}

OpCase& OpCase::Requested(const std::string& spec) {
  ctx_.requested = MakeLayout(spec, mesh_);
  return *this;
}

OpCase& OpCase::OutShapes(std::vector<std::vector<int64_t>> shapes) {
  out_shapes_ = std::move(shapes);
  ctx_.num_outputs = static_cast<int>(out_shapes_.size());
  return *this;
}

StatusOr<const RegisteredRule*> OpCase::FindRule() const {
  const RegisteredRule* rule = RuleRegistry::Global().Find(op_name_);
  if (!rule) return Unimplemented("'" + op_name_ + "' has no registered rule");
  return rule;
}

StatusOr<Plan> OpCase::Forward() const {
  TFD_ASSIGN_OR_RETURN(const RegisteredRule* rule, FindRule());
  return PlanOp(*rule->rule, rule->traits, ctx_);
}

std::string OpCase::PlanString() const {
  StatusOr<Plan> plan = Forward();
  if (!plan.ok()) return "error: " + plan.status().message();
  std::vector<std::string> ins, outs;
  for (size_t i = 0; i < ctx_.inputs.size(); ++i) {
    if (plan->host_inputs.count(static_cast<int>(i))) {
      ins.push_back("host" + ShapeString(plan->host_inputs.at(static_cast<int>(i))));
    } else if (!ctx_.inputs[i].layout) {
      ins.push_back("host");
    } else if (i < plan->inputs.size() && plan->inputs[i]) {
      ins.push_back(plan->inputs[i]->SpecString());
    } else {
      ins.push_back("=");
    }
  }
  for (const Layout& out : plan->outputs) outs.push_back(out.SpecString());
  return Join(ins, " ") + " -> " + (outs.empty() ? std::string("replicated") : Join(outs, " "));
}

std::vector<std::string> OpCase::Collectives() const {
  StatusOr<Plan> plan = Forward();
  if (!plan.ok()) return {"error: " + plan.status().message()};
  return plan->Collectives(ctx_);
}

std::vector<std::string> OpCase::Steps() const {
  StatusOr<const RegisteredRule*> rule = FindRule();
  if (!rule.ok()) return {"error: " + rule.status().message()};
  StatusOr<Plan> plan = PlanOp(*(*rule)->rule, (*rule)->traits, ctx_);
  if (!plan.ok()) return {"error: " + plan.status().message()};
  RecordingBuilder builder;
  for (const InputInfo& in : ctx_.inputs) {
    const ValueId v = builder.AddInput(in.layout, in.shape, in.dtype);
    if (in.resource) builder.set_resource(v, *in.resource);
  }
  builder.set_output_shapes(out_shapes_);
  StatusOr<std::vector<ValueId>> outputs = (*rule)->rule->Expand(ctx_, *plan, builder);
  std::vector<std::string> steps = builder.steps();
  if (!outputs.ok()) steps.push_back("error: " + outputs.status().message());
  return steps;
}

std::string OpCase::Backward(const std::vector<std::string>& wanted) const {
  StatusOr<const RegisteredRule*> rule = FindRule();
  if (!rule.ok()) return "error: " + rule.status().message();
  // The op fed by one producer per input, its outputs asked for `wanted` (as
  // debug.explain builds it).
  std::vector<SolverNode> graph(ctx_.inputs.size() + 1);
  SolverNode& node = graph.back();
  node.rule = *rule;
  node.ctx = std::shared_ptr<const OpContext>(&ctx_, [](const OpContext*) {});
  node.num_outputs = static_cast<int>(wanted.size());
  for (const std::string& spec : wanted) {
    node.seeds.push_back(spec.empty() ? std::nullopt
                                      : std::optional<Layout>(MakeLayout(spec, mesh_)));
  }
  for (size_t i = 0; i < ctx_.inputs.size(); ++i) node.inputs.push_back({static_cast<int>(i), 0});
  std::vector<std::vector<std::optional<Layout>>> solved = SolveRequests(graph);
  std::vector<std::string> asked;
  for (size_t i = 0; i < ctx_.inputs.size(); ++i) {
    asked.push_back(solved[i][0] ? solved[i][0]->SpecString() : "-");
  }
  return Join(asked, " ");
}

namespace {

// Adds a row's arguments and attributes to `op`; returns them in words for the trace.
std::string SetUp(OpCase& op, const std::vector<Arg>& args,
                  const std::map<std::string, bool>& bools,
                  const std::map<std::string, int64_t>& ints,
                  const std::map<std::string, std::string>& strings,
                  const std::map<std::string, std::vector<int64_t>>& int_lists) {
  std::vector<std::string> words;
  for (const Arg& arg : args) {
    if (arg.host) {
      arg.scalar ? op.HostScalar(arg.host->at(0)) : op.Host(*arg.host);
      words.push_back("host " + ShapeString(*arg.host));
    } else {
      op.In(arg.spec, arg.shape, arg.dtype);
      words.push_back(arg.spec + ShapeString(arg.shape));
    }
  }
  for (const auto& [name, value] : bools) {
    op.Bool(name, value);
    words.push_back(name + "=" + (value ? "true" : "false"));
  }
  for (const auto& [name, value] : ints) {
    op.Int(name, value);
    words.push_back(name + "=" + std::to_string(value));
  }
  for (const auto& [name, value] : strings) {
    op.Str(name, value);
    words.push_back(name + "=\"" + value + "\"");
  }
  for (const auto& [name, value] : int_lists) {
    op.Ints(name, value);
    words.push_back(name + "=" + ShapeString(value));
  }
  return Join(words, ", ");
}

}  // namespace

void CheckRuleTable(const Mesh& mesh, const std::vector<RuleRow>& rows) {
  for (const RuleRow& row : rows) {
    OpCase op(row.op, mesh);
    const std::string args =
        SetUp(op, row.args, row.bools, row.ints, row.strings, row.int_lists);
    SCOPED_TRACE(row.op + "(" + args + ") on " + mesh.ShortString() + " of " +
                 mesh.device_type());
    if (row.plan == "error") {
      EXPECT_ERROR(op.Forward(), kInvalidArgument, row.steps);
      continue;
    }
    EXPECT_EQ(op.PlanString(), row.plan);
    EXPECT_LINES(op.Steps(), row.steps);
  }
}

void CheckBackwardTable(const Mesh& mesh, const std::vector<BackwardRow>& rows) {
  for (const BackwardRow& row : rows) {
    OpCase op(row.op, mesh);
    const std::string args =
        SetUp(op, row.args, row.bools, row.ints, row.strings, row.int_lists);
    SCOPED_TRACE(row.op + "(" + args + ") asked for " + Join(row.wanted, ", ") + " on " +
                 mesh.ShortString());
    EXPECT_EQ(op.Backward(row.wanted), row.inputs);
  }
}

std::vector<std::string> Cat(std::initializer_list<std::vector<std::string>> parts) {
  std::vector<std::string> out;
  for (const auto& part : parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

std::vector<std::string> IdCheckSteps(const std::string& ids, const std::string& op,
                                      int64_t rows, const std::string& table,
                                      bool nonnegative) {
  const std::string n = std::to_string(rows);
  std::vector<std::string> out = {"host constant [" + n + "] int32",
                                  "local GreaterEqual " + ids + " host [] -> " + ids + " T=int32"};
  if (nonnegative) {
    out.push_back("host constant [0] int32");
    out.push_back("local Less " + ids + " host [] -> " + ids + " T=int32");
    out.push_back("local LogicalOr " + ids + " " + ids + " -> " + ids);
  }
  const std::string range = nonnegative ? "[0, " + n + ")" : "below " + n;
  std::vector<std::string> rest = {
      "host constant [0] int32",
      "local Any " + ids + " host [1] -> [] Tidx=int32 keep_dims=false",
      "local Cast [] -> [] SrcT=bool DstT=float32",
      "local OnesLike [] -> [] T=float32",
      "local Sub [] [] -> [] T=float32",
      "local Log [] -> [] T=float32",
      "local CheckNumerics [] -> [] T=float32 message=tf_dtensor " + op +
          ": an index is out of range " + range + " (axis of " + n + " rows, laid out " + table +
          "); one device raises InvalidArgumentError for it too. Check the indices against "
          "the table's size.",
      "local Cast [] -> [] SrcT=float32 DstT=int32",
      "local AddV2 " + ids + " [] -> " + ids + " T=int32"};
  out.insert(out.end(), rest.begin(), rest.end());
  return out;
}

std::vector<std::string> SoftmaxNonFiniteSteps(const std::string& row, const std::string& x) {
  return {"host constant [0] int32",
          "local Bitcast host [] -> [] T=int32 type=float32",
          "local Maximum " + row + " [] -> " + row + " T=float32",
          "local Mul " + row + " [] -> " + row + " T=float32",
          "local IsNan " + row + " -> " + row + " T=float32",
          "local Maximum " + x + " [] -> " + x + " T=float32",
          "local Mul " + x + " [] -> " + x + " T=float32",
          "local SelectV2 " + row + " " + x + " " + x + " -> " + x + " T=float32"};
}

}  // namespace testing
}  // namespace tf_dtensor
