/* The int4 layers' product for a few float rows (engine/runtime/int4_weights.py, whose torch
 * version is the reference, holds the layout and says why the format exists): each row rounded
 * to int8 per group of 32 inputs, times the 4-bit weight levels with int32 sums per group; each
 * group's sum scaled by the weight's and the row's scales of that group, plus the weight's
 * minimum times the row's scale and level sum, added up in float32. The weight's scale and
 * minimum of a group are its 8-bit codes times its super-block's bf16 factors (8 groups).
 * Built into every variant's library; the ISA shows only in `block_outputs` below (AVX-512,
 * AVX2 with or without AVX-VNNI, plain C).
 *
 * Why it is shaped this way:
 * - A step of a 1-8B model on a CPU is bound by reading its weights: at 4 bits, an 8-bit scale
 *   and minimum code per 32 and two bf16 factors per 256 (4.625 bits a weight) it reads 0.58x
 *   the bytes of the int8 layers; a Q4_K_M file's layers are 4.5-6.6 bits a weight (Q4_K, and
 *   Q6_K for some).
 * - The weight is packed 16 rows a block, each 32-bit lane one row's 4 inputs in a row (a
 *   nibble each), so VPDPBUSD adds 4 products into each of 16 rows' sums at once, the
 *   activations' 4 bytes broadcast to every lane. The sums come out a row a lane: no horizontal
 *   sums at all (the int8 kernel needs a shuffle tree for them).
 * - The levels are unsigned (0-15, from the group's minimum up) and the activations signed, as
 *   VPDPBUSD multiplies them. The minimum's part needs the activations' level sum only, one
 *   number per token and group, not per row.
 * - One group's weights are unpacked once and used for every token of the call, so a verify of
 *   8 tokens unpacks them once, not 8 times.
 * - Each token's sum adds its groups in order, one float multiply and add each (-ffp-contract=off):
 *   a token's output is the same bits whatever else is in the call, and in every build. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define GROUP 32        /* inputs per scale */
#define BLOCK_ROWS 16   /* weight rows packed together */
#define GROUP_BYTES 256 /* one block's group: 16 rows x 32 nibbles */
#define SUPER_GROUPS 8  /* groups whose codes share two bf16 factors */
#define FACTOR_BYTES 64 /* a block's factors per super-block: 16 scale factors, 16 minimum factors */
#define CODE_BYTES 32   /* a block's codes per group: 16 scale codes (uint8), 16 minimum codes (int8) */

/* Where group g's codes and its super-block's factors sit in a block's scale bytes
 * (int4_weights.py's layout: each super-block's factors, then its groups' codes). */
static inline const uint8_t *factors_of(const uint8_t *scale_bytes, int64_t g) {
    return scale_bytes + (g / SUPER_GROUPS) * (FACTOR_BYTES + SUPER_GROUPS * CODE_BYTES);
}
static inline const uint8_t *codes_of(const uint8_t *scale_bytes, int64_t g) {
    return factors_of(scale_bytes, g) + FACTOR_BYTES + (g % SUPER_GROUPS) * CODE_BYTES;
}

/* Asks for the weight bytes 16 groups on (4 KB: the rest of this block, then the next block's,
 * which follow it) while this group is multiplied. The hardware prefetcher alone does not run
 * far enough ahead: with 4-8 tokens a group costs enough instructions that the loads wait on
 * memory, and a verify of 8 tokens read its weights at 16 GB/s where one token reads them at
 * 50 (measured on a Zen 5 EPYC: with this, 41 GB/s and 2.6x faster; 2-16 KB ahead all alike). */
#define PREFETCH_BYTES 4096
static inline void prefetch_ahead(const uint8_t *group) {
    for (int line = 0; line < GROUP_BYTES; line += 64) __builtin_prefetch(group + PREFETCH_BYTES + line, 0, 3);
}

/* A bf16 scale as float32 (exact: bf16 is float32's top half). */
static inline float bf16_to_float(uint16_t bits) {
    uint32_t wide = (uint32_t)bits << 16;
    float value;
    memcpy(&value, &wide, sizeof value);
    return value;
}

