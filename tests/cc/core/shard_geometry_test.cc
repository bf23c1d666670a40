// Shard geometry: the one function that places blocks (torch.chunk pieces), and Partial
// layouts (pending reductions per mesh dimension), on CPU and GPU-typed meshes.
#include "cc/core/layout.h"
#include "tests/cc/testing.h"

namespace tf_dtensor {
namespace {

using testing::MakeLayout;
using testing::MakeMesh;

TEST(ShardGeometry, PiecesFollowTorchChunk) {
  struct Row {
    int64_t size, pieces;
    std::vector<std::pair<int64_t, int64_t>> expected;  // (size, offset) per piece
  };
  const std::vector<Row> rows = {
      {8, 4, {{2, 0}, {2, 2}, {2, 4}, {2, 6}}},
      {5, 4, {{2, 0}, {2, 2}, {1, 4}, {0, 5}}},
      {3, 4, {{1, 0}, {1, 1}, {1, 2}, {0, 3}}},
      {6, 8, {{1, 0}, {1, 1}, {1, 2}, {1, 3}, {1, 4}, {1, 5}, {0, 6}, {0, 6}}},
      {0, 2, {{0, 0}, {0, 0}}},
      {7, 1, {{7, 0}}},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(std::to_string(row.size) + " over " + std::to_string(row.pieces));
    int64_t total = 0;
    for (int64_t i = 0; i < row.pieces; ++i) {
      EXPECT_EQ(Layout::Piece(row.size, row.pieces, i), row.expected[i]);
      total += Layout::Piece(row.size, row.pieces, i).first;
    }
    EXPECT_EQ(total, row.size);
  }
}

TEST(ShardGeometry, BlocksOfTwoAxesPerDevice) {
  for (const char* type : {"CPU", "GPU"}) {
    SCOPED_TRACE(type);
    Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}}, type);
    Layout layout = MakeLayout("[y,x]", mesh);
    // Device (x, y): rows by y, columns by x.
    struct Row {
      int device;
      std::vector<int64_t> shape, offset;
    };
    for (const Row& row : std::vector<Row>{{0, {2, 3}, {0, 0}},
                                           {1, {1, 3}, {2, 0}},
                                           {2, {2, 2}, {0, 3}},
                                           {3, {1, 2}, {2, 3}}}) {
      ShardGeometry g = layout.GeometryOfDevice({3, 5}, row.device);
      EXPECT_EQ(g.shape, row.shape);
      EXPECT_EQ(g.offset, row.offset);
    }
    EXPECT_EQ(layout.PieceSizes({3, 5}, 0), (std::vector<int64_t>{2, 1}));
    EXPECT_TRUE(!layout.IsEven({3, 5}));
    EXPECT_TRUE(layout.IsEven({4, 6}));
    EXPECT_EQ(layout.EvenPart({3, 6}), MakeLayout("[*,x]", mesh));
  }
}

TEST(ShardGeometry, LocalShapeIsTheFirstBlockAndUniformIsChecked) {
  Layout layout = MakeLayout("[x,*]", MakeMesh({{"x", 4}}));
  ASSERT_OK_AND_ASSIGN(std::vector<int64_t> local, layout.LocalShape({5, 3}, "t"));
  EXPECT_EQ(local, (std::vector<int64_t>{2, 3}));
  EXPECT_ERROR(layout.UniformLocalShape({5, 3}, "t"), kInvalidArgument,
               {"size 5", "not divisible by 4"});
  EXPECT_ERROR(layout.LocalShape({5}, "t"), kInvalidArgument, {"rank 2", "rank 1"});
}

