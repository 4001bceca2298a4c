// Row kernels of torch.ops.vllm_kunlun.sample_rows (sampling_cpu.cpp). No torch types,
// so they build and time on their own. The algorithm is described in sampling_cpu.cpp.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#define VLLM_KUNLUN_X86 1
#endif

namespace vllm_kunlun::sampling {

constexpr int64_t kBlock = 64;
constexpr float kInf = std::numeric_limits<float>::infinity();
// A weight exp(x - max) below exp(kExpFloor) (about 1.6e-38) counts as 0 when drawing.
constexpr float kExpFloor = -87.0f;
constexpr float kLog2e = 1.44269504088896341f;

// ---- random numbers -----------------------------------------------------------------

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// splitmix64: the row's random numbers.
struct Stream {
  uint64_t state;
  // Uniform double in [0, 1) with 53 random bits.
  double next() {
    state += 0x9E3779B97F4A7C15ULL;
    return static_cast<double>(mix64(state) >> 11) * 0x1.0p-53;
  }
};

// The stream of a row: seeded from the bits of its uniforms.
inline Stream row_stream(const float* u, int64_t n) {
  uint64_t s = 0x243F6A8885A308D3ULL;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, u + i, sizeof(bits));
    s = mix64(s ^ (static_cast<uint64_t>(bits) + (static_cast<uint64_t>(i) << 32)));
  }
  return Stream{s};
}

// ---- portable kernels -------------------------------------------------------------------

// Masses of a row: total = sum of exp(x - m); mass = the part with x > above.
// `only_above`: blocks whose maximum is not above `above` are skipped (total is then
// not the row's total).
struct Masses {
  double total;
  double mass;
};

inline float weight_of(float x, float m) {
  const float y = x - m;
  return y >= kExpFloor ? std::exp(y) : 0.0f;
}

// Block maxima of a row; true when the row has a NaN.
inline bool block_max_scalar(const float* x, int64_t vocab, float* bmax) {
  bool nan = false;
  for (int64_t start = 0, b = 0; start < vocab; start += kBlock, ++b) {
    const int64_t end = std::min(vocab, start + kBlock);
    float m = -kInf;
    for (int64_t j = start; j < end; ++j) {
      nan |= std::isnan(x[j]);
      m = x[j] > m ? x[j] : m;
    }
    bmax[b] = m;
  }
  return nan;
}

inline Masses masses_scalar(const float* x, int64_t vocab, const float* bmax, float m,
                            float above, bool only_above) {
  Masses out{0.0, 0.0};
  for (int64_t start = 0, b = 0; start < vocab; start += kBlock, ++b) {
    if (only_above && !(bmax[b] > above)) continue;
    const int64_t end = std::min(vocab, start + kBlock);
    for (int64_t j = start; j < end; ++j) {
      const float e = weight_of(x[j], m);
      out.total += e;
      if (x[j] > above) out.mass += e;
    }
  }
  return out;
}

// How many of x[0, n) are >= lo.
inline int64_t count_at_least_scalar(const float* x, int64_t n, float lo) {
  int64_t c = 0;
  for (int64_t j = 0; j < n; ++j) c += x[j] >= lo;
  return c;
}

inline void exps_scalar(const float* x, int64_t n, float m, float* out) {
  for (int64_t j = 0; j < n; ++j) out[j] = weight_of(x[j], m);
}

#if VLLM_KUNLUN_X86

__attribute__((target("avx2,fma"))) inline float hmax(__m256 v) {
  __m128 lo = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_max_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_max_ss(lo, _mm_shuffle_ps(lo, lo, 1));
  return _mm_cvtss_f32(lo);
}

__attribute__((target("avx2,fma"))) inline double hsum(__m256 v) {
  const __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m256d d = _mm256_cvtps_pd(lo);
  __m128d s = _mm_add_pd(_mm256_castpd256_pd128(d), _mm256_extractf128_pd(d, 1));
  s = _mm_add_sd(s, _mm_unpackhi_pd(s, s));
  return _mm_cvtsd_f64(s);
}

