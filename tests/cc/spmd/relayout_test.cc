// Relayout plans, recorded step by step with RecordingBuilder.
#include "cc/spmd/relayout.h"

#include "tensorflow/c/tf_datatype.h"
#include "tests/cc/spmd/recording_builder.h"
#include "tests/cc/testing.h"

namespace tf_dtensor {
namespace {

using testing::MakeLayout;
using testing::MakeMesh;
using testing::RecordingBuilder;

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
                  {"all-gather axis 0 [x,y] -> [*,y]", "all-gather axis 1 [*,y] -> [*,*]",
                   "slice axis 0 over y [*,*] -> [y,*]", "slice axis 1 over x [y,*] -> [y,x]"}},
                 {"[x,*,*]", "[*,y,x]",
                  {"all-to-all axis 0 -> 2 [x,*,*] -> [*,*,x]",
                   "slice axis 1 over y [*,*,x] -> [*,y,x]"}},
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
        // Only the reductions the target drops are done.
        {WithPending("[*,*]", mesh, {max_x, sum_y}), WithPending("[*,*]", mesh, {max_x}),
         {"all-reduce(sum) [*,*] +partial(x:max,y:sum) over y"}},
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

}  // namespace
}  // namespace tf_dtensor
