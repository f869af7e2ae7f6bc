// Block-quantized matrix products for the CPU, the way llama.cpp multiplies its GGUF blocks:
// each row of activations is rounded to 8-bit integers in blocks of 32 (one float scale per
// block), and every block of weights is multiplied with integer dot products, then scaled.
//
//   q4_1_mm(x, w, n):  w holds ggml's Q4_1 blocks (20 bytes: float16 d, float16 m, 16 bytes of
//                      4-bit integers q, the low nibbles weights 0..15, the high ones 16..31),
//                      weight = d * q + m;
//   q8_0_mm(x, w, n):  w holds ggml's Q8_0 blocks (34 bytes: float16 d, 32 int8 q), weight = d * q.
//
// x is float32 or bfloat16 (..., in), w uint8 (n, in / 32 * block bytes), the result (..., n) in x's
// dtype (computed in float32).
// The activations' blocks (the Q8_1 of llama.cpp): amax = max |x| over the block,
// d_x = amax / 127, q_x = round-half-even(x * (127 / amax)) (0 where amax = 0), s = d_x * sum(q_x).
// One output is then, over the blocks b of its row,
//   Q4_1:  sum_b  d_w d_x * sum(q_w q_x) + m_w * s        Q8_0:  sum_b  d_w d_x * sum(q_w q_x)
// with every sum(q_w q_x) exact in integers, and the rest in float32 (kvlib.fast.kernels
// computes the same formula in Python, and the tests compare them).
//
// With AVX2 (x86: compiled with -mavx2 -mfma -mf16c where the CPU has them) the integer dot
// products are _mm256_maddubs_epi16 on 32 bytes at a time; elsewhere plain loops, which the
// compiler vectorizes as it can. Rows of weights are shared out among the threads (at::parallel_for).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "simd.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define KVLIB_AVX2 1
#endif

namespace {

constexpr int64_t QK = 32;          // weights (and activations) per block
constexpr int PREFETCH = 1024;       // bytes ahead of the weight block being multiplied, asked of memory early
constexpr int ROWS = 4;             // activation rows multiplied with each weight block while it is loaded

struct BlockQ4_1 { uint16_t d, m; uint8_t qs[QK / 2]; };
struct BlockQ8_0 { uint16_t d; int8_t qs[QK]; };
struct BlockQ8_1 { float d, s; int8_t qs[QK]; };
static_assert(sizeof(BlockQ4_1) == 20, "ggml's block_q4_1 is 20 bytes");
static_assert(sizeof(BlockQ8_0) == 34, "ggml's block_q8_0 is 34 bytes");

inline float half(uint16_t h) { return c10::detail::fp16_ieee_to_fp32_value(h); }

// One block of 32 activations to 8 bits.
void quantize_block(const float* x, BlockQ8_1* y) {
#ifdef KVLIB_AVX2
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4];
  __m256 amax = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(x + 8 * i);
    amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[i]));
  }
  __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(amax, 1), _mm256_castps256_ps128(amax));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const float a = _mm_cvtss_f32(m4);
  const __m256 id = _mm256_set1_ps(a != 0.0f ? 127.0f / a : 0.0f);
  __m256i q[4];
  for (int i = 0; i < 4; ++i)
    q[i] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[i], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  __m256i total = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
  t = _mm_hadd_epi32(t, t);
  t = _mm_hadd_epi32(t, t);
  const __m256i packed = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(y->qs),
                      _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  y->d = a / 127.0f;
  y->s = y->d * static_cast<float>(_mm_cvtsi128_si32(t));
#else
  float a = 0.0f;
  for (int64_t i = 0; i < QK; ++i) a = std::fmax(a, std::fabs(x[i]));
  const float id = a != 0.0f ? 127.0f / a : 0.0f;
  int sum = 0;
  for (int64_t i = 0; i < QK; ++i) {
    const int q = static_cast<int>(std::nearbyint(x[i] * id));
    y->qs[i] = static_cast<int8_t>(q);
    sum += q;
  }
  y->d = a / 127.0f;
  y->s = y->d * static_cast<float>(sum);
#endif
}

#ifdef KVLIB_AVX2
using kvlib_simd::hsum8;

