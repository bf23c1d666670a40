#include "cc/graph/cost.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <queue>
#include <set>
#include <unordered_map>

#include "cc/spmd/ledger.h"

namespace tf_dtensor {
namespace {

// Ops whose output is their input's buffer (or a variable's), with nothing allocated.
bool HandsOnBuffer(const std::string& op) {
  static const std::set<std::string> kOps = {
      "Identity",     "IdentityN",    "Reshape",        "Squeeze",   "ExpandDims",
      "StopGradient", "EnsureShape",  "PreventGradient", "Snapshot", "DebugIdentity",
      "CheckNumerics", "CheckNumericsV2", "ReadVariableOp"};
  return kOps.count(op) > 0;
}

// Elementwise ops whose kernels write into an input buffer of the result's size that no
// later op reads (TensorFlow's forward_input_or_allocate_output).
bool ForwardsInput(const std::string& op) {
  static const std::set<std::string> kOps = {
      "Abs", "Add", "AddV2", "BiasAdd", "Ceil", "Cos", "Div", "DivNoNan",
      "Elu", "EluGrad", "Erf", "Exp", "Expm1", "Floor", "FloorDiv", "FloorMod", "Gelu",
      "Inv", "Log", "Log1p", "LeakyRelu", "LeakyReluGrad", "Maximum", "Minimum", "Mul",
      "MulNoNan", "Neg", "Pow", "RealDiv", "Reciprocal", "Relu", "Relu6", "Relu6Grad",
      "ReluGrad", "Round", "Rsqrt", "RsqrtGrad", "Selu", "SeluGrad", "Sigmoid",
      "SigmoidGrad", "Sign", "Sin", "Softplus", "SoftplusGrad", "Softsign", "Sqrt",
      "SqrtGrad", "Square", "SquaredDifference", "Sub", "Tan", "Tanh", "TanhGrad",
      "SelectV2", "Select", "ClipByValue", "AddN", "CollectiveReduceV2"};
  return kOps.count(op) > 0;
}

// The inferred shape of `o` (-1 for unknown dims; {-1} when even the rank is unknown).
std::vector<int64_t> ShapeOf(TF_Graph* graph, TF_Output o, TF_Status* status) {
  const int rank = TF_GraphGetTensorNumDims(graph, o, status);
  if (TF_GetCode(status) != TF_OK || rank < 0) return {-1};
  std::vector<int64_t> dims(rank);
  TF_GraphGetTensorShape(graph, o, dims.data(), rank, status);
  if (TF_GetCode(status) != TF_OK) return {-1};
  return dims;
}

// The int value of a host constant (a Split's axis), if `o` is one.
std::optional<int64_t> ConstantInt(TF_Output o, TF_Status* status) {
  if (std::string(TF_OperationOpType(o.oper)) != "Const") return std::nullopt;
  TF_Tensor* value = nullptr;
  TF_OperationGetAttrTensor(o.oper, "value", &value, status);
  if (TF_GetCode(status) != TF_OK || value == nullptr) return std::nullopt;
  std::optional<int64_t> result;
  if (TF_NumDims(value) == 0 && TF_TensorType(value) == TF_INT32) {
    result = *static_cast<const int32_t*>(TF_TensorData(value));
  } else if (TF_NumDims(value) == 0 && TF_TensorType(value) == TF_INT64) {
    result = *static_cast<const int64_t*>(TF_TensorData(value));
  }
  TF_DeleteTensor(value);
  return result;
}

// Outputs that are slices of input `*from`'s buffer (TensorFlow's Split, SplitV and
// Slice share it when they cut only along the outermost axis that is not 1).
bool SlicesInput(TF_Graph* graph, TF_Operation* op, const std::string& type, int* from,
                 TF_Status* status) {
  auto shape_of = [&](TF_Output o) { return ShapeOf(graph, o, status); };
  auto outer = [](const std::vector<int64_t>& shape, int64_t axis) {
    if (axis < 0) axis += static_cast<int64_t>(shape.size());
    if (axis < 0 || axis >= static_cast<int64_t>(shape.size())) return false;
    for (int64_t a = 0; a < axis; ++a) {
      if (shape[a] != 1) return false;
    }
    return true;
  };
  if (type == "Split" || type == "SplitV") {
    *from = type == "Split" ? 1 : 0;
    const int axis_input = type == "Split" ? 0 : 2;
    if (TF_OperationNumInputs(op) <= std::max(*from, axis_input)) return false;
    std::optional<int64_t> axis =
        ConstantInt(TF_OperationInput(TF_Input{op, axis_input}), status);
    return axis && outer(shape_of(TF_OperationInput(TF_Input{op, *from})), *axis);
  }
  if (type == "Slice" || type == "StridedSlice") {
    *from = 0;
    if (TF_OperationNumInputs(op) < 1) return false;
    const std::vector<int64_t> in = shape_of(TF_OperationInput(TF_Input{op, 0}));
    const std::vector<int64_t> out = shape_of(TF_Output{op, 0});
    if (in.empty() || in.size() != out.size()) return false;
    for (size_t a = 1; a < in.size(); ++a) {
      if (in[a] < 0 || in[a] != out[a]) return false;
    }
    return true;
  }
  return false;
}

// Ops that move or describe data, or run elsewhere (collectives, sends): no FLOPs.
bool MovesData(const std::string& op) {
  static const std::set<std::string> kOps = {
      "Identity", "IdentityN", "Reshape", "Squeeze", "ExpandDims", "StopGradient",
      "EnsureShape", "PreventGradient", "Snapshot", "Const", "Placeholder", "NoOp",
      "Shape", "ShapeN", "Size", "Rank", "ReadVariableOp", "AssignVariableOp",
      "VarHandleOp", "Transpose", "ConjugateTranspose", "ConcatV2", "Concat", "Slice",
      "StridedSlice", "StridedSliceGrad", "TensorStridedSliceUpdate", "Split", "SplitV",
      "Pack", "Unpack", "Tile", "GatherV2", "Gather", "GatherNd", "ResourceGather",
      "Fill", "ZerosLike", "OnesLike", "Cast", "Bitcast", "Pad", "PadV2", "MirrorPad",
      "BroadcastTo", "BroadcastGradientArgs", "Range", "OneHot", "ReverseV2", "_Send",
      "_Recv", "_HostSend", "_HostRecv", "PartitionedCall", "StatefulPartitionedCall",
      "If", "StatelessIf", "Case", "StatelessCase", "While", "StatelessWhile", "DynamicStitch",
      "ParallelDynamicStitch", "ScatterNd", "TensorScatterUpdate", "AllToAll",
      "DeviceIndex", "Where", "Unique", "EmptyTensorList", "TensorListReserve",
      "TensorListFromTensor", "TensorListStack", "TensorListGetItem", "TensorListSetItem",
      "TensorListPushBack", "TensorListPopBack", "TensorListElementShape",
      "TensorListLength", "TensorListConcatV2", "TensorListSplit", "InvertPermutation",
      "StatelessRandomGetKeyCounter", "XlaSharding", "Assert", "Print", "PrintV2"};
  return kOps.count(op) > 0 || op.rfind("Collective", 0) == 0;
}

bool Reduces(const std::string& op) {
  static const std::set<std::string> kOps = {
      "Sum", "Mean", "Max", "Min", "Prod", "ArgMax", "ArgMin", "All", "Any",
      "EuclideanNorm", "L2Loss", "BiasAddGrad", "SegmentSum", "UnsortedSegmentSum",
      "SegmentMean", "UnsortedSegmentMax", "UnsortedSegmentMin", "Cumsum", "Cumprod"};
  return kOps.count(op) > 0;
}

bool Known(const std::vector<int64_t>& shape) {
  for (int64_t d : shape) {
    if (d < 0) return false;
  }
  return true;
}

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return Known(shape) ? n : 0;
}

int64_t Product(const std::vector<int64_t>& shape, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t i = begin; i < end && i < shape.size(); ++i) n *= std::max<int64_t>(shape[i], 0);
  return n;
}

