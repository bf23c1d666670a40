// Layout: text forms (short and TensorFlow's), construction checks, shard counts and the
// device -> shard map, on CPU, GPU-typed and single-device meshes.
#include "cc/core/layout.h"

#include "tests/cc/testing.h"

namespace tf_dtensor {
namespace {

using testing::MakeLayout;
using testing::MakeMesh;

const char kMesh2x2[] =
    "|x=2,y=2|0,1,2,3|0,1,2,3|/job:localhost/replica:0/task:0/device:CPU:0,"
    "/job:localhost/replica:0/task:0/device:CPU:1,/job:localhost/replica:0/task:0/device:CPU:2,"
    "/job:localhost/replica:0/task:0/device:CPU:3";

TEST(Layout, ShortAndTensorFlowForms) {
  Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}});
  struct Row {
    const char* spec;
    const char* short_form;
    std::string tf_form;
  };
  const std::vector<Row> rows = {
      {"[x,*]", "[x,*] @ mesh(x=2,y=2)", std::string("sharding_specs:x,unsharded, mesh:") + kMesh2x2},
      {"[*,y,x]", "[*,y,x] @ mesh(x=2,y=2)",
       std::string("sharding_specs:unsharded,y,x, mesh:") + kMesh2x2},
      {"[]", "[] @ mesh(x=2,y=2)", std::string("sharding_specs: mesh:") + kMesh2x2},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.spec);
    Layout layout = MakeLayout(row.spec, mesh);
    EXPECT_EQ(layout.SpecString(), row.spec);
    EXPECT_EQ(layout.ShortString(), row.short_form);
    EXPECT_EQ(layout.ToString(), row.tf_form);
    ASSERT_OK_AND_ASSIGN(Layout parsed, Layout::FromString(layout.ToString()));
    EXPECT_EQ(parsed, layout);
    EXPECT_EQ(parsed.Hash(), layout.Hash());
    ASSERT_OK_AND_ASSIGN(Layout from_proto, Layout::FromProto(*layout.ToProto()));
    EXPECT_EQ(from_proto, layout);
  }
}

TEST(Layout, ParsesTensorFlowsFormsOfEveryType) {
  const std::vector<std::pair<std::string, std::string>> rows = {
      {"sharding_specs:x, mesh:|x=2|0,1|0,1|/job:localhost/replica:0/task:0/device:GPU:0,"
       "/job:localhost/replica:0/task:0/device:GPU:1",
       "[x] @ mesh(x=2)"},
      {"parted:x,unsharded, mesh:|x=2|0,1|0,1|/job:localhost/replica:0/task:0/device:CPU:0,"
       "/job:localhost/replica:0/task:0/device:CPU:1",
       "parted[x,*] @ mesh(x=2)"},
      {"maximal:true, mesh:/job:localhost/replica:0/task:0/device:CPU:0", "[] @ mesh(CPU:0)"},
  };
  for (const auto& [text, short_form] : rows) {
    SCOPED_TRACE(text);
    ASSERT_OK_AND_ASSIGN(Layout layout, Layout::FromString(text));
    EXPECT_EQ(layout.ShortString(), short_form);
    EXPECT_EQ(*Layout::FromString(layout.ToString()), layout);
    EXPECT_EQ(*Layout::FromProto(*layout.ToProto()), layout);
  }
}

TEST(Layout, ConstructionErrorsNameTheProblem) {
  Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}});
  ASSERT_OK_AND_ASSIGN(Mesh single, Mesh::FromDevice("CPU:0"));
  EXPECT_ERROR(Layout::Create({"x", "z"}, mesh), kInvalidArgument,
               {"axis 1", "`z`", "mesh(x=2,y=2)", "`x`, `y`"});
  EXPECT_ERROR(Layout::Create({"x", "x"}, mesh), kInvalidArgument,
               {"[x,x]", "axes 0 and 1", "`x`"});
  EXPECT_ERROR(Layout::Create({"unsharded"}, single), kInvalidArgument,
               {"single-device mesh(CPU:0)"});
  EXPECT_ERROR(Layout::FromSingleDeviceMesh(mesh), kInvalidArgument,
               {"needs a single-device mesh", "mesh(x=2,y=2)"});
  EXPECT_ERROR(Layout::FromSpecs({DimSpec::Sharded(0)}, single, LayoutType::kSingleDevice),
               kInvalidArgument, {"no sharding specs", "1 were given"});
  EXPECT_ERROR(Layout::FromString("specs:x mesh:"), kInvalidArgument, {"Cannot parse layout"});
  EXPECT_ERROR(Layout::FromString("sharding_specs:q, mesh:|x=2|0,1|0,1|"
                                  "/job:localhost/replica:0/task:0/device:CPU:0,"
                                  "/job:localhost/replica:0/task:0/device:CPU:1"),
               kInvalidArgument, {"`q`"});
  EXPECT_ERROR(Layout::Replicated(single, 1).ToParted(), kInvalidArgument, {"single-device"});
}