// exp(x - m) for 8 lanes, x - m clamped at kExpFloor: 2^t with t = (x - m) log2(e) split into round(t) and f in [-1/2, 1/2]; 2^f by its Taylor
// series to degree 6 (truncation below 1.3e-7), the integer part added to the exponent
// bits. Within a few 1e-7 of exp for the weights that matter (|t| small); t's own
// rounding adds up to 7e-6 relative for weights near exp(kExpFloor).
struct ExpConsts {
  __m256 m, floor, scale, magic;
};

__attribute__((target("avx2,fma"))) inline ExpConsts exp_consts(float m) {
  return {_mm256_set1_ps(m), _mm256_set1_ps(kExpFloor), _mm256_set1_ps(kLog2e),
          _mm256_set1_ps(12582912.0f)};
}

// x - m is rounded once (relative to itself), so large logits (a low temperature) lose
// no accuracy; it is clamped at kExpFloor.
__attribute__((target("avx2,fma"))) inline __m256 exp_shifted(__m256 x, const ExpConsts& c) {
  const __m256 y = _mm256_max_ps(_mm256_sub_ps(x, c.m), c.floor);
  const __m256 t = _mm256_mul_ps(y, c.scale);
  const __m256 rounded = _mm256_add_ps(t, c.magic);  // round to nearest in the low bits
  const __m256 f = _mm256_sub_ps(t, _mm256_sub_ps(rounded, c.magic));
  __m256 p = _mm256_set1_ps(1.5403530393381606e-4f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.3333558146428441e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.6181291076284772e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.5504108664821576e-2f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.4022650695910071e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.9314718055994531e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  const __m256i n = _mm256_slli_epi32(_mm256_castps_si256(rounded), 23);
  return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), n));
}

// A bound-certified cheap exp(x - m): the float whose bits are (t + 127) * 2^23,
// i.e. 2^floor(t) * (1 + frac(t)). Since 1 + f >= 2^f on [0, 1), it is >= exp and at
// most 1.0616 times it (at f = 1/ln2 - 1); float rounding of t moves it by < 1e-4.
constexpr double kApproxLow = 1.0 - 1e-4;
constexpr double kApproxHigh = 1.0616 + 1e-4;
// Up to this |row max| the shift is folded into one fma: the folded constant's rounding
// stays below 256 units of 2^-23 (3e-5 relative); beyond it x - m is taken first.
constexpr float kFoldedMax = 512.0f;

struct ApproxConsts {
  __m256 m, floor, scale, bias, folded_bias, folded_floor;
};

__attribute__((target("avx2,fma"))) inline ApproxConsts approx_consts(float m) {
  const double scale = static_cast<double>(kLog2e) * 8388608.0;
  const double bias = 127.0 * 8388608.0;
  return {_mm256_set1_ps(m),
          _mm256_set1_ps(kExpFloor),
          _mm256_set1_ps(static_cast<float>(scale)),
          _mm256_set1_ps(static_cast<float>(bias)),
          _mm256_set1_ps(static_cast<float>(bias - static_cast<double>(m) * scale)),
          _mm256_set1_ps(m + kExpFloor)};
}

template <bool kFolded>
__attribute__((target("avx2,fma"))) inline __m256 exp_approx(__m256 x, const ApproxConsts& c) {
  if (kFolded) {
    const __m256 t = _mm256_fmadd_ps(_mm256_max_ps(x, c.folded_floor), c.scale, c.folded_bias);
    return _mm256_castsi256_ps(_mm256_cvtps_epi32(t));
  }
  const __m256 y = _mm256_max_ps(_mm256_sub_ps(x, c.m), c.floor);
  return _mm256_castsi256_ps(_mm256_cvtps_epi32(_mm256_fmadd_ps(y, c.scale, c.bias)));
}