bool AttrTrue(const std::map<std::string, std::string>& attrs, const std::string& name) {
  auto it = attrs.find(name);
  return it != attrs.end() && it->second == "true";
}

// 2 per multiply-add over every combination of the labels of a two-operand einsum (one
// operand: one per element). "..." stands for the leading dims the labels leave.
int64_t EinsumFlops(const std::string& equation, const OpShapes& s) {
  std::string lhs = equation.substr(0, equation.find("->"));
  std::vector<std::string> operands;
  size_t start = 0;
  for (size_t comma = lhs.find(','); comma != std::string::npos; comma = lhs.find(',', start)) {
    operands.push_back(lhs.substr(start, comma - start));
    start = comma + 1;
  }
  operands.push_back(lhs.substr(start));
  if (operands.size() != s.inputs.size()) return 0;
  std::map<std::string, int64_t> sizes;
  for (size_t k = 0; k < operands.size(); ++k) {
    const std::vector<int64_t>& shape = s.inputs[k];
    if (!Known(shape)) return 0;
    std::string labels;
    for (char c : operands[k]) {
      if (c != ' ') labels += c;
    }
    const size_t dots = labels.find("...");
    std::vector<std::string> names;
    if (dots == std::string::npos) {
      for (char c : labels) names.emplace_back(1, c);
    } else {
      const std::string before = labels.substr(0, dots), after = labels.substr(dots + 3);
      const int64_t ellipsis =
          static_cast<int64_t>(shape.size()) - static_cast<int64_t>(before.size() + after.size());
      for (char c : before) names.emplace_back(1, c);
      for (int64_t e = 0; e < ellipsis; ++e) {
        names.push_back("." + std::to_string(ellipsis - e));  // aligned from the right
      }
      for (char c : after) names.emplace_back(1, c);
    }
    if (names.size() != shape.size()) return 0;
    for (size_t i = 0; i < names.size(); ++i) {
      sizes[names[i]] = std::max(sizes[names[i]], shape[i]);
    }
  }
  int64_t n = 1;
  for (const auto& [label, size] : sizes) n *= size;
  return operands.size() == 2 ? 2 * n : n;
}

}  // namespace

