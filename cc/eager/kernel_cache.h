// TF's own kernels for eager local ops on CPU devices, created once and run directly.
//
// Every eager local op (one per distinct shard) used to go through TFE_Execute, which
// for each call rebuilds the op's NodeDef, looks its kernel definition up again, places
// it and, since TF 2.x runs every eager op as a function, runs a one-node function: about
// 2.9 µs an op, of which the kernel itself is a tenth. On CPU devices of this process,
// the cache keeps TensorFlow's eager kernel for each (op, attributes, device): the same
// `KernelAndDeviceOp` TF's eager runtime builds when it does not wrap ops in functions,
// created from the op's own NodeDef and run with TF's own step container, runner and
// allocator attributes. Only the dispatch around it is skipped; the kernel that runs on
// each device is the one TensorFlow would run there.
//
// An op runs through TFE_Execute instead (Run returns false) when the cache cannot be
// sure to do what TF would: a stateful op, an op with a resource or function, a device
// that is not a local CPU, an asynchronous context, an op TF rewrites before running it
// (oneDNN's eager rewrites, and its graph pass over the one-node function TFE_Execute
// runs), an input on another kind of device or of another type than the kernel's, or
// while TF logs device placement (its dispatch writes the log).
//
// This file and cc/tf/op_registry.cc include TF's C++ runtime headers (the pinned
// tensorflow 2.21 wheel's); everything else uses the C API.
#ifndef TF_DTENSOR_CC_EAGER_KERNEL_CACHE_H_
#define TF_DTENSOR_CC_EAGER_KERNEL_CACHE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "tensorflow/c/eager/c_api.h"

namespace tf_dtensor {

class KernelCache {
 public:
  KernelCache();
  ~KernelCache();
  KernelCache(const KernelCache&) = delete;
  KernelCache& operator=(const KernelCache&) = delete;

  // Runs `op` (named, placed on `device_name`, with its attributes and inputs added) with
  // its cached kernel. Returns false, with `status` untouched, when the op is not one the
  // cache runs: the caller runs it with TFE_Execute. Returns true when it ran, `status`
  // then holding the kernel's error if it failed (TF's own message and code). At most
  // `*num_outputs` results; `*num_outputs` is set to how many were made. Thread-safe.
  bool Run(TFE_Op* op, const char* device_name, TFE_TensorHandle** outputs, int* num_outputs,
           TF_Status* status);

  // Ops run here since the device was created (tests check that the path is taken).
  int64_t num_runs() const { return runs_.load(std::memory_order_relaxed); }
  // Whether the cache is used at all: TF_DTENSOR_DIRECT_KERNELS=0 turns it off (every
  // local op then runs with TFE_Execute; for A/B measurements).
  static bool Enabled();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::atomic<int64_t> runs_{0};
};

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_EAGER_KERNEL_CACHE_H_
