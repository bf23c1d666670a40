// Reductions over some axes (input 1 holds the axes):
//   sum([x,*], axis=1) -> [x]                       (local)
//   sum([x,*], axis=0) -> partial(x) -> all-reduce -> [*]
//   mean([x,*], axis=0) -> local sum, all-reduce(sum), divide by the global count
//                          (integers: the input is first gathered along axis 0)
//   argmax([x,*], axis=0) -> the input is first gathered along axis 0 -> [*]
// keep_dims keeps reduced axes as unsharded size-1 axes.
//   l2_loss([x,y]) -> partial(x,y) -> all-reduce -> []
//   bias_add_grad([x,y]) (channels last) -> partial(x) -> all-reduce -> [y]
// Softmax and LogSoftmax normalise over the last axis; a sharded last (class) axis stays
// sharded (vocab-parallel), with two all-reduces of one value per row:
//   softmax([x,y]) -> m = all-reduce(max) over y of the local row max
//                  -> e = exp(x - m), s = all-reduce(sum) over y of the local row sum
//                  -> e / s [x,y]          (log_softmax: (x - m) - log(s))
// The softmax cross entropies do the same; the loss sums over the classes, a partial sum
// over y (all-reduced, or left pending inside tf.function), and the backprop stays sharded:
//   sparse_softmax_cross_entropy(logits [x,y], labels [x]) -> loss [x], backprop [x,y]
// (sparse labels become a local one-hot against each shard's class indices; a label out of
// range gives the loss log(sum(exp)) rather than TF's error).
// Cumsum and Cumprod scan along an axis, which they gather if sharded.
#include <limits>
#include <set>

