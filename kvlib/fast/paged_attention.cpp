// Attention read straight from the paged KV pool, the way vLLM's CPU attention kernel reads its
// blocks where they lie, instead of gathering each request's keys into a padded tensor first.
// Each query is one token: a decoding request's new token, or one token of a prefilling request's
// chunk, which at position p attends to its request's keys 0 .. p (the causal mask, as lengths).
//
//   paged_attention(q, k_pool, v_pool, context, lengths, row, scale):
//     q        float32 (n, heads, head_dim): n query tokens, each with its heads;
//     k_pool   float32 (slots, kv_heads, head_dim): one layer's keys, v_pool its values;
//     context  int64 (rows, k_len): the pool slot of each request's key at each position (padded
//              with slots inside the pool);
//     lengths  int64 (n,): how many keys each query sees (positions 0 .. lengths[i] - 1);
//     row      int64 (n,): which request (row of context) each query belongs to;
//   returns float32 (n, heads, head_dim): softmax(scale * q . k) . v over those keys, each
//   query head h reading key/value head h / (heads / kv_heads) (grouped-query attention).
//
// Per (query, key/value head) pair, the group's query heads in three passes: the scores and their
// maximum, the exponentials and their sum, the weighted sum of values. With AVX2 (x86: built with
// -mavx2 -mfma where the CPU has them) the dot products (four keys at a time), the exponentials and
// the sums of values take 8 floats at a time, and for head_dim 64 a query and a sum of values stay
// in registers (the exponential as Cephes' expf computes it: e^x = 2^n e^r, e^r by a polynomial,
// within 2 units of the last place); elsewhere plain loops and std::exp. The pairs are shared out
// among the threads (at::parallel_for). The sums run in another order than PyTorch's attention, so
// results agree with it to float32 rounding (tests/fast/test_paged_attention.py).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define KVLIB_AVX2 1
#endif

namespace {

constexpr const char* NAME = "kvlib_cpu::paged_attention";

void check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& context,
           const at::Tensor& lengths, const at::Tensor& row) {
  for (const at::Tensor* t : {&q, &k, &v}) {
    TORCH_CHECK(t->dim() == 3 && t->scalar_type() == at::kFloat && t->is_contiguous(), NAME,
                ": q, k_pool and v_pool must be contiguous 3-d float32 tensors, got ", t->sizes(), " ", t->scalar_type());
  }
  TORCH_CHECK(k.sizes() == v.sizes() && q.size(2) == k.size(2) && q.size(1) % k.size(1) == 0, NAME,
              ": q (n, heads, head_dim) and the pools (slots, kv_heads, head_dim) do not fit: ", q.sizes(), " ",
              k.sizes(), " ", v.sizes());
  for (const at::Tensor* t : {&lengths, &row}) {
    TORCH_CHECK(t->dim() == 1 && t->scalar_type() == at::kLong && t->size(0) == q.size(0) && t->is_contiguous(), NAME,
                ": lengths and row must be contiguous int64 (n,), one for each of q's ", q.size(0), " queries");
  }
  TORCH_CHECK(context.dim() == 2 && context.scalar_type() == at::kLong && context.is_contiguous(), NAME,
              ": context must be contiguous int64 (rows, k_len)");
  const int64_t* lp = lengths.data_ptr<int64_t>();
  const int64_t* rp = row.data_ptr<int64_t>();
  for (int64_t i = 0; i < q.size(0); ++i) {
    TORCH_CHECK(rp[i] >= 0 && rp[i] < context.size(0), NAME, ": query ", i, " belongs to request ", rp[i],
                ", but the context has ", context.size(0));
    TORCH_CHECK(lp[i] >= 1 && lp[i] <= context.size(1), NAME, ": query ", i, " sees ", lp[i],
                " keys, but its request's context holds ", context.size(1));
  }
  const int64_t* cp = context.data_ptr<int64_t>();
  for (int64_t j = 0; j < context.numel(); ++j) {
    TORCH_CHECK(cp[j] >= 0 && cp[j] < k.size(0), NAME, ": slot ", cp[j], " of request ", j / context.size(1),
                " is outside the pool of ", k.size(0));
  }
}

