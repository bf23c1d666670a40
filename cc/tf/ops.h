// tf_dtensor's own TF ops, registered through TF's C op-definition API at import:
//   TfDTensorPack(components: N*T, layout) -> T      components -> one DTensor
//   TfDTensorUnpack(input: T, N) -> N*T                DTensor -> its components
//   TfDTensorRelayout(input: T, layout) -> T           relayout / copy_to_mesh
//   TfDTensorRelayoutLike(input: T, layout_input: U) -> T   input in layout_input's layout
//   TfDTensorFetchLayout(input: T) -> string            the layout, in TF DTensor's form
// They only ever run on the DTensor device, which intercepts them; they have no kernels.
#ifndef TF_DTENSOR_CC_TF_OPS_H_
#define TF_DTENSOR_CC_TF_OPS_H_

namespace tf_dtensor {

inline constexpr char kPackOp[] = "TfDTensorPack";
inline constexpr char kUnpackOp[] = "TfDTensorUnpack";
inline constexpr char kRelayoutOp[] = "TfDTensorRelayout";
inline constexpr char kRelayoutLikeOp[] = "TfDTensorRelayoutLike";
inline constexpr char kFetchLayoutOp[] = "TfDTensorFetchLayout";

// Registers the ops once per process.
void RegisterOps();

}  // namespace tf_dtensor

#endif  // TF_DTENSOR_CC_TF_OPS_H_
