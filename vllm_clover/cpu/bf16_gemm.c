/* y = x @ W^T (+ b) for bfloat16 x (M, K) and W (N, K) on AVX2 + FMA, float32 sums.
 *
 * For CPUs without bfloat16 units, where oneDNN creates no bf16 matmul and PyTorch's own
 * bf16 matmul costs one pass over W per row of x. This kernel widens each W element to
 * float32 once and multiplies it into up to ROWS rows of x: W is read once for all rows.
 * Each output element is the same sequence of FMAs (8 lanes over k, then a fixed lane sum)
 * whatever M is, so a row's result does not depend on the rows beside it.
 * Built and loaded by bf16_gemm.py.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ROWS 4    /* rows of x per pass over a pair of W rows: 8 accumulators */
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

/* Chain c of the sums of W rows w0, w1 against ROWS rows of x from xr (row stride K): the
 * lanes k = 8c .. 8c + 7 of every BLOCK, as one of ATen's 8 accumulator registers. */
static void full_chain(const float* xr, const uint16_t* w0, const uint16_t* w1, int64_t K,
                       int64_t main, int c, __m256 p0[ROWS][CHAINS], __m256 p1[ROWS][CHAINS]) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int64_t k = 8 * c; k < main; k += BLOCK) {
        const __m256 wa = load8(w0 + k), wb = load8(w1 + k);
        __m256 xv = _mm256_loadu_ps(xr + k);
        a0 = _mm256_fmadd_ps(xv, wa, a0);
        b0 = _mm256_fmadd_ps(xv, wb, b0);
        xv = _mm256_loadu_ps(xr + K + k);
        a1 = _mm256_fmadd_ps(xv, wa, a1);
        b1 = _mm256_fmadd_ps(xv, wb, b1);
        xv = _mm256_loadu_ps(xr + 2 * K + k);
        a2 = _mm256_fmadd_ps(xv, wa, a2);
        b2 = _mm256_fmadd_ps(xv, wb, b2);
        xv = _mm256_loadu_ps(xr + 3 * K + k);
        a3 = _mm256_fmadd_ps(xv, wa, a3);
        b3 = _mm256_fmadd_ps(xv, wb, b3);
    }
    p0[0][c] = a0, p0[1][c] = a1, p0[2][c] = a2, p0[3][c] = a3;
    p1[0][c] = b0, p1[1][c] = b1, p1[2][c] = b2, p1[3][c] = b3;
}

/* The same chain for one row of x. */
static void row_chain(const float* x, const uint16_t* w0, const uint16_t* w1, int64_t main,
                      int c, __m256* p0, __m256* p1) {
    __m256 a = _mm256_setzero_ps(), b = a;
    for (int64_t k = 8 * c; k < main; k += BLOCK) {
        const __m256 xv = _mm256_loadu_ps(x + k);
        a = _mm256_fmadd_ps(xv, load8(w0 + k), a);
        b = _mm256_fmadd_ps(xv, load8(w1 + k), b);
    }
    *p0 = a;
    *p1 = b;
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

/* Rows m0 .. m0 + rows - 1 of y for W rows n and n2 (n2 == n when N is odd at the end). */
static void pass(const float* xf, const uint16_t* W, const float* bias, uint16_t* y,
                 int64_t m0, int64_t rows, int64_t n, int64_t n2, int64_t N, int64_t K) {
    const uint16_t* w0 = W + n * K;
    const uint16_t* w1 = W + n2 * K;
    const int64_t main = K - K % BLOCK;
    __m256 p0[ROWS][CHAINS], p1[ROWS][CHAINS];
    for (int c = 0; c < CHAINS; c++) {
        if (rows == ROWS) {
            full_chain(xf + m0 * K, w0, w1, K, main, c, p0, p1);
        } else {
            for (int64_t r = 0; r < rows; r++)
                row_chain(xf + (m0 + r) * K, w0, w1, main, c, &p0[r][c], &p1[r][c]);
        }
    }
    for (int64_t r = 0; r < rows; r++) {
        const float* x = xf + (m0 + r) * K;
        float s0 = finish(x, w0, K, main, chains_sum(p0[r]));
        float s1 = finish(x, w1, K, main, chains_sum(p1[r]));
        if (bias) {
            s0 += bias[n];
            s1 += bias[n2];
        }
        y[(m0 + r) * N + n] = f32_to_bf16(s0);
        y[(m0 + r) * N + n2] = f32_to_bf16(s1);
    }
}

/* Returns 0, or -1 when the scratch copy of x could not be allocated. bias: float32 or NULL. */
int clover_bf16_linear(const uint16_t* x, const uint16_t* W, const float* bias, uint16_t* y,
                       int64_t M, int64_t N, int64_t K) {
    float* xf = (float*)malloc((size_t)(M * K) * sizeof(float));
    if (!xf) return -1;
    for (int64_t i = 0; i < M * K; i++) xf[i] = bf16_to_f32(x[i]);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n += 2) {
        const int64_t n2 = n + 1 < N ? n + 1 : n;
        for (int64_t m0 = 0; m0 < M; m0 += ROWS) {
            pass(xf, W, bias, y, m0, M - m0 < ROWS ? M - m0 : ROWS, n, n2, N, K);
        }
    }
    free(xf);
    return 0;
}
