// Mesh: construction checks (with the key parts of their messages), text and proto round
// trips, coordinates, GPU-typed and single-device meshes.
#include "cc/core/mesh.h"

#include "tests/cc/testing.h"

namespace tf_dtensor {
namespace {

using testing::MakeMesh;

const char kCpu0[] = "/job:localhost/replica:0/task:0/device:CPU:0";
const char kCpu1[] = "/job:localhost/replica:0/task:0/device:CPU:1";
const char kGpu0[] = "/job:localhost/replica:0/task:0/device:GPU:0";

struct CreateErrorRow {
  const char* name;
  std::vector<MeshDim> dims;
  std::vector<int64_t> global_ids;
  std::vector<int64_t> local_ids;
  std::vector<std::string> local_devices;
  std::vector<std::string> parts;  // pieces the message must contain
};

TEST(Mesh, CreateRejectsInvalidMeshesNamingTheProblem) {
  const std::vector<CreateErrorRow> rows = {
      {"empty name", {{"", 2}}, {0, 1}, {0, 1}, {kCpu0, kCpu1}, {"non-empty", "=2"}},
      {"reserved name", {{"unsharded", 2}}, {0, 1}, {0, 1}, {kCpu0, kCpu1},
       {"`unsharded`", "reserved"}},
      {"wildcard name", {{"*", 2}}, {0, 1}, {0, 1}, {kCpu0, kCpu1}, {"`*`", "reserved"}},
      {"plus in name", {{"a+b", 2}}, {0, 1}, {0, 1}, {kCpu0, kCpu1},
       {"`a+b`", "contains `+`", "separator"}},
      {"comma in name", {{"a,b", 2}}, {0, 1}, {0, 1}, {kCpu0, kCpu1}, {"contains `,`"}},
      {"bar in name", {{"a|b", 2}}, {0, 1}, {0, 1}, {kCpu0, kCpu1}, {"contains `|`"}},
      {"equals in name", {{"a=b", 2}}, {0, 1}, {0, 1}, {kCpu0, kCpu1}, {"contains `=`"}},
      {"colon in name", {{"mesh:", 2}}, {0, 1}, {0, 1}, {kCpu0, kCpu1}, {"contains `:`"}},
      {"space in name", {{" x", 2}}, {0, 1}, {0, 1}, {kCpu0, kCpu1}, {"contains whitespace"}},
      {"duplicate name", {{"x", 1}, {"x", 2}}, {0, 1}, {0, 1}, {kCpu0, kCpu1},
       {"`x`", "appears twice", "x=1,x=2"}},
      {"zero size", {{"x", 0}}, {}, {}, {}, {"`x`", "size 0", "positive"}},
      {"negative size", {{"x", -2}}, {0, 1}, {0, 1}, {kCpu0, kCpu1}, {"size -2"}},
      {"too few ids", {{"x", 2}, {"y", 2}}, {0, 1}, {0, 1}, {kCpu0, kCpu1},
       {"x=2,y=2", "4 devices", "2 global device ids"}},
      {"duplicate ids", {{"x", 2}}, {0, 0}, {0}, {kCpu0}, {"duplicates", "0,0"}},
      {"ids without devices", {{"x", 2}}, {0, 1}, {0, 1}, {kCpu0},
       {"2 local device ids", "1 local devices"}},
      {"local id not global", {{"x", 2}}, {0, 1}, {5}, {kCpu0}, {"Local device id 5", "0,1"}},
      {"device twice", {{"x", 2}}, {0, 1}, {0, 1}, {kCpu0, kCpu0}, {kCpu0, "twice"}},
      {"mixed types", {{"x", 2}}, {0, 1}, {0, 1}, {kCpu0, kGpu0}, {"CPU", "GPU", "one type"}},
      {"unparsable device", {{"x", 2}}, {0, 1}, {0, 1}, {kCpu0, "foo"},
       {"`foo`", "not a device name", "CPU:0"}},
      {"device without a type", {{"x", 2}}, {0, 1}, {0, 1}, {"0", "1"},
       {"Device `0`", "not a device name", "CPU:0"}},
  };
  for (const CreateErrorRow& row : rows) {
    SCOPED_TRACE(row.name);
    EXPECT_ERROR(Mesh::Create(row.dims, row.global_ids, row.local_ids, row.local_devices),
                 kInvalidArgument, row.parts);
  }
}

TEST(Mesh, AccessorsOfATwoByThreeMesh) {
  Mesh mesh = MakeMesh({{"x", 2}, {"y", 3}});
  EXPECT_EQ(mesh.size(), 6);
  EXPECT_EQ(mesh.num_dims(), 2);
  EXPECT_EQ(mesh.ShortString(), "mesh(x=2,y=3)");
  EXPECT_EQ(mesh.device_type(), "CPU");
  EXPECT_TRUE(mesh.shares_host_memory());
  EXPECT_FALSE(mesh.is_single_device());
  EXPECT_EQ(mesh.DimIndex("y"), 1);
  EXPECT_EQ(mesh.DimIndex("z"), -1);
  EXPECT_EQ(mesh.Strides(), (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(*mesh.DimSizeByName("y"), 3);
  EXPECT_ERROR(mesh.DimSizeByName("z"), kInvalidArgument, {"`z`", "mesh(x=2,y=3)", "`x`, `y`"});
}

TEST(Mesh, CoordsAreRowMajorWithTheFirstDimensionOutermost) {
  Mesh mesh = MakeMesh({{"x", 2}, {"y", 3}});
  const std::vector<std::pair<int64_t, std::vector<int64_t>>> rows = {
      {0, {0, 0}}, {1, {0, 1}}, {2, {0, 2}}, {3, {1, 0}}, {5, {1, 2}},
  };
  for (const auto& [id, coords] : rows) {
    SCOPED_TRACE("device " + std::to_string(id));
    EXPECT_EQ(mesh.Coords(id), coords);
    EXPECT_EQ(*mesh.DeviceLocation(id), coords);
  }
  for (int i = 0; i < mesh.num_local_devices(); ++i) {
    EXPECT_EQ(mesh.LocalCoord(i, 0), i / 3);
    EXPECT_EQ(mesh.LocalCoord(i, 1), i % 3);
  }
  EXPECT_ERROR(mesh.DeviceLocation(6), kInvalidArgument, {"offset 6", "6 devices", "0 to 5"});
}

TEST(Mesh, CoordsFollowThePositionOfPermutedIds) {
  ASSERT_OK_AND_ASSIGN(Mesh mesh, Mesh::Create({{"x", 2}}, {1, 0}, {1, 0}, {kCpu1, kCpu0}));
  EXPECT_EQ(mesh.Coords(1), (std::vector<int64_t>{0}));
  EXPECT_EQ(mesh.Coords(0), (std::vector<int64_t>{1}));
  EXPECT_EQ(*mesh.MinGlobalDeviceId(), 0);
}

TEST(Mesh, StringAndProtoRoundTrips) {
  const std::vector<Mesh> meshes = {
      MakeMesh({{"x", 2}}), MakeMesh({{"x", 2}, {"y", 2}}), MakeMesh({{"batch", 4}}, "GPU"),
      *Mesh::FromDevice("CPU:0"),
  };
  for (const Mesh& mesh : meshes) {
    SCOPED_TRACE(mesh.ToString());
    ASSERT_OK_AND_ASSIGN(Mesh parsed, Mesh::FromString(mesh.ToString()));
    EXPECT_EQ(parsed, mesh);
    EXPECT_EQ(parsed.Hash(), mesh.Hash());
    ASSERT_OK_AND_ASSIGN(Mesh from_proto, Mesh::FromProto(mesh.ToProto()));
    EXPECT_EQ(from_proto, mesh);
  }
}

// Equal meshes share one representation, however they were made (a layout parsed from
// text made its own, so every eager op compared two meshes by their text: ~4 us an op).
TEST(Mesh, EqualMeshesShareOneRepresentation) {
  const Mesh mesh = MakeMesh({{"x", 2}, {"y", 2}});
  ASSERT_OK_AND_ASSIGN(Mesh parsed, Mesh::FromString(mesh.ToString()));
  EXPECT_TRUE(parsed.SharesRepresentation(mesh));
  EXPECT_TRUE(MakeMesh({{"x", 2}, {"y", 2}}).SharesRepresentation(mesh));
  ASSERT_OK_AND_ASSIGN(Mesh from_proto, Mesh::FromProto(mesh.ToProto()));
  EXPECT_TRUE(from_proto.SharesRepresentation(mesh));
  ASSERT_OK_AND_ASSIGN(Mesh one, Mesh::FromDevice("CPU:0"));
  ASSERT_OK_AND_ASSIGN(Mesh again, Mesh::FromDevice(kCpu0));
  EXPECT_TRUE(one.SharesRepresentation(again));
  // Different meshes stay different, by value and by object.
  const Mesh other = MakeMesh({{"x", 2}, {"z", 2}});
  EXPECT_FALSE(other.SharesRepresentation(mesh));
  EXPECT_NE(other, mesh);
  EXPECT_FALSE(MakeMesh({{"x", 4}}, "GPU").SharesRepresentation(MakeMesh({{"x", 4}})));
  EXPECT_NE(MakeMesh({{"x", 4}}, "GPU"), MakeMesh({{"x", 4}}));
}

// A mesh made after every equal one is gone gets a new representation that works alike.
TEST(Mesh, MeshesMadeAgainAfterTheOldOnesAreGoneAreEqual) {
  std::string text;
  size_t hash = 0;
  {
    const Mesh first = MakeMesh({{"gone", 3}});
    text = first.ToString();
    hash = first.Hash();
  }
  for (int i = 0; i < 100; ++i) MakeMesh({{"m" + std::to_string(i), 2}});  // table clean-ups
  ASSERT_OK_AND_ASSIGN(Mesh again, Mesh::FromString(text));
  EXPECT_EQ(again.ToString(), text);
  EXPECT_EQ(again.Hash(), hash);
  EXPECT_EQ(again, MakeMesh({{"gone", 3}}));
}

TEST(Mesh, ParsesTensorFlowsStringForm) {
  ASSERT_OK_AND_ASSIGN(
      Mesh mesh,
      Mesh::FromString("m|x=2,y=1|0,1|0,1|/job:localhost/replica:0/task:0/device:CPU:0,"
                       "/job:localhost/replica:0/task:0/device:CPU:1"));
  EXPECT_EQ(mesh.name(), "m");
  EXPECT_EQ(mesh.ShortString(), "mesh(x=2,y=1)");
  EXPECT_EQ(mesh.local_devices()[1], kCpu1);
  EXPECT_ERROR(Mesh::FromString("m|x=2"), kInvalidArgument, {"Cannot parse mesh", "m|x=2"});
  EXPECT_ERROR(Mesh::FromString("m|x|0|0|" + std::string(kCpu0)), kInvalidArgument,
               {"mesh dimension 'x'", "name=size"});
}

TEST(Mesh, GpuTypedMeshesDoNotShareHostMemory) {
  Mesh gpu = MakeMesh({{"x", 2}, {"y", 2}}, "GPU");
  EXPECT_EQ(gpu.device_type(), "GPU");
  EXPECT_FALSE(gpu.shares_host_memory());
  EXPECT_EQ(gpu.local_devices()[3], "/job:localhost/replica:0/task:0/device:GPU:3");
  ASSERT_OK_AND_ASSIGN(Mesh host, gpu.HostMesh());
  EXPECT_EQ(host.device_type(), "CPU");
  EXPECT_EQ(host.local_devices()[3], "/job:localhost/replica:0/task:0/device:CPU:3");
  EXPECT_EQ(host.dims(), gpu.dims());
  EXPECT_NE(host, gpu);
  Mesh cpu = MakeMesh({{"x", 2}});
  EXPECT_EQ(*cpu.HostMesh(), cpu);
}

TEST(Mesh, SingleDeviceMesh) {
  ASSERT_OK_AND_ASSIGN(Mesh mesh, Mesh::FromDevice("gpu:1"));
  EXPECT_TRUE(mesh.is_single_device());
  EXPECT_EQ(mesh.single_device(), "/job:localhost/replica:0/task:0/device:GPU:1");
  EXPECT_EQ(mesh.ShortString(), "mesh(GPU:1)");
  EXPECT_EQ(mesh.size(), 1);
  EXPECT_EQ(mesh.ReportedSize(), 0);
  EXPECT_EQ(mesh.num_dims(), 0);
  EXPECT_EQ(mesh.ToString(), mesh.single_device());
  EXPECT_ERROR(mesh.ReportedGlobalDeviceIds(), kInvalidArgument, {"no global device ids"});
  EXPECT_ERROR(Mesh::FromDevice(""), kInvalidArgument, {"needs a device name"});
  EXPECT_ERROR(Mesh::FromDevice("/job:x/oops"), kInvalidArgument, {"`/job:x/oops`"});
  ASSERT_OK_AND_ASSIGN(Mesh host, mesh.HostMesh());
  EXPECT_EQ(host.single_device(), "/job:localhost/replica:0/task:0/device:CPU:1");
}

TEST(Mesh, DeviceNameHelpers) {
  EXPECT_EQ(CanonicalDeviceName("cpu:3"), "/job:localhost/replica:0/task:0/device:CPU:3");
  EXPECT_EQ(CanonicalDeviceName("/device:GPU:1"), "/job:localhost/replica:0/task:0/device:GPU:1");
  // The forms TensorFlow's device specs take (TF's own DTensor tests use several).
  EXPECT_EQ(CanonicalDeviceName("/CPU:0"), "/job:localhost/replica:0/task:0/device:CPU:0");
  EXPECT_EQ(CanonicalDeviceName("job:localhost/replica:0/task:0/TPU:0"),
            "/job:localhost/replica:0/task:0/device:TPU:0");
  EXPECT_EQ(CanonicalDeviceName("/job:worker/task:1/device:gpu:2"),
            "/job:worker/replica:0/task:1/device:GPU:2");
  EXPECT_EQ(CanonicalDeviceName("/job:w/replica:0/task:3/device:CPU:0"),
            "/job:w/replica:0/task:3/device:CPU:0");
  EXPECT_EQ(ShortDeviceName(kGpu0), "GPU:0");
  EXPECT_EQ(DeviceType(kGpu0), "GPU");
  EXPECT_TRUE(IsFullDeviceName(kCpu0));
  EXPECT_FALSE(IsFullDeviceName("CPU:0"));
}

}  // namespace
}  // namespace tf_dtensor
