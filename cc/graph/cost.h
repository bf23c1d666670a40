// What one call of an expanded function costs each device, known before it runs: the
// bytes of its arguments and variables, the most bytes its intermediates hold at once,
// and the floating-point operations it does (`tf_dtensor.debug.estimate`).
//
// Read off the expanded graph itself, after the rules, relayouts and collectives have
// been planned, so the figures are those of the program that will run, with local
// (per-device) shapes:
//   - memory: the graph's ops in a topological order (the order they were built where it
//     is one), each output a buffer on its op's device from the op's inferred local shape;
//     a buffer is freed after its last reader, the function's results live to its end.
//     Ops that hand on their input's buffer allocate nothing (Identity, Reshape, reading a
//     variable, ...), and an elementwise op whose input of the same size has no later
//     reader writes in place, as TensorFlow's kernels forward such a buffer. Constants
//     are built once with the kernel and not counted. A call, If or While adds its
//     body's peak to what is live around it (an If the larger branch; a While body is
//     counted for one iteration).
//   - FLOPs: 2·m·n·k for a matrix product (MatMul, BatchMatMul, Einsum), 2 per
//     multiply-add of a convolution and its gradients, one per element of the result for
//     elementwise ops and per input element for reductions; data movement (slices,
//     concatenations, transposes, gathers, collectives) counts none.
// Where devices share buffers (virtual CPUs), a value the same on several devices is
// computed once and counted once, on the device that computes it.
#ifndef TF_DTENSOR_CC_GRAPH_COST_H_
#define TF_DTENSOR_CC_GRAPH_COST_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tensorflow/c/c_api.h"

namespace tf_dtensor {

struct DeviceCost {
  int64_t argument_bytes = 0;      // the function's tensor inputs on this device
  int64_t variable_bytes = 0;      // the blocks of the variables it reads or writes
  int64_t intermediate_bytes = 0;  // the most its own buffers hold at once (results among them)
  int64_t flops = 0;
};

struct FunctionCost {
  std::map<std::string, DeviceCost> devices;  // by full device name
  // Outputs whose size the graph does not know (a data-dependent shape): counted as 0.
  int64_t unknown_sizes = 0;
  // A loop body was counted for one iteration.
  bool has_loops = false;
};

// What the analysis needs to know of a flat input of the graph (a Placeholder).
struct InputCharge {
  std::string device;
  int64_t bytes = 0;      // a tensor's bytes, or the variable's block on `device`
  bool variable = false;  // a resource handle: `bytes` are its variable's
};

// A functional op of the graph (a call, If or While) and the costs of its bodies.
struct FunctionalCost {
  std::vector<const FunctionCost*> bodies;
  bool alternatives = false;  // If: one of the bodies runs (the larger one is counted)
  bool loop = false;          // While: cond and body, counted for one iteration
  std::vector<std::string> output_devices;  // each flat output's device
};

// The cost of one call of `graph`, whose flat inputs are `inputs` (charged as `charges`,
// same order) and results `outputs`.
FunctionCost AnalyzeCost(TF_Graph* graph, const std::vector<TF_Output>& inputs,
                         const std::vector<InputCharge>& charges,
                         const std::vector<TF_Output>& outputs,
                         const std::map<TF_Operation*, FunctionalCost>& functional);

// FLOPs of one op of `op_type` from its inputs' and outputs' local shapes (-1: unknown
// dim, then 0); `attrs` answers the op's string and bool attributes used (equation,
// transpose_a, ...). Exposed for tests.
struct OpShapes {
  std::vector<std::vector<int64_t>> inputs;
  std::vector<std::vector<int64_t>> outputs;
};
int64_t OpFlops(const std::string& op_type, const OpShapes& shapes,
                const std::map<std::string, std::string>& attrs);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_GRAPH_COST_H_