__attribute__((target("avx2,fma"))) inline bool block_max_avx2(const float* x, int64_t vocab,
                                                               float* bmax) {
  const int64_t full = vocab / kBlock;
  __m256 nan = _mm256_setzero_ps();
  for (int64_t b = 0; b < full; ++b) {
    const float* p = x + b * kBlock;
    const __m256 v0 = _mm256_loadu_ps(p), v1 = _mm256_loadu_ps(p + 8);
    const __m256 v2 = _mm256_loadu_ps(p + 16), v3 = _mm256_loadu_ps(p + 24);
    const __m256 v4 = _mm256_loadu_ps(p + 32), v5 = _mm256_loadu_ps(p + 40);
    const __m256 v6 = _mm256_loadu_ps(p + 48), v7 = _mm256_loadu_ps(p + 56);
    // An unordered compare flags a NaN in either operand.
    nan = _mm256_or_ps(nan, _mm256_or_ps(_mm256_cmp_ps(v0, v1, _CMP_UNORD_Q),
                                         _mm256_cmp_ps(v2, v3, _CMP_UNORD_Q)));
    nan = _mm256_or_ps(nan, _mm256_or_ps(_mm256_cmp_ps(v4, v5, _CMP_UNORD_Q),
                                         _mm256_cmp_ps(v6, v7, _CMP_UNORD_Q)));
    const __m256 m = _mm256_max_ps(
        _mm256_max_ps(_mm256_max_ps(v0, v1), _mm256_max_ps(v2, v3)),
        _mm256_max_ps(_mm256_max_ps(v4, v5), _mm256_max_ps(v6, v7)));
    bmax[b] = hmax(m);
  }
  bool tail_nan = false;
  if (full * kBlock < vocab) {
    tail_nan = block_max_scalar(x + full * kBlock, vocab - full * kBlock, bmax + full);
  }
  return tail_nan || _mm256_movemask_ps(nan) != 0;
}

// Which exp the masses use.
enum class ExpKind { kAccurate, kApproxFolded, kApprox };

template <ExpKind kKind>
__attribute__((target("avx2,fma"))) inline __m256 exp_of(__m256 v, const ExpConsts& ce,
                                                         const ApproxConsts& ca) {
  if (kKind == ExpKind::kAccurate) return exp_shifted(v, ce);
  return exp_approx<kKind == ExpKind::kApproxFolded>(v, ca);
}

// Float accumulators are summed into float64 every kFlushBlocks blocks (512 tokens:
// 64 float additions per lane, a relative error of at most a few 1e-6).
constexpr int64_t kFlushBlocks = 8;

template <ExpKind kKind>
__attribute__((target("avx2,fma"))) inline Masses masses_kind(const float* x, int64_t vocab,
                                                              const float* bmax, float m,
                                                              float above, bool only_above) {
  const int64_t full = vocab / kBlock;
  const ExpConsts ce = exp_consts(m);
  const ApproxConsts ca = approx_consts(m);
  const __m256 va = _mm256_set1_ps(above);
  Masses out{0.0, 0.0};
  __m256 z0 = _mm256_setzero_ps(), z1 = _mm256_setzero_ps();
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  for (int64_t b = 0; b < full; ++b) {
    if (!only_above || bmax[b] > above) {
      const float* p = x + b * kBlock;
      for (int j = 0; j < kBlock; j += 16) {
        const __m256 v0 = _mm256_loadu_ps(p + j), v1 = _mm256_loadu_ps(p + j + 8);
        const __m256 e0 = exp_of<kKind>(v0, ce, ca), e1 = exp_of<kKind>(v1, ce, ca);
        z0 = _mm256_add_ps(z0, e0);
        z1 = _mm256_add_ps(z1, e1);
        a0 = _mm256_add_ps(a0, _mm256_and_ps(e0, _mm256_cmp_ps(v0, va, _CMP_GT_OQ)));
        a1 = _mm256_add_ps(a1, _mm256_and_ps(e1, _mm256_cmp_ps(v1, va, _CMP_GT_OQ)));
      }
    }
    if (b % kFlushBlocks == kFlushBlocks - 1 || b == full - 1) {
      out.total += hsum(_mm256_add_ps(z0, z1));
      out.mass += hsum(_mm256_add_ps(a0, a1));
      z0 = z1 = a0 = a1 = _mm256_setzero_ps();
    }
  }
  if (full * kBlock < vocab && (!only_above || bmax[full] > above)) {
    // The short last block through the same formula, padded with weightless lanes.
    float buf[kBlock];
    const int64_t n = vocab - full * kBlock;
    for (int64_t j = 0; j < kBlock; ++j) buf[j] = j < n ? x[full * kBlock + j] : -kInf;
    for (int j = 0; j < kBlock; j += 8) {
      const __m256 v = _mm256_loadu_ps(buf + j);
      __m256 e = exp_of<kKind>(v, ce, ca);
      e = _mm256_and_ps(e, _mm256_cmp_ps(v, _mm256_set1_ps(-kInf), _CMP_GT_OQ));
      out.total += hsum(e);
      out.mass += hsum(_mm256_and_ps(e, _mm256_cmp_ps(v, va, _CMP_GT_OQ)));
    }
  }
  return out;
}

