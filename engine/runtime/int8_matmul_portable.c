/* The int8 layers' product for a few float rows in plain C, no intrinsics: the portable build,
 * for a CPU with none of the vector units the other builds need (or another architecture),
 * and the reference every other build is compared with (tests/engine/runtime/).
 *
 * It computes what int8_matmul.c and int8_matmul_avx2.c compute, and what the torch version
 * in engine/runtime/int8_kernel.py computes: each row rounded to int8 in two levels, the same
 * float32 operations in the same order; times the weight with exact int32 sums (signed levels:
 * no shift to take back); scaled back as sums1 * scale1 + sums2 * scale2, then times the
 * layer's row scale and plus its bias. So its floats are the others' to the bit.
 *
 * Shaped for the compiler's vectoriser (SSE2 on any x86-64): the levels kept as int16, so that
 * a token's two dot products with a weight row are one loop of 16-bit multiplies summed in
 * pairs into int32 (PMADDWD; with int8 levels the compiler widened both sides, 2.2x slower at
 * one token); each weight row taken for every token while it is in L1; OpenMP over blocks of
 * ROWS rows. Built with -ffp-contract=off, as the others.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define ROWS 16

/* torch's amax(...).clamp(min=1e-30) / 127 (NaN where any value was NaN, as amax keeps it) */
static float scale_of(float largest, int any_nan) {
    float most = any_nan ? NAN : largest;
    return (most < 1e-30f ? 1e-30f : most) / 127.0f;
}

/* Row x's two levels and their scales, as int8_matmul_avx2.c's round_row (leftover: k floats). */
static void round_row(const float *x, int64_t k, int16_t *first, int16_t *second, float *leftover, float scales[2]) {
    float largest = 0.0f;
    int any_nan = 0;
    for (int64_t j = 0; j < k; j++) {
        any_nan |= isnan(x[j]);
        largest = fabsf(x[j]) > largest ? fabsf(x[j]) : largest;
    }
    float scale = scale_of(largest, any_nan), inverse = 1.0f / scale; /* times it, as torch_product */
    float left_largest = 0.0f;
    int left_nan = 0;
    for (int64_t j = 0; j < k; j++) {
        float level = nearbyintf(x[j] * inverse); /* half to even, as torch.round */
        first[j] = any_nan ? 0 : (int16_t)(int)level; /* a NaN row's product is NaN whatever its levels */
        float product = level * scale;
        leftover[j] = x[j] - product;
        left_nan |= isnan(leftover[j]);
        left_largest = fabsf(leftover[j]) > left_largest ? fabsf(leftover[j]) : left_largest;
    }
    float left_scale = scale_of(left_largest, left_nan), left_inverse = 1.0f / left_scale;
    for (int64_t j = 0; j < k; j++) {
        float level = nearbyintf(leftover[j] * left_inverse);
        second[j] = left_nan ? 0 : (int16_t)(int)level;
    }
    scales[0] = scale;
    scales[1] = left_scale;
}

/* A token's two levels times one weight row: exact int32 sums, so any order gives the same. */
static inline void dot_levels(const int16_t *first, const int16_t *second, const int8_t *row, int64_t k, int32_t sums[2]) {
    int32_t a = 0, b = 0;
    for (int64_t j = 0; j < k; j++) {
        int16_t weight = row[j];
        a += first[j] * weight;
        b += second[j] * weight;
    }
    sums[0] = a;
    sums[1] = b;
}

/* int8_matmul.c's contract: out (m, n) = the rows x (m, k), each prepared first where
 * `prepare` is not NULL and rounded to two levels, times the int8 weight rows (n of k bytes,
 * `w_stride` apart), times row_scale[j] and plus bias[j] where those are not NULL. row_sums is
 * not needed here (the levels stay signed). Returns 0, or -1 where memory for the rounded rows
 * could not be had. */
int tandem_int8_linear(const float *x, int64_t m, int64_t k, const int8_t *w, int64_t n, int64_t w_stride,
                       const int32_t *row_sums, const float *row_scale, const float *bias, float *out,
                       void (*prepare)(const void *context, int64_t row), const void *context, int threads) {
    (void)row_sums;
    int16_t *levels = malloc(sizeof(int16_t) * 2 * m * k + 1); /* row i: levels 2i and 2i+1 */
    float *scales = malloc(sizeof(float) * 2 * m);
    float *leftover = malloc(sizeof(float) * m * k + 1);
    if (levels == NULL || scales == NULL || leftover == NULL) {
        free(levels), free(scales), free(leftover);
        return -1;
    }
    int64_t blocks = (n + ROWS - 1) / ROWS;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int64_t i = 0; i < m; i++) {
            if (prepare != NULL) prepare(context, i);
            round_row(x + i * k, k, levels + 2 * i * k, levels + (2 * i + 1) * k, leftover + i * k, scales + 2 * i);
        }
#pragma omp for schedule(static)
        for (int64_t block = 0; block < blocks; block++) {
            int64_t first = block * ROWS, last = first + ROWS < n ? first + ROWS : n;
            for (int64_t j = first; j < last; j++)
                for (int64_t i = 0; i < m; i++) {
                    const int16_t *first_level = levels + 2 * i * k, *second_level = first_level + k;
                    int32_t sums[2];
                    dot_levels(first_level, second_level, w + j * w_stride, k, sums);
                    float product = (float)sums[0] * scales[2 * i] + (float)sums[1] * scales[2 * i + 1];
                    if (row_scale != NULL) product = product * row_scale[j];
                    if (bias != NULL) product = product + bias[j];
                    out[i * n + j] = product;
                }
        }
    }
    free(levels), free(scales), free(leftover);
    return 0;
}

/* The product alone (no scale, no bias): int8_kernel.py's operator. */
int tandem_int8_product(const float *x, int64_t m, int64_t k, const int8_t *w, int64_t n, int64_t w_stride,
                        const int32_t *row_sums, float *out, int threads) {
    return tandem_int8_linear(x, m, k, w, n, w_stride, row_sums, NULL, NULL, out, NULL, NULL, threads);
}
