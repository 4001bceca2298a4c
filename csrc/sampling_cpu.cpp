// torch.ops.vllm_kunlun.sample_rows: top-k / top-p sampling of float32 logits on the
// CPU, one token per row, reading each row about once.
//
// Why: the portable torch sampler issues 30-60 tensor operations per step and reads the
// logits 6-12 times (softmax, block sums, masks, rejection checks); a decode step of
// 256 x 152K logits is memory-bound, so its floor is one read of the logits.
//
// How, per row (the row kernels are in sampling_cpu_kernels.h):
// * One pass computes the maximum of every 64-token block (and whether the row has a
//   NaN). Nothing else reads the whole row unless top-p needs the row's mass.
// * Unfiltered draw by rejection from the block maxima: pick a block with probability
//   proportional to (tokens in block) x exp(block max - row max), a token uniformly in
//   it, and accept it with probability exp(token - block max). An accepted token
//   follows softmax(logits) exactly; a try is accepted with probability at least 1/64
//   (the block's maximum always passes), so a few tries touch a few cache lines. After
//   `max_tries` failed tries the exact inverse transform runs instead.
// * Top-k: the k-th largest block maximum is a lower bound of the k-th largest logit,
//   so the top-k tokens lie in the (about k) blocks whose maximum reaches it; those
//   blocks are scanned and the exact k-th value selected among their candidates.
//   Top-p after top-k works on the sorted kept set (k tokens).
// * Top-p without top-k: a token drawn from the whole distribution is kept when the
//   mass strictly above it is below top_p of the row's mass (the same criterion as a
//   threshold). One pass computes both masses with a cheap exp whose error is bounded
//   (1 to 1.0617 times exp); only when those bounds cannot decide does an accurate pass
//   run. A rejected row draws again from the tokens above the rejected one (the kept
//   set lies there, so an accepted token follows the kept set's distribution exactly);
//   after `rounds` rejections the exact threshold is found by sorting the tokens above
//   the last rejected one.
// Kept sets are decided on the logits (ties at a threshold are kept); masses are
// float32 exps (within a few 1e-7) summed in float64. The random numbers of a row are a
// splitmix64 stream seeded from the bits of the row's uniforms, so a row's token
// depends only on its logits, its parameters and its uniforms, never on its batch. A
// row with a NaN logit, a +inf logit or only -inf logits has no distribution and
// yields token 0 (as the portable sampler). Rows run on torch's intra-op threads.
#include <ATen/Parallel.h>
#include <torch/extension.h>
#include <torch/library.h>

#include <string>

#include "sampling_cpu_kernels.h"

namespace {

using vllm_kunlun::sampling::Row;
using vllm_kunlun::sampling::Scratch;
using vllm_kunlun::sampling::row_stream;

// The row kernels' instruction set ("avx2" or "scalar"); `force` "scalar" switches this
// process to the portable C++ kernels (what CPUs without AVX2 run: tests and benchmarks
// exercise them anywhere), "auto" back to the best the CPU has.
std::string sample_rows_isa(const c10::optional<std::string>& force) {
  if (!force.has_value()) return vllm_kunlun::sampling::kernels_isa();
  TORCH_CHECK(*force == "scalar" || *force == "auto",
              "sample_rows_isa: force must be 'scalar' or 'auto', got '", *force, "'");
  return vllm_kunlun::sampling::select_isa(*force == "scalar");
}

at::Tensor sample_rows(const at::Tensor& logits, const c10::optional<at::Tensor>& top_k,
                       const c10::optional<at::Tensor>& top_p, const at::Tensor& uniforms,
                       int64_t max_tries, int64_t rounds) {
  TORCH_CHECK(logits.device().is_cpu() && logits.scalar_type() == at::kFloat &&
                  logits.dim() == 2 && logits.stride(1) == 1 && logits.stride(0) >= 0,
              "sample_rows: logits must be a 2-D float32 CPU tensor with contiguous rows, "
              "got ", logits.scalar_type(), " ", logits.sizes(), " strides ",
              logits.strides(), " on ", logits.device());
  const int64_t batch = logits.size(0), vocab = logits.size(1);
  TORCH_CHECK(vocab > 0, "sample_rows: empty vocabulary");
  TORCH_CHECK(uniforms.device().is_cpu() && uniforms.scalar_type() == at::kFloat &&
                  uniforms.dim() == 2 && uniforms.size(0) == batch &&
                  uniforms.size(1) > 0 && uniforms.is_contiguous(),
              "sample_rows: uniforms must be a contiguous float32 CPU tensor of shape (",
              batch, ", D), got ", uniforms.scalar_type(), " ", uniforms.sizes());
  TORCH_CHECK(max_tries >= 0 && rounds >= 0,
              "sample_rows: max_tries and rounds must be >= 0");
  at::Tensor k, p;
  if (top_k.has_value()) {
    k = top_k->contiguous();
    TORCH_CHECK(k.device().is_cpu() && k.scalar_type() == at::kLong && k.dim() == 1 &&
                    k.size(0) == batch,
                "sample_rows: top_k must be an int64 CPU tensor of shape (", batch, ")");
  }
  if (top_p.has_value()) {
    p = top_p->contiguous();
    TORCH_CHECK(p.device().is_cpu() && p.scalar_type() == at::kFloat && p.dim() == 1 &&
                    p.size(0) == batch,
                "sample_rows: top_p must be a float32 CPU tensor of shape (", batch, ")");
  }
  at::Tensor out = at::empty({batch}, logits.options().dtype(at::kLong));
  const float* x = logits.data_ptr<float>();
  // Rows may repeat (stride 0, an expanded row) or be a slice of a wider buffer.
  const int64_t row_stride = logits.size(0) > 1 ? logits.stride(0) : vocab;
  const float* u = uniforms.data_ptr<float>();
  const int64_t draws = uniforms.size(1);
  const int64_t* kp = k.defined() ? k.data_ptr<int64_t>() : nullptr;
  const float* pp = p.defined() ? p.data_ptr<float>() : nullptr;
  int64_t* o = out.data_ptr<int64_t>();
  // torch's intra-op pool (OpenMP in torch's wheels; setup.py compiles this file to
  // match), one contiguous range of rows per thread.
  at::parallel_for(0, batch, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch;
    for (int64_t i = begin; i < end; ++i) {
      int64_t ki = kp ? kp[i] : vocab;
      if (ki <= 0 || ki > vocab) ki = vocab;  // no top-k
      const float pi = pp && !std::isnan(pp[i]) ? pp[i] : 1.0f;
      Row row(x + i * row_stride, vocab, row_stream(u + i * draws, draws), scratch, max_tries);
      o[i] = row.sample(ki, pi, rounds);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(vllm_kunlun, m) {
  m.def(
      "sample_rows(Tensor logits, Tensor? top_k, Tensor? top_p, Tensor uniforms, "
      "int max_tries, int rounds) -> Tensor");
  m.def("sample_rows_isa(str? force=None) -> str", &sample_rows_isa);
}

TORCH_LIBRARY_IMPL(vllm_kunlun, CPU, m) { m.impl("sample_rows", &sample_rows); }
