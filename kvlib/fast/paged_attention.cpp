// Decode attention read straight from the paged KV pool, the way vLLM's CPU attention kernel reads
// its blocks where they lie, instead of gathering each request's keys into a padded tensor first.
//
//   paged_decode_attention(q, k_pool, v_pool, context, lengths, scale):
//     q        float32 (rows, heads, head_dim): each decoding request's one query per head;
//     k_pool   float32 (slots, kv_heads, head_dim): one layer's keys, v_pool its values;
//     context  int64 (rows, k_len): the pool slot of each request's key at each position (padded);
//     lengths  int64 (rows,): how many keys each request sees (positions 0 .. lengths[r] - 1);
//   returns float32 (rows, heads, head_dim): softmax(scale * q . k) . v over those keys, each
//   query head h reading key/value head h / (heads / kv_heads) (grouped-query attention).
//
// Plain loops in float32 (two passes: the scores and their maximum, then the exponentials and the
// weighted sum of values), which the compiler vectorizes (the dot products in partial sums); the (request, key/value head) pairs are
// shared out among the threads (at::parallel_for). The sums run in another order than PyTorch's
// attention, so results agree with it to float32 rounding (tests/fast/test_paged_attention.py).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

void check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& context,
           const at::Tensor& lengths) {
  const char* name = "kvlib_cpu::paged_decode_attention";
  for (const at::Tensor* t : {&q, &k, &v}) {
    TORCH_CHECK(t->dim() == 3 && t->scalar_type() == at::kFloat && t->is_contiguous(), name,
                ": q, k_pool and v_pool must be contiguous 3-d float32 tensors, got ", t->sizes(), " ", t->scalar_type());
  }
  TORCH_CHECK(k.sizes() == v.sizes() && q.size(2) == k.size(2) && q.size(1) % k.size(1) == 0, name,
              ": q (rows, heads, head_dim) and the pools (slots, kv_heads, head_dim) do not fit: ", q.sizes(), " ",
              k.sizes(), " ", v.sizes());
  TORCH_CHECK(context.dim() == 2 && context.scalar_type() == at::kLong && context.is_contiguous() &&
              context.size(0) == q.size(0) && lengths.dim() == 1 && lengths.scalar_type() == at::kLong &&
              lengths.size(0) == q.size(0), name, ": context must be contiguous int64 (rows, k_len) and lengths int64 (rows,)");
}

// q . k in LANES partial sums (the compiler turns the inner loop into one vector multiply-add; a
// single running sum would wait on each addition in turn), then added up.
constexpr int64_t LANES = 16;

inline float dot(const float* a, const float* b, int64_t n) {
  float part[LANES] = {};
  int64_t d = 0;
  for (; d + LANES <= n; d += LANES) {
    for (int64_t j = 0; j < LANES; ++j) part[j] += a[d + j] * b[d + j];
  }
  float sum = 0.f;
  for (int64_t j = 0; j < LANES; ++j) sum += part[j];
  for (; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_pool, const at::Tensor& v_pool,
                                  const at::Tensor& context, const at::Tensor& lengths, double scale) {
  check(q, k_pool, v_pool, context, lengths);
  const int64_t rows = q.size(0), heads = q.size(1), dim = q.size(2), kv_heads = k_pool.size(1);
  const int64_t group = heads / kv_heads, k_len = context.size(1), slots = k_pool.size(0);
  at::Tensor out = at::empty_like(q);
  const float* qp = q.data_ptr<float>();
  const float* kp = k_pool.data_ptr<float>();
  const float* vp = v_pool.data_ptr<float>();
  const int64_t* cp = context.data_ptr<int64_t>();
  const int64_t* lp = lengths.data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    TORCH_CHECK(lp[r] >= 1 && lp[r] <= k_len, "kvlib_cpu::paged_decode_attention: request ", r, " sees ", lp[r],
                " keys, but its context holds ", k_len);
    for (int64_t p = 0; p < lp[r]; ++p) {
      TORCH_CHECK(cp[r * k_len + p] >= 0 && cp[r * k_len + p] < slots, "kvlib_cpu::paged_decode_attention: slot ",
                  cp[r * k_len + p], " of request ", r, " is outside the pool of ", slots);
    }
  }
  const float s = static_cast<float>(scale);
  at::parallel_for(0, rows * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(group * k_len), acc(dim);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t r = task / kv_heads, h = task % kv_heads, n = lp[r];
      for (int64_t g = 0; g < group; ++g) {                      // pass 1: scores and their maximum
        const float* qv = qp + (r * heads + h * group + g) * dim;
        float* sc = scores.data() + g * k_len;
        float top = -std::numeric_limits<float>::infinity();
        for (int64_t p = 0; p < n; ++p) {
          const float* kv = kp + (cp[r * k_len + p] * kv_heads + h) * dim;
          sc[p] = dot(qv, kv, dim) * s;
          top = std::max(top, sc[p]);
        }
        float total = 0.f;                                     // pass 2: softmax weights, then values
        for (int64_t p = 0; p < n; ++p) total += (sc[p] = std::exp(sc[p] - top));
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int64_t p = 0; p < n; ++p) {
          const float* vv = vp + (cp[r * k_len + p] * kv_heads + h) * dim;
          const float w = sc[p];
          for (int64_t d = 0; d < dim; ++d) acc[d] += w * vv[d];
        }
        float* o = op + (r * heads + h * group + g) * dim;
        for (int64_t d = 0; d < dim; ++d) o[d] = acc[d] / total;
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(kvlib_cpu, m) {
  m.def("paged_decode_attention(Tensor q, Tensor k_pool, Tensor v_pool, Tensor context, Tensor lengths, "
        "float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(kvlib_cpu, CPU, m) {
  m.impl("paged_decode_attention", paged_decode_attention);
}
