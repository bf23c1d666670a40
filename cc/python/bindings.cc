// The only pybind11 file: binds Mesh, Layout, the rule planner and the DTensor device.
// Status codes become Python exceptions through one table (RaiseIfError).
#include <algorithm>

#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "cc/core/layout.h"
#include "cc/core/mesh.h"
#include "cc/core/strings.h"
#include "cc/device/custom_device.h"
#include "cc/tf/op_registry.h"
#include "cc/tf/ops.h"
#include "cc/eager/collective_recovery.h"
#include "cc/eager/tensor_with_layout.h"
#include "cc/propagation/propagate.h"
#include "cc/rules/dispatch.h"
#include "cc/rules/plan.h"
#include "cc/rules/registry.h"
#include "cc/spmd/collectives.h"
#include "cc/spmd/ledger.h"
#include "cc/spmd/lowering.h"

namespace py = pybind11;

namespace tf_dtensor {
namespace {

// Which Python exception a failed status raises: the class (from tf_dtensor._errors)
// depends on what failed (a mesh, a layout, an op) and on the code.
enum class Subject { kMesh, kLayout, kOp };

[[noreturn]] void Raise(const Status& status, Subject subject) {
  if (status.code() == Code::kInternal) {
    // A broken invariant in tf_dtensor, not a user mistake: no user-facing error class.
    PyErr_SetString(PyExc_RuntimeError, ("tf_dtensor internal error: " + status.message()).c_str());
    throw py::error_already_set();
  }
  py::module_ errors = py::module_::import("tf_dtensor._errors");
  const char* name = "LayoutError";
  switch (status.code()) {
    case Code::kUnimplemented: name = "UnsupportedOpError"; break;
    case Code::kInvalidArgument:
      name = subject == Subject::kMesh ? "MeshError" : "LayoutError";
      break;
    default: name = "RelayoutError"; break;
  }
  py::object cls = errors.attr(name);
  PyErr_SetString(cls.ptr(), status.message().c_str());
  throw py::error_already_set();
}

template <typename T>
T ValueOrRaise(StatusOr<T> value, Subject subject) {
  if (!value.ok()) Raise(value.status(), subject);
  return std::move(value).value();
}

TFE_Context* ContextFromCapsule(py::capsule capsule) {
  return static_cast<TFE_Context*>(PyCapsule_GetPointer(capsule.ptr(), nullptr));
}

// Plans `op_name` on inputs described from Python, without running anything: the golden
// rule tests and dtensor.debug.explain use this.
py::dict Explain(const std::string& op_name, const std::vector<std::optional<Layout>>& layouts,
                 const std::vector<std::vector<int64_t>>& shapes,
                 const std::map<int, std::vector<int64_t>>& int_values,
                 const std::map<std::string, py::object>& attrs,
                 const std::optional<Layout>& requested, int num_outputs,
                 const std::vector<std::optional<Layout>>& output_layouts) {
  AttrMap attr_map;
  for (const auto& [name, value] : attrs) {
    AttrValue v;
    if (py::isinstance<py::bool_>(value)) {
      v.b = value.cast<bool>();
    } else if (py::isinstance<py::int_>(value)) {
      v.i = value.cast<int64_t>();
    } else if (py::isinstance<py::str>(value)) {
      v.s = value.cast<std::string>();
    } else if (py::hasattr(value, "as_datatype_enum")) {  // a tf.DType (Bitcast's "type")
      v.type = value.attr("as_datatype_enum").cast<int>();
    } else {
      v.list_i = value.cast<std::vector<int64_t>>();
      v.shape = v.list_i;
    }
    attr_map.Set(name, std::move(v));
  }
  std::optional<Mesh> mesh = requested ? std::optional<Mesh>(requested->mesh()) : std::nullopt;
  for (const std::optional<Layout>& layout : output_layouts) {
    if (layout && !mesh) mesh = layout->mesh();
  }
  for (const std::optional<Layout>& layout : layouts) {
    if (layout) mesh = layout->mesh();
  }
  if (!mesh) throw py::value_error("explain needs at least one input layout or a requested layout");
  // The inputs are checked as TF checks an op's inputs before a rule sees them: a rule
  // reads each input its op has, and one missing would be read out of range.
  if (layouts.size() != shapes.size()) {
    Raise(InvalidArgument("explain got " + std::to_string(layouts.size()) + " layouts and " +
                          std::to_string(shapes.size()) + " shapes for '" + op_name +
                          "'; give one layout (or None, a host tensor) and one global shape "
                          "per input."),
          Subject::kOp);
  }
  // An op with a fixed number of outputs is planned for all of them, as the device plans it
  // (FusedBatchNormV3's six, not five); `num_outputs` serves ops with output lists.
  if (!output_layouts.empty()) num_outputs = static_cast<int>(output_layouts.size());
  if (std::optional<OpArgCounts> counts = ArgCountsOf(op_name)) {
    if (!counts->outputs.lists) num_outputs = counts->outputs.fixed;
    const ArgCount& in = counts->inputs;
    const int n = static_cast<int>(shapes.size());
    if (in.lists ? n < in.fixed : n != in.fixed) {
      Raise(InvalidArgument("explain got " + std::to_string(n) + " inputs for '" + op_name +
                            "', which takes " + (in.lists ? "at least " : "") +
                            std::to_string(in.fixed) + " (TensorFlow's definition of the "
                            "op); give one layout and one shape per input, in order."),
            Subject::kOp);
    }
    const ArgCount& out = counts->outputs;
    const int wanted = static_cast<int>(output_layouts.size());
    if (wanted > 0 && !out.lists && wanted != out.fixed) {
      Raise(InvalidArgument("explain got " + std::to_string(wanted) + " output layouts for '" +
                            op_name + "', which has " + std::to_string(out.fixed) +
                            " outputs; give one per output (None: nothing asked)."),
            Subject::kOp);
    }
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (layouts[i] && layouts[i]->rank() != static_cast<int>(shapes[i].size())) {
      Raise(InvalidArgument("explain got input " + std::to_string(i) + " of '" + op_name +
                            "' with layout " + layouts[i]->ShortString() + " of rank " +
                            std::to_string(layouts[i]->rank()) + " and shape " +
                            ShapeString(shapes[i]) + " of rank " +
                            std::to_string(shapes[i].size()) +
                            "; a layout has one spec per axis of its shape."),
            Subject::kOp);
    }
  }
  OpContext ctx(op_name, &attr_map, *mesh);
  // Each input's dtype where the op's definition and `attrs` tell it (Div's "T"): rules
  // plan by dtype (integer division keeps no partial sum pending).
  const std::vector<int> dtypes = InputDTypes(op_name, attr_map);
  for (size_t i = 0; i < shapes.size(); ++i) {
    InputInfo info;
    info.shape = shapes[i];
    if (i < dtypes.size()) info.dtype = dtypes[i];
    if (i < layouts.size() && layouts[i]) info.layout = layouts[i];
    ctx.inputs.push_back(std::move(info));
  }
  ctx.requested = requested;
  ctx.num_outputs = num_outputs;
  const RegisteredRule* rule = RuleRegistry::Global().Find(op_name);
  if (!rule) {
    Raise(Unimplemented("'" + op_name + "' has no tf_dtensor rule (inputs: " + ctx.DescribeInputs() +
                        ")."),
          Subject::kOp);
  }
  // Values are given for host arguments only (the op's traits say which inputs those are).
  const int n = static_cast<int>(ctx.inputs.size());
  for (const auto& [input, value] : int_values) {
    std::optional<HostValue> what = rule->traits.HostInput(input, n);
    if (input < 0 || input >= n || !what) {
      Raise(InvalidArgument("explain got a value for input " + std::to_string(input) + " of '" +
                            op_name + "', which is not one of its host arguments (" +
                            rule->traits.Describe() + "). Give values only for those, and a "
                            "layout (or None, a host tensor) for data inputs."),
            Subject::kOp);
    }
  }
  // The context as Dispatch makes it: host arguments' values, a data input without a layout
  // is a host tensor that joins the mesh replicated, axes over several mesh dimensions seen
  // over their major dimension, keep_partial.
  auto int_value = [&](int input) -> std::optional<std::vector<int64_t>> {
    auto it = int_values.find(input);
    return it == int_values.end() ? std::nullopt : std::optional<std::vector<int64_t>>(it->second);
  };
  Status prepared = PrepareContext(rule->traits, ctx, /*in_function=*/false, "", int_value);
  if (!prepared.ok()) Raise(prepared, Subject::kOp);
  Plan plan = ValueOrRaise(PlanOp(*rule->rule, rule->traits, ctx), Subject::kOp);
  py::dict out;
  out["inputs"] = plan.inputs;
  out["outputs"] = plan.outputs;
  out["collectives"] = plan.Collectives(ctx);
  if (!output_layouts.empty()) {
    // The backward plan, from the same solver tf.function expansion uses: the op fed by
    // one producer per input, its outputs asked for `output_layouts`.
    std::vector<SolverNode> graph(ctx.inputs.size() + 1);
    SolverNode& node = graph.back();
    node.rule = rule;
    node.ctx = std::shared_ptr<const OpContext>(&ctx, [](const OpContext*) {});
    node.num_outputs = static_cast<int>(output_layouts.size());
    node.seeds = output_layouts;
    for (size_t i = 0; i < ctx.inputs.size(); ++i) {
      node.inputs.push_back({static_cast<int>(i), 0});
    }
    std::vector<std::vector<std::optional<Layout>>> solved = SolveRequests(graph);
    std::vector<std::optional<Layout>> backward;
    for (size_t i = 0; i < ctx.inputs.size(); ++i) backward.push_back(solved[i][0]);
    out["backward"] = backward;
  }
  return out;
}

// Python's handle on a device that TensorFlow owns and deletes with its context: the
// device, the context it was registered with, and the flag the device clears when it is
// deleted. A call through a handle whose device is gone raises instead of touching freed
// memory; tf_dtensor._device registers a new device on the new context.
class DeviceRef {
 public:
  DeviceRef(DTensorDevice* device, TFE_Context* context)
      : device_(device), alive_(device->alive()), context_(context) {}
  bool alive() const { return alive_->load(); }
  uintptr_t context_address() const { return reinterpret_cast<uintptr_t>(context_); }
  TFE_Context* context() const { return context_; }
  DTensorDevice& get() const {
    if (!alive()) {
      throw std::runtime_error(
          "This DTensor device was deleted with its TensorFlow context (the context was "
          "reset); tf_dtensor registers a new device on the current context when next used.");
    }
    return *device_;
  }

