// kvlib's vector of floats, the one the kernels of panels.cpp and paged_attention.cpp are written in:
// 16 floats with AVX-512 (built with -mavx512f), 8 with AVX2 and FMA, else 8 in plain loops.
// Every operation works lane by lane (nothing sums across lanes but hsum), so a lane's result does
// not depend on what the other lanes hold.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

// Before a loop over a tile's registers (a handful of accumulators, a count known when compiling):
// unroll it completely, early, so that the compiler keeps each accumulator in a register. Without
// it GCC 12 kept panels.cpp's accumulators in memory too, a store for every multiply-add, and two
// threads on an AMD EPYC with AVX2 ran the products slower than one.
#define KVLIB_UNROLL _Pragma("GCC unroll 16")

namespace kvlib_simd {

#if defined(__AVX2__)
inline float hsum8(__m256 v) {              // v[0] + ... + v[7]
  __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}
#endif

#if defined(__AVX512F__)
constexpr const char* SIMD = "avx512";
using Vec = __m512;
constexpr int64_t WIDTH = 16, REGISTERS = 32;    // floats a vector, vector registers
inline Vec vzero() { return _mm512_setzero_ps(); }
inline Vec vset(float x) { return _mm512_set1_ps(x); }
inline Vec vload(const float* p) { return _mm512_loadu_ps(p); }
inline Vec vbroadcast(const float* p) { return _mm512_set1_ps(*p); }
inline void vstore(float* p, Vec v) { _mm512_storeu_ps(p, v); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline Vec vadd(Vec a, Vec b) { return _mm512_add_ps(a, b); }
inline Vec vsub(Vec a, Vec b) { return _mm512_sub_ps(a, b); }
inline Vec vmul(Vec a, Vec b) { return _mm512_mul_ps(a, b); }
inline Vec vmax(Vec a, Vec b) { return _mm512_max_ps(a, b); }
// x where a < b, else `other`
inline Vec vwhere_less(Vec a, Vec b, Vec x, float other) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), _mm512_set1_ps(other), x);
}
inline Vec vround(Vec x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline Vec vpow2(Vec n) {                     // 2^n for whole n in -126 .. 127, from the exponent's bits
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_castsi512_ps(bits);
}
inline float hsum(Vec v) { return _mm512_reduce_add_ps(v); }
inline void prefetch(const float* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0); }
#elif defined(__AVX2__) && defined(__FMA__)
constexpr const char* SIMD = "avx2";
using Vec = __m256;
constexpr int64_t WIDTH = 8, REGISTERS = 16;
inline Vec vzero() { return _mm256_setzero_ps(); }
inline Vec vset(float x) { return _mm256_set1_ps(x); }
inline Vec vload(const float* p) { return _mm256_loadu_ps(p); }
inline Vec vbroadcast(const float* p) { return _mm256_broadcast_ss(p); }
inline void vstore(float* p, Vec v) { _mm256_storeu_ps(p, v); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline Vec vadd(Vec a, Vec b) { return _mm256_add_ps(a, b); }
inline Vec vsub(Vec a, Vec b) { return _mm256_sub_ps(a, b); }
inline Vec vmul(Vec a, Vec b) { return _mm256_mul_ps(a, b); }
inline Vec vmax(Vec a, Vec b) { return _mm256_max_ps(a, b); }
inline Vec vwhere_less(Vec a, Vec b, Vec x, float other) {
  return _mm256_blendv_ps(_mm256_set1_ps(other), x, _mm256_cmp_ps(a, b, _CMP_LT_OQ));
}
inline Vec vround(Vec x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
inline Vec vpow2(Vec n) {
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_castsi256_ps(bits);
}
inline float hsum(Vec v) { return hsum8(v); }
inline void prefetch(const float* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0); }
#else
constexpr const char* SIMD = "plain loops";
constexpr int64_t WIDTH = 8, REGISTERS = 0;     // (none: the compiler's choice)
struct Vec { float v[WIDTH]; };              // one "vector" of 8 floats, in plain loops
template <typename F>
inline Vec lanes(F f) { Vec r; for (int64_t i = 0; i < WIDTH; ++i) r.v[i] = f(i); return r; }
inline Vec vzero() { return Vec{}; }
inline Vec vset(float x) { return lanes([&](int64_t) { return x; }); }
inline Vec vload(const float* p) { return lanes([&](int64_t i) { return p[i]; }); }
inline Vec vbroadcast(const float* p) { return vset(*p); }
inline void vstore(float* p, Vec v) { std::copy(v.v, v.v + WIDTH, p); }
inline Vec vfma(Vec a, Vec b, Vec c) { return lanes([&](int64_t i) { return a.v[i] * b.v[i] + c.v[i]; }); }
inline Vec vadd(Vec a, Vec b) { return lanes([&](int64_t i) { return a.v[i] + b.v[i]; }); }
inline Vec vsub(Vec a, Vec b) { return lanes([&](int64_t i) { return a.v[i] - b.v[i]; }); }
inline Vec vmul(Vec a, Vec b) { return lanes([&](int64_t i) { return a.v[i] * b.v[i]; }); }
inline Vec vmax(Vec a, Vec b) { return lanes([&](int64_t i) { return a.v[i] > b.v[i] ? a.v[i] : b.v[i]; }); }
inline Vec vwhere_less(Vec a, Vec b, Vec x, float other) {
  return lanes([&](int64_t i) { return a.v[i] < b.v[i] ? x.v[i] : other; });
}
inline Vec vround(Vec x) { return lanes([&](int64_t i) { return std::nearbyint(x.v[i]); }); }
inline Vec vpow2(Vec n) { return lanes([&](int64_t i) { return std::ldexp(1.0f, static_cast<int>(n.v[i])); }); }
inline float hsum(Vec v) { float s = 0.f; for (float x : v.v) s += x; return s; }
inline void prefetch(const float*) {}
#endif

// e^x, lane by lane, for x <= 0 (below -87, where e^x < 2^-125, as e^-87), as Cephes' expf computes
// it: e^x = 2^n e^r with n = round(x / ln 2), e^r by a polynomial; within 2 units of the last place.
inline Vec vexp(Vec x) {
  x = vmax(vset(-87.0f), x);
  const Vec n = vround(vmul(x, vset(1.44269504f)));
  Vec r = vfma(n, vset(-0.693359375f), x);              // x - n ln 2, ln 2 in two parts
  r = vfma(n, vset(2.12194440e-4f), r);
  Vec p = vset(1.9875691500e-4f);
  for (float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f}) {
    p = vfma(p, r, vset(c));
  }
  return vmul(vadd(vfma(p, vmul(r, r), r), vset(1.0f)), vpow2(n));
}

}  // namespace kvlib_simd