int64_t OpFlops(const std::string& op, const OpShapes& s,
                const std::map<std::string, std::string>& attrs) {
  auto in = [&](size_t i) -> const std::vector<int64_t>& {
    static const std::vector<int64_t> kNone = {-1};
    return i < s.inputs.size() ? s.inputs[i] : kNone;
  };
  auto out = [&](size_t i) -> const std::vector<int64_t>& {
    static const std::vector<int64_t> kNone = {-1};
    return i < s.outputs.size() ? s.outputs[i] : kNone;
  };
  if (op == "MatMul") {
    const std::vector<int64_t>& a = in(0);
    if (a.size() != 2 || !Known(a) || !Known(out(0))) return 0;
    const int64_t k = AttrTrue(attrs, "transpose_a") ? a[0] : a[1];
    return 2 * Elements(out(0)) * k;
  }
  if (op == "BatchMatMul" || op == "BatchMatMulV2" || op == "BatchMatMulV3") {
    const std::vector<int64_t>& a = in(0);
    if (a.size() < 2 || !Known(a) || !Known(out(0))) return 0;
    const bool adjoint = AttrTrue(attrs, "adj_x");
    const int64_t k = adjoint ? a[a.size() - 2] : a[a.size() - 1];
    return 2 * Elements(out(0)) * k;
  }
  if (op == "Einsum") {
    auto it = attrs.find("equation");
    return it == attrs.end() ? 0 : EinsumFlops(it->second, s);
  }
  // Convolutions: 2 per multiply-add, each output element (of the forward op) summing
  // over the filter's window and input channels.
  if (op == "Conv2D" || op == "Conv3D" || op == "Conv1D") {
    const std::vector<int64_t>& filter = in(1);
    if (!Known(filter) || filter.empty()) return 0;
    return 2 * Elements(out(0)) * Product(filter, 0, filter.size() - 1);
  }
  if (op == "Conv2DBackpropInput" || op == "Conv3DBackpropInputV2") {
    const std::vector<int64_t>& filter = in(1);
    if (!Known(filter) || filter.empty()) return 0;
    return 2 * Elements(in(2)) * Product(filter, 0, filter.size() - 1);
  }
  if (op == "Conv2DBackpropFilter" || op == "Conv3DBackpropFilterV2") {
    const std::vector<int64_t>& filter = out(0);
    if (!Known(filter) || filter.empty()) return 0;
    return 2 * Elements(in(2)) * Product(filter, 0, filter.size() - 1);
  }
  if (op == "DepthwiseConv2dNative") {
    const std::vector<int64_t>& filter = in(1);
    if (!Known(filter) || filter.size() < 2) return 0;
    return 2 * Elements(out(0)) * Product(filter, 0, filter.size() - 2);
  }
  if (op == "DepthwiseConv2dNativeBackpropInput" || op == "DepthwiseConv2dNativeBackpropFilter") {
    const std::vector<int64_t>& filter = op == "DepthwiseConv2dNativeBackpropInput" ? in(1) : out(0);
    if (!Known(filter) || filter.size() < 2) return 0;
    return 2 * Elements(in(2)) * Product(filter, 0, filter.size() - 2);
  }
  if (MovesData(op)) return 0;
  if (Reduces(op)) return Elements(in(0));
  return s.outputs.empty() ? 0 : Elements(out(0));
}

