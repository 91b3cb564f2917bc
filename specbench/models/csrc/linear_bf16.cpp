// bf16 x bf16 -> bf16 linear layer for CPUs without native bf16 dot products (AVX2 + FMA, no AVX512-BF16/AMX).
//
// There, PyTorch's bf16 matmul has no fast kernel: its cost grows linearly with the number of rows M (a verify
// forward of 4 tokens costs 2x a decode step). This kernel streams each weight row once, widens it to fp32 in
// fp32 and multiplies it with 4 activation rows at a time, so for the small M of decoding and
// speculative verification it stays memory-bound (~the cost of M = 1). Accumulation is fp32; each output is
// rounded once to bf16 (round to nearest even). Built on first use by specbench/models/cpu_kernels.py.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cstring>
#include <vector>

// y[m, n] = sum_k x[m, k] * w[n, k]; x bf16 [M, K], w bf16 [N, K] -> y bf16 [M, N].
static inline __m256 load_bf16x8(const uint16_t* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
static inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 sh = _mm_movehdup_ps(lo);
  __m128 s = _mm_add_ps(lo, sh);
  sh = _mm_movehl_ps(sh, s);
  return _mm_cvtss_f32(_mm_add_ss(s, sh));
}
static inline uint16_t to_bf16(float f) {  // round to nearest even (NaN not expected here)
  uint32_t u; std::memcpy(&u, &f, 4);
  u += 0x7FFF + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

// 2 weight rows x up to 4 activation rows per inner loop (8 fp32 accumulators). The weight pair is widened to
// fp32 once into a small buffer, so activation blocks beyond the first re-read it from L1 without converting.
static void rows2(const uint16_t* w0, const float* X, int64_t M, int64_t K, float* buf, float* out0, float* out1) {
  const uint16_t* w1 = w0 + K;
  for (int64_t k = 0; k < K; k += 8) {
    _mm256_storeu_ps(buf + k, load_bf16x8(w0 + k));
    _mm256_storeu_ps(buf + K + k, load_bf16x8(w1 + k));
  }
  const float* b0 = buf;
  const float* b1 = buf + K;
  for (int64_t m0 = 0; m0 < M; m0 += 4) {
    const int64_t mb = std::min<int64_t>(4, M - m0);
    const float* x0 = X + m0 * K;
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
    __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    for (int64_t k = 0; k < K; k += 8) {
      __m256 v0 = _mm256_loadu_ps(b0 + k), v1 = _mm256_loadu_ps(b1 + k);
      __m256 xv = _mm256_loadu_ps(x0 + k);
      a00 = _mm256_fmadd_ps(xv, v0, a00); a10 = _mm256_fmadd_ps(xv, v1, a10);
      if (mb > 1) { xv = _mm256_loadu_ps(x0 + K + k); a01 = _mm256_fmadd_ps(xv, v0, a01); a11 = _mm256_fmadd_ps(xv, v1, a11); }
      if (mb > 2) { xv = _mm256_loadu_ps(x0 + 2 * K + k); a02 = _mm256_fmadd_ps(xv, v0, a02); a12 = _mm256_fmadd_ps(xv, v1, a12); }
      if (mb > 3) { xv = _mm256_loadu_ps(x0 + 3 * K + k); a03 = _mm256_fmadd_ps(xv, v0, a03); a13 = _mm256_fmadd_ps(xv, v1, a13); }
    }
    const __m256 acc0[4] = {a00, a01, a02, a03}, acc1[4] = {a10, a11, a12, a13};
    for (int64_t i = 0; i < mb; ++i) {
      out0[m0 + i] = hsum(acc0[i]);
      out1[m0 + i] = hsum(acc1[i]);
    }
  }
}

torch::Tensor linear_bf16(torch::Tensor x, torch::Tensor w) {
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "linear_bf16: shapes");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16, "linear_bf16: bf16 only");
  TORCH_CHECK(w.is_contiguous(), "linear_bf16: weight must be contiguous");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(K % 8 == 0, "K must be a multiple of 8");  // callers fall back to torch otherwise
  auto xf = x.contiguous().to(at::kFloat);  // activations widened once: [M, K]
  auto y = torch::empty({M, N}, x.options());
  const float* X = xf.data_ptr<float>();
  const uint16_t* W = reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>());
  uint16_t* Y = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  at::parallel_for(0, (N + 1) / 2, 8, [&](int64_t p0, int64_t p1) {
    std::vector<float> buf(2 * K), o0(M), o1(M);
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n = 2 * p;
      if (n + 1 < N) {
        rows2(W + n * K, X, M, K, buf.data(), o0.data(), o1.data());
        for (int64_t i = 0; i < M; ++i) {
          Y[i * N + n] = to_bf16(o0[i]);
          Y[i * N + n + 1] = to_bf16(o1[i]);
        }
      } else {  // odd N: the last row alone
        const uint16_t* w0 = W + n * K;
        for (int64_t i = 0; i < M; ++i) {
          __m256 a = _mm256_setzero_ps();
          const float* xi = X + i * K;
          for (int64_t k = 0; k < K; k += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(xi + k), load_bf16x8(w0 + k), a);
          Y[i * N + n] = to_bf16(hsum(a));
        }
      }
    }
  });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("linear_bf16", &linear_bf16); }