TEST(PartialLayout, CheckedAtConstructionWithForms) {
  Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}});
  Layout base = MakeLayout("[x,*]", mesh);
  ASSERT_OK_AND_ASSIGN(Layout partial, base.WithPartial({{1, ReduceOp::kSum}}));
  EXPECT_EQ(partial.ShortString(), "[x,*] +partial(y:sum) @ mesh(x=2,y=2)");
  EXPECT_TRUE(partial.ToString().find("partial:y=sum, mesh:") != std::string::npos);
  ASSERT_OK_AND_ASSIGN(Layout parsed, Layout::FromString(partial.ToString()));
  EXPECT_EQ(parsed, partial);
  EXPECT_EQ(parsed.Hash(), partial.Hash());
  EXPECT_TRUE(partial != base);
  EXPECT_EQ(partial.WithoutPartial(), base);
  EXPECT_TRUE(!partial.IsFullyReplicated());
  EXPECT_EQ(partial.DistinctMeshDims(), (std::vector<int>{0, 1}));
  // A mesh dim shards an axis or is partial, never both; never partial twice.
  EXPECT_ERROR(base.WithPartial({{0, ReduceOp::kSum}}), kInvalidArgument,
               {"cannot be partial over `x`", "already shards an axis"});
  EXPECT_ERROR(partial.WithPartial({{1, ReduceOp::kMax}}), kInvalidArgument,
               {"partial twice"});
  EXPECT_ERROR(partial.ToProto(), kInvalidArgument, {"LayoutProto cannot hold"});
  EXPECT_ERROR(Layout::FromString("sharding_specs:x, partial:y=median, mesh:|x=2,y=2|0,1,2,3|"
                                  "0,1,2,3|/job:localhost/replica:0/task:0/device:CPU:0,"
                                  "/job:localhost/replica:0/task:0/device:CPU:1,"
                                  "/job:localhost/replica:0/task:0/device:CPU:2,"
                                  "/job:localhost/replica:0/task:0/device:CPU:3"),
               kInvalidArgument, {"partial entry 'y=median'"});
  // Specs change, pending reductions go: they belong to a value, not a pattern.
  EXPECT_TRUE(!partial.WithSpecs({DimSpec::Replicated(), DimSpec::Replicated()}).is_partial());
}

// PyTorch's [Shard(0), Shard(0)]: one axis over two mesh dimensions, cut like nested
// torch.chunks (over the major dimension, then each piece over the next).
TEST(ShardGeometry, AxisOverSeveralMeshDimsIsNestedChunks) {
  Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}});
  Layout xy = MakeLayout("[x+y,*]", mesh);
  Layout yx = MakeLayout("[y+x,*]", mesh);
  EXPECT_EQ(xy.NumShards(0), 4);
  EXPECT_EQ(xy.sharding_specs(), (std::vector<std::string>{"x+y", "unsharded"}));
  EXPECT_EQ(xy.ShortString(), "[x+y,*] @ mesh(x=2,y=2)");
  EXPECT_EQ(*Layout::FromString(xy.ToString()), xy);
  EXPECT_EQ(*Layout::FromProto(*xy.ToProto()), xy);
  EXPECT_TRUE(xy != yx && xy.Hash() != yx.Hash());
  // 5 rows: x cuts 3 | 2, then y cuts 3 -> 2 | 1 and 2 -> 1 | 1 (flat chunks would give
  // 2, 2, 1, 0).
  EXPECT_EQ(xy.PieceSizes({5, 2}, 0), (std::vector<int64_t>{2, 1, 1, 1}));
  const std::vector<int64_t> xy_offsets = {0, 2, 3, 4};  // device (x, y) holds piece 2x + y
  const std::vector<int64_t> yx_offsets = {0, 3, 2, 4};  // device (x, y) holds piece 2y + x
  for (int d = 0; d < 4; ++d) {
    EXPECT_EQ(xy.GeometryOfDevice({5, 2}, d).offset[0], xy_offsets[d]);
    EXPECT_EQ(yx.GeometryOfDevice({5, 2}, d).offset[0], yx_offsets[d]);
  }
  EXPECT_EQ(xy.OffsetToShard(), (std::vector<std::vector<int64_t>>{{0, 0}, {1, 0}, {2, 0}, {3, 0}}));
  EXPECT_EQ(yx.FirstDeviceOfPieces(0), (std::vector<int>{0, 2, 1, 3}));
  EXPECT_TRUE(xy.IsEven({8, 2}) && !xy.IsEven({6, 2}));
  EXPECT_EQ(xy.MajorOnly(), MakeLayout("[x,*]", mesh));
  EXPECT_EQ(xy.ShardedMeshDims(), (std::vector<int>{0, 1}));
  // A mesh dimension still shards one axis once, and is never also partial.
  EXPECT_ERROR(Layout::Create({"x+x"}, mesh), kInvalidArgument, {"axis 0 twice", "`x`"});
  EXPECT_ERROR(Layout::Create({"x+y", "y"}, mesh), kInvalidArgument, {"axes 0 and 1", "`y`"});
  EXPECT_ERROR(Layout::Create({"x+z"}, mesh), kInvalidArgument, {"`z`", "`x+y`"});
  EXPECT_ERROR(xy.WithPartial({{1, ReduceOp::kSum}}), kInvalidArgument, {"partial over `y`"});
}