/* Row x (k floats) rounded per group: levels in [-127, 127], the group's scale (its largest
 * |value| / 127, at least 1e-30, NaN where a value is NaN) and the scale times the levels' sum.
 * The same float32 operations as int4_weights.round_groups: times the scale's reciprocal,
 * rounded half to even. */
static void round_groups(const float *x, int64_t k, int8_t *levels, float *scales, float *scaled_sums) {
    for (int64_t g = 0; g < k / GROUP; g++) {
        const float *values = x + g * GROUP;
        float largest = 0.0f;
        int any_nan = 0;
        for (int i = 0; i < GROUP; i++) {
            any_nan |= isnan(values[i]);
            float size = fabsf(values[i]);
            largest = size > largest ? size : largest;
        }
        float scale = (largest < 1e-30f ? 1e-30f : largest) / 127.0f, inverse = 1.0f / scale;
        int32_t sum = 0;
        for (int i = 0; i < GROUP; i++) {
            int level = any_nan ? 0 : (int)nearbyintf(values[i] * inverse);
            levels[g * GROUP + i] = (int8_t)level;
            sum += level;
        }
        scales[g] = any_nan ? NAN : scale;
        scaled_sums[g] = scales[g] * (float)sum;
    }
}

/* The outputs of one block (16 rows) for `count` tokens (levels, scales and scaled sums from the
 * first of them), into out + t * n (the block's first row), `lanes` of them (a short last
 * block writes fewer), plus bias where it is not NULL: group by group, each token's sums times
 * (weight scale x activation scale), plus weight minimum x (activation scale x level sum),
 * added to its running total. scale_bytes: the block's factors and codes (factors_of, codes_of);
 * a group's weight scale is factor x code, one float32 multiply, as is its minimum. */
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#define TILE 8 /* tokens whose totals stay in registers: 8 + 8 weight vectors + a few */

static inline __attribute__((always_inline)) void block_tile(const uint8_t *packed, const uint8_t *scale_bytes,
                                                             const int8_t *levels, const float *scales, const float *scaled_sums,
                                                             int64_t groups, int64_t k, const int count, float *out, int64_t n,
                                                             __mmask16 lanes, const float *bias) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    __m512 total[TILE], scale_factor = _mm512_setzero_ps(), minimum_factor = _mm512_setzero_ps();
    for (int t = 0; t < count; t++) total[t] = _mm512_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        const uint8_t *bytes = packed + g * GROUP_BYTES;
        prefetch_ahead(bytes);
        __m512i quads[8]; /* quad q: inputs 4q..4q+3 of each row, a lane a row */
        for (int v = 0; v < 4; v++) {
            __m512i vector = _mm512_loadu_si512(bytes + 64 * v);
            quads[2 * v] = _mm512_and_si512(vector, low);
            quads[2 * v + 1] = _mm512_and_si512(_mm512_srli_epi16(vector, 4), low);
        }
        if (g % SUPER_GROUPS == 0) { /* the 16 rows' bf16 factors as float32: bf16 is float32's top half */
            const uint8_t *factors = factors_of(scale_bytes, g);
            scale_factor = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)factors)), 16));
            minimum_factor = _mm512_castsi512_ps(
                _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(factors + 32))), 16));
        }
        const uint8_t *codes = codes_of(scale_bytes, g);
        __m512 weight_scale = _mm512_mul_ps(scale_factor, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)codes))));
        __m512 weight_minimum =
            _mm512_mul_ps(minimum_factor, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(codes + 16)))));
        for (int t = 0; t < count; t++) {
            const int8_t *mine = levels + t * k + g * GROUP;
            /* two chains of 4, not one of 8: a step waits on each VPDPBUSD's latency */
            __m512i even = _mm512_setzero_si512(), odd = _mm512_setzero_si512();
            for (int q = 0; q < 8; q += 2) {
                /* 4 bytes at a time: broadcast straight from memory, not through a general register */
                int32_t first, second;
                memcpy(&first, mine + 4 * q, 4);
                memcpy(&second, mine + 4 * q + 4, 4);
                even = _mm512_dpbusd_epi32(even, quads[q], _mm512_set1_epi32(first));
                odd = _mm512_dpbusd_epi32(odd, quads[q + 1], _mm512_set1_epi32(second));
            }
            __m512 scale = _mm512_mul_ps(weight_scale, _mm512_set1_ps(scales[t * groups + g]));
            __m512 part = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(even, odd)), scale);
            part = _mm512_add_ps(part, _mm512_mul_ps(weight_minimum, _mm512_set1_ps(scaled_sums[t * groups + g])));
            total[t] = _mm512_add_ps(total[t], part);
        }
    }
    for (int t = 0; t < count; t++) {
        __m512 result = bias != NULL ? _mm512_add_ps(total[t], _mm512_maskz_loadu_ps(lanes, bias)) : total[t];
        _mm512_mask_storeu_ps(out + t * n, lanes, result);
    }
}