#include "cc/core/strings.h"
#include "cc/rules/factor.h"
#include "cc/rules/local_math.h"
#include "cc/rules/row_blocks.h"
#include "cc/rules/expand.h"
#include "cc/rules/registry.h"
#include "cc/tf/dtypes.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {
namespace {

StatusOr<std::set<int>> ReducedAxes(const OpContext& ctx) {
  TFD_ASSIGN_OR_RETURN(std::vector<int64_t> axes, ctx.IntValue(1, "reduction axes"));
  const int rank = ctx.rank(0);
  std::set<int> out;
  for (int64_t a : axes) {
    if (a < -rank || a >= rank) {
      return InvalidArgument("Reduction axis " + std::to_string(a) + " is out of range for " +
                             ctx.Describe(0) + ".");
    }
    out.insert(static_cast<int>(a < 0 ? a + rank : a));
  }
  return out;
}

// Each input axis a factor; reduced axes are contracted (partial results combined with
// `op`) or, with no `op`, need replication. keep_dims keeps them as new unsharded axes.
StatusOr<FactorSpec> ReduceFactors(const OpContext& ctx, std::optional<ReduceOp> op) {
  TFD_ASSIGN_OR_RETURN(std::set<int> axes, ReducedAxes(ctx));
  const bool keep_dims = ctx.attrs->GetBool("keep_dims", false);
  FactorSpec spec;
  std::vector<int> in, out;
  for (int d = 0; d < ctx.rank(0); ++d) {
    const bool reduced = axes.count(d) > 0;
    in.push_back(spec.Add(!reduced ? FactorKind::kPassThrough
                          : op     ? FactorKind::kContracted
                                   : FactorKind::kNeedReplication));
    if (!reduced) {
      out.push_back(in.back());
    } else if (keep_dims) {
      out.push_back(FactorSpec::kNew);
    }
  }
  spec.inputs = {in, std::nullopt};
  spec.outputs = {out};
  if (op) spec.reduce = *op;
  return spec;
}

class ReduceRule : public FactorRule {
 public:
  // `op`: how partial results combine; nullopt gathers reduced axes instead.
  // An integer mean gathers its reduced axes: its quotient truncates, so neither the terms
  // nor a sum that could wrap in the narrow type give one device's answer.
  explicit ReduceRule(std::optional<ReduceOp> op, bool mean = false)
      : FactorRule([op, mean](const OpContext& ctx) {
          const bool whole = mean && IsIntegerDType(ctx.inputs[0].dtype);
          return ReduceFactors(ctx, whole ? std::nullopt : op);
        }),
        mean_(mean) {}

  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    if (!mean_ || plan.partial_dims[0].empty()) return ExpandDefault(ctx, plan, builder);
    // Mean over a sharded axis: sum locally, all-reduce, divide by the global count.
    TFD_ASSIGN_OR_RETURN(std::set<int> axes, ReducedAxes(ctx));
    std::optional<int64_t> count = 1;  // none where a reduced axis has no static size
    for (int a : axes) {
      if (ctx.inputs[0].shape[a] < 0) {
        count.reset();
        break;
      }
      *count *= ctx.inputs[0].shape[a];
    }
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> inputs, PrepareInputs(ctx, plan, builder));
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> sum,
                         builder.LocalOp("Sum", inputs, {}, plan.outputs));
    // With the plan's sum left pending (PlanOp deferred it: inside tf.function, or an
    // input already partial), each device divides its own term: sum_i(s_i) / n is
    // sum_i(s_i / n), so the quotient stays pending as the plan (and explain) says.
    bool deferred = true;
    for (int d : plan.partial_dims[0]) {
      bool found = false;
      for (const PartialSpec& p : plan.outputs[0].partial()) found = found || p.mesh_dim == d;
      deferred = deferred && found;
    }
    ValueId total = sum[0];
    if (!deferred) {
      TFD_ASSIGN_OR_RETURN(total, builder.AllReduce(sum[0], plan.partial_dims[0], ReduceOp::kSum));
    }
    LocalMath math(builder, ctx.mesh, ctx.inputs[0].dtype);
    ValueId divisor;
    if (count) {
      TFD_ASSIGN_OR_RETURN(divisor, math.Count(*count));
    } else {
      // A reduced axis of unknown size (inside a tf.function: batches of a tf.data
      // iterator, the last one partial): the count is not known while expanding (the
      // product of the static sizes, -1, gave a negative mean). Each device counts its
      // elements as it sums them (ones), and the counts are added over the mesh
      // dimensions that shard the reduced axes (not over a pending sum of the input).
      std::vector<int> sharding;
      for (int a : axes) {
        for (int d : builder.layout(inputs[0])->spec(a).mesh_dims()) sharding.push_back(d);
      }
      TFD_ASSIGN_OR_RETURN(ValueId ones, math.Apply("OnesLike", inputs[0]));
      TFD_ASSIGN_OR_RETURN(std::vector<ValueId> counts,
                           builder.LocalOp("Sum", {ones, inputs[1]}, {}, plan.outputs));
      TFD_ASSIGN_OR_RETURN(divisor, builder.AllReduce(counts[0], sharding, ReduceOp::kSum));
    }
    // The quotient has the sum's layout (after the all-reduce, or still pending). One
    // device's complex Mean of no elements is 0, where 0 / 0 is NaN (as a float Mean of
    // no elements is on one device): complex numbers divide by DivNoNan.
    const int dtype = ctx.inputs[0].dtype;
    const bool complex = dtype == TF_COMPLEX64 || dtype == TF_COMPLEX128;
    TFD_ASSIGN_OR_RETURN(ValueId mean, math.Apply(complex ? "DivNoNan" : "Div",
                                                  {total, divisor}, *builder.layout(total)));
    return std::vector<ValueId>{mean};
  }

 private:
  bool mean_;
};

// Softmax-like ops: every axis passes through; the expansion normalises a sharded last axis.
StatusOr<FactorSpec> LastAxisFactors(const OpContext& ctx) {
  FactorSpec spec;
  std::vector<int> axes = spec.AddAxes(ctx.rank(0));
  spec.inputs = {axes};
  spec.outputs.assign(ctx.num_outputs, axes);
  return spec;
}

// The mesh dimension sharding the last axis of `layout`, or -1.
int LastAxisDim(const Layout& layout) {
  return layout.rank() == 0 ? -1 : layout.spec(layout.rank() - 1).mesh_dim;
}

