// Relayout: the planner's steps (PlanRelayout, pure), and their emission recorded step by
// step with RecordingBuilder, which must be exactly the planned steps.
#include "cc/spmd/relayout.h"

#include "cc/core/strings.h"
#include "cc/spmd/recording_builder.h"
#include "tensorflow/c/tf_datatype.h"
#include "tests/cc/testing.h"

namespace tf_dtensor {
namespace {

using testing::MakeLayout;
using testing::MakeMesh;

struct Row {
  const char* from;
  const char* to;
  std::vector<std::string> steps;
};

// Relayouts an [8, 8] value (or rank-matching [8, ...]) from `from` to `to` on `mesh`
// and checks the steps and the final layout.
void CheckTable(const Mesh& mesh, const std::vector<Row>& rows) {
  for (const Row& row : rows) {
    SCOPED_TRACE(std::string(row.from) + " -> " + row.to + " on " + mesh.ShortString());
    Layout from = MakeLayout(row.from, mesh);
    Layout to = MakeLayout(row.to, mesh);
    RecordingBuilder builder;
    ValueId input = builder.AddInput(from, std::vector<int64_t>(from.rank(), 8), TF_FLOAT);
    ASSERT_OK_AND_ASSIGN(ValueId output, Relayout(builder, input, to, "input 0 of 'Test'"));
    EXPECT_EQ(*builder.layout(output), to);
    EXPECT_LINES(builder.steps(), row.steps);
  }
}

TEST(Relayout, OnAOneDimensionalMesh) {
  CheckTable(MakeMesh({{"x", 2}}),
             {
                 {"[x,*]", "[x,*]", {}},
                 {"[x,*]", "[*,*]", {"all-gather axis 0 [x,*] -> [*,*]"}},
                 {"[*,*]", "[*,x]", {"slice axis 1 over x [*,*] -> [*,x]"}},
                 {"[x,*]", "[*,x]", {"all-to-all axis 0 -> 1 [x,*] -> [*,x]"}},
                 {"[*,x]", "[x,*]", {"all-to-all axis 1 -> 0 [*,x] -> [x,*]"}},
                 {"[*,x,*]", "[*,*,x]", {"all-to-all axis 1 -> 2 [*,x,*] -> [*,*,x]"}},
             });
}

TEST(Relayout, OnATwoDimensionalMesh) {
  CheckTable(MakeMesh({{"x", 2}, {"y", 2}}),
             {
                 {"[x,y]", "[*,*]",
                  {"all-gather axis 0 [x,y] -> [*,y]", "all-gather axis 1 [*,y] -> [*,*]"}},
                 {"[*,*]", "[x,y]",
                  {"slice axis 0 over x [*,*] -> [x,*]", "slice axis 1 over y [x,*] -> [x,y]"}},
                 {"[x,*]", "[y,*]",
                  {"all-gather axis 0 [x,*] -> [*,*]", "slice axis 0 over y [*,*] -> [y,*]"}},
                 {"[x,*]", "[x,y]", {"slice axis 1 over y [x,*] -> [x,y]"}},
                 {"[x,*]", "[*,x]", {"all-to-all axis 0 -> 1 [x,*] -> [*,x]"}},
                 {"[x,y]", "[y,x]",
                  {"all-gather axis 0 [x,y] -> [*,y]", "all-to-all axis 1 -> 0 [*,y] -> [y,*]",
                   "slice axis 1 over x [y,*] -> [y,x]"}},
                 {"[x,*,*]", "[*,y,x]",
                  {"slice axis 1 over y [x,*,*] -> [x,y,*]",
                   "all-to-all axis 0 -> 2 [x,y,*] -> [*,y,x]"}},
             });
}

// "[x,*] +partial(y:sum)": MakeLayout's spec plus pending reductions.
Layout WithPending(const char* spec, const Mesh& mesh, std::vector<PartialSpec> partial) {
  return MakeLayout(spec, mesh).WithPartial(std::move(partial)).value();
}

TEST(Relayout, PartialPlansReduceScatterAndToPartial) {
  for (const char* type : {"CPU", "GPU"}) {
    SCOPED_TRACE(type);
    Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}}, type);
    const PartialSpec sum_y{1, ReduceOp::kSum};
    const PartialSpec max_x{0, ReduceOp::kMax};
    const PartialSpec sum_x{0, ReduceOp::kSum};
    struct Row {
      Layout from, to;
      std::vector<std::string> steps;
    };
    const std::vector<Row> rows = {
        // Partial -> replicated: an all-reduce.
        {WithPending("[x,*]", mesh, {sum_y}), MakeLayout("[x,*]", mesh),
         {"all-reduce(sum) [x,*] +partial(y:sum) over y"}},
        // Partial -> sharded over the same dimension: one reduce-scatter.
        {WithPending("[x,*]", mesh, {sum_y}), MakeLayout("[x,y]", mesh),
         {"reduce-scatter(sum) axis 1 over y [x,*] +partial(y:sum) -> [x,y]"}},
        // Only the reductions the target drops are done, where they commute.
        {WithPending("[*,*]", mesh, {sum_x, sum_y}), WithPending("[*,*]", mesh, {sum_x}),
         {"all-reduce(sum) [*,*] +partial(x:sum,y:sum) over y"}},
        // A max over x and a sum over y apply in mesh order (the max first, as full_tensor
        // does): all are done, one at a time, and the kept max made again.
        {WithPending("[*,*]", mesh, {max_x, sum_y}), WithPending("[*,*]", mesh, {max_x}),
         {"all-reduce(max) [*,*] +partial(x:max,y:sum) over x",
          "all-reduce(sum) [*,*] +partial(y:sum) over y",
          "to-partial(max) [*,*] -> [*,*] +partial(x:max)"}},
        // Replicated or sharded -> partial.
        {MakeLayout("[x,*]", mesh), WithPending("[x,*]", mesh, {sum_y}),
         {"to-partial(sum) [x,*] -> [x,*] +partial(y:sum)"}},
        {MakeLayout("[x,y]", mesh), WithPending("[x,*]", mesh, {sum_y}),
         {"all-gather axis 1 [x,y] -> [x,*]", "to-partial(sum) [x,*] -> [x,*] +partial(y:sum)"}},
    };
    for (const Row& row : rows) {
      SCOPED_TRACE(row.from.SpecString() + " -> " + row.to.SpecString());
      RecordingBuilder builder;
      ValueId input = builder.AddInput(row.from, {8, 8}, TF_FLOAT);
      ASSERT_OK_AND_ASSIGN(ValueId output, Relayout(builder, input, row.to, "t"));
      EXPECT_EQ(*builder.layout(output), row.to);
      EXPECT_LINES(builder.steps(), row.steps);
    }
  }
}