namespace {

std::map<std::string, std::string> FlopAttrs(TF_Operation* op, const std::string& type,
                                             TF_Status* status) {
  std::map<std::string, std::string> attrs;
  auto read_bool = [&](const char* name) {
    unsigned char value = 0;
    TF_OperationGetAttrBool(op, name, &value, status);
    if (TF_GetCode(status) == TF_OK) attrs[name] = value ? "true" : "false";
  };
  if (type == "MatMul") read_bool("transpose_a");
  if (type.rfind("BatchMatMul", 0) == 0) read_bool("adj_x");
  if (type == "Einsum") {
    TF_AttrMetadata meta = TF_OperationGetAttrMetadata(op, "equation", status);
    if (TF_GetCode(status) == TF_OK && meta.total_size >= 0) {
      std::string equation(static_cast<size_t>(meta.total_size), '\0');
      TF_OperationGetAttrString(op, "equation", equation.data(), equation.size(), status);
      if (TF_GetCode(status) == TF_OK) attrs["equation"] = equation;
    }
  }
  return attrs;
}

// Scratch a collective kernel holds while it runs, beyond its output (measured on
// TensorFlow's CPU collectives): a ring all-reduce receives (g-1)/g of its input in
// chunks, an all-to-all stages a 1/g share.
int64_t WorkingBytes(TF_Operation* op, const std::string& type, int64_t input_bytes,
                     TF_Status* status) {
  if (type != "CollectiveReduceV2" && type != "CollectiveAllToAllV2") return 0;
  if (TF_OperationNumInputs(op) < 2) return 0;
  std::optional<int64_t> g = ConstantInt(TF_OperationInput(TF_Input{op, 1}), status);
  if (!g || *g <= 1) return 0;
  return type == "CollectiveReduceV2" ? input_bytes * (*g - 1) / *g : input_bytes / *g;
}

struct Buffer {
  std::string device;
  int64_t bytes = 0;
  int last_use = -1;
  bool counted = false;  // an intermediate of this function (not an argument or constant)
};

}  // namespace