// The row statistics of logits `x` (layout `x_layout`, last axis sharded over `dim`):
// shifted = x - max, e = exp(shifted), sum = sum(e), all over the global row.
struct RowSoftmax {
  ValueId max, shifted, exp, sum;
};
StatusOr<RowSoftmax> ShardedRowSoftmax(ValueId x, const Layout& x_layout, int dim,
                                       LocalMath& math, Builder& builder) {
  const int last = x_layout.rank() - 1;
  std::vector<DimSpec> specs = x_layout.specs();
  specs[last] = DimSpec::Replicated();
  const Layout row = x_layout.WithSpecs(specs);
  RowSoftmax r;
  TFD_ASSIGN_OR_RETURN(ValueId max, math.Reduce("Max", x, {last}, row));
  TFD_ASSIGN_OR_RETURN(max, builder.AllReduce(max, {dim}, ReduceOp::kMax));
  r.max = max;
  TFD_ASSIGN_OR_RETURN(r.shifted, math.Apply("Sub", {x, max}, x_layout));
  TFD_ASSIGN_OR_RETURN(r.exp, math.Apply("Exp", r.shifted));
  TFD_ASSIGN_OR_RETURN(r.sum, math.Reduce("Sum", r.exp, {last}, row));
  TFD_ASSIGN_OR_RETURN(r.sum, builder.AllReduce(r.sum, {dim}, ReduceOp::kSum));
  return r;
}

// The row all-reduces of a softmax over a class axis sharded as the plan's input 0 says.
void ListRowCollectives(const OpContext& ctx, Plan& plan) {
  const int dim = plan.inputs.empty() || !plan.inputs[0] ? -1 : LastAxisDim(*plan.inputs[0]);
  if (dim < 0) return;
  const std::string over = " over " + ctx.mesh.dims()[dim].name;
  plan.notes = {"all-reduce(max) of the row max" + over,
                                "all-reduce(sum) of the row sum" + over};
}

// TF's CPU Softmax kernel of float32 and bfloat16 gives a row that holds NaN or +inf NaN
// where those are and 0 elsewhere (one device: softmax([1, nan, 2, -inf]) = [0, nan, 0,
// 0]), where the sharded exp / sum makes the whole row NaN, as the kernel of float64 and
// of float16 on some CPUs does (CpuKernelKeepsNonFiniteRowsFinite). Such a row's max is NaN or +inf (the row max
// all-reduce propagates both), and max(v, 0) * 0 is NaN exactly for NaN and +inf (and 0
// for -inf): the rows whose max says so take max(x, 0) * 0. A row of -inf alone is NaN
// through both. Log-softmax and the cross entropies make such rows NaN on one device too.
StatusOr<ValueId> AsCpuKernelOnNonFiniteRows(const Layout& x_layout, ValueId x, ValueId max,
                                             ValueId y, LocalMath& math) {
  Builder& b = math.builder();
  TFD_ASSIGN_OR_RETURN(ValueId zero, math.Float(0.0f));
  TFD_ASSIGN_OR_RETURN(ValueId row_pos, math.Apply("Maximum", {max, zero}, *b.layout(max)));
  TFD_ASSIGN_OR_RETURN(ValueId row_zero, math.Apply("Mul", {row_pos, zero}, *b.layout(max)));
  TFD_ASSIGN_OR_RETURN(ValueId bad_row,
                       math.Op("IsNan", {row_zero}, {AttrOverride::Type("T", math.type())},
                               *b.layout(max)));
  TFD_ASSIGN_OR_RETURN(ValueId x_pos, math.Apply("Maximum", {x, zero}, x_layout));
  TFD_ASSIGN_OR_RETURN(ValueId fill, math.Apply("Mul", {x_pos, zero}, x_layout));
  return math.Apply("SelectV2", {bad_row, fill, y}, x_layout);
}

// Whether TF's CPU Softmax kernel of `dtype` keeps a NaN or +inf row finite elsewhere
// (AsCpuKernelOnNonFiniteRows) on every CPU: float32's and bfloat16's do.
bool CpuKernelKeepsNonFiniteRowsFinite(int dtype) {
  return dtype == TF_FLOAT || dtype == TF_BFLOAT16;
}