#ifdef KVLIB_AVX2

inline float hsum(__m256 v) {                                   // v[0] + ... + v[7]
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}

inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {  // (sum of a, of b, of c, of d)
  const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));  // a0-3 b0-3 c0-3 d0-3 a4-7 ...
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

inline float dot(const float* a, const float* b, int64_t n) {   // a . b, in two vectors of partial sums
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + 16 <= n; d += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d + 8), _mm256_loadu_ps(b + d + 8), s1);
  }
  for (; d + 8 <= n; d += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), s0);
  float sum = hsum(_mm256_add_ps(s0, s1));
  for (; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

inline __m256 exp8(__m256 x) {            // e^x of 8 floats x <= 0 (below -87, where e^x < 2^-125: e^-87)
  x = _mm256_max_ps(_mm256_set1_ps(-87.0f), x);                 // (a NaN stays a NaN)
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);        // x - n ln 2, ln 2 in two parts
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);                              // Cephes' expf polynomial
  for (float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f}) {
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
  }
  const __m256 er = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(er, _mm256_castsi256_ps(two_n));
}

inline float exp_sum(float* x, int64_t n, float top) {          // x = e^(x - top); returns their sum
  __m256 total = _mm256_setzero_ps();
  int64_t p = 0;
  for (; p + 8 <= n; p += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + p), _mm256_set1_ps(top)));
    _mm256_storeu_ps(x + p, e);
    total = _mm256_add_ps(total, e);
  }
  float sum = hsum(total);
  for (; p < n; ++p) sum += (x[p] = std::exp(x[p] - top));
  return sum;
}

inline void axpy(float w, const float* x, float* y, int64_t n) {  // y += w x
  int64_t d = 0;
  for (; d + 8 <= n; d += 8) {
    _mm256_storeu_ps(y + d, _mm256_fmadd_ps(_mm256_set1_ps(w), _mm256_loadu_ps(x + d), _mm256_loadu_ps(y + d)));
  }
  for (; d < n; ++d) y[d] += w * x[d];
}

#else  // plain loops