// sum over 32 bytes of u * s (u unsigned 0..255, s signed), as 8 floats of partial sums.
inline __m256 dot_us8(__m256i u, __m256i s) {
  const __m256i pairs = _mm256_maddubs_epi16(u, s);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

inline __m256i nibbles(const uint8_t* qs) {             // 16 bytes -> 32 values 0..15, low nibbles first
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_insertf128_si256(_mm256_castsi128_si256(b), _mm_srli_epi16(b, 4), 1);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}
#endif

// One row of weights (nb blocks) against R rows of activations (R <= ROWS, known when compiled so
// that the accumulators stay in registers): R outputs.
template <int R>
void q4_1_row(const BlockQ4_1* w, const BlockQ8_1* const* a, int64_t nb, float* out) {
#ifdef KVLIB_AVX2
  __m256 acc[R];
  float mins[R];
  for (int j = 0; j < R; ++j) acc[j] = _mm256_setzero_ps(), mins[j] = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    _mm_prefetch(reinterpret_cast<const char*>(w + b) + PREFETCH, _MM_HINT_T0);
    const float dw = _cvtsh_ss(w[b].d), mw = _cvtsh_ss(w[b].m);
    const __m256i qw = nibbles(w[b].qs);
    for (int j = 0; j < R; ++j) {
      const BlockQ8_1& y = a[j][b];
      const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs));
      acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(dw * y.d), dot_us8(qw, qy), acc[j]);
      mins[j] += mw * y.s;
    }
  }
  for (int j = 0; j < R; ++j) out[j] = hsum8(acc[j]) + mins[j];
#else
  for (int j = 0; j < R; ++j) {
    float total = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const BlockQ8_1& y = a[j][b];
      int dot = 0;
      for (int64_t i = 0; i < QK / 2; ++i)
        dot += (w[b].qs[i] & 0x0F) * y.qs[i] + (w[b].qs[i] >> 4) * y.qs[i + QK / 2];
      total += half(w[b].d) * y.d * static_cast<float>(dot) + half(w[b].m) * y.s;
    }
    out[j] = total;
  }
#endif
}

template <int R>
void q8_0_row(const BlockQ8_0* w, const BlockQ8_1* const* a, int64_t nb, float* out) {
#ifdef KVLIB_AVX2
  __m256 acc[R];
  for (int j = 0; j < R; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    _mm_prefetch(reinterpret_cast<const char*>(w + b) + PREFETCH, _MM_HINT_T0);
    const float dw = _cvtsh_ss(w[b].d);
    const __m256i qw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[b].qs));
    const __m256i abs_w = _mm256_sign_epi8(qw, qw);                 // |q_w|, and q_y with q_w's sign:
    for (int j = 0; j < R; ++j) {                                    // |q_w| * sign(q_w) q_y = q_w q_y
      const BlockQ8_1& y = a[j][b];
      const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs));
      acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(dw * y.d), dot_us8(abs_w, _mm256_sign_epi8(qy, qw)), acc[j]);
    }
  }
  for (int j = 0; j < R; ++j) out[j] = hsum8(acc[j]);
#else
  for (int j = 0; j < R; ++j) {
    float total = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      int dot = 0;
      for (int64_t i = 0; i < QK; ++i) dot += w[b].qs[i] * a[j][b].qs[i];
      total += half(w[b].d) * a[j][b].d * static_cast<float>(dot);
    }
    out[j] = total;
  }
#endif
}

// x float32 (m, k) -> its Q8_1 blocks, (m, k / 32), in a uint8 tensor (40 bytes a block: d, s, 32 q).
at::Tensor quantize_rows(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() &&
              x.size(1) % QK == 0, "kvlib_cpu::quantize_rows: x must be a contiguous float32 CPU (rows, in) tensor "
              "with in a multiple of 32, got ", x.sizes(), " ", x.scalar_type());
  const int64_t m = x.size(0), nb = x.size(1) / QK;
  at::Tensor out = at::empty({m, nb * static_cast<int64_t>(sizeof(BlockQ8_1))}, x.options().dtype(at::kByte));
  const float* src = x.data_ptr<float>();
  auto* dst = reinterpret_cast<BlockQ8_1*>(out.data_ptr<uint8_t>());
  at::parallel_for(0, m * nb, 256, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) quantize_block(src + i * QK, dst + i);
  });
  return out;
}