// For the other dtypes the kernel's answer depends on the CPU it runs on (float16 rows
// came back NaN throughout on one machine and [0, nan, 0, 0] on another, TF 2.21 both), so
// each device asks its own kernel when it runs: whether softmax([nan, 0]) keeps its 0 (a
// replicated bool scalar).
StatusOr<ValueId> KernelKeepsNonFiniteRowsFinite(LocalMath& math) {
  Builder& b = math.builder();
  const Layout vector = Layout::Replicated(math.mesh(), 1);
  const AttrOverride type = AttrOverride::Type("T", math.type());
  TFD_ASSIGN_OR_RETURN(ValueId nan, math.Float(std::numeric_limits<float>::quiet_NaN()));
  TFD_ASSIGN_OR_RETURN(ValueId zero, math.Float(0.0f));
  TFD_ASSIGN_OR_RETURN(ValueId row, math.Op("Pack", {nan, zero},
                                            {type, AttrOverride::Int("N", 2),
                                             AttrOverride::Int("axis", 0)},
                                            vector));
  TFD_ASSIGN_OR_RETURN(ValueId softmax, math.Op("Softmax", {row}, {type}, vector));
  TFD_ASSIGN_OR_RETURN(ValueId finite, math.Op("IsFinite", {softmax}, {type}, vector));
  // Entry 0 is NaN whatever the kernel: any finite entry is the kept 0.
  TFD_ASSIGN_OR_RETURN(ValueId axis, b.HostConstant({0}, {}, TF_INT32));
  return math.Op("Any", {finite, axis},
                 {AttrOverride::Type("Tidx", TF_INT32), AttrOverride::Bool("keep_dims", false)},
                 Layout::Replicated(math.mesh(), 0));
}

class SoftmaxRule : public FactorRule {
 public:
  explicit SoftmaxRule(bool log) : FactorRule(LastAxisFactors), log_(log) {}

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    TFD_ASSIGN_OR_RETURN(Plan plan, FactorRule::Forward(ctx));
    ListRowCollectives(ctx, plan);
    return plan;
  }

  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    const Layout x_layout = (plan.inputs[0] ? *plan.inputs[0] : ctx.layout(0)).WithoutPartial();
    const int dim = LastAxisDim(x_layout);
    if (dim < 0) return ExpandDefault(ctx, plan, builder);
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> in, PrepareInputs(ctx, plan, builder));
    LocalMath math(builder, ctx.mesh, ctx.inputs[0].dtype);
    TFD_ASSIGN_OR_RETURN(RowSoftmax r, ShardedRowSoftmax(in[0], x_layout, dim, math, builder));
    if (!log_) {
      TFD_ASSIGN_OR_RETURN(ValueId y, math.Apply("RealDiv", {r.exp, r.sum}, x_layout));
      if (ctx.mesh.device_type() == "CPU") {
        TFD_ASSIGN_OR_RETURN(ValueId kept,
                             AsCpuKernelOnNonFiniteRows(x_layout, in[0], r.max, y, math));
        if (CpuKernelKeepsNonFiniteRowsFinite(ctx.inputs[0].dtype)) {
          y = kept;
        } else {
          TFD_ASSIGN_OR_RETURN(ValueId keeps, KernelKeepsNonFiniteRowsFinite(math));
          TFD_ASSIGN_OR_RETURN(y, math.Apply("SelectV2", {keeps, kept, y}, x_layout));
        }
      }
      return std::vector<ValueId>{y};
    }
    TFD_ASSIGN_OR_RETURN(ValueId log_sum, math.Apply("Log", r.sum));
    TFD_ASSIGN_OR_RETURN(ValueId y, math.Apply("Sub", {r.shifted, log_sum}, x_layout));
    return std::vector<ValueId>{y};
  }

 private:
  bool log_;
};

// SoftmaxCrossEntropyWithLogits(features [B,C], labels [B,C]) -> loss [B], backprop [B,C].
// SparseSoftmaxCrossEntropyWithLogits(features [B,C], labels [B]) -> the same outputs.
// Both axes pass through: the batch axis keeps a sharding of either input ([x,*] with
// labels [x] runs locally), and a sharded class axis makes the loss a partial sum.
// Dense labels may broadcast against the features along either axis.
StatusOr<FactorSpec> CrossEntropyFactors(const OpContext& ctx, bool sparse) {
  if (ctx.inputs.size() != 2 || ctx.rank(0) != 2 || ctx.rank(1) != (sparse ? 1 : 2)) {
    return InvalidArgument("'" + ctx.op_name + "' takes logits of rank 2 and labels of rank " +
                           (sparse ? "1" : "2") + "; got " + ctx.Describe(0) + " and " +
                           ctx.Describe(1) + ".");
  }
  FactorSpec spec;
  const int batch = spec.Add(FactorKind::kPassThrough);
  const int classes = spec.Add(FactorKind::kPassThrough);
  spec.inputs = {std::vector<int>{batch, classes},
                 sparse ? std::vector<int>{batch} : std::vector<int>{batch, classes}};
  spec.outputs = {{batch}, {batch, classes}};
  return spec;
}

