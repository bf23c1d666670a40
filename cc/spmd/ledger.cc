#include "cc/spmd/ledger.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {

size_t DTypeBytes(int dtype) {
  switch (dtype) {
    case TF_BOOL: case TF_INT8: case TF_UINT8: case TF_QINT8: case TF_QUINT8:
    case TF_FLOAT8_E5M2: case TF_FLOAT8_E4M3FN: return 1;
    case TF_HALF: case TF_BFLOAT16: case TF_INT16: case TF_UINT16: return 2;
    case TF_FLOAT: case TF_INT32: case TF_UINT32: case TF_QINT32: return 4;
    case TF_DOUBLE: case TF_INT64: case TF_UINT64: case TF_COMPLEX64: return 8;
    case TF_COMPLEX128: return 16;
    default: return 0;
  }
}

CollectiveRecord MakeCollectiveRecord(const std::string& kind, const std::string& reduction,
                                      const Layout& layout, const std::vector<int64_t>& shape,
                                      int dtype, const std::vector<int>& mesh_dims,
                                      const Layout& out) {
  CollectiveRecord r;
  r.kind = kind;
  r.reduction = reduction;
  r.mesh = layout.mesh().ShortString();
  for (int d : mesh_dims) {
    r.mesh_dims.push_back(layout.mesh().dims()[d].name);
    r.group_size *= static_cast<int>(layout.mesh().DimSize(d));
  }
  r.layout_in = layout.SpecString();
  r.layout_out = out.SpecString();
  r.shape = shape;
  r.dtype = dtype;
  // The input block: the first (largest) block of the layout; unknown sizes count 0.
  int64_t elements = 1;
  StatusOr<std::vector<int64_t>> local = layout.LocalShape(shape, "a collective's value");
  for (int64_t d : local.ok() ? *local : shape) elements *= d < 0 ? 0 : d;
  r.block_bytes = elements * static_cast<int64_t>(DTypeBytes(dtype));
  const int64_t g = r.group_size;
  if (kind == "all-gather") {
    // The most any device receives: its gathered block less its own. (g-1)*B where the
    // blocks are even; less where they are not ([5] over 4: blocks 2, 2, 1, 0, and the
    // device with none receives 5 elements, not 3*2).
    r.bytes_per_device = (g - 1) * r.block_bytes;
    if (local.ok() && out.rank() == layout.rank() &&
        std::none_of(shape.begin(), shape.end(), [](int64_t n) { return n < 0; }) &&
        !layout.IsEven(shape)) {
      int64_t most = 0;
      for (int d = 0; d < layout.mesh().num_local_devices(); ++d) {
        int64_t own = 1, gathered = 1;
        for (int64_t n : layout.GeometryOfDevice(shape, d).shape) own *= n;
        for (int64_t n : out.GeometryOfDevice(shape, d).shape) gathered *= n;
        most = std::max(most, gathered - own);
      }
      r.bytes_per_device = most * static_cast<int64_t>(DTypeBytes(dtype));
    }
  } else if (kind == "all-reduce") {
    r.bytes_per_device = 2 * (g - 1) * r.block_bytes / g;
  } else {  // reduce-scatter, all-to-all
    r.bytes_per_device = (g - 1) * r.block_bytes / g;
  }
  r.op = ledger::CurrentOp();
  r.requested = ledger::CurrentOpIsRelayout();
  return r;
}

namespace ledger {
namespace {

std::atomic<int> open_ledgers{0};
// Ledgers open on this thread. A collective issued on a thread with a ledger of its own
// goes to that thread's ledgers only, as a `debug.collectives()` block (a scope, like
// TensorFlow's device scopes) is per thread; one issued on a thread without (TensorFlow's
// executor threads, another Python thread) goes to every open ledger.
thread_local int ledgers_on_this_thread = 0;
std::mutex mu;
struct Noted {
  CollectiveRecord record;
  std::optional<std::thread::id> owner;  // the issuing thread, when it has a ledger open
};
std::vector<Noted>& Records() {
  static auto* records = new std::vector<Noted>();
  return *records;
}
const std::string& Empty() {
  static const auto* empty = new std::string();
  return *empty;
}
thread_local const std::string* current_op = nullptr;
thread_local bool current_is_relayout = false;

}  // namespace

bool Active() { return open_ledgers.load(std::memory_order_relaxed) > 0; }

int64_t Begin() {
  std::lock_guard<std::mutex> lock(mu);
  open_ledgers.fetch_add(1);
  ++ledgers_on_this_thread;
  return static_cast<int64_t>(Records().size());
}

std::vector<CollectiveRecord> End(int64_t start) {
  std::lock_guard<std::mutex> lock(mu);
  std::vector<Noted>& all = Records();
  std::vector<CollectiveRecord> mine;
  const std::thread::id me = std::this_thread::get_id();
  if (start >= 0 && start <= static_cast<int64_t>(all.size())) {
    for (auto it = all.begin() + start; it != all.end(); ++it) {
      if (!it->owner || *it->owner == me) mine.push_back(it->record);
    }
  }
  if (ledgers_on_this_thread > 0) --ledgers_on_this_thread;
  if (open_ledgers.fetch_sub(1) == 1) all.clear();
  return mine;
}

namespace {
std::mutex line_source_mu;
std::shared_ptr<const std::function<std::string()>> line_source;
}  // namespace

void SetLineSource(std::function<std::string()> source) {
  std::lock_guard<std::mutex> lock(line_source_mu);
  line_source = source ? std::make_shared<const std::function<std::string()>>(std::move(source))
                       : nullptr;
}

void Record(CollectiveRecord record) {
  if (!Active()) return;
  if (record.line.empty()) {
    std::shared_ptr<const std::function<std::string()>> source;
    {
      std::lock_guard<std::mutex> lock(line_source_mu);
      source = line_source;
    }
    if (source) record.line = (*source)();  // outside `mu`: the source may take the GIL
  }
  std::optional<std::thread::id> owner;
  if (ledgers_on_this_thread > 0) owner = std::this_thread::get_id();
  std::lock_guard<std::mutex> lock(mu);
  if (open_ledgers.load() > 0) Records().push_back(Noted{std::move(record), owner});
}

OpScope::OpScope(const std::string& op, bool relayout)
    : saved_(current_op), saved_relayout_(current_is_relayout) {
  current_op = &op;
  current_is_relayout = relayout;
}
OpScope::~OpScope() {
  current_op = saved_;
  current_is_relayout = saved_relayout_;
}

bool CurrentOpIsRelayout() { return current_is_relayout; }

const std::string& CurrentOp() { return current_op ? *current_op : Empty(); }

namespace {
std::mutex testing_mu;
std::string& DroppedOp() {
  static auto* op = new std::string();
  return *op;
}
std::atomic<bool> dropping{false};
}  // namespace

void SetDroppedAllReduceForTesting(const std::string& op) {
  std::lock_guard<std::mutex> lock(testing_mu);
  DroppedOp() = op;
  dropping.store(!op.empty());
}

bool DropsAllReduceForTesting(const std::string& op) {
  if (!dropping.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> lock(testing_mu);
  return op == DroppedOp();
}

}  // namespace ledger
}  // namespace tf_dtensor
