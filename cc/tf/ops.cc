#include "cc/tf/ops.h"

#include <initializer_list>
#include <string>

#include "tensorflow/c/kernels.h"
#include "tensorflow/c/ops.h"
#include "tensorflow/c/tf_status.h"

namespace tf_dtensor {
namespace {

void SameShapeAsInput(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  TF_ShapeHandle* shape = TF_NewShapeHandle();
  TF_ShapeInferenceContextGetInput(ctx, 0, shape, status);
  if (TF_GetCode(status) == TF_OK) TF_ShapeInferenceContextSetOutput(ctx, 0, shape, status);
  TF_DeleteShapeHandle(shape);
}

void UnknownShape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  TF_ShapeInferenceContextSetUnknownShape(ctx, status);
}

void Register(const char* name, std::initializer_list<const char*> inputs,
              std::initializer_list<const char*> outputs, std::initializer_list<const char*> attrs,
              void (*shape_fn)(TF_ShapeInferenceContext*, TF_Status*), TF_Status* status) {
  TF_OpDefinitionBuilder* builder = TF_NewOpDefinitionBuilder(name);
  for (const char* spec : inputs) TF_OpDefinitionBuilderAddInput(builder, spec);
  for (const char* spec : outputs) TF_OpDefinitionBuilderAddOutput(builder, spec);
  for (const char* spec : attrs) TF_OpDefinitionBuilderAddAttr(builder, spec);
  TF_OpDefinitionBuilderSetShapeInferenceFunction(builder, shape_fn);
  TF_RegisterOpDefinition(builder, status);  // takes ownership of the builder
}

// A relayout that reaches a plain device ran outside tf_dtensor: a tf.function whose
// only DTensors are made inside it, called with no mesh in scope.
void* NoState(TF_OpKernelConstruction*) { return nullptr; }
void NoDelete(void*) {}
void RelayoutOffMesh(void*, TF_OpKernelContext* ctx) {
  TF_Status* status = TF_NewStatus();
  TF_SetStatus(status, TF_INVALID_ARGUMENT,
               "`relayout` ran on a regular device: the tf.function that holds it was called "
               "without DTensor inputs and outside any mesh, so tf_dtensor never saw it. Call "
               "the function under `dtensor.run_on(mesh)`, or pass a DTensor in. (No OpKernel "
               "was registered to support Op 'Relayout' on a regular device.)");
  TF_OpKernelContext_Failure(ctx, status);
  TF_DeleteStatus(status);
}

}  // namespace

void RegisterOps() {
  static const bool registered = [] {
    TF_Status* status = TF_NewStatus();
    Register(kPackOp, {"components: N * T"}, {"output: T"},
             {"T: type", "N: int >= 1", "layout: string"}, UnknownShape, status);
    Register(kUnpackOp, {"input: T"}, {"components: N * T"}, {"T: type", "N: int >= 1"},
             UnknownShape, status);
    Register(kRelayoutOp, {"input: T"}, {"output: T"}, {"T: type", "layout: string"},
             SameShapeAsInput, status);
    Register(kRelayoutLikeOp, {"input: T", "layout_input: U"}, {"output: T"},
             {"T: type", "U: type"}, SameShapeAsInput, status);
    Register(kFetchLayoutOp, {"input: T"}, {"layout: string"}, {"T: type"}, UnknownShape,
             status);
    for (const char* op : {kRelayoutOp, kRelayoutLikeOp}) {
      for (const char* device : {"CPU", "GPU"}) {
        TF_KernelBuilder* kernel =
            TF_NewKernelBuilder(op, device, NoState, RelayoutOffMesh, NoDelete);
        TF_RegisterKernelBuilder((std::string(op) + device).c_str(), kernel, status);
      }
    }
    TF_DeleteStatus(status);
    return true;
  }();
  (void)registered;
}

}  // namespace tf_dtensor
