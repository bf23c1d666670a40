// TensorList ops, which tf.TensorArray and while_loop (its gradient accumulators) run on.
//
// A list is a scalar variant DTensor, replicated; each device holds a list of its own
// blocks of the elements. Like a DVariable's handle, the list records its elements'
// layout, global shape and dtype as handle metadata (ResourceInfo). Element ops pass the
// element layout through:
//   reserve([B,D], T) -> list (element layout not set yet: the first write sets it)
//   set_item(list, i, item [x,*]) -> list of [x,*] elements   (later items relaid out to it)
//   get_item(list of [x,*], i) -> [x,*];   pop_back likewise
//   stack(list of [x,*] of [B,D]) -> [*,x,*] of [T,B,D]       (gather likewise)
//   from_tensor(t [*,x,*]) -> list of [x,*];  from_tensor(t [x,*]) gathers axis 0 first
//   concat(list of [*,y]) -> [*,y]; split(t [*,y]) -> list of [*,y]   (axis 0 whole)
//   concat(list of [x,y]) gathers the elements' axis 0 first -> [*,y]
// The element_shape arguments of the local ops get the local element shape (-1 where the
// blocks differ in size); a list made before its element layout is known gets one of
// unknown dims, so that any block fits.
#include <algorithm>
#include <functional>

#include "cc/core/strings.h"
#include "cc/rules/expand.h"
#include "cc/rules/list_elements.h"
#include "cc/rules/registry.h"
#include "tensorflow/c/tf_datatype.h"

namespace tf_dtensor {
namespace {

using ElementInfo = ResourceInfo;

// What a list op does: its plan, the element metadata of each output that is a list,
// and, for TensorListElementShape, the value it returns.
struct ListOp {
  Plan plan;
  std::vector<std::optional<ElementInfo>> lists;  // per output
  std::optional<std::vector<int64_t>> constant;
  bool constant_is_scalar = false;  // TensorListElementShape of an unknown rank: -1
  // Per output: its global shape, where known (elements read from a list).
  std::vector<std::optional<std::vector<int64_t>>> shapes;
  // The layout the elements of the list input 0 take before the local op, if another.
  std::optional<Layout> elements_to;
};

using ListOpFn = std::function<StatusOr<ListOp>(const OpContext&)>;

// The value every element of the list this op leaves holds, where known (ResourceInfo::
// element_value): a push of a small replicated integer constant onto a list not yet
// written or holding only that constant, and a pop from such a list. Any other write
// (SetItem, a scatter, a resize that adds unset elements) forgets it.
std::optional<std::vector<int64_t>> ElementValue(const OpContext& ctx,
                                                 const std::vector<ValueId>& inputs,
                                                 Builder& builder) {
  constexpr size_t kMaxElements = 64;  // shapes and axes; larger values are not tracked
  // Eagerly an op reads the values it needs; only a function's plan needs them known.
  if (!ctx.in_function) return std::nullopt;
  const std::optional<ResourceInfo>& before =
      ctx.inputs.empty() ? std::nullopt : ctx.inputs[0].resource;
  if (ctx.op_name == "TensorListPopBack") {
    if (!before || !before->element_value || !before->value_layout.IsFullyReplicated() ||
        (before->value_dtype != TF_INT32 && before->value_dtype != TF_INT64)) {
      return std::nullopt;
    }
    return before->element_value;
  }
  if (ctx.op_name != "TensorListPushBack" || inputs.size() < 2) return std::nullopt;
  if (builder.resource(inputs[1])) return std::nullopt;
  std::optional<std::vector<int64_t>> value = builder.IntValue(inputs[1]);
  if (!value || value->size() > kMaxElements) return std::nullopt;
  int64_t elements = 1;
  for (int64_t d : ctx.inputs[1].shape) elements *= d;
  if (elements != static_cast<int64_t>(value->size())) return std::nullopt;
  if (before && before->element_value != value) return std::nullopt;
  return value;
}

class ListRule : public Rule {
 public:
  explicit ListRule(ListOpFn fn) : fn_(std::move(fn)) {}
  StatusOr<Plan> Forward(const OpContext& ctx) const override {
    TFD_ASSIGN_OR_RETURN(ListOp op, fn_(ctx));
    if (op.elements_to) {
      for (std::string& line : DescribeListRelayout(*ctx.inputs[0].resource, *op.elements_to,
                                                    "the elements of " + ctx.Describe(0))) {
        op.plan.notes.push_back("elements of list input 0: " + line);
      }
    }
    return op.plan;
  }
  StatusOr<std::vector<ValueId>> Expand(const OpContext& ctx, const Plan& plan,
                                        Builder& builder) const override {
    TFD_ASSIGN_OR_RETURN(ListOp op, fn_(ctx));
    if (op.constant) {
      const int dtype = ctx.attrs->GetType("shape_type").value_or(TF_INT32);
      const std::vector<int64_t> shape =
          op.constant_is_scalar ? std::vector<int64_t>{}
                                : std::vector<int64_t>{static_cast<int64_t>(op.constant->size())};
      TFD_ASSIGN_OR_RETURN(ValueId host, builder.HostConstant(*op.constant, shape, dtype));
      TFD_ASSIGN_OR_RETURN(ValueId out, builder.Broadcast(host, ctx.mesh));
      return std::vector<ValueId>{out};
    }
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> inputs, PrepareInputs(ctx, plan, builder));
    if (op.elements_to) {
      TFD_ASSIGN_OR_RETURN(inputs[0], RelayoutListElements(builder, inputs[0], *op.elements_to,
                                                           "the elements of " + ctx.Describe(0)));
    }
    LocalOpOptions options;
    options.global_shapes = op.shapes;
    TFD_ASSIGN_OR_RETURN(std::vector<ValueId> outs,
                         builder.LocalOp(ctx.op_name, inputs, options, plan.outputs));
    const std::optional<std::vector<int64_t>> value = ElementValue(ctx, inputs, builder);
    for (size_t o = 0; o < outs.size() && o < op.lists.size(); ++o) {
      if (!op.lists[o]) continue;
      ResourceInfo info = *op.lists[o];
      info.element_value = value;
      builder.set_resource(outs[o], std::move(info));
    }
    // The element popped from such a list is that constant (the local pop still runs, for
    // the list it leaves), so that the shapes and axes computed from it fold.
    if (value && ctx.op_name == "TensorListPopBack" && outs.size() == 2) {
      const ResourceInfo& info = *ctx.inputs[0].resource;
      TFD_ASSIGN_OR_RETURN(ValueId host,
                           builder.HostConstant(*value, info.value_shape, info.value_dtype));
      TFD_ASSIGN_OR_RETURN(outs[1], builder.Broadcast(host, ctx.mesh));
    }
    return outs;
  }