TEST(Relayout, GpuTypedMeshesPlanLikeCpuMeshes) {
  CheckTable(MakeMesh({{"x", 2}, {"y", 2}}, "GPU"),
             {
                 {"[x,*]", "[*,x]", {"all-to-all axis 0 -> 1 [x,*] -> [*,x]"}},
                 {"[x,y]", "[*,y]", {"all-gather axis 0 [x,y] -> [*,y]"}},
             });
}

TEST(Relayout, AcrossMeshesGoesWhole) {
  struct CrossRow {
    Mesh from_mesh, to_mesh;
    const char* from;
    const char* to;
    std::vector<std::string> steps;
  };
  Mesh a = MakeMesh({{"x", 2}});
  Mesh b = MakeMesh({{"y", 2}}, "CPU", 2);
  Mesh gpu = MakeMesh({{"x", 2}}, "GPU");
  const std::vector<CrossRow> rows = {
      {a, b, "[x,*]", "[*,y]",
       {"all-gather axis 0 [x,*] -> [*,*]", "move [*,*] @ mesh(x=2) -> [*,*] @ mesh(y=2)",
        "slice axis 1 over y [*,*] -> [*,y]"}},
      {a, b, "[*,*]", "[*,*]", {"move [*,*] @ mesh(x=2) -> [*,*] @ mesh(y=2)"}},
      {a, gpu, "[x,*]", "[x,*]",
       {"all-gather axis 0 [x,*] -> [*,*]", "move [*,*] @ mesh(x=2) -> [*,*] @ mesh(x=2)",
        "slice axis 0 over x [*,*] -> [x,*]"}},
  };
  for (const CrossRow& row : rows) {
    SCOPED_TRACE(std::string(row.from) + " @ " + row.from_mesh.local_devices()[0] + " -> " +
                 row.to + " @ " + row.to_mesh.local_devices()[0]);
    RecordingBuilder builder;
    ValueId input = builder.AddInput(MakeLayout(row.from, row.from_mesh), {8, 8}, TF_FLOAT);
    Layout to = MakeLayout(row.to, row.to_mesh);
    ASSERT_OK_AND_ASSIGN(ValueId output, Relayout(builder, input, to, "t"));
    EXPECT_EQ(*builder.layout(output), to);
    EXPECT_LINES(builder.steps(), row.steps);
  }
}

