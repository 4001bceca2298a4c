// Native ops of vllm-kunlun, in the plugin's own torch library namespace
// (torch.ops.vllm_kunlun.*), never vLLM's _C.
//
// weak_ref_tensor: a tensor that views another tensor's storage without owning it.
// vLLM's graph-capture code keeps such references to outputs so that holding them
// does not keep the memory alive. The caller guarantees the source outlives the view.
#include <torch/extension.h>
#include <torch/library.h>

namespace {

at::Tensor weak_ref_tensor(const at::Tensor& src) {
  TORCH_CHECK(src.defined(), "weak_ref_tensor: input tensor is undefined");
  // from_blob with a no-op deleter: same data pointer, sizes, strides and device,
  // no ownership of the storage. Works for any device whose memory torch can
  // address by pointer (CPU, CUDA and Kunlun's CUDA-compatible devices).
  return at::from_blob(
      src.data_ptr(), src.sizes(), src.strides(), [](void*) {},
      src.options());
}

// Meta / fake tensors have no data: return a tensor with the same metadata.
at::Tensor weak_ref_tensor_meta(const at::Tensor& src) {
  return at::empty_strided(src.sizes(), src.strides(), src.options());
}

}  // namespace

TORCH_LIBRARY(vllm_kunlun, m) {
  m.def("weak_ref_tensor(Tensor input) -> Tensor");
}

TORCH_LIBRARY_IMPL(vllm_kunlun, CPU, m) {
  m.impl("weak_ref_tensor", &weak_ref_tensor);
}

TORCH_LIBRARY_IMPL(vllm_kunlun, CUDA, m) {
  m.impl("weak_ref_tensor", &weak_ref_tensor);
}

TORCH_LIBRARY_IMPL(vllm_kunlun, Meta, m) {
  m.impl("weak_ref_tensor", &weak_ref_tensor_meta);
}

// Python imports this module to load the library; the ops live in torch.ops.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}