class CrossEntropyRule : public FactorRule {
 public:
  explicit CrossEntropyRule(bool sparse)
      : FactorRule([sparse](const OpContext& ctx) { return CrossEntropyFactors(ctx, sparse); }),
        sparse_(sparse) {}

  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    TFD_ASSIGN_OR_RETURN(Plan plan, FactorRule::Forward(ctx));
    // The loss sums over the classes: partial over the mesh dim sharding them.
    const int dim = plan.inputs[0] ? LastAxisDim(*plan.inputs[0]) : -1;
    if (dim >= 0) plan.partial_dims[0] = {dim};
    ListRowCollectives(ctx, plan);
    return plan;
  }

  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    if (!plan.inputs[0] || LastAxisDim(*plan.inputs[0]) < 0) {
      return ExpandDefault(ctx, plan, builder);
    }
    const Layout x_layout = plan.inputs[0]->WithoutPartial();
    const int dim = LastAxisDim(x_layout);
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> in, PrepareInputs(ctx, plan, builder));
    const int type = ctx.inputs[0].dtype;
    const Layout full = plan.outputs[1].WithoutPartial();
    LocalMath math(builder, ctx.mesh, type);
    TFD_ASSIGN_OR_RETURN(RowSoftmax r, ShardedRowSoftmax(in[0], x_layout, dim, math, builder));
    ValueId labels = in[1];
    std::optional<ValueId> one_hot;
    if (sparse_) {
      ValueId ids = in[1];
      if (ctx.mesh.device_type() == "CPU") {  // a label outside [0, C) raises there
        TFD_ASSIGN_OR_RETURN(ids, CheckIds(builder, ids, ids, ctx.inputs[0].shape[1],
                                           IdRange::kInRange, ctx.op_name, x_layout, -1));
      }
      TFD_ASSIGN_OR_RETURN(one_hot, OneHot(ctx, ids, full, dim, builder));
      TFD_ASSIGN_OR_RETURN(labels, math.Cast(*one_hot, TF_BOOL, type));
    }
    TFD_ASSIGN_OR_RETURN(ValueId softmax, math.Apply("RealDiv", {r.exp, r.sum}, x_layout));
    TFD_ASSIGN_OR_RETURN(ValueId backprop, math.Apply("Sub", {softmax, labels}, full));
    // loss = sum(labels * (log(sum) - shifted)) over the row: local terms, then the classes'
    // all-reduce (unless the plan leaves it pending). Sparse labels pick the label's term
    // (a select: another class's infinite logit must not make 0 * inf = NaN of it, as
    // the one-device kernel does not).
    TFD_ASSIGN_OR_RETURN(ValueId log_sum, math.Apply("Log", r.sum));
    TFD_ASSIGN_OR_RETURN(ValueId nll, math.Apply("Sub", {log_sum, r.shifted}, x_layout));
    ValueId terms;
    if (one_hot) {
      TFD_ASSIGN_OR_RETURN(ValueId zeros, math.Apply("ZerosLike", nll));
      TFD_ASSIGN_OR_RETURN(terms, math.Apply("SelectV2", {*one_hot, nll, zeros}, full));
    } else {
      TFD_ASSIGN_OR_RETURN(terms, math.Apply("Mul", {labels, nll}, full));
    }
    TFD_ASSIGN_OR_RETURN(ValueId loss, math.Reduce("Sum", terms, {1}, plan.outputs[0],
                                                   /*keep_dims=*/false));
    if (!plan.outputs[0].is_partial()) {
      TFD_ASSIGN_OR_RETURN(loss, builder.AllReduce(loss, {dim}, ReduceOp::kSum));
    }
    return std::vector<ValueId>{loss, backprop};
  }

 private:
  // labels [B] -> labels[b] == c for the classes c of each shard: [B, C] bool, laid out as
  // `full`. Each shard compares with its own slice of the global class indices 0..C-1.
  StatusOr<ValueId> OneHot(const OpContext& ctx, ValueId labels, const Layout& full, int dim,
                           Builder& builder) const {
    const int index_type = ctx.inputs[1].dtype;
    const int64_t classes = ctx.inputs[0].shape[1];
    LocalMath ints(builder, ctx.mesh, index_type);
    TFD_ASSIGN_OR_RETURN(ValueId start, builder.HostConstant({0}, {}, index_type));
    TFD_ASSIGN_OR_RETURN(ValueId limit, builder.HostConstant({classes}, {}, index_type));
    TFD_ASSIGN_OR_RETURN(ValueId delta, builder.HostConstant({1}, {}, index_type));
    TFD_ASSIGN_OR_RETURN(ValueId all, ints.Op("Range", {start, limit, delta},
                                              {AttrOverride::Type("Tidx", index_type)},
                                              Layout::Replicated(ctx.mesh, 1)));
    TFD_ASSIGN_OR_RETURN(ValueId mine, builder.Slice(all, 0, dim));
    const Layout column = full.WithSpecs({full.spec(0), DimSpec::Replicated()});
    TFD_ASSIGN_OR_RETURN(ValueId rows, ints.Reshape(labels, {-1, 1}, column));
    return ints.Op("Equal", {rows, mine},
                   {AttrOverride::Type("T", index_type),
                    LocalMath::Bool("incompatible_shape_error", true)},
                   full);
  }

  bool sparse_;
};

