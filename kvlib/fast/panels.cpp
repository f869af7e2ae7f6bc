// A float32 matrix product for the few rows of a decode step, reading each weight once, in order.
//
// A decode step multiplies a handful of rows (one token per request) by every weight of the model:
// it is a matter of reading the weights from memory as fast as the memory gives them. The weight
// (out, in) is laid out once in *panels* of 16 output features, (ceil(out / 16), in, 16): a panel is
// one contiguous stream, and the kernel reads each panel once, front to back, while up to MT rows
// of activations (12 with AVX-512, 6 with AVX2) accumulate their 16 outputs in vector registers.
//
//   panel_pack(w):        float32 (out, in) -> (ceil(out / 16), in, 16), zero rows after `out`;
//   panel_mm(x, p, out):  x float32 (..., in) times the packed weight -> (..., out).
//   panel_simd():         "avx512", "avx2" or "plain loops": what this build runs.
//
// Every output is one sum over `in`, added in order by one fused multiply-add after another, the
// same whatever the number of rows, the tile a row falls in, or the number of threads: a row gets
// the same bits alone as in a batch (batch-invariant). The sum runs in another order than MKL's or
// oneDNN's, so results agree with F.linear to float32 rounding (tests/fast/test_panels.py).
// The panels are shared out among the threads (at::parallel_for).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "simd.h"

namespace {

using namespace kvlib_simd;

constexpr int64_t PANEL = 16;       // output features per panel
constexpr int64_t AHEAD = 32;       // prefetch the weights this many steps of `in` ahead
constexpr int64_t MT = REGISTERS == 32 ? 12 : REGISTERS == 16 ? 6 : 4;   // rows a tile: AVX-512, AVX2, plain
constexpr int64_t VECS = PANEL / WIDTH;      // vectors per panel row

// M rows of x (row stride ldx) times one panel wp (in, 16): out (M, 16), row stride ldo.
template <int64_t M>
inline void tile(const float* x, int64_t ldx, const float* wp, int64_t in, float* out, int64_t ldo) {
  Vec acc[M][VECS];                          // in registers: every loop over m or v unrolled (simd.h)
  KVLIB_UNROLL for (int64_t m = 0; m < M; ++m)
    KVLIB_UNROLL for (int64_t v = 0; v < VECS; ++v) acc[m][v] = vzero();
  for (int64_t k = 0; k < in; ++k) {
    Vec w[VECS];
    KVLIB_UNROLL for (int64_t v = 0; v < VECS; ++v) w[v] = vload(wp + k * PANEL + v * WIDTH);
    prefetch(wp + (k + AHEAD) * PANEL);      // (a hint: past the end it reads nothing)
    KVLIB_UNROLL for (int64_t m = 0; m < M; ++m) {
      const Vec xb = vbroadcast(x + m * ldx + k);
      KVLIB_UNROLL for (int64_t v = 0; v < VECS; ++v) acc[m][v] = vfma(xb, w[v], acc[m][v]);
    }
  }
  KVLIB_UNROLL for (int64_t m = 0; m < M; ++m)
    KVLIB_UNROLL for (int64_t v = 0; v < VECS; ++v) vstore(out + m * ldo + v * WIDTH, acc[m][v]);
}

// The last rows (fewer than MT): a tile of exactly `rows`.
template <int64_t M>
void tail(const float* x, int64_t ldx, const float* wp, int64_t in, float* out, int64_t ldo, int64_t rows) {
  if constexpr (M > 0) {
    if (rows == M) return tile<M>(x, ldx, wp, in, out, ldo);
    tail<M - 1>(x, ldx, wp, in, out, ldo, rows);
  }
}

// Every row of x (rows, in) times panel wp: out (rows, 16), row stride ldo.
void panel_rows(const float* x, int64_t rows, int64_t in, const float* wp, float* out, int64_t ldo) {
  int64_t r = 0;
  for (; r + MT <= rows; r += MT) tile<MT>(x + r * in, in, wp, in, out + r * ldo, ldo);
  if (r < rows) tail<MT - 1>(x + r * in, in, wp, in, out + r * ldo, ldo, rows - r);
}

at::Tensor panel_pack(const at::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat, "kvlib_cpu::panel_pack: takes a 2-d float32 weight "
              "(out, in), got ", w.sizes(), " ", w.scalar_type());
  const int64_t out = w.size(0), in = w.size(1), panels = (out + PANEL - 1) / PANEL;
  at::Tensor padded = at::zeros({panels * PANEL, in}, w.options());
  padded.narrow(0, 0, out).copy_(w);
  return padded.view({panels, PANEL, in}).transpose(1, 2).contiguous();      // (panels, in, 16)
}

at::Tensor panel_mm(const at::Tensor& x, const at::Tensor& p, int64_t out) {
  TORCH_CHECK(p.dim() == 3 && p.size(2) == PANEL && p.scalar_type() == at::kFloat && p.is_contiguous(),
              "kvlib_cpu::panel_mm: the weight must come from panel_pack (panels, in, 16), got ", p.sizes());
  const int64_t panels = p.size(0), in = p.size(1);
  TORCH_CHECK(in > 0, "kvlib_cpu::panel_mm: the weight has no inputs (in = 0): ", p.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() >= 1 && x.size(-1) == in, "kvlib_cpu::panel_mm: x must be "
              "float32 (..., ", in, "), got ", x.sizes(), " ", x.scalar_type());
  TORCH_CHECK(out > (panels - 1) * PANEL && out <= panels * PANEL, "kvlib_cpu::panel_mm: ", panels,
              " panels hold ", (panels - 1) * PANEL + 1, " to ", panels * PANEL, " outputs, not ", out);
  const at::Tensor xc = x.contiguous();
  const int64_t rows = xc.numel() / in;
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = out;
  at::Tensor y = at::empty(shape, x.options());
  const float* xp = xc.data_ptr<float>();
  const float* wp = p.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      const float* panel = wp + j * in * PANEL;
      const int64_t cols = std::min(PANEL, out - j * PANEL);
      if (cols == PANEL) {
        panel_rows(xp, rows, in, panel, yp + j * PANEL, out);
        continue;
      }
      std::vector<float> part(rows * PANEL);                 // the last panel, part padding: only `cols` kept
      panel_rows(xp, rows, in, panel, part.data(), PANEL);
      for (int64_t r = 0; r < rows; ++r) std::copy_n(part.data() + r * PANEL, cols, yp + r * out + j * PANEL);
    }
  });
  return y;
}

std::string panel_simd() { return SIMD; }

}  // namespace

// Declared, with what torch.compile sees them return, in kvlib/ops.py.
TORCH_LIBRARY_FRAGMENT(kvlib_cpu, m) {
  m.impl("panel_simd", &panel_simd);
}

TORCH_LIBRARY_IMPL(kvlib_cpu, CPU, m) {
  m.impl("panel_pack", panel_pack);
  m.impl("panel_mm", panel_mm);
}
