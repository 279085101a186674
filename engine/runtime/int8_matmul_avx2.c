/* The int8 layers' product for a few float rows on CPUs without AVX-512 (most consumer Intel
 * CPUs, AMD before Zen 4): the same computation as int8_matmul.c, on 256-bit vectors, with
 * AVX-VNNI where the CPU has it (built with -mavxvnni) and AVX2 alone otherwise.
 *
 * Why it differs from the AVX-512 file:
 * - AVX2's byte product (VPMADDUBSW) adds two u8 x s8 products into a saturating int16: a
 *   shifted level (up to 255) times a weight (up to 127), twice, would overflow. So there the
 *   levels stay signed, and each pair multiplies |level| by the weight with the level's sign
 *   (VPSIGNB): at most 2 * 127 * 127, which fits.
 * - AVX-VNNI's VPDPBUSD adds four u8 x s8 products straight into int32, which cannot
 *   overflow: the levels are shifted to unsigned (level + 128) and 128 times each weight row's
 *   sum is taken off the sums after, as int8_matmul.c does. One instruction per 32 products
 *   where the signed levels took three (VPSIGNB, VPABSB, VPDPBUSD); the int32 sums are the
 *   same, exactly.
 * - There are no masked byte loads: the last k % 32 bytes of a row are copied into a
 *   zero-padded buffer first, so no load reads past a row's end.
 * - The rounding is plain C: the same float32 operations as the torch version, in the same
 *   order (and -ffp-contract=off keeps a multiply and a subtract from fusing).
 * - Blocks of 8 weight rows, TOGETHER at a time: each 32 bytes of a row loaded once for a
 *   token's two levels (with 16 accumulators the 16 vector registers spill); a tree of
 *   horizontal adds gives the 8 rows' sums of each level.
 * - As in int8_matmul.c, a block's rows come from memory once, for the first token, and that
 *   token's passes fetch the next block into L2, so the memory keeps streaming while the
 *   block is busy (without it a one-token product read the weights at under half the bandwidth
 *   two cores have, docs/BENCHMARKS.md).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ROWS 8
#define CHUNK 32

/* torch's amax(...).clamp(min=1e-30) / 127 (NaN where any value was NaN, as amax keeps it) */
static float scale_of(float largest, int any_nan) {
    float most = any_nan ? NAN : largest;
    return (most < 1e-30f ? 1e-30f : most) / 127.0f;
}

static void round_row(const float *x, int64_t k, int8_t *first, int8_t *second, float *leftover,
                      float scales[2]) {
    float largest = 0.0f;
    int any_nan = 0;
    for (int64_t j = 0; j < k; j++) {
        any_nan |= isnan(x[j]);
        largest = fabsf(x[j]) > largest ? fabsf(x[j]) : largest;
    }
    float scale = scale_of(largest, any_nan), inverse = 1.0f / scale; /* times it, as int8_matmul.c */
    float left_largest = 0.0f;
    int left_nan = 0;
    for (int64_t j = 0; j < k; j++) {
        float level = nearbyintf(x[j] * inverse); /* half to even, as torch.round */
        first[j] = any_nan ? 0 : (int8_t)(int)level; /* a NaN row's product is NaN whatever its levels */
        float product = level * scale;
        leftover[j] = x[j] - product;
        left_nan |= isnan(leftover[j]);
        left_largest = fabsf(leftover[j]) > left_largest ? fabsf(leftover[j]) : left_largest;
    }
    float left_scale = scale_of(left_largest, left_nan), left_inverse = 1.0f / left_scale;
    for (int64_t j = 0; j < k; j++) {
        float level = nearbyintf(leftover[j] * left_inverse);
        second[j] = left_nan ? 0 : (int8_t)(int)level;
    }
    scales[0] = scale;
    scales[1] = left_scale;
}

