// Running one op's rule without TensorFlow: build the inputs, plan with Forward, expand
// with a RecordingBuilder, and summarise both as strings for golden tables.
//
//   OpCase op("MatMul", mesh);
//   op.In("[x,*]", {8, 4}).In("[*,*]", {4, 8}).Bool("transpose_a", false);
//   EXPECT_EQ(op.PlanString(), "[x,*] [*,*] -> [x,*]");
//   EXPECT_LINES(op.Steps(), {"local MatMul [x,*] [*,*] -> [x,*]"});
#ifndef TF_DTENSOR_TESTS_CC_RULES_RULE_TESTING_H_
#define TF_DTENSOR_TESTS_CC_RULES_RULE_TESTING_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cc/tf/attrs.h"
#include "cc/rules/registry.h"
#include "cc/rules/rule.h"
#include "tensorflow/c/tf_datatype.h"
#include "tests/cc/testing.h"

namespace tf_dtensor {
namespace testing {

class OpCase {
 public:
  OpCase(std::string op_name, Mesh mesh) : op_name_(std::move(op_name)), mesh_(std::move(mesh)) {}
  OpCase(const OpCase&) = delete;  // the context points at this case's attributes
  OpCase& operator=(const OpCase&) = delete;

  // A DTensor input with layout `spec` ("[x,*]") on the mesh and global `shape`.
  OpCase& In(const std::string& spec, std::vector<int64_t> shape, int dtype = TF_FLOAT);
  // A DVariable handle whose value has layout `spec` and global `shape`.
  OpCase& Resource(const std::string& spec, std::vector<int64_t> shape, int dtype = TF_FLOAT);
  // The last input is a handle (a TensorList) whose elements have layout `spec`, global
  // `shape` and `dtype`.
  OpCase& Elements(const std::string& spec, std::vector<int64_t> shape, int dtype);
  // The last input carries these pending reductions ("[*,*] +partial(y:sum)").
  OpCase& Pending(std::vector<PartialSpec> partial);
  // Plan as inside tf.function: a contraction's reduction stays pending.
  OpCase& KeepPartial();
  // A host integer input (an axis, a shape, a permutation) with the given value.
  OpCase& Host(std::vector<int64_t> value, int dtype = TF_INT32);
  // A host integer scalar input (ConcatV2's axis).
  OpCase& HostScalar(int64_t value, int dtype = TF_INT32);
  OpCase& Bool(const std::string& name, bool value);
  OpCase& Int(const std::string& name, int64_t value);
  OpCase& Ints(const std::string& name, std::vector<int64_t> values);
  // A type attribute (Bitcast's "type"), a TF_DataType.
  OpCase& Type(const std::string& name, int dtype);
  OpCase& Str(const std::string& name, std::string value);
  OpCase& Requested(const std::string& spec);
  // Global shapes of the outputs, for steps after the local op that need them.
  OpCase& OutShapes(std::vector<std::vector<int64_t>> shapes);

  const OpContext& context() const { return ctx_; }
  // The registered rule's plan on these inputs (PlanOp: Forward, then pending reductions).
  StatusOr<Plan> Forward() const;
  // "[x,*] [*,*] -> [x,*]": the layouts the plan gives the inputs ("=" for an input passed
  // unchanged, "host" for a host argument) and the outputs ("replicated" when the plan
  // leaves them to the builder), or "error: <message>".
  std::string PlanString() const;
  // Plan::Collectives, or {"error: <message>"}.
  std::vector<std::string> Collectives() const;
  // The steps of Rule::Expand on a RecordingBuilder, or its error as the last line.
  std::vector<std::string> Steps() const;
  // Per input, the layout asked of it when output o is asked for `wanted[o]` ("" asks
  // nothing), through the solver tf.function expansion and debug.explain run (the
  // rule's Backward): "[x,*] [*,y]", with "-" for an input asked nothing.
  std::string Backward(const std::vector<std::string>& wanted) const;

 private:
  StatusOr<const RegisteredRule*> FindRule() const;

  std::string op_name_;
  Mesh mesh_;
  AttrMap attrs_;
  OpContext ctx_{op_name_, &attrs_, mesh_};
  std::vector<std::vector<int64_t>> out_shapes_;
};

// One argument of a golden-table row: a DTensor input or a host integer input.
struct Arg {
  std::string spec;  // "[x,*]"; empty for a host input
  std::vector<int64_t> shape;
  std::optional<std::vector<int64_t>> host;
  bool scalar = false;
  int dtype = TF_FLOAT;
};
// A DTensor input with layout `spec`, global `shape` and `dtype` (float32 by default).
inline Arg T(std::string spec, std::vector<int64_t> shape, int dtype = TF_FLOAT) {
  return Arg{std::move(spec), std::move(shape), std::nullopt, false, dtype};
}
// A host integer vector (reduction axes, a permutation) or scalar (ConcatV2's axis).
inline Arg H(std::vector<int64_t> values) { return Arg{"", {}, std::move(values)}; }
inline Arg HScalar(int64_t value) { return Arg{"", {}, std::vector<int64_t>{value}, true}; }

// A row of a golden table: op and arguments, then the expected PlanString and the
// expected steps of its expansion. A row whose plan is "error" expects Forward to fail,
// with a message containing each of `steps`.
struct RuleRow {
  std::string op;
  std::vector<Arg> args;
  std::string plan;
  std::vector<std::string> steps;
  std::map<std::string, bool> bools = {};        // bool attributes (transpose_a, keep_dims)
  std::map<std::string, int64_t> ints = {};      // int attributes (axis, num_split)
  std::map<std::string, std::string> strings = {};  // string attributes (equation)
  std::map<std::string, std::vector<int64_t>> int_lists = {};  // (strides, ksize)
};

// Checks every row on `mesh`; a failure names the row ("MatMul([x,*], [*,*]) on ...").
void CheckRuleTable(const Mesh& mesh, const std::vector<RuleRow>& rows);

// The step lists of a table row, joined.
std::vector<std::string> Cat(std::initializer_list<std::vector<std::string>> parts);

// The steps that check rank-1 int32 ids of layout `ids` against `rows` on a CPU mesh
// (CheckIds, cc/rules/row_blocks.cc): ids >= rows and (`nonnegative`) ids < 0 raise through
// a CheckNumerics named after `op` and the indexed layout `table`.
std::vector<std::string> IdCheckSteps(const std::string& ids, const std::string& op,
                                      int64_t rows, const std::string& table,
                                      bool nonnegative = true);

// The steps Softmax adds on a CPU mesh after the sharded exp / sum (rows with NaN or +inf
// as TF's CPU kernel gives them): `row` the row statistics' layout, `x` the logits'.
std::vector<std::string> SoftmaxNonFiniteSteps(const std::string& row, const std::string& x);

// A row of a Backward table: op and arguments (the layouts the forward pass saw), the
// layouts asked of its outputs ("" for none), and the expected OpCase::Backward.
struct BackwardRow {
  std::string op;
  std::vector<Arg> args;
  std::vector<std::string> wanted;
  std::string inputs;
  std::map<std::string, bool> bools = {};
  std::map<std::string, int64_t> ints = {};
  std::map<std::string, std::string> strings = {};
  std::map<std::string, std::vector<int64_t>> int_lists = {};
};

void CheckBackwardTable(const Mesh& mesh, const std::vector<BackwardRow>& rows);

}  // namespace testing
}  // namespace tf_dtensor

#endif  // TF_DTENSOR_TESTS_CC_RULES_RULE_TESTING_H_
