// Gathers and scatters over sharded tables: row blocks (row_blocks.h), index-tuple ops.
#include "tests/cc/rules/rule_testing.h"

namespace tf_dtensor {
namespace {

using testing::CheckRuleTable;
using testing::H;
using testing::HScalar;
using testing::MakeMesh;
using testing::OpCase;
using testing::T;

TEST(ScatterRules, Plans) {
  for (const char* type : {"CPU", "GPU"}) {
    SCOPED_TRACE(type);
    CheckRuleTable(
        MakeMesh({{"x", 2}, {"y", 2}}, type),
        {
            // Index-tuple gathers: indexed axes whole, slice and batch axes sharded.
            {"GatherNd", {T("[*,*,y]", {5, 3, 2}), T("[x,*]", {4, 2})},
             "[*,*,y] [x,*] -> [x,y]",
             {"local GatherNd [*,*,y] [x,*] -> [x,y]"}},
            {"GatherNd", {T("[x,*,y]", {5, 3, 2}), T("[*,*]", {4, 1})},
             "[*,*,y] [*,*] -> [*,*,y]",
             {"all-gather axis 0 [x,*,y] -> [*,*,y]",
              "local GatherNd [*,*,y] [*,*] -> [*,*,y]"}},
            // Tensor scatters: every device applies every update to its slice columns.
            {"TensorScatterAdd", {T("[x,y]", {5, 4}), T("[x,*]", {3, 1}), T("[x,y]", {3, 4})},
             "[*,y] [*,*] [*,y] -> [*,y]",
             {"all-gather axis 0 [x,y] -> [*,y]", "all-gather axis 0 [x,*] -> [*,*]",
              "all-gather axis 0 [x,y] -> [*,y]",
              "local TensorScatterAdd [*,y] [*,*] [*,y] -> [*,y]"}},
            // ScatterNd adds duplicates: sharded updates give partial sums.
            {"ScatterNd", {T("[x,*]", {4, 1}), T("[x,y]", {4, 6}), H({5, 6})},
             "[x,*] [x,y] host[5, 3] -> [*,y]",
             {"host constant [5, 3] int32", "local ScatterNd [x,*] [x,y] host [2] -> [*,y]",
              "all-reduce(sum) [*,y] over x"}},
            {"ScatterNd", {T("[x,*]", {4, 1}), T("[*,y]", {4, 5}), H({5, 5})},
             "[x,*] [x,*] host[5, 5] -> [*,*]",
             {"slice axis 0 over x [*,y] -> [x,y]", "all-gather axis 1 [x,y] -> [x,*]",
              "host constant [5, 5] int32", "local ScatterNd [x,*] [x,*] host [2] -> [*,*]",
              "all-reduce(sum) [*,*] over x"}},
            {"GatherNd", {T("[*]", {5}), T("[*,*]", {4, 2})}, "error", {"at most"}},
        });
  }
}

// A row-sharded table: each device gathers from its block, the table is never gathered.
TEST(ScatterRules, GatherFromRowBlocks) {
  const Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}}, "CPU");
  OpCase op("GatherV2", mesh);
  op.In("[x,y]", {7, 4}).In("[*]", {5}, TF_INT32).HostScalar(0);
  EXPECT_EQ(op.PlanString(), "[x,y] [*] host -> [*,y]");
  EXPECT_EQ(op.Collectives(), std::vector<std::string>{"all-reduce(sum) of output 0 over x"});
  // Uneven blocks [0,4) and [4,7): each device's bounds are a sliced host constant.
  // Then (a CPU mesh) the ids checked against the 7 rows, as one device checks them.
  EXPECT_LINES(op.Steps(), testing::Cat({{"host constant [0, 4] int32",
                            "broadcast host [2] -> [*] @ mesh(x=2,y=2)",
                            "slice axis 0 over x [*] -> [x]",
                            "host constant [4, 7] int32",
                            "broadcast host [2] -> [*] @ mesh(x=2,y=2)",
                            "slice axis 0 over x [*] -> [x]",
                            "local GreaterEqual [*] [x] -> [*] T=int32",
                            "local Less [*] [x] -> [*] T=int32",
                            "local LogicalAnd [*] [*] -> [*]",
                            "local Sub [*] [x] -> [*] T=int32",
                            "local ZerosLike [*] -> [*] T=int32",
                            "local SelectV2 [*] [*] [*] -> [*] T=int32"},
                           testing::IdCheckSteps("[*]", "GatherV2", 7, "[x,y] @ mesh(x=2,y=2)"),
                           {"local GatherV2 [x,y] [*] host [] -> [*,y]",
                            "host constant [1] int32",
                            "local ExpandDims [*] host [] -> [*,*] T=bool Tdim=int32",
                            "local ZerosLike [*,y] -> [*,y] T=float32",
                            "local SelectV2 [*,*] [*,y] [*,y] -> [*,y] +partial(x:sum) T=float32",
                            "all-reduce(sum) [*,y] +partial(x:sum) over x"}}));

  // Ids sharded over the rows' mesh dimension are gathered instead (they are smaller), and
  // the result goes back to their sharding: a reduce-scatter of the partial lookups.
  OpCase sharded_ids("GatherV2", mesh);
  sharded_ids.In("[x,*]", {7, 4}).In("[x]", {4}, TF_INT32).HostScalar(0);
  EXPECT_EQ(sharded_ids.PlanString(), "[x,*] [*] host -> [x,*]");

  // Inside tf.function the partial sum stays pending.
  OpCase deferred("GatherV2", mesh);
  deferred.In("[y,*]", {7, 4}).In("[x]", {6}, TF_INT32).HostScalar(0).KeepPartial();
  EXPECT_EQ(deferred.PlanString(), "[y,*] [x] host -> [x,*] +partial(y:sum)");
}

