// bf16 x bf16 -> bf16 linear layer for CPUs without native bf16 dot products (AVX2 + FMA, no AVX512-BF16/AMX).
//
// There, PyTorch's bf16 matmul has no fast kernel: its cost grows linearly with the number of rows M (a verify
// forward of 4 tokens costs 2x a decode step). This kernel streams each weight row once, widens it to fp32 in
// registers and multiplies it with up to 4 activation rows at a time, so for the small M of decoding and
// speculative verification it stays memory-bound (~the cost of M = 1). Accumulation is fp32; each output is
// rounded once to bf16 (round to nearest even). Built on first use by specbench/models/cpu_kernels.py.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>

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

// R weight rows x MB (<= 4) activation rows: each weight vector is widened once in registers and used for every
// activation row; R * MB independent fp32 accumulators keep the FMA pipes busy while the rows stream in.
template <int R, int MB>
static inline void tile(const uint16_t* w, const float* X, int64_t K, float* out /* [R][MB] */) {
  __m256 acc[R][MB];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < MB; ++i) acc[r][i] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) {
    __m256 v[R];
    for (int r = 0; r < R; ++r) v[r] = load_bf16x8(w + r * K + k);
    for (int i = 0; i < MB; ++i) {
      const __m256 xv = _mm256_loadu_ps(X + i * K + k);
      for (int r = 0; r < R; ++r) acc[r][i] = _mm256_fmadd_ps(xv, v[r], acc[r][i]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < MB; ++i) out[r * MB + i] = hsum(acc[r][i]);
}

// Rows [n0, n1) of W against activation rows [m0, m0 + MB) of X, written to Y (bf16, row stride N).
template <int R, int MB>
static void block(const uint16_t* W, const float* X, uint16_t* Y, int64_t n0, int64_t n1, int64_t m0, int64_t K,
                  int64_t N) {
  float out[R * MB];
  int64_t n = n0;
  for (; n + R <= n1; n += R) {
    tile<R, MB>(W + n * K, X + m0 * K, K, out);
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < MB; ++i) Y[(m0 + i) * N + n + r] = to_bf16(out[r * MB + i]);
  }
  for (; n < n1; ++n) {
    tile<1, MB>(W + n * K, X + m0 * K, K, out);
    for (int i = 0; i < MB; ++i) Y[(m0 + i) * N + n] = to_bf16(out[i]);
  }
}

static void rows(const uint16_t* W, const float* X, uint16_t* Y, int64_t n0, int64_t n1, int64_t M, int64_t K,
                 int64_t N) {
  // Activation blocks of 4 re-read the same weight rows; for M > 4 those re-reads hit the cache (each thread's
  // chunk of rows is walked in slices small enough to stay in L2 across the blocks).
  const int64_t slice = M <= 4 ? n1 - n0 : std::max<int64_t>(4, (128 * 1024) / (2 * K));
  for (int64_t s0 = n0; s0 < n1; s0 += slice) {
    const int64_t s1 = std::min(n1, s0 + slice);
    for (int64_t m0 = 0; m0 < M; m0 += 4) {
      switch (std::min<int64_t>(4, M - m0)) {
        case 1: block<4, 1>(W, X, Y, s0, s1, m0, K, N); break;
        case 2: block<2, 2>(W, X, Y, s0, s1, m0, K, N); break;
        case 3: block<2, 3>(W, X, Y, s0, s1, m0, K, N); break;
        default: block<2, 4>(W, X, Y, s0, s1, m0, K, N); break;
      }
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
  // Threads split the weight rows (compiled with -fopenmp, so at::parallel_for really runs on torch's pool).
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) { rows(W, X, Y, n0, n1, M, K, N); });
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("linear_bf16", &linear_bf16); }