__attribute__((target("avx2,fma"))) inline Masses masses_exact_avx2(
    const float* x, int64_t vocab, const float* bmax, float m, float above, bool only_above) {
  return masses_kind<ExpKind::kAccurate>(x, vocab, bmax, m, above, only_above);
}

__attribute__((target("avx2,fma"))) inline Masses masses_approx_avx2(
    const float* x, int64_t vocab, const float* bmax, float m, float above, bool only_above) {
  if (std::fabs(m) <= kFoldedMax) {
    return masses_kind<ExpKind::kApproxFolded>(x, vocab, bmax, m, above, only_above);
  }
  return masses_kind<ExpKind::kApprox>(x, vocab, bmax, m, above, only_above);
}

// exp(x - m) of n values into out; 0 below kExpFloor (never drawn).
__attribute__((target("avx2,fma"))) inline void exps_avx2(const float* x, int64_t n, float m,
                                                          float* out) {
  const ExpConsts c = exp_consts(m);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 v = _mm256_loadu_ps(x + j);
    const __m256 keep = _mm256_cmp_ps(_mm256_sub_ps(v, c.m), c.floor, _CMP_GE_OQ);
    _mm256_storeu_ps(out + j, _mm256_and_ps(exp_shifted(v, c), keep));
  }
  if (j < n) {
    float in[8], res[8];
    for (int i = 0; i < 8; ++i) in[i] = j + i < n ? x[j + i] : -kInf;
    const __m256 v = _mm256_loadu_ps(in);
    const __m256 keep = _mm256_cmp_ps(_mm256_sub_ps(v, c.m), c.floor, _CMP_GE_OQ);
    _mm256_storeu_ps(res, _mm256_and_ps(exp_shifted(v, c), keep));
    for (int64_t i = j; i < n; ++i) out[i] = res[i - j];
  }
}

__attribute__((target("avx2,fma"))) inline int64_t count_at_least_avx2(const float* x,
                                                                       int64_t n, float lo) {
  const __m256 vl = _mm256_set1_ps(lo);
  __m256i c0 = _mm256_setzero_si256(), c1 = _mm256_setzero_si256();
  int64_t j = 0;
  // Lanes count down by 1 per hit (a true compare is -1); at most 2^31 per lane.
  for (; j + 16 <= n; j += 16) {
    c0 = _mm256_add_epi32(c0, _mm256_castps_si256(_mm256_cmp_ps(
                                  _mm256_loadu_ps(x + j), vl, _CMP_GE_OQ)));
    c1 = _mm256_add_epi32(c1, _mm256_castps_si256(_mm256_cmp_ps(
                                  _mm256_loadu_ps(x + j + 8), vl, _CMP_GE_OQ)));
  }
  int32_t lanes[8];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(lanes), _mm256_add_epi32(c0, c1));
  int64_t c = 0;
  for (int i = 0; i < 8; ++i) c -= lanes[i];
  return c + count_at_least_scalar(x + j, n - j, lo);
}