inline float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.f;
  for (int64_t d = 0; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

inline float exp_sum(float* x, int64_t n, float top) {
  float sum = 0.f;
  for (int64_t p = 0; p < n; ++p) sum += (x[p] = std::exp(x[p] - top));
  return sum;
}

inline void axpy(float w, const float* x, float* y, int64_t n) {
  for (int64_t d = 0; d < n; ++d) y[d] += w * x[d];
}

#endif

// One (query, key/value head) pair: the group's query heads q (group, dim) over the keys and values
// at the n slots slot[0..n) of the pools (a slot's head h at kp + slot * stride), into out (group,
// dim); scores: room for group * n floats. Any dim, any build.
void attend_pair(const float* q, const float* kp, const float* vp, const int64_t* slot, int64_t n, int64_t stride,
                 int64_t group, int64_t dim, float scale, float* scores, float* out) {
  std::vector<float> top(group, -std::numeric_limits<float>::infinity()), total(group);
  for (int64_t p = 0; p < n; ++p) {                             // pass 1: scores and their maximum
    const float* kv = kp + slot[p] * stride;
    for (int64_t g = 0; g < group; ++g) {
      const float sc = scores[g * n + p] = dot(q + g * dim, kv, dim) * scale;
      top[g] = std::max(top[g], sc);
    }
  }
  for (int64_t g = 0; g < group; ++g) total[g] = exp_sum(scores + g * n, n, top[g]);   // pass 2
  std::fill(out, out + group * dim, 0.f);
  for (int64_t p = 0; p < n; ++p) {                             // pass 3: the weighted sum of values
    const float* vv = vp + slot[p] * stride;
    for (int64_t g = 0; g < group; ++g) axpy(scores[g * n + p], vv, out + g * dim, dim);
  }
  for (int64_t i = 0; i < group * dim; ++i) out[i] /= total[i / dim];
}

#ifdef KVLIB_AVX2
// The same for dim = 8 C, known when compiling: a key's and a sum of values' C vectors stay in registers.
template <int C>
void attend_pair_fixed(const float* q, const float* kp, const float* vp, const int64_t* slot, int64_t n,
                       int64_t stride, int64_t group, float scale, float* scores, float* out) {
  constexpr int64_t dim = 8 * C;
  for (int64_t g = 0; g < group; ++g) {
    float* sc = scores + g * n;
    __m256 qg[C];                                               // the query, in registers
    for (int c = 0; c < C; ++c) qg[c] = _mm256_loadu_ps(q + g * dim + 8 * c);
    __m128 top4 = _mm_set1_ps(-std::numeric_limits<float>::infinity());
    int64_t p = 0;
    for (; p + 4 <= n; p += 4) {                                // pass 1, four keys at a time
      __m256 a[4];
      for (int j = 0; j < 4; ++j) {
        const float* kv = kp + slot[p + j] * stride;
        a[j] = _mm256_mul_ps(qg[0], _mm256_loadu_ps(kv));
        for (int c = 1; c < C; ++c) a[j] = _mm256_fmadd_ps(qg[c], _mm256_loadu_ps(kv + 8 * c), a[j]);
      }
      const __m128 s4 = _mm_mul_ps(hsum4(a[0], a[1], a[2], a[3]), _mm_set1_ps(scale));
      _mm_storeu_ps(sc + p, s4);
      top4 = _mm_max_ps(top4, s4);
    }
    float top = std::max(std::max(top4[0], top4[1]), std::max(top4[2], top4[3]));
    for (; p < n; ++p) top = std::max(top, sc[p] = dot(q + g * dim, kp + slot[p] * stride, dim) * scale);
    const __m256 total = _mm256_set1_ps(exp_sum(sc, n, top));   // pass 2
    __m256 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
    for (int64_t p = 0; p < n; ++p) {                           // pass 3
      const float* vv = vp + slot[p] * stride;
      const __m256 w = _mm256_set1_ps(sc[p]);
      for (int c = 0; c < C; ++c) acc[c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vv + 8 * c), acc[c]);
    }
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(out + g * dim + 8 * c, _mm256_div_ps(acc[c], total));
  }
}
#endif

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_pool, const at::Tensor& v_pool,
                           const at::Tensor& context, const at::Tensor& lengths, const at::Tensor& row, double scale) {
  check(q, k_pool, v_pool, context, lengths, row);
  const int64_t n = q.size(0), heads = q.size(1), dim = q.size(2), kv_heads = k_pool.size(1);
  const int64_t group = heads / kv_heads, k_len = context.size(1), stride = kv_heads * dim;
  at::Tensor out = at::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const float* kp = k_pool.data_ptr<float>();
  const float* vp = v_pool.data_ptr<float>();
  const int64_t* cp = context.data_ptr<int64_t>();
  const int64_t* lp = lengths.data_ptr<int64_t>();
  const int64_t* rp = row.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  const float s = static_cast<float>(scale);
  at::parallel_for(0, n * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(group * k_len);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t i = task / kv_heads, h = task % kv_heads, first = (i * heads + h * group) * dim;
      const int64_t* slot = cp + rp[i] * k_len;
#ifdef KVLIB_AVX2
      if (dim == 64) {
        attend_pair_fixed<8>(qp + first, kp + h * dim, vp + h * dim, slot, lp[i], stride, group, s, scores.data(),
                             op + first);
        continue;
      }
#endif
      attend_pair(qp + first, kp + h * dim, vp + h * dim, slot, lp[i], stride, group, dim, s, scores.data(), op + first);
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvlib_cpu, m) {
  m.def("paged_attention(Tensor q, Tensor k_pool, Tensor v_pool, Tensor context, Tensor lengths, Tensor row, "
        "float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(kvlib_cpu, CPU, m) {
  m.impl("paged_attention", paged_attention);
}
