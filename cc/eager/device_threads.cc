#include "cc/eager/device_threads.h"

#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace tf_dtensor {
namespace {

// One worker thread; StartExecute hands it a job, Join waits for it (as in TF's
// parallel_device DeviceThread).
class Worker {
 public:
  Worker() : thread_([this] { Loop(); }) {}
  // Never destroyed: the pool lives as long as the process (threads are not joined at
  // exit, when TF's runtime may already be gone).

  void StartExecute(std::function<void()> job) {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = std::move(job);
    done_ = false;
    cv_.notify_all();
  }
  void Join() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [this] { return done_; });
  }

 private:
  void Loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [this] { return static_cast<bool>(job_); });
        job = std::move(job_);
        job_ = nullptr;
      }
      job();
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
      cv_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::function<void()> job_;
  bool done_ = true;
  std::thread thread_;
};

}  // namespace

void RunConcurrently(int n, const std::function<void(int)>& work) {
  static std::mutex* pool_mutex = new std::mutex();
  static auto* pool = new std::vector<std::unique_ptr<Worker>>();
  std::lock_guard<std::mutex> lock(*pool_mutex);
  while (static_cast<int>(pool->size()) < n) {
    pool->push_back(std::make_unique<Worker>());
    (*pool).back()->Join();  // constructed idle
  }
  for (int i = 0; i < n; ++i) {
    (*pool)[i]->StartExecute([&work, i] { work(i); });
  }
  for (int i = 0; i < n; ++i) (*pool)[i]->Join();
}

bool DispatchOnThreads(const Mesh& mesh) {
  // TF_DTENSOR_DISPATCH_THREADS: "auto" (default) runs a replayed op's per-device kernels
  // from a thread per device (as TF's parallel device does) on meshes of accelerators,
  // where each kernel launch is host work of its own; "on" / "off" force it. On CPUs the
  // kernels' own thread pools keep the cores busy and a hand-off costs more than a small
  // op. Read per op (a getenv, far below an op's cost) so that a benchmark can compare:
  // on an H100 split into 8 (bench/gpu.py --variants), an eager sharded add took 172 us
  // with threads and 212 us without.
  const char* env = std::getenv("TF_DTENSOR_DISPATCH_THREADS");
  if (env && (std::strcmp(env, "on") == 0 || std::strcmp(env, "1") == 0)) return true;
  if (env && (std::strcmp(env, "off") == 0 || std::strcmp(env, "0") == 0)) return false;
  return mesh.device_type() != "CPU";
}

}  // namespace tf_dtensor