#endif  // VLLM_KUNLUN_X86

// The kernels this CPU runs. `approx_low` / `approx_high`: the certified ratio range
// of masses_approx to the exact masses (1, 1 when it is the exact kernel).
struct Kernels {
  bool (*block_max)(const float*, int64_t, float*);
  Masses (*masses_exact)(const float*, int64_t, const float*, float, float, bool);
  Masses (*masses_approx)(const float*, int64_t, const float*, float, float, bool);
  void (*exps)(const float*, int64_t, float, float*);
  int64_t (*count_at_least)(const float*, int64_t, float);
  double approx_low;
  double approx_high;
  // Weight of one token, the same formula as `exps`.
  float weight(float x, float m) const {
    float out;
    exps(&x, 1, m, &out);
    return out;
  }
};

inline const Kernels& scalar_kernels() {
  static const Kernels k{block_max_scalar, masses_scalar,         masses_scalar, exps_scalar,
                         count_at_least_scalar, 1.0, 1.0};
  return k;
}

// The vector kernels where the CPU has them, else nullptr.
inline const Kernels* vector_kernels() {
#if VLLM_KUNLUN_X86
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    static const Kernels k{block_max_avx2,      masses_exact_avx2, masses_approx_avx2,
                           exps_avx2,           count_at_least_avx2, kApproxLow,
                           kApproxHigh};
    return &k;
  }
#endif
  return nullptr;
}

// The kernels rows use: the vector ones where available, unless force_scalar() asked
// for the portable C++ ones (tests and benchmarks of the fallback on any CPU).
inline std::atomic<const Kernels*>& active_kernels() {
  static std::atomic<const Kernels*> active{vector_kernels() ? vector_kernels()
                                                             : &scalar_kernels()};
  return active;
}

inline const Kernels& kernels() { return *active_kernels().load(); }

inline const char* kernels_isa() {
  return &kernels() == &scalar_kernels() ? "scalar" : "avx2";
}

// "avx2" or "scalar": what rows use now. `scalar` true: the portable C++ kernels from
// now on; false: the best this CPU has.
inline const char* select_isa(bool scalar) {
  const Kernels* best = vector_kernels();
  active_kernels().store(scalar || best == nullptr ? &scalar_kernels() : best);
  return kernels_isa();
}

// ---- one row ----------------------------------------------------------------------------

struct Candidate {
  float value;
  int64_t index;
};

// Descending value; ties by index (a deterministic order).
inline bool before(const Candidate& a, const Candidate& b) {
  return a.value > b.value || (a.value == b.value && a.index < b.index);
}

// Buffers reused across the rows one thread samples.
struct Scratch {
  std::vector<float> bmax;
  std::vector<float> weight;
  std::vector<double> cum;
  std::vector<float> values;  // selection scratch, then the candidates' logits
  std::vector<Candidate> cand;
  std::vector<float> cand_weight;
  std::vector<double> cand_cum;
};

// What decides a top-p test: the mass above the token against p of the row's mass,
// each known exactly or within the approximate kernel's bounds.
struct Estimate {
  double value;
  bool exact;
};

class Row {
 public:
  Row(const float* x, int64_t vocab, Stream stream, Scratch& s, int64_t max_tries)
      : x_(x), vocab_(vocab), nblocks_((vocab + kBlock - 1) / kBlock), rng_(stream),
        s_(s), k_(kernels()), max_tries_(max_tries) {}

