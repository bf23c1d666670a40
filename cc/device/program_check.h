// Every client of a multi-client mesh must run the same program: the same tf.functions,
// on the same input shapes and layouts, in the same order. A client that runs another
// would wait in a collective its peers never issue. Before the first run of each SPMD
// function on a mesh that spans processes (and, with TF_DTENSOR_CHECK_EAGER_COLLECTIVES,
// before each eager collective there), the clients compare what they are about to run
// through the coordination service's key-value store, and a difference is an error that
// says how the programs differ instead of a hang.
#ifndef TF_DTENSOR_CC_DEVICE_PROGRAM_CHECK_H_
#define TF_DTENSOR_CC_DEVICE_PROGRAM_CHECK_H_

#include <string>

#include "cc/core/mesh.h"
#include "cc/core/status.h"
#include "tensorflow/c/eager/c_api.h"

namespace tf_dtensor {

// Publishes `description` (what this client is about to run) as its next program step and
// compares it with every other client of `mesh`: FailedPrecondition naming both programs
// when one differs, DeadlineExceeded when a client does not reach that step within
// `TF_DTENSOR_PROGRAM_CHECK_TIMEOUT_S` seconds (default 300).
Status CheckSameProgram(TFE_Context* context, const Mesh& mesh, const std::string& description);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_DEVICE_PROGRAM_CHECK_H_