#ifdef __AVXVNNI__
#define SHIFTED_LEVELS 1 /* levels stored as level + 128 */
#define TOGETHER 4       /* weight rows taken at a time, both levels: 8 accumulators */
/* acc += the 32 shifted levels times the 32 weight bytes, four products per int32 lane */
static inline __m256i add_products(__m256i acc, __m256i levels, __m256i weights) {
    return _mm256_dpbusd_avx_epi32(acc, levels, weights);
}
#else
#define SHIFTED_LEVELS 0
#define TOGETHER 2 /* the signs, magnitudes and int16 pairs take registers too: 4 would spill */
/* acc += the 32 signed levels times the 32 weight bytes, four products per int32 lane */
static inline __m256i add_products(__m256i acc, __m256i levels, __m256i weights) {
    __m256i magnitudes = _mm256_abs_epi8(levels);
    __m256i signed_weights = _mm256_sign_epi8(weights, levels);
    __m256i pairs = _mm256_maddubs_epi16(magnitudes, signed_weights);
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
#endif

/* One vector whose lane r is the sum of acc[r]'s 8 lanes. */
static inline __m256i sum_lanes_8(const __m256i acc[ROWS]) {
    __m256i pairs[4];
    for (int i = 0; i < 4; i++) pairs[i] = _mm256_hadd_epi32(acc[2 * i], acc[2 * i + 1]);
    __m256i low = _mm256_hadd_epi32(pairs[0], pairs[1]), high = _mm256_hadd_epi32(pairs[2], pairs[3]);
    /* low's 128-bit halves hold rows 0-3's sums over lanes 0-3 and 4-7; high's, rows 4-7's */
    return _mm256_add_epi32(_mm256_permute2x128_si256(low, high, 0x20), _mm256_permute2x128_si256(low, high, 0x31));
}

/* Lane r of sums[0] (sums[1]): a token's first (second) level row times weight row r, over k
 * (levels zero-padded to a chunk). Where `next` is not NULL, the line of next + r * stride at
 * each load's offset is fetched into L2 (the next block's rows). */
static inline __attribute__((always_inline)) void dot_rows(const int8_t *first_level, const int8_t *second_level,
                                                           const int8_t *const rows[ROWS], int64_t k,
                                                           const int8_t *next, int64_t stride, __m256i sums[2]) {
    __m256i first[ROWS], second[ROWS];
    for (int group = 0; group < ROWS; group += TOGETHER) {
        __m256i a[TOGETHER], b[TOGETHER];
        for (int r = 0; r < TOGETHER; r++) a[r] = b[r] = _mm256_setzero_si256();
        int64_t start = 0;
        for (; start + CHUNK <= k; start += CHUNK) {
            __m256i x = _mm256_loadu_si256((const __m256i *)(first_level + start));
            __m256i y = _mm256_loadu_si256((const __m256i *)(second_level + start));
            for (int r = 0; r < TOGETHER; r++) {
                __m256i weights = _mm256_loadu_si256((const __m256i *)(rows[group + r] + start));
                a[r] = add_products(a[r], x, weights);
                b[r] = add_products(b[r], y, weights);
                if (next != NULL && start % 64 == 0) _mm_prefetch((const char *)(next + (group + r) * stride + start), _MM_HINT_T1);
            }
        }
        if (start < k) {
            __m256i x = _mm256_loadu_si256((const __m256i *)(first_level + start));
            __m256i y = _mm256_loadu_si256((const __m256i *)(second_level + start));
            for (int r = 0; r < TOGETHER; r++) {
                int8_t tail[CHUNK] = {0};
                memcpy(tail, rows[group + r] + start, (size_t)(k - start));
                __m256i weights = _mm256_loadu_si256((const __m256i *)tail);
                a[r] = add_products(a[r], x, weights);
                b[r] = add_products(b[r], y, weights);
            }
        }
        for (int r = 0; r < TOGETHER; r++) first[group + r] = a[r], second[group + r] = b[r];
    }
    sums[0] = sum_lanes_8(first);
    sums[1] = sum_lanes_8(second);
}

/* The same contract as int8_matmul.c's; row_sums is read with AVX-VNNI only. */
int tandem_int8_product(const float *x, int64_t m, int64_t k, const int8_t *w, int64_t n,
                        int64_t w_stride, const int32_t *row_sums, float *out, int threads) {
    int64_t padded = (k + CHUNK - 1) / CHUNK * CHUNK;
    int8_t *levels = calloc((size_t)(2 * m), (size_t)padded); /* zeros past k: the tail's products are 0 */
    float *scales = malloc(sizeof(float) * 2 * m);
    float *leftover = malloc(sizeof(float) * k);
    int8_t *zero_row = calloc((size_t)padded, 1); /* stands in for the rows past n */
    if (levels == NULL || scales == NULL || leftover == NULL || zero_row == NULL) {
        free(levels), free(scales), free(leftover), free(zero_row);
        return -1;
    }
    for (int64_t i = 0; i < m; i++) {
        int8_t *first_level = levels + 2 * i * padded, *second_level = first_level + padded;
        round_row(x + i * k, k, first_level, second_level, leftover, scales + 2 * i);
        if (SHIFTED_LEVELS) /* the bytes past k meet zero weights: whatever they hold adds 0 */
            for (int64_t j = 0; j < 2 * padded; j++) first_level[j] = (int8_t)((uint8_t)first_level[j] ^ 0x80u);
    }
    int64_t blocks = (n + ROWS - 1) / ROWS;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t block = 0; block < blocks; block++) {
        int64_t first = block * ROWS;
        int count = n - first < ROWS ? (int)(n - first) : ROWS;
        const int8_t *rows[ROWS];
        int32_t shift[ROWS] = {0}; /* what the shifted levels added: 128 times each row's sum */
        for (int r = 0; r < ROWS; r++) {
            rows[r] = r < count ? w + (first + r) * w_stride : zero_row;
            if (SHIFTED_LEVELS && r < count) shift[r] = row_sums[first + r] * 128;
        }
        __m256i shifts = _mm256_loadu_si256((const __m256i *)shift);
        /* the next block's rows, fetched by the first token's passes (the last block's rows past n: none) */
        const int8_t *next = first + 2 * ROWS <= n ? w + (first + ROWS) * w_stride : NULL;
        for (int64_t i = 0; i < m; i++) {
            const int8_t *first_level = levels + 2 * i * padded;
            __m256i sums[2];
            dot_rows(first_level, first_level + padded, rows, k, i == 0 ? next : NULL, w_stride, sums);
            __m256i first_sums = _mm256_sub_epi32(sums[0], shifts);
            __m256i second_sums = _mm256_sub_epi32(sums[1], shifts);
            __m256 first_part = _mm256_mul_ps(_mm256_cvtepi32_ps(first_sums), _mm256_set1_ps(scales[2 * i]));
            __m256 second_part = _mm256_mul_ps(_mm256_cvtepi32_ps(second_sums), _mm256_set1_ps(scales[2 * i + 1]));
            float product[ROWS];
            _mm256_storeu_ps(product, _mm256_add_ps(first_part, second_part));
            memcpy(out + i * n + first, product, sizeof(float) * (size_t)count);
        }
    }
    free(levels), free(scales), free(leftover), free(zero_row);
    return 0;
}

/* int8_matmul.c's contract: each row prepared, the product, then times row_scale[j] and plus
 * bias[j] where those are not NULL; here one after the other (this variant is the fallback of
 * CPUs without AVX-512; the decoder forward's few tokens make those passes small). */
int tandem_int8_linear(const float *x, int64_t m, int64_t k, const int8_t *w, int64_t n, int64_t w_stride,
                       const int32_t *row_sums, const float *row_scale, const float *bias, float *out,
                       void (*prepare)(const void *context, int64_t row), const void *context, int threads) {
    if (prepare != NULL)
        for (int64_t i = 0; i < m; i++) prepare(context, i);
    if (tandem_int8_product(x, m, k, w, n, w_stride, row_sums, out, threads)) return -1;
    for (int64_t i = 0; i < m; i++) {
        float *row = out + i * n;
        if (row_scale != NULL)
            for (int64_t j = 0; j < n; j++) row[j] = row[j] * row_scale[j];
        if (bias != NULL)
            for (int64_t j = 0; j < n; j++) row[j] = row[j] + bias[j];
    }
    return 0;
}