  // The token for top_k (>= vocab: none) and top_p (>= 1: none).
  int64_t sample(int64_t top_k, float top_p, int64_t rounds) {
    s_.bmax.resize(nblocks_);
    if (k_.block_max(x_, vocab_, s_.bmax.data())) return 0;  // NaN
    m_ = *std::max_element(s_.bmax.begin(), s_.bmax.end());
    if (!(m_ > -kInf) || m_ == kInf) return 0;  // all -inf, or +inf: no distribution
    if (top_k < vocab_) return top_k_row(top_k, top_p);
    if (top_p < 1.0f) return top_p_row(top_p, rounds);
    return draw_above(-kInf);
  }

 private:
  int64_t block_size(int64_t b) const { return std::min(kBlock, vocab_ - b * kBlock); }

  float weight(float v) const { return k_.weight(v, m_); }

  // A token with logit > lo, drawn from softmax restricted to them.
  int64_t draw_above(float lo) {
    const int64_t drawn = reject_above(lo);
    return drawn >= 0 ? drawn : exact_above(lo);
  }

  // Proposal weights (tokens in block) x exp(block max - row max) of the blocks whose
  // maximum is above lo, cumulated in s_.cum; returns the total.
  double proposal(float lo) {
    const int64_t nb = nblocks_;
    s_.weight.resize(nb);
    s_.cum.resize(nb);
    k_.exps(s_.bmax.data(), nb, m_, s_.weight.data());
    double total = 0.0;
    for (int64_t b = 0; b < nb; ++b) {
      if (s_.bmax[b] > lo) total += static_cast<double>(s_.weight[b]) * block_size(b);
      s_.cum[b] = total;
    }
    proposal_total_ = total;
    return total;
  }

  // Rejection from the block maxima; -1 after max_tries_ tries.
  int64_t reject_above(float lo) {
    const double total = proposal(lo);
    if (!(total > 0.0)) return -1;
    const int64_t nb = nblocks_;
    for (int64_t t = 0; t < max_tries_; ++t) {
      const double target = rng_.next() * total;
      int64_t b = std::upper_bound(s_.cum.begin(), s_.cum.end(), target) - s_.cum.begin();
      b = std::min(b, nb - 1);
      const int64_t n = block_size(b);
      const int64_t j =
          b * kBlock + std::min(n - 1, static_cast<int64_t>(rng_.next() * n));
      const float v = x_[j];
      if (!(v > lo)) continue;
      if (rng_.next() < std::exp(static_cast<double>(v) - s_.bmax[b])) return j;
    }
    return -1;
  }

  // Inverse transform over every token > lo: two passes over the blocks that hold one
  // (the fallback of reject_above, and what max_tries = 0 runs).
  int64_t exact_above(float lo) {
    float e[kBlock];
    std::vector<double>& sums = s_.cum;
    sums.assign(nblocks_, 0.0);
    double total = 0.0;
    for (int64_t b = 0; b < nblocks_; ++b) {
      if (!(s_.bmax[b] > lo)) continue;
      const int64_t n = block_size(b);
      k_.exps(x_ + b * kBlock, n, m_, e);
      double sum = 0.0;
      for (int64_t j = 0; j < n; ++j) sum += x_[b * kBlock + j] > lo ? e[j] : 0.0f;
      sums[b] = sum;
      total += sum;
    }
    if (!(total > 0.0)) return 0;
    double target = rng_.next() * total;
    int64_t last = 0;
    for (int64_t b = 0; b < nblocks_; ++b) {
      if (sums[b] <= 0.0) continue;
      const int64_t n = block_size(b);
      k_.exps(x_ + b * kBlock, n, m_, e);
      for (int64_t j = 0; j < n; ++j) {
        if (!(x_[b * kBlock + j] > lo) || e[j] <= 0.0f) continue;
        last = b * kBlock + j;
        if (target < e[j]) return last;
        target -= e[j];
      }
    }
    return last;  // rounding ran past the end: the last token with weight
  }

