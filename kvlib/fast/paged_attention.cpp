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
// Two paths, by how many queries a request has in the call:
// - one (a decoding request): per (query, key/value head) pair, the group's query heads in three
//   passes: the scores and their maximum, the exponentials and their sum, the weighted sum of
//   values; with AVX2, for head_dim 64, a query and a sum of values stay in registers;
// - several (a chunk of a prompt): tiles of up to 48 rows (24 without AVX-512), a row being one
//   query's head, the rows in the lanes of the vectors, so that each key is read once a tile and
//   every product is a broadcast times a full vector (see attend_tile), as a matrix product does.
// Vectors are simd.h's: 16 floats with AVX-512, 8 with AVX2, plain loops elsewhere; the exponential
// as Cephes' expf computes it (within 2 units of the last place). The work is shared out among the
// threads by its cost (at::parallel_for). The sums run in another order than PyTorch's attention,
// so results agree with it to float32 rounding (tests/fast/test_paged_attention.py).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "simd.h"

#if defined(__AVX2__) && defined(__FMA__)
#define KVLIB_AVX2 1
#endif

namespace {

using namespace kvlib_simd;

constexpr const char* NAME = "kvlib_cpu::paged_attention";

void check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& context,
           const at::Tensor& lengths, const at::Tensor& row) {
  for (const at::Tensor* t : {&q, &k, &v}) {
    TORCH_CHECK(t->dim() == 3 && t->scalar_type() == at::kFloat && t->is_contiguous(), NAME,
                ": q, k_pool and v_pool must be contiguous 3-d float32 tensors, got ", t->sizes(), " ", t->scalar_type());
  }
  TORCH_CHECK(k.size(1) > 0 && q.size(2) > 0, NAME, ": the pools need at least one kv head and one dimension a head, ",
              "got ", k.sizes(), " and q ", q.sizes());
  TORCH_CHECK(k.sizes() == v.sizes() && q.size(2) == k.size(2) && q.size(1) >= k.size(1) && q.size(1) % k.size(1) == 0, NAME,
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
using kvlib_simd::hsum8;

inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {  // (sum of a, of b, of c, of d)
  const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));  // a0-3 b0-3 c0-3 d0-3 a4-7 ...
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}
#endif