TEST(Relayout, RefusesWhatItCannotMove) {
  Mesh mesh = MakeMesh({{"x", 2}});
  {
    RecordingBuilder builder;
    ValueId input = builder.AddInput(MakeLayout("[x,*]", mesh), {8, 8}, TF_FLOAT);
    EXPECT_ERROR(Relayout(builder, input, MakeLayout("[x]", mesh), "input 1 of 'AddV2'"),
                 kInvalidArgument, {"input 1 of 'AddV2'", "rank 2", "[x] @ mesh(x=2)", "rank 1"});
    EXPECT_LINES(builder.steps(), {});
  }
  {
    RecordingBuilder builder;
    ValueId handle = builder.AddInput(MakeLayout("[]", mesh), {}, TF_RESOURCE);
    builder.set_resource(handle, ResourceInfo{MakeLayout("[x]", mesh), {8}, TF_FLOAT});
    Mesh other = MakeMesh({{"x", 2}}, "CPU", 2);
    EXPECT_ERROR(Relayout(builder, handle, MakeLayout("[]", other), "the variable"),
                 kInvalidArgument, {"the variable", "variable handle", "another mesh"});
  }
  {
    RecordingBuilder builder;
    ValueId host = builder.AddInput(std::nullopt, {2}, TF_INT32);
    EXPECT_ERROR(Relayout(builder, host, MakeLayout("[x]", mesh), "shape"), kInternal, {"host"});
  }
}

// Planner goldens: source -> target -> steps, with no builder at all.
struct PlanRow {
  Layout from, to;
  std::vector<int64_t> shape;
  std::vector<std::string> steps;
};

void CheckPlans(const std::vector<PlanRow>& rows) {
  for (const PlanRow& row : rows) {
    SCOPED_TRACE(row.from.ShortString() + " -> " + row.to.ShortString() + " of shape " +
                 ShapeString(row.shape));
    EXPECT_LINES(DescribeRelayout(row.from, row.to, row.shape, "t"), row.steps);
    ASSERT_OK_AND_ASSIGN(std::vector<RelayoutStep> steps,
                         PlanRelayout(row.from, row.to, row.shape, "t"));
    // Each step starts where the one before it ended, and the last ends at the target.
    Layout at = row.from;
    for (const RelayoutStep& step : steps) {
      EXPECT_EQ(step.from, at);
      at = step.to;
    }
    EXPECT_EQ(at, row.to);
  }
}

TEST(PlanRelayout, OneDimensionalMesh) {
  Mesh mesh = MakeMesh({{"x", 2}});
  auto L = [&](const char* spec) { return MakeLayout(spec, mesh); };
  CheckPlans({
      {L("[x,*]"), L("[x,*]"), {8, 8}, {}},
      {L("[x,*]"), L("[*,*]"), {8, 8}, {"all-gather axis 0 [x,*] -> [*,*]"}},
      {L("[*,*]"), L("[*,x]"), {8, 8}, {"slice axis 1 over x [*,*] -> [*,x]"}},
      {L("[x,*]"), L("[*,x]"), {8, 8}, {"all-to-all axis 0 -> 1 [x,*] -> [*,x]"}},
      {L("[*,x,*]"), L("[*,*,x]"), {8, 8, 8}, {"all-to-all axis 1 -> 2 [*,x,*] -> [*,*,x]"}},
  });
}