  // The weights of s_.cand[0, n) into s_.cand_weight, by the vector exp.
  void weigh(int64_t n) {
    s_.values.resize(n);
    s_.cand_weight.resize(n);
    for (int64_t i = 0; i < n; ++i) s_.values[i] = s_.cand[i].value;
    k_.exps(s_.values.data(), n, m_, s_.cand_weight.data());
  }

  // Draw among s_.cand[0, n) by their weights (weigh() has run).
  int64_t draw_candidates(int64_t n) {
    double total = 0.0;
    s_.cand_cum.resize(n);
    for (int64_t i = 0; i < n; ++i) {
      total += s_.cand_weight[i];
      s_.cand_cum[i] = total;
    }
    if (!(total > 0.0)) return 0;
    const double target = rng_.next() * total;
    int64_t i = std::upper_bound(s_.cand_cum.begin(), s_.cand_cum.begin() + n, target) -
                s_.cand_cum.begin();
    i = std::min(i, n - 1);
    while (i > 0 && s_.cand_weight[i] <= 0.0f) --i;
    return s_.cand[i].index;
  }

  // The k-th largest block maximum (k <= nblocks_): a lower bound of the k-th largest
  // logit. A min-heap of the k largest seen: most maxima cost one comparison.
  float kth_block_max(int64_t k) {
    std::vector<float>& heap = s_.values;
    heap.assign(s_.bmax.begin(), s_.bmax.begin() + k);
    std::make_heap(heap.begin(), heap.end(), std::greater<float>());
    for (int64_t b = k; b < nblocks_; ++b) {
      const float v = s_.bmax[b];
      if (v > heap.front()) {
        std::pop_heap(heap.begin(), heap.end(), std::greater<float>());
        heap.back() = v;
        std::push_heap(heap.begin(), heap.end(), std::greater<float>());
      }
    }
    return heap.front();
  }

  // A lower bound of the k-th largest logit for a k too large for kth_block_max to be
  // tight: a quantile of an evenly spaced sample of the row, checked by counting (one
  // vectorised pass) and lowered until at least k tokens reach it. Aims at 1.5 k
  // candidates.
  float kth_sampled(int64_t k) {
    const int64_t n = std::min<int64_t>(vocab_, 4096);
    const int64_t stride = vocab_ / n;
    std::vector<float>& sample = s_.values;
    sample.resize(n);
    for (int64_t i = 0; i < n; ++i) sample[i] = x_[i * stride];
    int64_t rank = std::max<int64_t>(1, (3 * k * n + 2 * vocab_ - 1) / (2 * vocab_));
    rank = std::min(rank, n);
    for (;;) {
      std::nth_element(sample.begin(), sample.begin() + (rank - 1), sample.end(),
                       std::greater<float>());
      const float bound = sample[rank - 1];
      if (k_.count_at_least(x_, vocab_, bound) >= k) return bound;
      if (rank == n) return -kInf;
      rank = std::min(n, 2 * rank);
    }
  }

  int64_t top_k_row(int64_t k, float top_p) {
    const float floor = 4 * k <= nblocks_ ? kth_block_max(k) : kth_sampled(k);
    s_.cand.clear();
    for (int64_t b = 0; b < nblocks_; ++b) {
      if (!(s_.bmax[b] >= floor)) continue;
      const int64_t start = b * kBlock, end = start + block_size(b);
      for (int64_t j = start; j < end; ++j) {
        if (x_[j] >= floor) s_.cand.push_back({x_[j], j});
      }
    }
    std::nth_element(s_.cand.begin(), s_.cand.begin() + (k - 1), s_.cand.end(), before);
    const float kth = s_.cand[k - 1].value;
    // The kept set: every candidate >= the k-th value (ties kept), moved to the front.
    const auto kept_end = std::partition(
        s_.cand.begin(), s_.cand.end(), [kth](const Candidate& c) { return c.value >= kth; });
    int64_t kept = kept_end - s_.cand.begin();
    if (top_p < 1.0f) std::sort(s_.cand.begin(), kept_end, before);
    weigh(kept);
    if (top_p < 1.0f) {
      double mass = 0.0;
      for (int64_t i = 0; i < kept; ++i) mass += s_.cand_weight[i];
      kept = nucleus(kept, static_cast<double>(top_p) * mass);
    }
    return draw_candidates(kept);
  }