template <typename Block>
void check(const at::Tensor& x, const at::Tensor& w, int64_t n, const char* name) {
  constexpr int64_t block_bytes = sizeof(Block);
  TORCH_CHECK(x.device().is_cpu() && w.device().is_cpu(), name, ": x and w must be CPU tensors");
  TORCH_CHECK(x.dim() >= 1 && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16), name,
              ": x must be a float32 or bfloat16 (..., in) tensor, got ", x.sizes(), " ", x.scalar_type());
  const int64_t k = x.size(-1);
  TORCH_CHECK(k > 0 && k % QK == 0, name, ": the input width (x's last size) must be a positive multiple of 32, got ",
              k);
  TORCH_CHECK(n >= 0, name, ": n, the number of outputs, must be at least 0, got ", n);
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kByte && w.is_contiguous() && w.size(0) == n &&
              w.size(1) == k / QK * block_bytes, name, ": w must be contiguous uint8 (", n, ", ", k / QK * block_bytes,
              ") blocks for ", n, " outputs of ", k, " inputs, got ", w.sizes(), " ", w.scalar_type());
  TORCH_CHECK(reinterpret_cast<uintptr_t>(w.data_ptr()) % alignof(Block) == 0, name, ": w's blocks must start at a ",
              "multiple of ", alignof(Block), " bytes (its half-precision scales); w is a view at an odd byte: ",
              "pass w.clone()");
}

// The R-row kernels, from one template, chosen by how many activation rows are left.
template <typename Block>
using RowKernel = void (*)(const Block*, const BlockQ8_1* const*, int64_t, float*);

// x (..., k) -> (..., n) in x's dtype; inside, float32 rows and their Q8_1 blocks.
template <typename Block>
at::Tensor blocks_mm(const at::Tensor& x, const at::Tensor& w, int64_t n, const RowKernel<Block> (&row)[ROWS]) {
  const int64_t k = x.size(-1), m = x.numel() / k, nb = k / QK;
  const at::Tensor a = quantize_rows(x.reshape({m, k}).to(at::kFloat).contiguous());
  at::Tensor y = at::empty({m, n}, x.options().dtype(at::kFloat));
  const auto* acts = reinterpret_cast<const BlockQ8_1*>(a.data_ptr<uint8_t>());
  const auto* blocks = reinterpret_cast<const Block*>(w.data_ptr<uint8_t>());
  float* out = y.data_ptr<float>();
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    const BlockQ8_1* rows[ROWS];
    float part[ROWS];
    for (int64_t i = begin; i < end; ++i) {
      for (int64_t j0 = 0; j0 < m; j0 += ROWS) {
        const int64_t r = std::min<int64_t>(ROWS, m - j0);
        for (int64_t j = 0; j < r; ++j) rows[j] = acts + (j0 + j) * nb;
        row[r - 1](blocks + i * nb, rows, nb, part);
        for (int64_t j = 0; j < r; ++j) out[(j0 + j) * n + i] = part[j];
      }
    }
  });
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = n;
  return y.view(shape).to(x.scalar_type());
}

at::Tensor q4_1_mm(const at::Tensor& x, const at::Tensor& w, int64_t n) {
  check<BlockQ4_1>(x, w, n, "kvlib_cpu::q4_1_mm");
  static const RowKernel<BlockQ4_1> rows[ROWS] = {q4_1_row<1>, q4_1_row<2>, q4_1_row<3>, q4_1_row<4>};
  return blocks_mm<BlockQ4_1>(x, w, n, rows);
}

at::Tensor q8_0_mm(const at::Tensor& x, const at::Tensor& w, int64_t n) {
  check<BlockQ8_0>(x, w, n, "kvlib_cpu::q8_0_mm");
  static const RowKernel<BlockQ8_0> rows[ROWS] = {q8_0_row<1>, q8_0_row<2>, q8_0_row<3>, q8_0_row<4>};
  return blocks_mm<BlockQ8_0>(x, w, n, rows);
}

std::string simd() {
#ifdef KVLIB_AVX2
  return "avx2";
#else
  return "plain loops";
#endif
}

}  // namespace

// The operators are declared, with what torch.compile sees them return, in kvlib/ops.py; this
// library registers their implementations only.
TORCH_LIBRARY_FRAGMENT(kvlib_cpu, m) {
  m.impl("simd", &simd);                     // which code this build runs: "avx2" or "plain loops"
}

TORCH_LIBRARY_IMPL(kvlib_cpu, CPU, m) {
  m.impl("q4_1_mm", q4_1_mm);
  m.impl("q8_0_mm", q8_0_mm);
  m.impl("quantize_rows", quantize_rows);
}