inline float dot(const float* a, const float* b, int64_t n) {   // a . b, in two vectors of partial sums
  Vec s0 = vzero(), s1 = vzero();
  int64_t d = 0;
  for (; d + 2 * WIDTH <= n; d += 2 * WIDTH) {
    s0 = vfma(vload(a + d), vload(b + d), s0);
    s1 = vfma(vload(a + d + WIDTH), vload(b + d + WIDTH), s1);
  }
  for (; d + WIDTH <= n; d += WIDTH) s0 = vfma(vload(a + d), vload(b + d), s0);
  float sum = hsum(vadd(s0, s1));
  for (; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

inline float exp_sum(float* x, int64_t n, float top) {          // x = e^(x - top); returns their sum
  Vec total = vzero();
  int64_t p = 0;
  for (; p + WIDTH <= n; p += WIDTH) {
    const Vec e = vexp(vsub(vload(x + p), vset(top)));
    vstore(x + p, e);
    total = vadd(total, e);
  }
  float sum = hsum(total);
  for (; p < n; ++p) sum += (x[p] = std::exp(x[p] - top));
  return sum;
}

inline void axpy(float w, const float* x, float* y, int64_t n) {  // y += w x
  int64_t d = 0;
  for (; d + WIDTH <= n; d += WIDTH) vstore(y + d, vfma(vset(w), vload(x + d), vload(y + d)));
  for (; d < n; ++d) y[d] += w * x[d];
}

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

// The tiled path, for a request with several queries in the call (a chunk of its prompt): the query
// heads of up to TQ of its queries that share one key/value head are the *rows* of a tile, row
// t * group + g being query t's head g, and the lanes of a vector are rows. Scores, softmax and the
// sum of values then run WIDTH rows at a time with no sum across lanes: keys stream once per tile,
// each key's dimension d a broadcast times a vector of the rows' queries (the tile's queries
// transposed, qt (dim, ROWS)). Each row is summed in its own lane, over d and then over keys in
// order, and a key past a row's length weighs exactly 0, so a query gets the same bits whatever
// else its tile holds.
constexpr int64_t RV = 3;                          // vectors of rows in a full tile
constexpr int64_t ROWS = RV * WIDTH;               // rows in a tile
constexpr int64_t KB = 4;                          // keys at a time, for the scores
constexpr int64_t DB = REGISTERS == 32 ? 8 : 4;    // dimensions at a time, for the sum of values

// Scores of NK keys (their rows in the pool at key[j]) for V vectors of rows: s[j * ROWS + lane].
template <int V, int NK>
inline void key_scores(const float* qt, const float* const* key, int64_t dim, float scale, float* s) {
  Vec acc[NK][V];
  for (int j = 0; j < NK; ++j)
    for (int v = 0; v < V; ++v) acc[j][v] = vzero();
  for (int64_t d = 0; d < dim; ++d) {
    Vec qv[V];
    for (int v = 0; v < V; ++v) qv[v] = vload(qt + d * ROWS + v * WIDTH);
    for (int j = 0; j < NK; ++j) {
      const Vec kd = vbroadcast(key[j] + d);
      for (int v = 0; v < V; ++v) acc[j][v] = vfma(kd, qv[v], acc[j][v]);
    }
  }
  for (int j = 0; j < NK; ++j)
    for (int v = 0; v < V; ++v) vstore(s + j * ROWS + v * WIDTH, vmul(acc[j][v], vset(scale)));
}

// The weighted sum of the values of n keys for ND dimensions from d0: ot[(d0 + e) * ROWS + lane].
template <int V, int ND>
inline void value_sums(const float* w, const float* vp, const int64_t* slot, int64_t n, int64_t stride, int64_t d0,
                       float* ot) {
  Vec acc[ND][V];
  for (int e = 0; e < ND; ++e)
    for (int v = 0; v < V; ++v) acc[e][v] = vzero();
  for (int64_t p = 0; p < n; ++p) {
    const float* val = vp + slot[p] * stride + d0;
    Vec wv[V];
    for (int v = 0; v < V; ++v) wv[v] = vload(w + p * ROWS + v * WIDTH);
    for (int e = 0; e < ND; ++e) {
      const Vec vd = vbroadcast(val + e);
      for (int v = 0; v < V; ++v) acc[e][v] = vfma(vd, wv[v], acc[e][v]);
    }
  }
  for (int e = 0; e < ND; ++e)
    for (int v = 0; v < V; ++v) vstore(ot + (d0 + e) * ROWS + v * WIDTH, acc[e][v]);
}

// Softmax of each row over its keys, in place in s (n, ROWS): a key at or past the row's length
// (limit, as floats) weighs 0. Returns each row's sum of weights in total (ROWS).
template <int V>
void softmax_rows(float* s, int64_t n, const float* limit, float* total) {
  Vec top[V], sum[V], lim[V];
  for (int v = 0; v < V; ++v) {
    top[v] = vset(-std::numeric_limits<float>::infinity()), sum[v] = vzero(), lim[v] = vload(limit + v * WIDTH);
  }
  for (int64_t p = 0; p < n; ++p) {
    for (int v = 0; v < V; ++v) top[v] = vmax(top[v], vwhere_less(vset(p), lim[v], vload(s + p * ROWS + v * WIDTH),
                                                                   -std::numeric_limits<float>::infinity()));
  }
  for (int64_t p = 0; p < n; ++p) {
    for (int v = 0; v < V; ++v) {
      float* sp = s + p * ROWS + v * WIDTH;
      const Vec e = vwhere_less(vset(p), lim[v], vexp(vsub(vload(sp), top[v])), 0.f);
      vstore(sp, e);
      sum[v] = vadd(sum[v], e);
    }
  }
  for (int v = 0; v < V; ++v) vstore(total + v * WIDTH, sum[v]);
}

// Working memory of one thread for the tiled path.
struct TileBuffers {
  std::vector<float> qt, s, ot, limit, total;
  TileBuffers(int64_t dim, int64_t k_len)
      : qt(dim * ROWS, 0.f), s(k_len * ROWS), ot(dim * ROWS), limit(ROWS), total(ROWS) {}
};

// Queries i0 .. i0 + count - 1 (one request, keys at slot[...]) with key/value head h, V vectors of
// rows: out (n, heads, dim) gets their heads h * group .. h * group + group - 1.
template <int V>
void attend_tile(const float* qp, const float* kp, const float* vp, const int64_t* slot, const int64_t* lengths,
                 int64_t i0, int64_t count, int64_t h, int64_t heads, int64_t group, int64_t dim, int64_t stride,
                 float scale, TileBuffers& b, float* op) {
  const int64_t rows = count * group;
  int64_t n = 0;
  std::fill(b.limit.begin(), b.limit.end(), 0.f);
  for (int64_t r = 0; r < rows; ++r) {                          // the tile's queries, transposed
    const int64_t i = i0 + r / group, head = h * group + r % group;
    for (int64_t d = 0; d < dim; ++d) b.qt[d * ROWS + r] = qp[(i * heads + head) * dim + d];
    b.limit[r] = static_cast<float>(lengths[i]);
    n = std::max(n, lengths[i]);
  }
  int64_t p = 0;
  for (; p + KB <= n; p += KB) {                                // scores, KB keys at a time
    const float* key[KB];
    for (int j = 0; j < KB; ++j) key[j] = kp + slot[p + j] * stride;
    key_scores<V, KB>(b.qt.data(), key, dim, scale, b.s.data() + p * ROWS);
  }
  for (; p < n; ++p) {
    const float* key[1] = {kp + slot[p] * stride};
    key_scores<V, 1>(b.qt.data(), key, dim, scale, b.s.data() + p * ROWS);
  }
  softmax_rows<V>(b.s.data(), n, b.limit.data(), b.total.data());
  int64_t d0 = 0;
  for (; d0 + DB <= dim; d0 += DB) value_sums<V, DB>(b.s.data(), vp, slot, n, stride, d0, b.ot.data());
  for (; d0 < dim; ++d0) value_sums<V, 1>(b.s.data(), vp, slot, n, stride, d0, b.ot.data());
  for (int64_t r = 0; r < rows; ++r) {                          // back to (query, head, dim)
    float* o = op + ((i0 + r / group) * heads + h * group + r % group) * dim;
    for (int64_t d = 0; d < dim; ++d) o[d] = b.ot[d * ROWS + r] / b.total[r];
  }
}

// One piece of work: `count` queries from `first` of one request, with key/value head `h`.
struct Task {
  int64_t first, count, h, cost;
};

// The call's tasks: each request's consecutive queries in even tiles of up to ROWS / group, for
// every key/value head, so that no query is alone in a tile unless all are (a decoding request's
// one query, or heads too many for a tile: then one task a query, all its heads); shared out among
// the threads by their cost (queries times keys), the largest first to the least loaded thread.
std::vector<std::vector<Task>> plan_tasks(const int64_t* rows, const int64_t* lengths, int64_t n, int64_t kv_heads,
                                          int64_t group, int64_t threads) {
  const int64_t per_tile = std::max<int64_t>(1, ROWS / group);
  std::vector<Task> tasks;
  for (int64_t i = 0; i < n;) {
    int64_t run = 1;                                            // the request's queries from i
    while (i + run < n && rows[i + run] == rows[i]) ++run;
    const int64_t tiles = (run + per_tile - 1) / per_tile;     // even tiles: none alone unless all are
    for (int64_t t = 0; t < tiles; ++t) {
      const int64_t first = i + run * t / tiles, count = i + run * (t + 1) / tiles - first;
      const int64_t most = *std::max_element(lengths + first, lengths + first + count);
      if (count == 1) {                                         // one query: all its heads, each key's row once
        tasks.push_back({first, 1, -1, kv_heads * most});
        continue;
      }
      for (int64_t h = 0; h < kv_heads; ++h) tasks.push_back({first, count, h, count * most});
    }
    i += run;
  }
  std::stable_sort(tasks.begin(), tasks.end(), [](const Task& a, const Task& b) { return a.cost > b.cost; });
  std::vector<std::vector<Task>> bins(std::max<int64_t>(1, std::min<int64_t>(threads, tasks.size())));
  std::vector<int64_t> load(bins.size(), 0);
  for (const Task& t : tasks) {
    const size_t least = std::min_element(load.begin(), load.end()) - load.begin();
    bins[least].push_back(t);
    load[least] += t.cost;
  }
  return bins;
}

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
  const auto bins = plan_tasks(rp, lp, n, kv_heads, group, at::get_num_threads());
  at::parallel_for(0, bins.size(), 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(group * k_len);
    TileBuffers buffers(dim, k_len);
    for (int64_t bin = begin; bin < end; ++bin) {
      for (const Task& t : bins[bin]) {
        const int64_t* slot = cp + rp[t.first] * k_len;
        const int64_t vectors = (t.count * group + WIDTH - 1) / WIDTH;
        if (t.count > 1) {                                     // a tile of a prompt's queries
          auto tile = vectors == 1 ? attend_tile<1> : vectors == 2 ? attend_tile<2> : attend_tile<3>;
          tile(qp, kp + t.h * dim, vp + t.h * dim, slot, lp, t.first, t.count, t.h, heads, group, dim, stride, s,
               buffers, op);
          continue;
        }
        for (int64_t h = 0; h < kv_heads; ++h) {
          const int64_t first = (t.first * heads + h * group) * dim;
#ifdef KVLIB_AVX2
          if (dim == 64) {
            attend_pair_fixed<8>(qp + first, kp + h * dim, vp + h * dim, slot, lp[t.first], stride, group, s,
                                 scores.data(), op + first);
            continue;
          }
#endif
          attend_pair(qp + first, kp + h * dim, vp + h * dim, slot, lp[t.first], stride, group, dim, s,
                      scores.data(), op + first);
        }
      }
    }
  });
  return out;
}

}  // namespace

// Declared, with what torch.compile sees it return, in kvlib/ops.py.
TORCH_LIBRARY_IMPL(kvlib_cpu, CPU, m) {
  m.impl("paged_attention", paged_attention);
}