 private:
  ListOpFn fn_;
};

std::shared_ptr<const Rule> List(ListOpFn fn) { return std::make_shared<ListRule>(std::move(fn)); }

Layout ListLayout(const OpContext& ctx) { return Layout::Replicated(ctx.mesh, 0); }

// The element metadata of list input `input`, if its element layout is set.
std::optional<ElementInfo> Elements(const OpContext& ctx, int input) {
  if (input >= static_cast<int>(ctx.inputs.size())) return std::nullopt;
  return ctx.inputs[input].resource;
}

// Sets host argument `input` (an element_shape) to the local element shape of `info`, or,
// without one, to a shape of unknown dims of the same rank (an unknown rank, a scalar -1,
// stays).
void LocalizeElementShape(const OpContext& ctx, int input, const std::optional<ElementInfo>& info,
                          Plan& plan) {
  if (info) {
    plan.host_inputs[input] = LocalElementShape(*info);
  } else if (ctx.inputs[input].shape.size() == 1) {  // a vector; a scalar is kept
    plan.host_inputs[input] = std::vector<int64_t>(ctx.inputs[input].shape[0], -1);
  }
}

// A data input whose axis 0 indexes list elements: its layout with axis 0 unsharded
// (relaid out so), and the element metadata of its rows.
StatusOr<std::pair<Layout, ElementInfo>> RowsOf(const OpContext& ctx, int input) {
  const InputInfo& in = ctx.inputs[input];
  if (in.shape.empty() || !in.layout) {
    return InvalidArgument("'" + ctx.op_name + "' needs a tensor of rank 1 or more; got " +
                           ctx.Describe(input) + ".");
  }
  std::vector<DimSpec> specs = in.layout->WithoutPartial().specs();
  specs[0] = DimSpec::Replicated();
  Layout whole = in.layout->WithSpecs(specs);
  std::vector<DimSpec> element_specs(specs.begin() + 1, specs.end());
  std::vector<int64_t> element_shape(in.shape.begin() + 1, in.shape.end());
  ElementInfo info{in.layout->WithSpecs(element_specs), element_shape, in.dtype};
  return std::make_pair(whole, info);
}

std::vector<std::optional<Layout>> Unchanged(const OpContext& ctx) {
  return std::vector<std::optional<Layout>>(ctx.inputs.size(), std::nullopt);
}

// TensorListReserve(element_shape, num_elements), EmptyTensorList(element_shape,
// max_num_elements): a new list; its element layout is set by the first write.
StatusOr<ListOp> NewList(const OpContext& ctx) {
  ListOp op;
  op.plan.inputs = Unchanged(ctx);
  op.plan.outputs = {ListLayout(ctx)};
  LocalizeElementShape(ctx, 0, std::nullopt, op.plan);
  op.lists = {std::nullopt};
  return op;
}

// TensorListSetItem(list, index, item), TensorListPushBack(list, item): the item takes
// the list's element layout, or sets it.
StatusOr<ListOp> Write(const OpContext& ctx, int item) {
  ListOp op;
  op.plan.inputs = Unchanged(ctx);
  std::optional<ElementInfo> info = Elements(ctx, 0);
  const InputInfo& in = ctx.inputs[item];
  if (!info) info = ElementInfo{in.layout->WithoutPartial(), in.shape, in.dtype};
  if (info->value_layout.rank() != static_cast<int>(in.shape.size())) {
    return InvalidArgument("'" + ctx.op_name + "' writes " + ctx.Describe(item) +
                           " into a list of elements of layout " +
                           info->value_layout.ShortString() + ".");
  }
  op.plan.inputs[item] = info->value_layout;
  op.plan.outputs = {ListLayout(ctx)};
  // Elements of differing sizes (a TensorArray of infer_shape=False, which concat joins)
  // leave those sizes open: [4,3] then [6,3] -> [-1,3].
  for (size_t d = 0; d < in.shape.size(); ++d) {
    if (info->value_shape[d] != in.shape[d]) info->value_shape[d] = -1;
  }
  op.lists = {info};
  return op;
}

// TensorListGetItem(list, index, element_shape), TensorListPopBack(list, element_shape):
// an element in the list's element layout.
StatusOr<ListOp> Read(const OpContext& ctx, int shape_input, bool pop) {
  ListOp op;
  op.plan.inputs = Unchanged(ctx);
  std::optional<ElementInfo> info = Elements(ctx, 0);
  LocalizeElementShape(ctx, shape_input, info, op.plan);
  if (pop) {
    op.plan.outputs.push_back(ListLayout(ctx));
    op.lists = {info, std::nullopt};
  }
  if (info) {
    if (pop) op.shapes.push_back(std::nullopt);
    op.plan.outputs.push_back(info->value_layout);
    op.shapes.push_back(info->value_shape);
  } else if (std::optional<std::vector<int64_t>> shape = ctx.inputs[shape_input].int_value;
             shape && ctx.inputs[shape_input].shape.size() == 1) {
    op.plan.outputs.push_back(Layout::Replicated(ctx.mesh, static_cast<int>(shape->size())));
  } else if (pop) {
    return InvalidArgument("'" + ctx.op_name + "' pops from a list whose element rank is unknown.");
  }
  return op;
}

// TensorListStack(list, element_shape), TensorListGather(list, indices, element_shape):
// the elements stacked on a new unsharded axis 0; gathered indices are read whole.
StatusOr<ListOp> Stack(const OpContext& ctx, int shape_input) {
  ListOp op;
  TFD_ASSIGN_OR_RETURN(op, Read(ctx, shape_input, false));
  if (ctx.op_name == "TensorListGather") {
    op.plan.inputs[1] = Layout::Replicated(ctx.mesh, static_cast<int>(ctx.inputs[1].shape.size()));
  }
  for (Layout& out : op.plan.outputs) out = Stacked(out);
  for (auto& shape : op.shapes) {
    if (shape) shape->insert(shape->begin(), -1);
  }
  return op;
}

// TensorListFromTensor(tensor, element_shape), TensorListScatter(V2)(tensor, indices,
// element_shape, ...), TensorListSplit(tensor, element_shape, lengths): rows of a tensor
// become elements (axis 0 whole).
StatusOr<ListOp> FromRows(const OpContext& ctx, int shape_input, bool split) {
  ListOp op;
  op.plan.inputs = Unchanged(ctx);
  TFD_ASSIGN_OR_RETURN(auto rows, RowsOf(ctx, 0));
  op.plan.inputs[0] = rows.first;
  ElementInfo info = rows.second;
  if (split) {
    // Split's elements are pieces of axis 0 of unknown length.
    info.value_layout = rows.first;
    info.value_shape = ctx.inputs[0].shape;
    info.value_shape[0] = -1;
  }
  if (ctx.op_name == "TensorListScatter" || ctx.op_name == "TensorListScatterV2") {
    op.plan.inputs[1] = Layout::Replicated(ctx.mesh, static_cast<int>(ctx.inputs[1].shape.size()));
  }
  // The element_shape argument as given (a scalar -1: an unknown rank), for
  // TensorListElementShape; the local op gets the local element shape.
  const InputInfo& declared = ctx.inputs[shape_input];
  if (declared.int_value && declared.shape.empty() && declared.int_value->size() == 1 &&
      (*declared.int_value)[0] == -1) {
    info.declared_element_shape = std::optional<std::vector<int64_t>>();
  } else if (declared.int_value && declared.shape.size() == 1) {
    info.declared_element_shape = declared.int_value;
  }
  LocalizeElementShape(ctx, shape_input, info, op.plan);
  op.plan.outputs = {ListLayout(ctx)};
  op.lists = {info};
  return op;
}

// TensorListScatterIntoExistingList(list, tensor, indices).
StatusOr<ListOp> ScatterInto(const OpContext& ctx) {
  ListOp op;
  op.plan.inputs = Unchanged(ctx);
  std::optional<ElementInfo> info = Elements(ctx, 0);
  TFD_ASSIGN_OR_RETURN(auto rows, RowsOf(ctx, 1));
  if (!info) info = rows.second;
  op.plan.inputs[1] = Stacked(info->value_layout);
  op.plan.inputs[2] = Layout::Replicated(ctx.mesh, static_cast<int>(ctx.inputs[2].shape.size()));
  op.plan.outputs = {ListLayout(ctx)};
  op.lists = {info};
  return op;
}

// TensorListConcatV2(list, element_shape, leading_dims) -> (tensor, lengths): elements
// joined along their axis 0, which each element's sizes leave open:
//   concat(list of [*,y] of [4,6]) -> [*,y] of [-1,6]
// Each device joins its own blocks, so a sharded axis 0 is gathered first: the joined rows
// of blocks would interleave the elements' rows, which no layout describes.
//   concat(list of [x,y]) -> elements [x,y] -> [*,y] (all-gather) -> [*,y]
StatusOr<ListOp> Concat(const OpContext& ctx) {
  ListOp op;
  op.plan.inputs = Unchanged(ctx);
  std::optional<ElementInfo> info = Elements(ctx, 0);
  if (info && info->value_layout.rank() > 0) {
    if (info->value_layout.spec(0).sharded()) {
      std::vector<DimSpec> specs = info->value_layout.specs();
      specs[0] = DimSpec::Replicated();
      op.elements_to = info->value_layout.WithSpecs(specs);
      if (info->value_shape[0] < 0) {
        return Unimplemented("'" + ctx.op_name + "' joins elements of layout " +
                             info->value_layout.ShortString() + " and differing lengths along "
                             "their sharded axis 0; write elements with axis 0 unsharded.");
      }
      info->value_layout = *op.elements_to;
    }
    info->value_shape[0] = -1;  // any length: the element_shape of every element
  }
  LocalizeElementShape(ctx, 1, info, op.plan);
  if (info) {
    op.plan.outputs.push_back(info->value_layout);
    op.shapes.push_back(info->value_shape);  // the joined axis: of unknown length
  } else if (std::optional<std::vector<int64_t>> shape = ctx.inputs[1].int_value;
             shape && ctx.inputs[1].shape.size() == 1) {
    op.plan.outputs.push_back(Layout::Replicated(ctx.mesh, static_cast<int>(shape->size())));
  }
  op.plan.outputs.push_back(Layout::Replicated(ctx.mesh, 1));
  return op;
}

// TensorListLength(list), TensorListResize(list, size): the list passes through.
StatusOr<ListOp> PassList(const OpContext& ctx, bool list_out) {
  ListOp op;
  op.plan.inputs = Unchanged(ctx);
  op.plan.outputs = {ListLayout(ctx)};
  if (list_out) op.lists = {Elements(ctx, 0)};
  return op;
}

// TensorListElementShape(list): the element shape the list was declared with, as one
// device answers it (-1 for an unknown rank, -1 sizes where unknown), where the list's
// metadata records it; else the global element shape when the elements' metadata knows
// it; else the local op's (a list not written yet reports unknown dims).
//   element_shape(from_tensor(t [3,2], element_shape=-1)) -> -1
//   element_shape(from_tensor(t [3,2] [*,x], element_shape=[-1,2])) -> [-1,2]
// TODO(#10): a list made empty (TensorListReserve, EmptyTensorList) records no element
// metadata until its first write, which records the elements' shape alone: such a list
// answers its elements' global shape where one device answers the declared one.
StatusOr<ListOp> ElementShape(const OpContext& ctx) {
  ListOp op;
  op.plan.inputs = Unchanged(ctx);
  op.plan.outputs = {Layout::Replicated(ctx.mesh, 1)};
  std::optional<ElementInfo> info = Elements(ctx, 0);
  if (info && info->declared_element_shape) {
    const std::optional<std::vector<int64_t>>& declared = *info->declared_element_shape;
    op.constant_is_scalar = !declared;
    op.constant = declared ? *declared : std::vector<int64_t>{-1};
    if (!declared) op.plan.outputs = {Layout::Replicated(ctx.mesh, 0)};
  } else if (info && std::all_of(info->value_shape.begin(), info->value_shape.end(),
                          [](int64_t d) { return d >= 0; })) {
    op.constant = info->value_shape;
  }
  return op;
}

// A new list is a DTensor even inside tf.function with host arguments alone (it makes a
// mesh value): its element layout is set by the first write, and then each device holds
// its own blocks. Element shapes and indices are host values.
const RuleTraits kNewList =
    Traits().Host(0, HostValue::kShape).Host(1, HostValue::kCount).MakesMeshValue();
const RuleTraits kShapeAt1 = Traits().Host(1, HostValue::kShape);
const RuleTraits kShapeAt2 = Traits().Host(2, HostValue::kShape);
const RuleTraits kIndexAt1 = Traits().Host(1, HostValue::kCount);

const bool kRegistered = RegisterRules({
    {"EmptyTensorList", List(NewList), kNewList},
    {"TensorListConcatV2", List(Concat), Traits().Host(1, 2, HostValue::kShape)},
    {"TensorListElementShape", List(ElementShape)},
    {"TensorListFromTensor",
     List([](const OpContext& c) { return FromRows(c, 1, false); }),
     Traits().Host(1, HostValue::kShape).MakesMeshValue()},
    {"TensorListGather", List([](const OpContext& c) { return Stack(c, 2); }), kShapeAt2},
    {"TensorListGetItem", List([](const OpContext& c) { return Read(c, 2, false); }),
     Traits().Host(1, HostValue::kCount).Host(2, HostValue::kShape)},
    {"TensorListLength", List([](const OpContext& c) { return PassList(c, false); })},
    {"TensorListPopBack", List([](const OpContext& c) { return Read(c, 1, true); }), kShapeAt1},
    {"TensorListPushBack", List([](const OpContext& c) { return Write(c, 1); })},
    {"TensorListReserve", List(NewList), kNewList},
    {"TensorListResize", List([](const OpContext& c) { return PassList(c, true); }), kIndexAt1},
    {"TensorListScatter", List([](const OpContext& c) { return FromRows(c, 2, false); }),
     kShapeAt2},
    {"TensorListScatterIntoExistingList", List(ScatterInto)},
    {"TensorListScatterV2", List([](const OpContext& c) { return FromRows(c, 2, false); }),
     Traits().Host(2, HostValue::kShape).Host(3, HostValue::kCount)},
    {"TensorListSetItem", List([](const OpContext& c) { return Write(c, 2); }), kIndexAt1},
    {"TensorListSplit", List([](const OpContext& c) { return FromRows(c, 1, true); }),
     Traits().Host(1, 2, HostValue::kShape)},
    {"TensorListStack", List([](const OpContext& c) { return Stack(c, 1); }), kShapeAt1},
});

}  // namespace
}  // namespace tf_dtensor
