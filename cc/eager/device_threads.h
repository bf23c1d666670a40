// Runs per-device work at once: what TF collective ops need in eager mode, where every
// participant blocks until its whole group has arrived (TF's parallel device keeps a
// thread per device for the same reason).
#ifndef TF_DTENSOR_CC_EAGER_DEVICE_THREADS_H_
#define TF_DTENSOR_CC_EAGER_DEVICE_THREADS_H_

#include <functional>

#include "cc/core/mesh.h"

namespace tf_dtensor {

// Calls work(0), ..., work(n - 1), each on a thread of its own, and returns when all
// have returned. The threads are kept between calls (a process-wide pool that grows to
// the largest `n` asked for); calls from several threads take turns.
void RunConcurrently(int n, const std::function<void(int)>& work);

// Whether eager per-device work on `mesh` (a replay's kernels, a collective's copies) goes
// from a thread per device (TF_DTENSOR_DISPATCH_THREADS: auto, on, off; auto = meshes
// that are not CPUs).
bool DispatchOnThreads(const Mesh& mesh);

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_EAGER_DEVICE_THREADS_H_