  // The kept prefix of the descending, weighed s_.cand[0, n): the smallest prefix
  // whose mass reaches `target`, extended over ties of its last value.
  int64_t nucleus(int64_t n, double target) {
    double cum = 0.0;
    int64_t j = 0;
    for (; j < n; ++j) {
      cum += s_.cand_weight[j];
      if (cum >= target) break;
    }
    if (j >= n) return n;
    const float t = s_.cand[j].value;
    while (j + 1 < n && s_.cand[j + 1].value >= t) ++j;
    return j + 1;
  }

  // +1: the mass above the token is below p of the total (kept); -1: it is not;
  // 0: the approximate masses cannot tell.
  int decide(const Estimate& above, const Estimate& total, double p) const {
    if (above.value <= 0.0) return 1;  // nothing above: the most likely token
    if (p <= 0.0) return -1;
    const double lo = k_.approx_low, hi = k_.approx_high;
    const double above_max = above.exact ? above.value : above.value / lo;
    const double above_min = above.exact ? above.value : above.value / hi;
    const double total_max = total.exact ? total.value : total.value / lo;
    const double total_min = total.exact ? total.value : total.value / hi;
    if (above_max < p * total_min) return 1;
    if (above_min >= p * total_max) return -1;
    return 0;
  }

  int64_t top_p_row(float top_p, int64_t rounds) {
    const double p = top_p;
    int64_t token = draw_above(-kInf);
    float value = x_[token];
    // Cheap accept: a token heavier than (1 - p) of the whole-row proposal's total (an
    // upper bound of the row's mass) has less than p of the mass above it.
    if (weight(value) > (1.0 - p) * proposal_total_) return token;
    Masses approx = k_.masses_approx(x_, vocab_, s_.bmax.data(), m_, value, false);
    Estimate total{approx.total, false}, above{approx.mass, false};
    for (int64_t round = 0;; ++round) {
      int verdict = decide(above, total, p);
      if (verdict == 0) {
        const Masses exact =
            k_.masses_exact(x_, vocab_, s_.bmax.data(), m_, value, total.exact);
        if (!total.exact) total = {exact.total, true};
        above = {exact.mass, true};
        verdict = decide(above, total, p);
      }
      if (verdict > 0) return token;
      if (round == rounds) break;
      token = draw_above(value);
      value = x_[token];
      above = {k_.masses_approx(x_, vocab_, s_.bmax.data(), m_, value, true).mass, false};
    }
    // Exact: the kept set lies above the last rejected token; sort those.
    if (!total.exact) {
      total = {k_.masses_exact(x_, vocab_, s_.bmax.data(), m_, value, false).total, true};
    }
    s_.cand.clear();
    for (int64_t b = 0; b < nblocks_; ++b) {
      if (!(s_.bmax[b] > value)) continue;
      const int64_t start = b * kBlock, end = start + block_size(b);
      for (int64_t j = start; j < end; ++j) {
        if (x_[j] > value) s_.cand.push_back({x_[j], j});
      }
    }
    std::sort(s_.cand.begin(), s_.cand.end(), before);
    const int64_t n = static_cast<int64_t>(s_.cand.size());
    if (n == 0) return token;
    weigh(n);
    return draw_candidates(nucleus(n, p * total.value));
  }

  const float* x_;
  const int64_t vocab_;
  const int64_t nblocks_;
  Stream rng_;
  Scratch& s_;
  const Kernels& k_;
  const int64_t max_tries_;
  float m_ = 0.0f;
  double proposal_total_ = 0.0;  // of the latest proposal()
};

}  // namespace vllm_kunlun::sampling