// The rule never reads the DVariable's value whole: no ReadVariableOp (whose value could
// be gathered) among the steps, and the op runs on the per-device variables.
void ExpectNoTableGather(const std::vector<std::string>& steps) {
  bool local = false;
  for (const std::string& step : steps) {
    SCOPED_TRACE(step);
    EXPECT_EQ(step.find("ReadVariableOp"), std::string::npos);
    local = local || step.find("local Resource") != std::string::npos;
  }
  EXPECT_TRUE(local);
}

TEST(ScatterRules, ResourceGatherReadsRowBlocks) {
  const Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}}, "CPU");
  OpCase rows("ResourceGather", mesh);
  rows.Resource("[x,y]", {7, 4}).In("[*,*]", {2, 3}, TF_INT32);
  EXPECT_EQ(rows.PlanString(), "= [*,*] -> [*,*,y]");
  EXPECT_EQ(rows.Collectives(), std::vector<std::string>{"all-reduce(sum) of output 0 over x"});
  ExpectNoTableGather(rows.Steps());
  EXPECT_EQ(rows.Steps().back(), "all-reduce(sum) [*,*,y] +partial(x:sum) over x");

  // Ids sharded over the rows' dimension are gathered (the table never is), even when
  // they outnumber the rows; the result keeps the ids' sharding (reduce-scattered).
  OpCase many("ResourceGather", mesh);
  many.Resource("[x,*]", {3, 4}).In("[x,y]", {8, 4}, TF_INT32);
  EXPECT_EQ(many.PlanString(), "= [*,y] -> [x,y,*]");
  ExpectNoTableGather(many.Steps());

  OpCase columns("ResourceGather", mesh);
  columns.Resource("[*,y]", {7, 4}).In("[x]", {6}, TF_INT32);
  EXPECT_EQ(columns.PlanString(), "= [x] -> [x,y]");
  EXPECT_EQ(columns.Collectives(), std::vector<std::string>{});
}