// Sums over every axis that is sharded away: L2Loss (all axes) and BiasAddGrad (all but
// the channel axis). Sharded summed axes leave partial sums, all-reduced over their mesh
// dimensions; the channel axis keeps its sharding.
StatusOr<FactorSpec> SumToChannelFactors(const OpContext& ctx, bool keep_channel) {
  const int rank = ctx.rank(0);
  int channel = -1;
  if (keep_channel) {
    std::optional<std::string> format = ctx.attrs->GetString("data_format");
    channel = format && *format == "NCHW" ? 1 : rank - 1;
    if (rank < 2 || channel >= rank) {
      return InvalidArgument("'" + ctx.op_name + "' needs a value of rank 2 or more; got " +
                             ctx.Describe(0) + ".");
    }
  }
  FactorSpec spec;
  std::vector<int> in;
  for (int d = 0; d < rank; ++d) {
    in.push_back(spec.Add(d == channel ? FactorKind::kPassThrough : FactorKind::kContracted));
  }
  spec.inputs = {in};
  spec.outputs = {channel >= 0 ? std::vector<int>{in[channel]} : std::vector<int>{}};
  return spec;
}

// Cumsum(x, axis) / Cumprod / CumulativeLogsumexp: each element depends on every earlier one along the axis, so a
// sharded scan axis is gathered; other axes keep their sharding.
StatusOr<FactorSpec> ScanFactors(const OpContext& ctx) {
  TFD_ASSIGN_OR_RETURN(std::vector<int64_t> axis, ctx.IntValue(1, "axis"));
  const int rank = ctx.rank(0);
  if (axis.size() != 1 || axis[0] < -rank || axis[0] >= rank) {
    return InvalidArgument("'" + ctx.op_name + "' axis " + ShapeString(axis) +
                           " is out of range for " + ctx.Describe(0) + ".");
  }
  FactorSpec spec;
  std::vector<int> axes = spec.AddAxes(rank);
  spec.factors[axes[axis[0] < 0 ? axis[0] + rank : axis[0]]] = FactorKind::kNeedReplication;
  spec.inputs = {axes, std::nullopt};
  spec.outputs = {axes};
  return spec;
}

StatusOr<FactorSpec> BiasAddGradFactors(const OpContext& ctx) {
  return SumToChannelFactors(ctx, /*keep_channel=*/true);
}
StatusOr<FactorSpec> L2LossFactors(const OpContext& ctx) {
  return SumToChannelFactors(ctx, /*keep_channel=*/false);
}