 private:
  DTensorDevice* device_;
  std::shared_ptr<const std::atomic<bool>> alive_;
  TFE_Context* context_;
};

// A collective record as the ledger's Python side reads it (dtype as a TF_DataType number).
py::dict RecordDict(const CollectiveRecord& r) {
  py::dict d;
  d["kind"] = r.kind;
  d["reduction"] = r.reduction;
  d["mesh"] = r.mesh;
  d["mesh_dims"] = r.mesh_dims;
  d["group_size"] = r.group_size;
  d["layout_in"] = r.layout_in;
  d["layout_out"] = r.layout_out;
  d["shape"] = r.shape;
  d["dtype"] = r.dtype;
  d["block_bytes"] = r.block_bytes;
  d["bytes_per_device"] = r.bytes_per_device;
  d["op"] = r.op;
  d["requested"] = r.requested;
  d["combined"] = r.combined;
  d["in_loop"] = r.in_loop;
  d["in_branch"] = r.in_branch;
  d["branch"] = r.branch;
  d["where"] = r.where.empty() ? std::string("eager") : r.where;
  d["line"] = r.line;
  return d;
}

// An input of `debug.estimate`: (layout or None, global shape, dtype, resource or None),
// the resource (value layout, value shape, value dtype) of a DVariable's handle.
using PlanInput = std::tuple<std::optional<Layout>, std::vector<int64_t>, int,
                             std::optional<std::tuple<Layout, std::vector<int64_t>, int>>>;

// The expansion of `function` for `inputs` on `mesh` (DTensorDevice::PlanFunction): its
// collectives and per-device cost, as dicts.
py::dict PlanFunction(const DeviceRef& ref, const std::string& function, const Mesh& mesh,
                      const std::vector<PlanInput>& inputs) {
  std::vector<ValueMeta> metas;
  for (const auto& [layout, shape, dtype, resource] : inputs) {
    ValueMeta m;
    m.layout = layout;
    m.shape = shape;
    m.dtype = dtype;
    if (resource) {
      const auto& [value_layout, value_shape, value_dtype] = *resource;
      // Made under the lowering in force now, as a variable created now would be.
      m.resource = ResourceInfo{value_layout, value_shape, value_dtype,
                                CollectiveLowering::For(value_layout.mesh()).shares_buffers()};
    }
    metas.push_back(std::move(m));
  }
  DTensorDevice& device = ref.get();
  StatusOr<std::shared_ptr<const ExpandedFunction>> planned = Internal("not planned");
  {
    py::gil_scoped_release release;
    planned = device.PlanFunction(ref.context(), function, mesh, metas);
  }
  std::shared_ptr<const ExpandedFunction> expanded = ValueOrRaise(std::move(planned), Subject::kOp);
  py::dict devices;
  for (const auto& [device, c] : expanded->cost.devices) {
    py::dict d;
    d["argument_bytes"] = c.argument_bytes;
    d["variable_bytes"] = c.variable_bytes;
    d["intermediate_bytes"] = c.intermediate_bytes;
    d["flops"] = c.flops;
    devices[py::str(device)] = std::move(d);
  }
  py::list collectives;
  for (CollectiveRecord r : expanded->collectives) {
    r.where = function;
    collectives.append(RecordDict(r));
  }
  py::dict result;
  result["devices"] = std::move(devices);
  result["collectives"] = std::move(collectives);
  result["unknown_sizes"] = expanded->cost.unknown_sizes;
  result["has_loops"] = expanded->cost.has_loops;
  result["num_nodes"] = expanded->num_nodes;
  return result;
}

}  // namespace
}  // namespace tf_dtensor