TEST(ScatterRules, ResourceScatterAppliesRowBlocks) {
  const Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}}, "CPU");
  OpCase add("ResourceScatterAdd", mesh);
  add.Resource("[x,y]", {7, 4}).In("[y]", {6}, TF_INT32).In("[y,*]", {6, 4});
  EXPECT_EQ(add.PlanString(), "= [*] [*,y] -> replicated");
  const std::vector<std::string> steps = add.Steps();
  ExpectNoTableGather(steps);
  ASSERT_TRUE(!steps.empty());
  SCOPED_TRACE(steps.back());
  EXPECT_NE(steps.back().find("local ResourceScatterAdd"), std::string::npos);

  // An update of row blocks: each device keeps the ids in its block (Where, GatherNd) and
  // their updates' rows (a gather by position among the ids, which works on an empty
  // block of the trailing axes too) and updates its own rows; the table is never gathered.
  OpCase update("ResourceScatterUpdate", mesh);
  update.Resource("[x,y]", {7, 4}).In("[*]", {6}, TF_INT32).In("[*,*]", {6, 4});
  EXPECT_EQ(update.PlanString(), "= [*] [*,y] -> replicated");
  const std::vector<std::string> update_steps = update.Steps();
  ExpectNoTableGather(update_steps);
  EXPECT_EQ(update.Collectives(),  // a slice: no communication
            std::vector<std::string>{"input 2: slice axis 1 over y [*,*] -> [*,y]"});
  ASSERT_TRUE(update_steps.size() >= 7u);
  EXPECT_EQ(std::vector<std::string>(update_steps.end() - 7, update_steps.end()),
            (std::vector<std::string>{
                "local Where [*] -> [*,*] T=bool",
                "local GatherNd [*] [*,*] -> [*] Tparams=int32 Tindices=int64",
                "host constant [-1] int32",
                "local Reshape [*,*] host [1] -> [*] T=int64 Tshape=int32",
                "host constant [0] int32",
                "local GatherV2 [*,y] [*] host [] -> [*,y] Tparams=float32 Tindices=int64 "
                "Taxis=int32 batch_dims=0",
                "local ResourceScatterUpdate [] [*] [*,y] -> replicated"}));

  // So does a scalar update (every combine), and a table with an empty block (5 rows
  // over 4 devices: blocks of 2, 2, 1, 0), where no row is there to clamp ids to.
  OpCase scalar("ResourceScatterMax", mesh);
  scalar.Resource("[x,y]", {7, 4}).In("[*,*]", {2, 3}, TF_INT64).In("[]", {});
  EXPECT_EQ(scalar.PlanString(), "= [*,*] [] -> replicated");
  ExpectNoTableGather(scalar.Steps());
  EXPECT_EQ(scalar.Steps().back(), "local ResourceScatterMax [] [*] [] -> replicated");
  const Mesh four = MakeMesh({{"x", 4}}, "CPU");
  OpCase empty_block("ResourceScatterAdd", four);
  empty_block.Resource("[x,*]", {5, 3}).In("[*]", {6}, TF_INT32).In("[*,*]", {6, 3});
  ExpectNoTableGather(empty_block.Steps());
  EXPECT_EQ(empty_block.Steps().back(), "local ResourceScatterAdd [] [*] [*,*] -> replicated");

  OpCase columns("ResourceScatterUpdate", mesh);
  columns.Resource("[*,y]", {7, 4}).In("[x]", {6}, TF_INT32).In("[x,y]", {6, 4});
  EXPECT_EQ(columns.PlanString(), "= [*] [*,y] -> replicated");
}

TEST(ScatterRules, SegmentsIntoRequestedRowBlocks) {
  const Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}}, "CPU");
  OpCase op("UnsortedSegmentSum", mesh);
  op.In("[y,*]", {6, 4}).In("[y]", {6}, TF_INT32).HostScalar(8).Requested("[x,*]");
  EXPECT_EQ(op.PlanString(), "[y,*] [y] host -> [x,*]");
  EXPECT_EQ(op.Collectives(), std::vector<std::string>{"all-reduce(sum) of output 0 over y"});

  OpCase unasked("UnsortedSegmentSum", mesh);
  unasked.In("[y,*]", {6, 4}).In("[y]", {6}, TF_INT32).HostScalar(8);
  EXPECT_EQ(unasked.PlanString(), "[y,*] [y] host -> [*,*]");
}

}  // namespace
}  // namespace tf_dtensor
