/* y = x @ W^T (+ b) for bfloat16 x (M, K) and W (N, K) on AVX2 + FMA, float32 sums.
 *
 * For CPUs without bfloat16 units, where oneDNN creates no bf16 matmul and PyTorch's own
 * bf16 matmul costs one pass over W per row of x. This kernel widens each W element to
 * float32 once for up to ROWS rows of x, WIDE rows of W at a time: W is read from memory
 * once for all rows, and the WIDE * ROWS sums in flight keep both FMA units busy.
 * Each output element is the same sequence of FMAs (8 lanes over k, then a fixed lane sum)
 * whatever M is, so a row's result does not depend on the rows beside it.
 * Built and loaded by bf16_gemm.py.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ROWS 3    /* rows of x per pass */
#define WIDE 4    /* rows of W per pass: with ROWS, 12 sums in registers */
#define CHAINS 8  /* ATen's accumulator registers per dot product (kF32RegistersPerIteration) */
#define BLOCK 64  /* columns per ATen main-loop iteration: CHAINS x 8 lanes */

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even, NaN kept */
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline __m256 load8(const uint16_t* p) { /* 8 bf16 -> 8 float32 */
    __m128i h = _mm_loadu_si128((const __m128i*)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* The sum of v's 8 lanes in the order of ATen's vec_reduce_all for AVX2 float vectors. */
static inline float lane_sum(__m256 v) {
    v = _mm256_add_ps(v, _mm256_permute2f128_ps(v, v, 1));
    v = _mm256_add_ps(v, _mm256_shuffle_ps(v, v, 0x4E));
    v = _mm256_add_ps(v, _mm256_shuffle_ps(v, v, 0xB1));
    return _mm256_cvtss_f32(v);
}

/* One dot product's CHAINS partial sums, reduced as ATen reduces its 8 registers. */
static inline float chains_sum(__m256 part[CHAINS]) {
    for (int c = 0; c < 4; c++) part[c] = _mm256_add_ps(part[c], part[c + 4]);
    for (int c = 0; c < 2; c++) part[c] = _mm256_add_ps(part[c], part[c + 2]);
    return lane_sum(_mm256_add_ps(part[0], part[1]));
}

/* Chain c of the sums of WIDE rows of W (w[j]) against R rows of x from xr (row stride K):
 * the lanes k = 8c .. 8c + 7 of every BLOCK, as one of ATen's 8 accumulator registers.
 * Each W element is widened once for all R rows, and each output's sum is the FMAs a single
 * row would make, in the same order. Called with a constant R, so that the compiler keeps
 * the WIDE * R sums in registers: enough independent sums to hide the FMA latency. */
static inline __attribute__((always_inline)) void chain(
    const float* xr, const uint16_t* const w[WIDE], int64_t K, int64_t main, int c, const int R,
    __m256 p[WIDE][ROWS][CHAINS]) {
    __m256 a[WIDE][ROWS];
    for (int j = 0; j < WIDE; j++)
        for (int r = 0; r < R; r++) a[j][r] = _mm256_setzero_ps();
    for (int64_t k = 8 * c; k < main; k += BLOCK) {
        __m256 wv[WIDE];
        for (int j = 0; j < WIDE; j++) wv[j] = load8(w[j] + k);
        for (int r = 0; r < R; r++) {
            const __m256 xv = _mm256_loadu_ps(xr + r * K + k);
            for (int j = 0; j < WIDE; j++) a[j][r] = _mm256_fmadd_ps(xv, wv[j], a[j][r]);
        }
    }
    for (int j = 0; j < WIDE; j++)
        for (int r = 0; r < R; r++) p[j][r][c] = a[j][r];
}

/* x . w after the main loop's sums: ATen's tail, 16 columns at a time into one register
 * (low 8 then high 8), then column by column. */
static float finish(const float* x, const uint16_t* w, int64_t K, int64_t main, float sum) {
    const int64_t vec = K - K % 16;
    __m256 t = _mm256_setzero_ps();
    for (int64_t k = main; k < vec; k += 16) {
        t = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), load8(w + k), t);
        t = _mm256_fmadd_ps(_mm256_loadu_ps(x + k + 8), load8(w + k + 8), t);
    }
    sum += lane_sum(t);
    for (int64_t k = vec; k < K; k++) sum += x[k] * bf16_to_f32(w[k]);
    return sum;
}

/* Rows m0 .. m0 + R - 1 of y for the WIDE rows of W from n (clamped to N - 1 at the end,
 * where a row is then computed twice into the same place). */
static inline __attribute__((always_inline)) void pass(const float* xf, const uint16_t* W,
                                                      const float* bias, uint16_t* y,
                                                      int64_t m0, const int R, int64_t n,
                                                      int64_t N, int64_t K) {
    const uint16_t* w[WIDE];
    int64_t col[WIDE];
    for (int j = 0; j < WIDE; j++) {
        col[j] = n + j < N ? n + j : N - 1;
        w[j] = W + col[j] * K;
    }
    const int64_t main = K - K % BLOCK;
    __m256 p[WIDE][ROWS][CHAINS];
    for (int c = 0; c < CHAINS; c++) chain(xf + m0 * K, w, K, main, c, R, p);
    for (int r = 0; r < R; r++) {
        const float* x = xf + (m0 + r) * K;
        for (int j = 0; j < WIDE; j++) {
            float s = finish(x, w[j], K, main, chains_sum(p[j][r]));
            if (bias) s += bias[col[j]];
            y[(m0 + r) * N + col[j]] = f32_to_bf16(s);
        }
    }
}

/* Returns 0, or -1 when the scratch copy of x could not be allocated. bias: float32 or NULL. */
int clover_bf16_linear(const uint16_t* x, const uint16_t* W, const float* bias, uint16_t* y,
                       int64_t M, int64_t N, int64_t K) {
    float* xf = (float*)malloc((size_t)(M * K) * sizeof(float));
    if (!xf) return -1;
    for (int64_t i = 0; i < M * K; i++) xf[i] = bf16_to_f32(x[i]);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n += WIDE) {
        for (int64_t m0 = 0; m0 < M; m0 += ROWS) {
            switch (M - m0) { /* a constant R for each pass */
                case 1: pass(xf, W, bias, y, m0, 1, n, N, K); break;
                case 2: pass(xf, W, bias, y, m0, 2, n, N, K); break;
                default: pass(xf, W, bias, y, m0, ROWS, n, N, K); break;
            }
        }
    }
    free(xf);
    return 0;
}