static void block_outputs(const uint8_t *packed, const uint8_t *scale_bytes, const int8_t *levels, const float *scales,
                          const float *scaled_sums, int64_t m, int64_t k, float *out, int64_t n, int64_t rows, const float *bias) {
    int64_t groups = k / GROUP;
    __mmask16 lanes = (__mmask16)((1u << rows) - 1);
    for (int64_t first = 0; first < m; first += TILE) {
        int count = m - first < TILE ? (int)(m - first) : TILE;
        const int8_t *tile_levels = levels + first * k;
        const float *tile_scales = scales + first * groups;
        const float *tile_sums = scaled_sums + first * groups;
        float *tile_out = out + first * n;
        /* a constant count each: the totals stay in registers */
#define TILE_OF(c) block_tile(packed, scale_bytes, tile_levels, tile_scales, tile_sums, groups, k, c, tile_out, n, lanes, bias)
        switch (count) {
        case 1: TILE_OF(1); break;
        case 2: TILE_OF(2); break;
        case 3: TILE_OF(3); break;
        case 4: TILE_OF(4); break;
        case 5: TILE_OF(5); break;
        case 6: TILE_OF(6); break;
        case 7: TILE_OF(7); break;
        default: TILE_OF(8); break;
        }
#undef TILE_OF
    }
}
#elif defined(__AVX2__)
/* 8 rows' sums of one group for one token: the rows' quads (the first or second 32 bytes of
 * each 64) against the token's 32 levels */
static inline __m256i dot_quads(const __m256i quads[8], const int8_t *mine) {
#ifdef __AVXVNNI__
    __m256i acc = _mm256_setzero_si256();
    for (int q = 0; q < 8; q++) {
        int32_t four;
        memcpy(&four, mine + 4 * q, 4);
        acc = _mm256_dpbusd_avx_epi32(acc, quads[q], _mm256_set1_epi32(four));
    }
    return acc;
#else
    /* pairs of products into int16 (at most 2 x 15 x 127), 8 quads' pairs added in int16 (at
     * most 30,480: no saturation), then the pairs into int32 */
    __m256i pairs = _mm256_setzero_si256();
    for (int q = 0; q < 8; q++) {
        int32_t four;
        memcpy(&four, mine + 4 * q, 4);
        pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(quads[q], _mm256_set1_epi32(four)));
    }
    return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
#endif
}

#define TILE 2 /* tokens whose totals (both halves) stay in registers beside 8 weight vectors: 16 in all */

static inline __m256 bf16_lanes(const uint8_t *bits) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)bits)), 16));
}

/* 8 codes as float32: unsigned (scales) or signed (minimums) */
static inline __m256 unsigned_codes(const uint8_t *codes) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)codes)));
}
static inline __m256 signed_codes(const uint8_t *codes) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)codes)));
}

/* A block (16 rows, in two halves of 8, `lanes` of each written) for `count` tokens, as
 * block_tile does on AVX-512 (the same float operations in the same order). Both halves of a
 * group in turn: a 64-byte line of weights is read once. */