// The inverse geometry: the blocks GeometryOfDevice gives add up to the global shape
// again, even or uneven, over one mesh dimension or several.
TEST(ShardGeometry, GlobalShapeOfBlocksInvertsTheBlocks) {
  Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}});
  for (const char* spec : {"[x,*]", "[y,x]", "[*,y]", "[x+y,*]", "[*,*]"}) {
    const Layout layout = MakeLayout(spec, mesh);
    for (const std::vector<int64_t>& global :
         std::vector<std::vector<int64_t>>{{8, 6}, {9, 2}, {3, 5}, {1, 7}, {0, 3}}) {
      SCOPED_TRACE(std::string(spec) + " " + testing::Print(global));
      EXPECT_EQ(layout.GlobalShapeOfBlocks(
                    [&](int d) { return layout.GeometryOfDevice(global, d).shape; }),
                global);
    }
  }
  // [x,*] @ mesh(x=2): blocks [9,2] and [8,2] are a [17,2] tensor.
  const Layout rows = MakeLayout("[x,*]", MakeMesh({{"x", 2}}));
  const std::vector<std::vector<int64_t>> blocks = {{9, 2}, {8, 2}};
  EXPECT_EQ(rows.GlobalShapeOfBlocks([&](int d) { return blocks[d]; }),
            (std::vector<int64_t>{17, 2}));
}

TEST(ShardGeometry, GlobalShapeOfBlocksAsksOnlyTheFirstHolderOfEachPiece) {
  // [x,*] @ mesh(x=2,y=2): devices 0 and 1 (x=0) hold piece 0, devices 2 and 3 piece 1.
  const Layout layout = MakeLayout("[x,*]", MakeMesh({{"x", 2}, {"y", 2}}));
  std::vector<int> asked;
  const std::vector<int64_t> global = layout.GlobalShapeOfBlocks([&](int d) {
    asked.push_back(d);
    return std::vector<int64_t>{d < 2 ? 3 : 2, 4};
  });
  EXPECT_EQ(global, (std::vector<int64_t>{5, 4}));
  EXPECT_EQ(asked, (std::vector<int>{0, 2}));
}

TEST(ShardGeometry, GlobalShapeOfBlocksWithUnknownSizes) {
  const Layout layout = MakeLayout("[x,*]", MakeMesh({{"x", 2}}));
  // An unknown piece leaves the sharded axis unknown; an unknown replicated size stays.
  const std::vector<std::vector<int64_t>> blocks = {{3, -1}, {-1, -1}};
  EXPECT_EQ(layout.GlobalShapeOfBlocks([&](int d) { return blocks[d]; }),
            (std::vector<int64_t>{-1, -1}));
  const std::vector<std::vector<int64_t>> known_rows = {{3, -1}, {2, -1}};
  EXPECT_EQ(layout.GlobalShapeOfBlocks([&](int d) { return known_rows[d]; }),
            (std::vector<int64_t>{5, -1}));
}

TEST(ShardGeometry, GlobalShapeOfBlocksOfOtherClientsIsEven) {
  // This client holds devices 0 and 1 of mesh(x=2,y=2): piece 1 of x lives elsewhere, so
  // its size is taken from this client's piece; y's pieces are both here.
  StatusOr<Mesh> mesh = Mesh::Create({{"x", 2}, {"y", 2}}, {0, 1, 2, 3}, {0, 1},
                                     {"/job:localhost/replica:0/task:0/device:CPU:0",
                                      "/job:localhost/replica:0/task:0/device:CPU:1"});
  ASSERT_OK(mesh.status());
  const Layout layout = MakeLayout("[x,y]", *mesh);
  const std::vector<std::vector<int64_t>> blocks = {{3, 2}, {3, 1}};
  EXPECT_EQ(layout.GlobalShapeOfBlocks([&](int d) { return blocks[d]; }),
            (std::vector<int64_t>{6, 3}));
}

TEST(ShardGeometry, GlobalShapeOfBlocksKeepsWholeBlocks) {
  // A single-device layout holds the whole tensor; a block of another rank is not split.
  ASSERT_OK_AND_ASSIGN(Mesh single, Mesh::FromDevice("CPU:0"));
  ASSERT_OK_AND_ASSIGN(Layout whole, Layout::FromSingleDeviceMesh(single));
  EXPECT_EQ(whole.GlobalShapeOfBlocks([](int) { return std::vector<int64_t>{4, 5}; }),
            (std::vector<int64_t>{4, 5}));
  const Layout rows = MakeLayout("[x,*]", MakeMesh({{"x", 2}}));
  EXPECT_EQ(rows.GlobalShapeOfBlocks([](int) { return std::vector<int64_t>{7}; }),
            (std::vector<int64_t>{7}));
}

}  // namespace
}  // namespace tf_dtensor