TEST(Layout, NumShardsAndPredicates) {
  Mesh mesh = MakeMesh({{"x", 2}, {"y", 4}});
  struct Row {
    const char* spec;
    std::vector<int64_t> num_shards;
    int64_t total;
    bool fully_replicated;
    bool batch_parallel;
  };
  const std::vector<Row> rows = {
      {"[x,*]", {2, 1}, 2, false, true},
      {"[*,y]", {1, 4}, 4, false, false},
      {"[y,x]", {4, 2}, 8, false, false},
      {"[*,*]", {1, 1}, 1, true, false},
      {"[x]", {2}, 2, false, true},
      {"[]", {}, 1, true, false},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.spec);
    Layout layout = MakeLayout(row.spec, mesh);
    std::vector<int64_t> num_shards;
    for (int d = 0; d < layout.rank(); ++d) num_shards.push_back(*layout.NumShardsChecked(d));
    EXPECT_EQ(num_shards, row.num_shards);
    EXPECT_EQ(layout.TotalShards(), row.total);
    EXPECT_EQ(layout.IsFullyReplicated(), row.fully_replicated);
    EXPECT_EQ(layout.IsBatchParallel(), row.batch_parallel);
  }
  EXPECT_ERROR(MakeLayout("[x,*]", mesh).NumShardsChecked(2), kInvalidArgument,
               {"Axis 2", "[x,*] @ mesh(x=2,y=4)", "rank 2"});
}

TEST(Layout, OffsetToShardFollowsMeshCoordinates) {
  Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}});
  using Shards = std::vector<std::vector<int64_t>>;
  const std::vector<std::pair<const char*, Shards>> rows = {
      {"[x,*]", {{0, 0}, {0, 0}, {1, 0}, {1, 0}}},
      {"[*,y]", {{0, 0}, {0, 1}, {0, 0}, {0, 1}}},
      {"[y,x]", {{0, 0}, {1, 0}, {0, 1}, {1, 1}}},
      {"[*,*]", {{0, 0}, {0, 0}, {0, 0}, {0, 0}}},
  };
  for (const auto& [spec, shards] : rows) {
    SCOPED_TRACE(spec);
    Layout layout = MakeLayout(spec, mesh);
    EXPECT_EQ(layout.OffsetToShard(), shards);
    for (int i = 0; i < mesh.num_local_devices(); ++i) {
      for (int d = 0; d < layout.rank(); ++d) EXPECT_EQ(layout.ShardIndex(i, d), shards[i][d]);
    }
  }
  Layout layout = MakeLayout("[y,x]", mesh);
  EXPECT_EQ(*layout.OffsetTupleToGlobalIndex({1, 0}), 2);
  EXPECT_ERROR(layout.OffsetTupleToGlobalIndex({2, 0}), kInvalidArgument,
               {"[2, 0]", "axis 0 has 2 shard(s)"});
  EXPECT_ERROR(layout.OffsetTupleToGlobalIndex({0}), kInvalidArgument, {"1 entries", "rank 2"});
  ASSERT_OK_AND_ASSIGN(Mesh single, Mesh::FromDevice("CPU:0"));
  EXPECT_EQ(Layout::Replicated(single, 3).OffsetToShard(), Shards{{}});
}

TEST(Layout, LocalAndGlobalShapes) {
  Mesh mesh = MakeMesh({{"x", 2}, {"y", 4}});
  Layout layout = MakeLayout("[x,*,y]", mesh);
  EXPECT_EQ(*layout.LocalShape({8, 3, 16}, "t"), (std::vector<int64_t>{4, 3, 4}));
  EXPECT_EQ(layout.GlobalShape({4, 3, 4}), (std::vector<int64_t>{8, 3, 16}));
  EXPECT_ERROR(layout.LocalShape({8, 3}, "input 0 of 'Foo'"), kInvalidArgument,
               {"rank 3", "input 0 of 'Foo'", "[8, 3]"});
}

TEST(Layout, ReplicatedSingleDeviceAndParted) {
  Mesh gpu = MakeMesh({{"x", 2}}, "GPU");
  EXPECT_EQ(Layout::Replicated(gpu, 2).ShortString(), "[*,*] @ mesh(x=2)");
  ASSERT_OK_AND_ASSIGN(Mesh single, Mesh::FromDevice("GPU:0"));
  Layout whole = Layout::Replicated(single, 2);
  EXPECT_TRUE(whole.is_single_device());
  EXPECT_FALSE(whole.IsFullyReplicated());
  EXPECT_EQ(whole.rank(), 0);
  EXPECT_EQ(*whole.LocalShape({5, 7}, "t"), (std::vector<int64_t>{5, 7}));
  ASSERT_OK_AND_ASSIGN(Layout parted, MakeLayout("[x,*]", gpu).ToParted());
  EXPECT_TRUE(parted.is_parted());
  EXPECT_EQ(parted.SpecString(), "parted[x,*]");
  EXPECT_NE(parted, MakeLayout("[x,*]", gpu));
  EXPECT_EQ(parted.WithSpecs({DimSpec::Replicated()}).SpecString(), "parted[*]");
}

}  // namespace
}  // namespace tf_dtensor