static inline __attribute__((always_inline)) void block_tile(const uint8_t *packed, const uint8_t *scale_bytes,
                                                             const int8_t *levels, const float *scales, const float *scaled_sums,
                                                             int64_t groups, int64_t k, const int count, float *out, int64_t n,
                                                             const __m256i lanes[2], const float *bias) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256 total[TILE][2];
    for (int t = 0; t < count; t++) total[t][0] = total[t][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        prefetch_ahead(packed + g * GROUP_BYTES);
        for (int half = 0; half < 2; half++) {
            __m256i quads[8];
            for (int v = 0; v < 4; v++) {
                __m256i bytes = _mm256_loadu_si256((const __m256i *)(packed + g * GROUP_BYTES + 64 * v + 32 * half));
                quads[2 * v] = _mm256_and_si256(bytes, low);
                quads[2 * v + 1] = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low);
            }
            const uint8_t *factors = factors_of(scale_bytes, g) + 16 * half, *codes = codes_of(scale_bytes, g) + 8 * half;
            __m256 weight_scale = _mm256_mul_ps(bf16_lanes(factors), unsigned_codes(codes));
            __m256 weight_minimum = _mm256_mul_ps(bf16_lanes(factors + 32), signed_codes(codes + 16));
            for (int t = 0; t < count; t++) {
                __m256i sums = dot_quads(quads, levels + t * k + g * GROUP);
                __m256 scale = _mm256_mul_ps(weight_scale, _mm256_set1_ps(scales[t * groups + g]));
                __m256 part = _mm256_mul_ps(_mm256_cvtepi32_ps(sums), scale);
                part = _mm256_add_ps(part, _mm256_mul_ps(weight_minimum, _mm256_set1_ps(scaled_sums[t * groups + g])));
                total[t][half] = _mm256_add_ps(total[t][half], part);
            }
        }
    }
    for (int t = 0; t < count; t++)
        for (int half = 0; half < 2; half++) {
            __m256 result = total[t][half];
            if (bias != NULL) result = _mm256_add_ps(result, _mm256_maskload_ps(bias + 8 * half, lanes[half]));
            _mm256_maskstore_ps(out + t * n + 8 * half, lanes[half], result);
        }
}

static void block_outputs(const uint8_t *packed, const uint8_t *scale_bytes, const int8_t *levels, const float *scales,
                          const float *scaled_sums, int64_t m, int64_t k, float *out, int64_t n, int64_t rows, const float *bias) {
    int64_t groups = k / GROUP;
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    /* a short last block writes `rows` outputs: lanes r < rows, then r < rows - 8 */
    __m256i lanes[2] = {_mm256_cmpgt_epi32(_mm256_set1_epi32((int)rows), lane),
                        _mm256_cmpgt_epi32(_mm256_set1_epi32((int)rows - 8), lane)};
    for (int64_t first = 0; first < m; first += TILE) {
        /* a constant count each: the totals stay in registers */
        if (m - first >= 2)
            block_tile(packed, scale_bytes, levels + first * k, scales + first * groups, scaled_sums + first * groups, groups,
                       k, 2, out + first * n, n, lanes, bias);
        else
            block_tile(packed, scale_bytes, levels + first * k, scales + first * groups, scaled_sums + first * groups, groups,
                       k, 1, out + first * n, n, lanes, bias);
    }
}
#else
/* sums[t][r] (r < 16) = the integer product of token t's levels in one group with the block's
 * group: sum over the 32 inputs of weight level x activation level. */
static void block_sums(const uint8_t *packed, const int8_t *levels, int64_t k, int64_t m, int32_t (*sums)[BLOCK_ROWS]) {
    for (int64_t t = 0; t < m; t++) {
        const int8_t *mine = levels + t * k;
        for (int r = 0; r < BLOCK_ROWS; r++) {
            int32_t sum = 0;
            for (int v = 0; v < 4; v++)
                for (int i = 0; i < 4; i++) {
                    uint8_t byte = packed[64 * v + 4 * r + i];
                    sum += (byte & 0x0F) * mine[8 * v + i] + (byte >> 4) * mine[8 * v + 4 + i];
                }
            sums[t][r] = sum;
        }
    }
}

#define TILE 8 /* tokens a block's group is unpacked for at a time */