using namespace tf_dtensor;  // NOLINT: the module body names many core types.

PYBIND11_MODULE(_core, m) {
  m.doc() = "tf_dtensor C++ core: Mesh, Layout, op rules and the DTensor custom device.";
  // Rules register during static initialisation, where a refused registration (an op
  // registered twice) has no one to tell; refuse to load rather than run with either rule.
  if (const std::vector<Status>& errors = RuleRegistry::Global().registration_errors();
      !errors.empty()) {
    std::string message = "tf_dtensor's C++ core has inconsistent op rules:";
    for (const Status& error : errors) message += "\n  " + error.message();
    throw py::import_error(message);
  }
  // Our ops are registered when the module loads, not when the device is first made: a
  // SavedModel whose functions hold a `relayout` loads in a process that has only imported
  // tf_dtensor (TF looks up every op of a loaded function when it reads the library).
  RegisterOps();

  py::class_<Mesh>(m, "Mesh")
      .def_static(
          "create",
          [](const std::vector<std::pair<std::string, int64_t>>& dims,
             std::vector<int64_t> global_ids, std::vector<int64_t> local_ids,
             std::vector<std::string> local_devices, std::string name,
             std::vector<std::string> global_devices, bool use_xla_spmd) {
            std::vector<MeshDim> mesh_dims;
            for (const auto& [n, s] : dims) mesh_dims.push_back({n, s});
            return ValueOrRaise(Mesh::Create(std::move(mesh_dims), std::move(global_ids),
                                             std::move(local_ids), std::move(local_devices),
                                             std::move(name), std::move(global_devices),
                                             use_xla_spmd),
                                Subject::kMesh);
          })
      .def_static("from_string",
                  [](const std::string& text) {
                    return ValueOrRaise(Mesh::FromString(text), Subject::kMesh);
                  })
      .def_static("from_device",
                  [](const std::string& device) {
                    return ValueOrRaise(Mesh::FromDevice(device), Subject::kMesh);
                  })
      .def_static("from_proto",
                  [](const py::bytes& serialized) {
                    return ValueOrRaise(Mesh::FromProto(std::string(serialized)), Subject::kMesh);
                  })
      .def("to_proto", [](const Mesh& mesh) { return py::bytes(mesh.ToProto()); })
      .def("spans_processes", &Mesh::spans_processes)
      .def("to_string", &Mesh::ToString)
      .def("short_string", &Mesh::ShortString)
      .def_property_readonly("name", &Mesh::name)
      .def_property_readonly("dim_names",
                             [](const Mesh& mesh) {
                               std::vector<std::string> names;
                               for (const MeshDim& d : mesh.dims()) names.push_back(d.name);
                               return names;
                             })
      .def_property_readonly("dim_sizes",
                             [](const Mesh& mesh) {
                               std::vector<int64_t> sizes;
                               for (const MeshDim& d : mesh.dims()) sizes.push_back(d.size);
                               return sizes;
                             })
      .def_property_readonly("size", &Mesh::size)
      .def_property_readonly("global_device_ids", &Mesh::global_device_ids)
      .def_property_readonly("local_device_ids", &Mesh::local_device_ids)
      .def_property_readonly("local_devices", &Mesh::local_devices)
      .def_property_readonly("global_devices", &Mesh::global_devices)
      .def_property_readonly("device_type", &Mesh::device_type)
      .def_property_readonly("use_xla_spmd", &Mesh::use_xla_spmd)
      .def_property_readonly("is_single_device", &Mesh::is_single_device)
      .def_property_readonly("single_device", &Mesh::single_device)
      .def_property_readonly("reported_size", &Mesh::ReportedSize)
      .def_property_readonly("reported_local_device_ids", &Mesh::ReportedLocalDeviceIds)
      .def_property_readonly("reported_local_devices", &Mesh::ReportedLocalDevices)
      .def("reported_global_device_ids",
           [](const Mesh& mesh) {
             return ValueOrRaise(mesh.ReportedGlobalDeviceIds(), Subject::kMesh);
           })
      .def("min_global_device_id",
           [](const Mesh& mesh) { return ValueOrRaise(mesh.MinGlobalDeviceId(), Subject::kMesh); })
      .def("dim_size",
           [](const Mesh& mesh, const std::string& name) {
             return ValueOrRaise(mesh.DimSizeByName(name), Subject::kMesh);
           })
      .def_property_readonly("strides", &Mesh::Strides)
      .def("device_location",
           [](const Mesh& mesh, int64_t offset) {
             return ValueOrRaise(mesh.DeviceLocation(offset), Subject::kMesh);
           })
      .def("host_mesh", [](const Mesh& mesh) { return ValueOrRaise(mesh.HostMesh(), Subject::kMesh); })
      .def("dim_index", [](const Mesh& mesh, const std::string& name) { return mesh.DimIndex(name); })
      .def("coords",
           [](const Mesh& mesh, int64_t device_id) {
             const std::vector<int64_t>& ids = mesh.global_device_ids();
             if (std::find(ids.begin(), ids.end(), device_id) == ids.end()) {
               Raise(InvalidArgument("Device id " + std::to_string(device_id) + " is not in " +
                                     mesh.ShortString() + "; its ids run from " +
                                     std::to_string(ids.empty() ? 0 : *std::min_element(ids.begin(), ids.end())) +
                                     " to " +
                                     std::to_string(ids.empty() ? 0 : *std::max_element(ids.begin(), ids.end())) +
                                     "."),
                     Subject::kMesh);
             }
             return mesh.Coords(device_id);
           })
      .def("__eq__", [](const Mesh& a, const Mesh& b) { return a == b; })
      .def("__hash__", [](const Mesh& mesh) { return mesh.Hash(); });

  // TF DTensor's `LayoutType`: the same member names and values (and pybind11 enum
  // behaviour) as tensorflow.dtensor.python.layout.LayoutType.
  py::enum_<LayoutType>(m, "LayoutType")
      .value("STATIC", LayoutType::kStatic)
      .value("PARTED", LayoutType::kParted)
      .value("SINGLE_DEVICE", LayoutType::kSingleDevice);

  py::class_<Layout>(m, "Layout")
      .def_static("create",
                  [](const std::vector<std::string>& specs, const Mesh& mesh) {
                    return ValueOrRaise(Layout::Create(specs, mesh), Subject::kLayout);
                  })
      .def_static("from_string",
                  [](const std::string& text) {
                    return ValueOrRaise(Layout::FromString(text), Subject::kLayout);
                  })
      .def_static("from_proto",
                  [](const py::bytes& serialized) {
                    return ValueOrRaise(Layout::FromProto(std::string(serialized)),
                                        Subject::kLayout);
                  })
      .def_static("from_single_device_mesh",
                  [](const Mesh& mesh) {
                    return ValueOrRaise(Layout::FromSingleDeviceMesh(mesh), Subject::kLayout);
                  })
      .def_static("replicated", &Layout::Replicated)
      .def("to_proto",
           [](const Layout& layout) {
             return py::bytes(ValueOrRaise(layout.ToProto(), Subject::kLayout));
           })
      .def("with_partial",
           [](const Layout& layout, const std::vector<std::pair<std::string, std::string>>& partial) {
             // [(mesh dimension name, reduce op name)], checked by Layout::WithPartial.
             std::vector<PartialSpec> specs;
             for (const auto& [name, op_name] : partial) {
               int dim = layout.mesh().DimIndex(name);
               std::optional<ReduceOp> op = ReduceOpFromName(op_name);
               if (dim < 0) {
                 Raise(InvalidArgument("Partial names mesh dimension `" + name + "`, which " +
                                       layout.mesh().ShortString() + " does not have."),
                       Subject::kLayout);
               }
               if (!op) {
                 Raise(InvalidArgument("Partial reduction `" + op_name + "` for `" + name +
                                       "` is not one of `sum`, `mean`, `max`, `min`, `prod`."),
                       Subject::kLayout);
               }
               specs.push_back({dim, *op});
             }
             return ValueOrRaise(layout.WithPartial(std::move(specs)), Subject::kLayout);
           })
      .def("without_partial", &Layout::WithoutPartial)
      .def_property_readonly("partial",
                             [](const Layout& layout) {
                               std::vector<std::pair<std::string, std::string>> out;
                               for (const PartialSpec& p : layout.partial()) {
                                 out.emplace_back(layout.mesh().dims()[p.mesh_dim].name,
                                                  ReduceOpName(p.op));
                               }
                               return out;
                             })
      .def("shard_geometry",
           [](const Layout& layout, const std::vector<int64_t>& global_shape,
              const std::vector<int64_t>& shard_index) {
             if (!layout.is_single_device() &&
                 (static_cast<int>(global_shape.size()) != layout.rank() ||
                  static_cast<int>(shard_index.size()) != layout.rank())) {
               Raise(InvalidArgument("Layout " + layout.ShortString() + " has rank " +
                                     std::to_string(layout.rank()) + "; give a global shape and "
                                     "a shard index with one entry per axis."),
                     Subject::kLayout);
             }
             ShardGeometry g = layout.GeometryOfShard(global_shape, shard_index);
             return std::make_pair(g.shape, g.offset);
           })
      .def("to_parted",
           [](const Layout& layout) { return ValueOrRaise(layout.ToParted(), Subject::kLayout); })
      .def_property_readonly("type", &Layout::type)
      .def_property_readonly("is_single_device", &Layout::is_single_device)
      .def("is_batch_parallel", &Layout::IsBatchParallel)
      .def("offset_to_shard", &Layout::OffsetToShard)
      .def("shard_index_of_device",
           [](const Layout& layout, int64_t device_id) {
             return layout.ShardIndexOfCoords(layout.mesh().Coords(device_id));
           })
      .def("offset_tuple_to_global_index",
           [](const Layout& layout, const std::vector<int64_t>& shard_index) {
             return ValueOrRaise(layout.OffsetTupleToGlobalIndex(shard_index), Subject::kLayout);
           })
      .def("global_shape",
           [](const Layout& layout, const std::vector<int64_t>& shape) {
             return ValueOrRaise(layout.GlobalShapeChecked(shape, "the local shape"),
                                 Subject::kLayout);
           })
      .def("to_string", &Layout::ToString)
      .def("short_string", &Layout::ShortString)
      .def("spec_string", &Layout::SpecString)
      .def_property_readonly("sharding_specs", &Layout::sharding_specs)
      .def_property_readonly("rank", &Layout::rank)
      .def_property_readonly("mesh", &Layout::mesh)
      .def("num_shards",
           [](const Layout& layout, int dim) {
             return ValueOrRaise(layout.NumShardsChecked(dim), Subject::kLayout);
           })
      .def("is_fully_replicated", &Layout::IsFullyReplicated)
      .def("local_shape",
           [](const Layout& layout, const std::vector<int64_t>& shape) {
             return ValueOrRaise(layout.LocalShape(shape, "the tensor"), Subject::kLayout);
           })
      .def("uniform_local_shape",
           [](const Layout& layout, const std::vector<int64_t>& shape) {
             return ValueOrRaise(layout.UniformLocalShape(shape, "the tensor"), Subject::kLayout);
           })
      .def("is_even", &Layout::IsEven)
      .def("__eq__", [](const Layout& a, const Layout& b) { return a == b; })
      .def("__hash__", [](const Layout& layout) { return layout.Hash(); });

  py::class_<DeviceRef>(m, "Device")
      .def_static(
          "register",
          [](py::capsule context, const std::string& name) {
            TFE_Context* tfe_context = ContextFromCapsule(context);
            DTensorDevice* device =
                ValueOrRaise(RegisterDTensorDevice(tfe_context, name), Subject::kOp);
            return DeviceRef(device, tfe_context);
          })
      .def_property_readonly("alive", &DeviceRef::alive)
      .def_property_readonly("context_address", &DeviceRef::context_address)
      .def_property_readonly("name", [](const DeviceRef& ref) { return ref.get().name(); })
      .def_property_readonly("num_expanded_functions",
                             [](const DeviceRef& ref) { return ref.get().num_expanded_functions(); })
      .def("function_cache_stats",
           [](const DeviceRef& ref) {
             FunctionExpander::Stats stats = ref.get().function_cache_stats(ref.context());
             py::dict result;
             result["hit"] = stats.hits;
             result["miss"] = stats.misses;
             result["size"] = stats.size;
             return result;
           })
      .def("plan_function", &PlanFunction, py::arg("function"), py::arg("mesh"),
           py::arg("inputs"))
      .def_property_readonly("num_cached_plans",
                             [](const DeviceRef& ref) { return ref.get().num_cached_plans(); })
      .def_property_readonly("num_local_only_runs",
                             [](const DeviceRef& ref) { return ref.get().num_local_only_runs(); })
      .def_property_readonly("num_direct_kernel_runs",
                             [](const DeviceRef& ref) { return ref.get().num_direct_kernel_runs(); })
      .def("push_default_mesh",
           [](const DeviceRef& ref, std::optional<Mesh> mesh) { ref.get().PushDefaultMesh(mesh); })
      .def("pop_default_mesh", [](const DeviceRef& ref) { ref.get().PopDefaultMesh(); })
      .def("push_default_layout", [](const DeviceRef& ref, std::optional<Layout> layout) {
        ref.get().PushDefaultLayout(layout);
      })
      .def("pop_default_layout", [](const DeviceRef& ref) { ref.get().PopDefaultLayout(); })
      .def_property(
          "strict", [](const DeviceRef&) { return RuleRegistry::Global().strict(); },
          [](const DeviceRef&, bool strict) { RuleRegistry::Global().set_strict(strict); })
      .def("set_warning_handler", [](const DeviceRef& ref, py::object handler) {
        // Held for the life of the process: the device may warn during interpreter exit.
        PyObject* callable = handler.release().ptr();
        ref.get().set_warning_handler([callable](const std::string& message) {
          py::gil_scoped_acquire gil;
          PyObject* result = PyObject_CallFunction(callable, "s", message.c_str());
          if (result) {
            Py_DECREF(result);
          } else {
            PyErr_WriteUnraisable(callable);
          }
        });
      });
  m.def("num_live_devices", &DTensorDevice::num_live);
  m.def("num_live_dtensors", &TensorWithLayout::num_live);
  m.def("context_address", [](py::capsule context) {
    return reinterpret_cast<uintptr_t>(ContextFromCapsule(context));
  });
  // TF's collective executor after failed steps (cc/eager/collective_recovery.h).
  m.def("collectives_aborted", [](py::capsule context) {
    return CollectivesAborted(ContextFromCapsule(context));
  });
  m.def("collective_renewals", &CollectiveRenewals);
  // Instance keys handed out for TF collective ops (cc/spmd/collectives.h).
  m.def("instance_keys_issued", &InstanceKeysIssued);

  m.def("explain", &Explain, py::arg("op_name"), py::arg("layouts"), py::arg("shapes"),
        py::arg("int_values") = std::map<int, std::vector<int64_t>>(),
        py::arg("attrs") = std::map<std::string, py::object>(),
        py::arg("requested") = std::nullopt, py::arg("num_outputs") = 1,
        py::arg("output_layouts") = std::vector<std::optional<Layout>>());
  m.def("registered_ops", [] { return RuleRegistry::Global().OpNames(); });
  // The inputs an op with `num_inputs` inputs reads as host arguments, by its traits
  // (explain takes values for these only); empty for an op without a rule.
  m.def("host_inputs", [](const std::string& op_name, int num_inputs) {
    std::vector<int> inputs;
    const RegisteredRule* rule = RuleRegistry::Global().Find(op_name);
    for (int i = 0; rule && i < num_inputs; ++i) {
      if (rule->traits.IsHostInput(i, num_inputs)) inputs.push_back(i);
    }
    return inputs;
  });
  m.def("set_collective_lowering", [](const std::string& policy) {
    Status status = SetCollectiveLoweringPolicy(policy);
    if (!status.ok()) Raise(status, Subject::kOp);
  });
  m.def("collective_lowering", &CollectiveLoweringPolicy);
  // The lowering `mesh`'s collectives take under the policy in force; "ops (nccl)" where
  // they go over NCCL (UsesNccl).
  m.def("collective_lowering_for", [](const Mesh& mesh) {
    std::string name(CollectiveLowering::For(mesh).name());
    if (name == "ops" && UsesNccl(mesh)) name += " (nccl)";
    return name;
  });
  // On while this process is one client of several (initialize_accelerator_system with a
  // DTENSOR_JOBS of several clients): collectives over other clients' devices are issued as
  // TF's collective ops, which TF's distributed runtime completes.
  m.def("set_multi_client", &SetMultiClientCollectives);
  m.def("multi_client", &MultiClientCollectives);
  m.def("register_ops", &RegisterOps);
  // The collective ledger (cc/spmd/ledger.h): ledger_begin opens one and returns where its
  // records start; ledger_end(start) closes it and returns them, as dicts (dtype as a
  // TF_DataType number).
  m.def("ledger_begin", &ledger::Begin);
  // `source()` names the user's line of a collective being recorded. It is called on the
  // thread that issues the op, with the GIL taken again (TFE_Py_Execute releases it);
  // threads that never ran Python (TF's executors) get "".
  m.def("set_ledger_line_source", [](py::function source) {
    auto* held = new py::function(std::move(source));  // kept past interpreter teardown
    ledger::SetLineSource([held]() -> std::string {
      if (!Py_IsInitialized() || PyGILState_GetThisThreadState() == nullptr) return "";
      py::gil_scoped_acquire gil;
      try {
        return (*held)().cast<std::string>();
      } catch (const py::error_already_set&) {
        return "";
      }
    });
  });
  m.def("drop_all_reduce_for_testing", &ledger::SetDroppedAllReduceForTesting);
  m.def("ledger_end", [](int64_t start) {
    py::list out;
    for (const CollectiveRecord& r : ledger::End(start)) {
      out.append(RecordDict(r));
    }
    return out;
  });
  m.attr("PACK_OP") = kPackOp;
  m.attr("UNPACK_OP") = kUnpackOp;
  m.attr("RELAYOUT_OP") = kRelayoutOp;
  m.attr("RELAYOUT_LIKE_OP") = kRelayoutLikeOp;
  m.attr("FETCH_LAYOUT_OP") = kFetchLayoutOp;
}