TEST(PlanRelayout, TwoDimensionalMesh) {
  Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}});
  auto L = [&](const char* spec) { return MakeLayout(spec, mesh); };
  CheckPlans({
      {L("[x,y]"), L("[*,*]"), {8, 8},
       {"all-gather axis 0 [x,y] -> [*,y]", "all-gather axis 1 [*,y] -> [*,*]"}},
      {L("[x,*]"), L("[y,*]"), {8, 8},
       {"all-gather axis 0 [x,*] -> [*,*]", "slice axis 0 over y [*,*] -> [y,*]"}},
      {L("[x,*,*]"), L("[*,y,x]"), {8, 8, 8},
       {"slice axis 1 over y [x,*,*] -> [x,y,*]", "all-to-all axis 0 -> 2 [x,y,*] -> [*,y,x]"}},
      // One axis over two mesh dimensions: gathered or sliced as one step.
      {L("[x+y,*]"), L("[*,*]"), {8, 8}, {"all-gather axis 0 [x+y,*] -> [*,*]"}},
      {L("[*,*]"), L("[*,y+x]"), {8, 8}, {"slice axis 1 over y+x [*,*] -> [*,y+x]"}},
      {L("[x+y,*]"), L("[*,x+y]"), {8, 8},
       {"all-gather axis 0 [x+y,*] -> [*,*]", "slice axis 1 over x+y [*,*] -> [*,x+y]"}},
  });
}

TEST(PlanRelayout, UnevenShapesPlanAsEvenOnes) {
  // [5] over x=2 is pieces 3, 2; [3] over 4 devices is 1, 1, 1, 0. The steps are those of
  // an even shape; the builders move pieces of the shard geometry's sizes.
  Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}});
  auto L = [&](const char* spec) { return MakeLayout(spec, mesh); };
  CheckPlans({
      {L("[x]"), L("[*]"), {5}, {"all-gather axis 0 [x] -> [*]"}},
      {L("[*,*]"), L("[x,y]"), {5, 3},
       {"slice axis 0 over x [*,*] -> [x,*]", "slice axis 1 over y [x,*] -> [x,y]"}},
      {L("[x,*]"), L("[*,x]"), {5, 3}, {"all-to-all axis 0 -> 1 [x,*] -> [*,x]"}},
      {L("[*]"), L("[x+y]"), {3}, {"slice axis 0 over x+y [*] -> [x+y]"}},
  });
}

TEST(PlanRelayout, PartialLayouts) {
  Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}});
  auto L = [&](const char* spec) { return MakeLayout(spec, mesh); };
  const PartialSpec sum_x{0, ReduceOp::kSum};
  const PartialSpec sum_y{1, ReduceOp::kSum};
  const PartialSpec max_x{0, ReduceOp::kMax};
  CheckPlans({
      {WithPending("[*,*]", mesh, {sum_y}), L("[*,*]"), {8, 8},
       {"all-reduce(sum) [*,*] +partial(y:sum) over y"}},
      {WithPending("[*,*]", mesh, {sum_y}), L("[y,*]"), {8, 8},
       {"reduce-scatter(sum) axis 0 over y [*,*] +partial(y:sum) -> [y,*]"}},
      // Both reductions pending: x is scattered onto axis 1, y all-reduced, then sliced.
      {WithPending("[*,*]", mesh, {sum_x, sum_y}), L("[y,x]"), {8, 8},
       {"reduce-scatter(sum) axis 1 over x [*,*] +partial(x:sum,y:sum) -> [*,x] +partial(y:sum)",
        "reduce-scatter(sum) axis 0 over y [*,x] +partial(y:sum) -> [y,x]"}},
      {WithPending("[x,*]", mesh, {sum_y}), L("[*,y]"), {5, 3},
       {"reduce-scatter(sum) axis 1 over y [x,*] +partial(y:sum) -> [x,y]",
        "all-gather axis 0 [x,y] -> [*,y]"}},
      // A kept reduction stays; a changed op is a reduction, then a new pending one.
      {WithPending("[*,y]", mesh, {sum_x}), WithPending("[y,*]", mesh, {sum_x}), {8, 8},
       {"all-to-all axis 1 -> 0 [*,y] +partial(x:sum) -> [y,*] +partial(x:sum)"}},
      {WithPending("[*]", mesh, {max_x}), WithPending("[*]", mesh, {sum_x}), {8},
       {"all-reduce(max) [*] +partial(x:max) over x",
        "to-partial(sum) [*] -> [*] +partial(x:sum)"}},
      {L("[y,x]"), WithPending("[y,*]", mesh, {sum_x}), {8, 8},
       {"all-gather axis 1 [y,x] -> [y,*]", "to-partial(sum) [y,*] -> [y,*] +partial(x:sum)"}},
  });
}

