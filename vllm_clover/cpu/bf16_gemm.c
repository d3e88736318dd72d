/* y = x @ W^T (+ b) for bfloat16 x (M, K) and W (N, K) on AVX2 + FMA, float32 sums.
 *
 * For CPUs without bfloat16 units, where oneDNN creates no bf16 matmul and PyTorch's own
 * bf16 matmul costs one pass over W per row of x. This kernel reads NB rows of W from memory
 * once for all rows of x, and widens each W element to float32 once for up to R rows of x.
 * Each output element is the same sequence of FMAs (8 chains of 8 lanes over k, as ATen's
 * AVX2 dot product makes them, then its fixed reduction) whatever M is, so a row's result does
 * not depend on the rows beside it, and equals PyTorch's own AVX2 bf16 matmul bit for bit.
 * Built and loaded by bf16_gemm.py.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CHAINS 8  /* ATen's accumulator registers per dot product (kF32RegistersPerIteration) */
#define BLOCK 64  /* columns per ATen main-loop iteration: CHAINS x 8 lanes */
#define NB 4      /* rows of W per task */
#define MAXR 6    /* rows of x per pass */

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

/* x's main part (k < main) reordered as the W registers of ``pair`` hold their lanes: in each
 * 16 columns, 0-3 and 8-11 first, then 4-7 and 12-15. */
static void interleave(const float* x, float* xp, int64_t main) {
    for (int64_t k = 0; k < main; k += 16) {
        memcpy(xp + k, x + k, 16);
        memcpy(xp + k + 4, x + k + 8, 16);
        memcpy(xp + k + 8, x + k + 4, 16);
        memcpy(xp + k + 12, x + k + 12, 16);
    }
}

/* Chains 2g and 2g + 1 of the sums of W rows w[0 .. WIDE - 1] against R rows of x (xp,
 * interleaved, row stride K). 16 bf16 of W widen with two unpacks into lo (lanes 0-3 of both
 * chains) and hi (lanes 4-7): each lane's sum is the FMAs ATen's register lane makes, in its
 * order, regrouped into the chains' registers at the end. Called with constant R and WIDE, so
 * that the compiler keeps the 2 * WIDE * R sums in registers. */
static inline __attribute__((always_inline)) void pair(
    const float* xp, const uint16_t* const w[NB], int64_t K, int64_t main, int g, const int R,
    const int WIDE, __m256 p[NB][MAXR][CHAINS]) {
    const __m256i zero = _mm256_setzero_si256();
    __m256 lo[NB][MAXR], hi[NB][MAXR];
    for (int j = 0; j < WIDE; j++)
        for (int r = 0; r < R; r++) lo[j][r] = hi[j][r] = _mm256_setzero_ps();
    for (int64_t k = 16 * g; k < main; k += BLOCK) {
        for (int j = 0; j < WIDE; j++) {
            const __m256i h = _mm256_loadu_si256((const __m256i*)(w[j] + k));
            const __m256 wl = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, h));
            const __m256 wh = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, h));
            for (int r = 0; r < R; r++) {
                lo[j][r] = _mm256_fmadd_ps(_mm256_loadu_ps(xp + r * K + k), wl, lo[j][r]);
                hi[j][r] = _mm256_fmadd_ps(_mm256_loadu_ps(xp + r * K + k + 8), wh, hi[j][r]);
            }
        }
    }
    for (int j = 0; j < WIDE; j++)
        for (int r = 0; r < R; r++) {
            p[j][r][2 * g] = _mm256_permute2f128_ps(lo[j][r], hi[j][r], 0x20);
            p[j][r][2 * g + 1] = _mm256_permute2f128_ps(lo[j][r], hi[j][r], 0x31);
        }
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

/* Rows m0 .. m0 + R - 1 of y for the WIDE rows of W from col[0]. */
static inline __attribute__((always_inline)) void pass(
    const float* xf, const float* xp, const uint16_t* W, const float* bias, uint16_t* y,
    int64_t m0, const int R, const int WIDE, const int64_t* col, int64_t N, int64_t K) {
    const uint16_t* w[NB];
    for (int j = 0; j < WIDE; j++) w[j] = W + col[j] * K;
    const int64_t main = K - K % BLOCK;
    __m256 p[NB][MAXR][CHAINS];
    for (int g = 0; g < CHAINS / 2; g++) pair(xp + m0 * K, w, K, main, g, R, WIDE, p);
    for (int r = 0; r < R; r++) {
        const float* x = xf + (m0 + r) * K;
        for (int j = 0; j < WIDE; j++) {
            float s = finish(x, w[j], K, main, chains_sum(p[j][r]));
            if (bias) s += bias[col[j]];
            y[(m0 + r) * N + col[j]] = f32_to_bf16(s);
        }
    }
}

/* Rows m0 .. m0 + R - 1 of y for the NB rows of W in col, WIDE of them per pass: 2 * WIDE * R
 * sums stay within the 16 registers with the two of W. */
static inline __attribute__((always_inline)) void rows(
    const float* xf, const float* xp, const uint16_t* W, const float* bias, uint16_t* y,
    int64_t m0, const int R, const int64_t* col, int64_t N, int64_t K) {
    const int WIDE = R == 1 ? 4 : R <= 3 ? 2 : 1;
    for (int j = 0; j < NB; j += WIDE) pass(xf, xp, W, bias, y, m0, R, WIDE, col + j, N, K);
}

/* Returns 0, or -1 when the scratch copies of x could not be allocated. bias: float32 or NULL. */
int clover_bf16_linear(const uint16_t* x, const uint16_t* W, const float* bias, uint16_t* y,
                       int64_t M, int64_t N, int64_t K) {
    float* xf = (float*)malloc((size_t)(2 * M * K) * sizeof(float));
    if (!xf) return -1;
    float* xp = xf + M * K;
    for (int64_t i = 0; i < M * K; i++) xf[i] = bf16_to_f32(x[i]);
    for (int64_t m = 0; m < M; m++) interleave(xf + m * K, xp + m * K, K - K % BLOCK);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n += NB) {
        int64_t col[NB]; /* clamped to N - 1 at the end: that row is computed twice */
        for (int j = 0; j < NB; j++) col[j] = n + j < N ? n + j : N - 1;
        for (int64_t m0 = 0; m0 < M; m0 += MAXR) {
            switch (M - m0) { /* a constant R for each pass */
                case 1: rows(xf, xp, W, bias, y, m0, 1, col, N, K); break;
                case 2: rows(xf, xp, W, bias, y, m0, 2, col, N, K); break;
                case 3: rows(xf, xp, W, bias, y, m0, 3, col, N, K); break;
                case 4: rows(xf, xp, W, bias, y, m0, 4, col, N, K); break;
                case 5: rows(xf, xp, W, bias, y, m0, 5, col, N, K); break;
                default: rows(xf, xp, W, bias, y, m0, MAXR, col, N, K); break;
            }
        }
    }
    free(xf);
    return 0;
}