static void block_outputs(const uint8_t *packed, const uint8_t *scale_bytes, const int8_t *levels, const float *scales,
                          const float *scaled_sums, int64_t m, int64_t k, float *out, int64_t n, int64_t rows, const float *bias) {
    int64_t groups = k / GROUP;
    float total[TILE][BLOCK_ROWS];
    int32_t sums[TILE][BLOCK_ROWS];
    for (int64_t first = 0; first < m; first += TILE) {
        int64_t count = m - first < TILE ? m - first : TILE;
        for (int64_t t = 0; t < count; t++)
            for (int r = 0; r < BLOCK_ROWS; r++) total[t][r] = 0.0f;
        for (int64_t g = 0; g < groups; g++) {
            prefetch_ahead(packed + g * GROUP_BYTES);
            block_sums(packed + g * GROUP_BYTES, levels + first * k + g * GROUP, k, count, sums);
            float weight_scale[BLOCK_ROWS], weight_minimum[BLOCK_ROWS];
            const uint8_t *factors = factors_of(scale_bytes, g), *codes = codes_of(scale_bytes, g);
            for (int r = 0; r < BLOCK_ROWS; r++) {
                uint16_t scale_bits, minimum_bits;
                memcpy(&scale_bits, factors + 2 * r, 2);
                memcpy(&minimum_bits, factors + 32 + 2 * r, 2);
                weight_scale[r] = bf16_to_float(scale_bits) * (float)codes[r];
                weight_minimum[r] = bf16_to_float(minimum_bits) * (float)(int8_t)codes[16 + r];
            }
            for (int64_t t = 0; t < count; t++) {
                float scale = scales[(first + t) * groups + g], scaled_sum = scaled_sums[(first + t) * groups + g];
                for (int r = 0; r < BLOCK_ROWS; r++) {
                    float part = (float)sums[t][r] * (weight_scale[r] * scale);
                    part = part + weight_minimum[r] * scaled_sum;
                    total[t][r] = total[t][r] + part;
                }
            }
        }
        for (int64_t t = 0; t < count; t++)
            for (int64_t r = 0; r < rows; r++)
                out[(first + t) * n + r] = bias != NULL ? total[t][r] + bias[r] : total[t][r];
    }
}
#endif

/* out (m, n) float32 = the float rows x (m, k), rounded per group, times the int4 weight
 * (int4_weights.py's packed layout: n rows in blocks of 16, k a multiple of 32), plus bias[j]
 * for output j where bias is not NULL. Where `prepare` is not NULL, prepare(context, i) first
 * writes row i of x (tandem_int8_linear's hook, for the decoder forward). Returns 0, -1 where
 * memory could not be had, -2 where k is not whole groups. */
int tandem_int4_linear(const float *x, int64_t m, int64_t k, const uint8_t *packed, const uint8_t *scale_bytes,
                       int64_t n, const float *bias, float *out, void (*prepare)(const void *context, int64_t row),
                       const void *context, int threads) {
    if (k % GROUP != 0) return -2;
    int64_t groups = k / GROUP, blocks = (n + BLOCK_ROWS - 1) / BLOCK_ROWS;
    int64_t block_scale_bytes = (groups + SUPER_GROUPS - 1) / SUPER_GROUPS * FACTOR_BYTES + groups * CODE_BYTES;
    int8_t *levels = malloc((size_t)(m * k));
    float *scales = malloc(sizeof(float) * m * groups);
    float *scaled_sums = malloc(sizeof(float) * m * groups);
    if (levels == NULL || scales == NULL || scaled_sums == NULL) {
        free(levels), free(scales), free(scaled_sums);
        return -1;
    }
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int64_t i = 0; i < m; i++) {
            if (prepare != NULL) prepare(context, i);
            round_groups(x + i * k, k, levels + i * k, scales + i * groups, scaled_sums + i * groups);
        }
#pragma omp for schedule(static)
        for (int64_t b = 0; b < blocks; b++) {
            int64_t first = b * BLOCK_ROWS, rows = n - first < BLOCK_ROWS ? n - first : BLOCK_ROWS;
            block_outputs(packed + b * groups * GROUP_BYTES, scale_bytes + b * block_scale_bytes, levels, scales, scaled_sums, m, k,
                          out + first, n, rows, bias != NULL ? bias + first : NULL);
        }
    }
    free(levels), free(scales), free(scaled_sums);
    return 0;
}