FunctionCost AnalyzeCost(TF_Graph* graph, const std::vector<TF_Output>& inputs,
                         const std::vector<InputCharge>& charges,
                         const std::vector<TF_Output>& outputs,
                         const std::map<TF_Operation*, FunctionalCost>& functional) {
  FunctionCost cost;
  TF_Status* status = TF_NewStatus();
  // The ops in creation order, then a topological order that keeps it where it can (a
  // combined all-reduce is built after the ops that read its parts).
  std::vector<TF_Operation*> created;
  std::unordered_map<TF_Operation*, int> index;
  size_t pos = 0;
  while (TF_Operation* op = TF_GraphNextOperation(graph, &pos)) {
    index[op] = static_cast<int>(created.size());
    created.push_back(op);
  }
  const int n = static_cast<int>(created.size());
  std::vector<std::vector<int>> users(n);
  std::vector<int> pending(n, 0);
  for (int i = 0; i < n; ++i) {
    TF_Operation* op = created[i];
    std::set<int> producers;
    for (int k = 0; k < TF_OperationNumInputs(op); ++k) {
      producers.insert(index[TF_OperationInput(TF_Input{op, k}).oper]);
    }
    const int num_controls = TF_OperationNumControlInputs(op);
    std::vector<TF_Operation*> controls(num_controls);
    if (num_controls > 0) TF_OperationGetControlInputs(op, controls.data(), num_controls);
    for (TF_Operation* c : controls) producers.insert(index[c]);
    for (int p : producers) users[p].push_back(i);
    pending[i] = static_cast<int>(producers.size());
  }
  std::priority_queue<int, std::vector<int>, std::greater<int>> ready;
  for (int i = 0; i < n; ++i) {
    if (pending[i] == 0) ready.push(i);
  }
  std::vector<int> order;  // creation index by step
  while (!ready.empty()) {
    const int i = ready.top();
    ready.pop();
    order.push_back(i);
    for (int u : users[i]) {
      if (--pending[u] == 0) ready.push(u);
    }
  }
  // Buffers: each output's, or the one it hands on (HandsOnBuffer), with the step of its
  // last reader; the function's results live to the end.
  std::map<std::pair<int, int>, int> buffer_of;  // (creation index, output) -> buffer
  std::vector<Buffer> buffers;
  std::vector<bool> hands_on(n, false);  // its outputs are (parts of) an input's buffer
  std::map<TF_Operation*, int> charge_of;
  for (size_t k = 0; k < inputs.size() && k < charges.size(); ++k) {
    charge_of[inputs[k].oper] = static_cast<int>(k);
  }
  for (int step = 0; step < static_cast<int>(order.size()); ++step) {
    TF_Operation* op = created[order[step]];
    const std::string type = TF_OperationOpType(op);
    int sliced = -1;
    const bool slices = SlicesInput(graph, op, type, &sliced, status);
    hands_on[order[step]] = slices || (HandsOnBuffer(type) && TF_OperationNumInputs(op) > 0);
    for (int k = 0; k < TF_OperationNumOutputs(op); ++k) {
      int buffer = -1;
      if (hands_on[order[step]]) {
        const int from = slices ? sliced : type == "IdentityN" ? k : 0;
        TF_Output source = TF_OperationInput(TF_Input{op, std::min(from, TF_OperationNumInputs(op) - 1)});
        auto it = buffer_of.find({index[source.oper], source.index});
        if (it != buffer_of.end()) buffer = it->second;
      }
      if (buffer < 0) {
        buffer = static_cast<int>(buffers.size());
        buffers.emplace_back();
        buffers.back().last_use = step;  // freed at once if nothing reads it
      }
      buffer_of[{order[step], k}] = buffer;
    }
    for (int k = 0; k < TF_OperationNumInputs(op); ++k) {
      TF_Output source = TF_OperationInput(TF_Input{op, k});
      auto it = buffer_of.find({index[source.oper], source.index});
      if (it != buffer_of.end()) buffers[it->second].last_use = std::max(buffers[it->second].last_use, step);
    }
  }
  const int end = static_cast<int>(order.size());
  for (const TF_Output& o : outputs) {
    auto it = buffer_of.find({index[o.oper], o.index});
    if (it != buffer_of.end()) buffers[it->second].last_use = end;
  }
  std::vector<std::vector<int>> frees(end + 1);
  for (size_t b = 0; b < buffers.size(); ++b) {
    frees[std::max(buffers[b].last_use, 0)].push_back(static_cast<int>(b));
  }

  std::map<std::string, int64_t> live;
  auto raise_peak = [&](const std::string& device, int64_t bytes) {
    DeviceCost& d = cost.devices[device];
    d.intermediate_bytes = std::max(d.intermediate_bytes, bytes);
  };
  for (int step = 0; step < end; ++step) {
    const int i = order[step];
    TF_Operation* op = created[i];
    const std::string type = TF_OperationOpType(op);
    const std::string device = TF_OperationDevice(op);
    auto charge = charge_of.find(op);
    if (charge != charge_of.end()) {
      const InputCharge& c = charges[charge->second];
      DeviceCost& d = cost.devices[c.device];
      (c.variable ? d.variable_bytes : d.argument_bytes) += c.bytes;
      continue;  // held by the caller: not this function's buffer
    }
    OpShapes shapes;
    for (int k = 0; k < TF_OperationNumInputs(op); ++k) {
      shapes.inputs.push_back(ShapeOf(graph, TF_OperationInput(TF_Input{op, k}), status));
    }
    for (int k = 0; k < TF_OperationNumOutputs(op); ++k) {
      shapes.outputs.push_back(ShapeOf(graph, TF_Output{op, k}, status));
    }
    auto body = functional.find(op);
    if (body != functional.end()) {
      // The bodies' own peaks on top of what is live around the op, and their FLOPs.
      std::map<std::string, int64_t> peak, flops;
      for (const FunctionCost* b : body->second.bodies) {
        if (!b) continue;
        cost.unknown_sizes += b->unknown_sizes;
        cost.has_loops = cost.has_loops || b->has_loops || body->second.loop;
        for (const auto& [dev, c] : b->devices) {
          peak[dev] = std::max(peak[dev], c.intermediate_bytes);
          flops[dev] = body->second.alternatives ? std::max(flops[dev], c.flops)
                                                 : flops[dev] + c.flops;
        }
      }
      for (const auto& [dev, bytes] : peak) raise_peak(dev, live[dev] + bytes);
      for (const auto& [dev, f] : flops) cost.devices[dev].flops += f;
    } else {
      cost.devices[device].flops += OpFlops(type, shapes, FlopAttrs(op, type, status));
    }
    const bool constant = type == "Const";
    for (int k = 0; k < TF_OperationNumOutputs(op); ++k) {
      Buffer& b = buffers[buffer_of[{i, k}]];
      if (b.counted || constant || hands_on[i]) {
        continue;  // a buffer handed on, or built with the kernel
      }
      const int dtype = TF_OperationOutputType(TF_Output{op, k});
      const std::vector<int64_t>& shape = shapes.outputs[k];
      if (!Known(shape) && DTypeBytes(dtype) > 0) ++cost.unknown_sizes;
      const int64_t bytes = Elements(shape) * static_cast<int64_t>(DTypeBytes(dtype));
      std::string where = device;
      if (body != functional.end() && k < static_cast<int>(body->second.output_devices.size())) {
        where = body->second.output_devices[k];
      }
      b.device = where;
      b.counted = true;
      // Written in place: an input buffer of the same size on this device that no later
      // op reads becomes this output's.
      bool forwarded = false;
      if (ForwardsInput(type)) {
        for (int in = 0; in < TF_OperationNumInputs(op) && !forwarded; ++in) {
          TF_Output source = TF_OperationInput(TF_Input{op, in});
          auto it = buffer_of.find({index[source.oper], source.index});
          if (it == buffer_of.end()) continue;
          Buffer& from = buffers[it->second];
          if (&from == &b || !from.counted || from.device != where || from.bytes != bytes ||
              bytes == 0 || from.last_use != step ||
              TF_OperationOutputType(source) != dtype) {
            continue;
          }
          from.bytes = 0;  // moved: freed with this output instead
          b.bytes = bytes;
          forwarded = true;
        }
      }
      if (!forwarded) {
        b.bytes = bytes;
        live[where] += bytes;
      }
      raise_peak(where, live[where]);
    }
    if (!shapes.inputs.empty() && TF_OperationNumInputs(op) > 0) {
      const int64_t input_bytes =
          Elements(shapes.inputs[0]) *
          static_cast<int64_t>(DTypeBytes(TF_OperationOutputType(TF_OperationInput(TF_Input{op, 0}))));
      const int64_t working = WorkingBytes(op, type, input_bytes, status);
      if (working > 0) raise_peak(device, live[device] + working);
    }
    for (int f : frees[step]) {
      Buffer& b = buffers[f];
      if (b.counted) live[b.device] -= b.bytes;
      b.bytes = 0;
    }
  }
  TF_DeleteStatus(status);
  return cost;
}

}  // namespace tf_dtensor