TEST(PlanRelayout, AcrossMeshesAndItsRefusals) {
  Mesh a = MakeMesh({{"x", 2}});
  Mesh b = MakeMesh({{"y", 2}}, "CPU", 2);
  CheckPlans({{WithPending("[x,*]", a, {}), MakeLayout("[*,y]", b), {8, 8},
               {"all-gather axis 0 [x,*] -> [*,*]",
                "move [*,*] @ mesh(x=2) -> [*,*] @ mesh(y=2)",
                "slice axis 1 over y [*,*] -> [*,y]"}}});
  EXPECT_ERROR(PlanRelayout(MakeLayout("[]", a), MakeLayout("[]", b), {}, "the variable", true),
               kInvalidArgument, {"the variable", "variable handle", "another mesh"});
  EXPECT_ERROR(PlanRelayout(MakeLayout("[x,*]", a), MakeLayout("[x]", a), {8, 8}, "input 1"),
               kInvalidArgument, {"input 1", "rank 2", "[x] @ mesh(x=2)", "rank 1"});
  EXPECT_ERROR(PlanRelayout(MakeLayout("[x,*]", a), MakeLayout("[*,x]", a), {8}, "input 2"),
               kInvalidArgument, {"input 2", "rank 1", "[8]"});
  EXPECT_LINES(DescribeRelayout(MakeLayout("[x,*]", a), MakeLayout("[*,x]", a), {8}, "input 2"),
               {"cannot relayout: Layout [*,x] @ mesh(x=2) has rank 2 but input 2 has rank 1 "
                "(shape [8]). Give one sharding spec per tensor axis."});
}

// Emitting a plan runs exactly its steps: for every pair of a small set of layouts, the
// RecordingBuilder's record is the planned steps' lines, and the value ends at the target.
TEST(EmitRelayout, RecordsExactlyThePlannedSteps) {
  Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}});
  std::vector<Layout> layouts;
  for (const char* spec : {"[*,*]", "[x,*]", "[*,x]", "[y,*]", "[x,y]", "[y,x]", "[x+y,*]",
                           "[*,y+x]"}) {
    layouts.push_back(MakeLayout(spec, mesh));
  }
  layouts.push_back(WithPending("[*,*]", mesh, {{1, ReduceOp::kSum}}));
  layouts.push_back(WithPending("[x,*]", mesh, {{1, ReduceOp::kMax}}));
  layouts.push_back(WithPending("[*,*]", mesh, {{0, ReduceOp::kSum}, {1, ReduceOp::kSum}}));
  layouts.push_back(WithPending("[*,y]", mesh, {{0, ReduceOp::kMean}}));
  int pairs = 0;
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{8, 8}, {5, 3}}) {
    for (const Layout& from : layouts) {
      for (const Layout& to : layouts) {
        SCOPED_TRACE(from.SpecString() + " -> " + to.SpecString() + " of shape " +
                     ShapeString(shape));
        ASSERT_OK_AND_ASSIGN(std::vector<RelayoutStep> steps,
                             PlanRelayout(from, to, shape, "t"));
        std::vector<std::string> planned;
        for (const RelayoutStep& step : steps) planned.push_back(step.ToString());
        RecordingBuilder builder;
        ValueId input = builder.AddInput(from, shape, TF_FLOAT);
        ASSERT_OK_AND_ASSIGN(ValueId output, EmitRelayout(builder, input, steps));
        EXPECT_LINES(builder.steps(), planned);
        EXPECT_EQ(*builder.layout(output), to);
        ++pairs;
      }
    }
  }
  EXPECT_EQ(pairs, 2 * 12 * 12);
}

}  // namespace
}  // namespace tf_dtensor