// DebugNumericSummaryV2, which tf.debugging.enable_check_numerics puts after every float
// output inside a tf.function: a summary vector whose length its mode gives (TF infers no
// shape for it). REDUCE_INF_NAN_THREE_SLOTS (mode 8, the check's) holds -inf, +inf and NaN
// or 0 per slot, so each device summarises its block and the summaries add: [x,*] ->
// partial(x) [*] of 3 (a slot's -inf plus 0 is -inf, NaN plus anything NaN). The other
// modes count or name the whole tensor (its id, size, shape): the input is gathered.
class DebugSummaryRule : public FactorRule {
 public:
  DebugSummaryRule() : FactorRule(Spec) {}

  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> in, PrepareInputs(ctx, plan, builder));
    LocalOpOptions options;
    options.overrides = plan.overrides;
    TFD_ASSIGN_OR_RETURN(int64_t length, Length(ctx));
    options.global_shapes = {std::vector<int64_t>{length}};
    return ExpandWithInputs(ctx, plan, in, options, builder);
  }

 private:
  static constexpr int64_t kReduceInfNanThreeSlots = 8;

  // The summary's length in each mode the kernel has (TensorDebugMode).
  static StatusOr<int64_t> Length(const OpContext& ctx) {
    const int64_t mode = ctx.attrs->GetInt("tensor_debug_mode", -1);
    switch (mode) {
      case 2: return 2;   // CURT_HEALTH
      case 3: return 5;   // CONCISE_HEALTH
      case 4: return 11;  // FULL_HEALTH
      case 5: return 10;  // SHAPE
      case kReduceInfNanThreeSlots: return 3;
      default:
        return InvalidArgument("'" + ctx.op_name + "' has tensor_debug_mode " +
                               std::to_string(mode) + ", which its kernel does not " +
                               "summarise; expected 2, 3, 4, 5 or 8.");
    }
  }

  static StatusOr<FactorSpec> Spec(const OpContext& ctx) {
    TFD_RETURN_IF_ERROR(Length(ctx).status());
    const bool adds = ctx.attrs->GetInt("tensor_debug_mode", -1) == kReduceInfNanThreeSlots;
    FactorSpec spec;
    std::vector<int> in;
    for (int d = 0; d < ctx.rank(0); ++d) {
      in.push_back(spec.Add(adds ? FactorKind::kContracted : FactorKind::kNeedReplication));
    }
    spec.inputs = {in};
    spec.outputs = {{FactorSpec::kNew}};
    return spec;
  }
};

std::shared_ptr<const Rule> ReduceOver(std::optional<ReduceOp> op) {
  return std::make_shared<ReduceRule>(op);
}

// Reductions read their axes as a host value.
const RuleTraits kReduce = Traits().Host(1, HostValue::kAxis);

const bool kRegistered = RegisterRules({
    {"All", ReduceOver(std::nullopt), kReduce},
    {"Any", ReduceOver(std::nullopt), kReduce},
    {"ArgMax", ReduceOver(std::nullopt), kReduce},
    {"ArgMin", ReduceOver(std::nullopt), kReduce},
    {"BiasAddGrad", Factors(BiasAddGradFactors)},
    {"Cumprod", Factors(ScanFactors), Traits().Host(1, HostValue::kAxis)},
    {"Cumsum", Factors(ScanFactors), Traits().Host(1, HostValue::kAxis)},
    {"CumulativeLogsumexp", Factors(ScanFactors), Traits().Host(1, HostValue::kAxis)},
    {"DebugNumericSummaryV2", std::make_shared<DebugSummaryRule>()},
    {"EuclideanNorm", ReduceOver(std::nullopt), kReduce},
    {"L2Loss", Factors(L2LossFactors)},
    {"LogSoftmax", std::make_shared<SoftmaxRule>(/*log=*/true)},
    {"Max", ReduceOver(ReduceOp::kMax), Traits().Linear(Linearity::kMax).Host(1, HostValue::kAxis)},
    {"Mean", std::make_shared<ReduceRule>(ReduceOp::kSum, /*mean=*/true), kReduce},
    {"Min", ReduceOver(ReduceOp::kMin), Traits().Linear(Linearity::kMin).Host(1, HostValue::kAxis)},
    {"Prod", ReduceOver(ReduceOp::kProd), kReduce},
    {"Softmax", std::make_shared<SoftmaxRule>(/*log=*/false)},
    {"SoftmaxCrossEntropyWithLogits", std::make_shared<CrossEntropyRule>(/*sparse=*/false)},
    {"SparseSoftmaxCrossEntropyWithLogits", std::make_shared<CrossEntropyRule>(/*sparse=*/true)},
    {"Sum", ReduceOver(ReduceOp::kSum), Traits().Linear(Linearity::kSum).Host(1, HostValue::kAxis)},
});

}  // namespace
}  // namespace tf_dtensor
