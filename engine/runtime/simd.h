/* The vector helpers decoder_forward.c writes its attention and e^x over, one set per ISA the
 * kernel is built for: AVX-512 (16 lanes), AVX2 with FMA (8 lanes) and plain C (1 lane, the
 * portable build). Which set is compiled follows the build's flags (kernel_build.py).
 *
 * Why: the forward's softmax, weighted values and e^x had been written once per ISA, so a fix
 * had to land in every copy. Written once over these, each ISA's code is what its old copy was,
 * operation for operation (the AVX-512 build's logits are the same bits as before the helpers).
 * As llamafile's tinyBLAS does it: small per-ISA loads, stores, multiply-adds and horizontal
 * steps, and every kernel above them written once.
 *
 * The helpers keep the x86 rules wherever lanes differ in what they give:
 * - v_min(a, b) and v_max(a, b) return b where either is NaN (MINPS/MAXPS), so a NaN passed
 *   second survives a clamp;
 * - v_fmadd(a, b, c) is a * b + c, fused where the ISA fuses it; the portable build rounds
 *   twice (-ffp-contract=off), as Cephes' own C code does.
 * v_seen_lanes gives the lanes of a block of key rows a token sees: lane t where t < rows,
 * first <= t < last and seen[t] is not 0 (its bytes past `rows` are not read).
 */
#ifndef TANDEM_SIMD_H
#define TANDEM_SIMD_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__)
#include <immintrin.h>

#define LANES 16
/* weigh_values: query heads whose column sums stay in registers (4 x 4 vectors) */
#define HEADS_AT_ONCE 4
/* v_dot_rows_heads: query heads whose sums and queries stay in registers (3 x 4 + 3 x 5) */
#define SCORE_HEADS 3
typedef __m512 vec;
typedef __mmask16 lanes_mask;

static inline vec v_zero(void) { return _mm512_setzero_ps(); }
static inline vec v_set(float x) { return _mm512_set1_ps(x); }
static inline vec v_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void v_store(float *p, vec x) { _mm512_storeu_ps(p, x); }
static inline lanes_mask v_first_lanes(int64_t count) {
    return count >= LANES ? (lanes_mask)0xFFFF : (lanes_mask)((1u << count) - 1);
}
/* the first `count` lanes (0..LANES) from p, zeros after: nothing past them is read */
static inline vec v_load_first(const float *p, int64_t count) { return _mm512_maskz_loadu_ps(v_first_lanes(count), p); }
static inline void v_store_first(float *p, int64_t count, vec x) { _mm512_mask_storeu_ps(p, v_first_lanes(count), x); }
static inline vec v_add(vec a, vec b) { return _mm512_add_ps(a, b); }
static inline vec v_sub(vec a, vec b) { return _mm512_sub_ps(a, b); }
static inline vec v_mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
static inline vec v_div(vec a, vec b) { return _mm512_div_ps(a, b); }
static inline vec v_fmadd(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
static inline vec v_fnmadd(vec a, vec b, vec c) { return _mm512_fnmadd_ps(a, b, c); } /* c - a * b */
static inline vec v_min(vec a, vec b) { return _mm512_min_ps(a, b); }
static inline vec v_max(vec a, vec b) { return _mm512_max_ps(a, b); }
static inline vec v_round(vec x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/* p * 2^n for whole n, rounded once (below the normal range too) */
static inline vec v_times_power_of_two(vec p, vec n) { return _mm512_scalef_ps(p, n); }
static inline lanes_mask v_less(vec a, vec b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
static inline lanes_mask v_seen_lanes(const uint8_t *seen, int64_t rows, int64_t first, int64_t last) {
    uint32_t mine = last > first ? ((1u << last) - 1) & ~((1u << first) - 1) : 0;
    lanes_mask in = v_first_lanes(rows);
    return _mm_mask_cmpneq_epi8_mask(in & (lanes_mask)mine, _mm_maskz_loadu_epi8(in, seen), _mm_setzero_si128());
}
static inline vec v_select(lanes_mask where, vec chosen, vec otherwise) { return _mm512_mask_blend_ps(where, otherwise, chosen); }
static inline float v_largest(vec x) { return _mm512_reduce_max_ps(x); }

/* The steps of v_dot_rows' reduction tree, the int8 kernel's (int8_matmul.c, sum_lanes_16) for
 * floats: two vectors of sums into one of half as many sums, each lane added once. */
static inline __attribute__((always_inline)) __m512 v_pair_sums(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
}
static inline __attribute__((always_inline)) __m512 v_quad_sums(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b))),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b))));
}
static inline __attribute__((always_inline)) __m512 v_half_sums(__m512 a, __m512 b) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
}
static inline __attribute__((always_inline)) __m512 v_last_sums(__m512 low, __m512 high) {
    return _mm512_add_ps(_mm512_shuffle_f32x4(low, high, 0x88), _mm512_shuffle_f32x4(low, high, 0xDD));
}

#if defined(__AVX512BF16__)
/* The AVX-512 BF16 build's attention multiplies in bf16 (VDPBF16PS: two products a lane per
 * instruction, twice float32's multiply-adds), and its KV cache holds bf16: queries, keys,
 * values and the softmax weights are rounded to bf16 (8 significant bits), every sum stays
 * float32. Why: reading a long prompt, the scores and the weighted values were two thirds of
 * the time, both at ~90% of the CPU's float32 multiply-add peak (perf, 7,000 tokens); and a
 * step at a long context reads the whole cache, now half the bytes. What it costs the demo
 * target (docs/bench/bf16_attention_quality.py, 1,500 tokens): NLL 4.1269 -> 4.1268 nats a
 * token, the same top token 99.7% of the time. Each value is rounded on its own, so a
 * verify's tokens still get their steps' bits. */
#define BF16_ATTENTION 1
typedef uint16_t attn_elem; /* an element of a query, key or value as attention reads it */
typedef __m512bh score_vec;
#define SCORE_STEP 32 /* elements a score_vec holds */
static inline float attn_float(attn_elem x) {
    uint32_t bits = (uint32_t)x << 16;
    float value;
    memcpy(&value, &bits, 4);
    return value;
}
static inline score_vec v_load_scores(const attn_elem *p) { return (__m512bh)_mm512_loadu_si512(p); }
/* acc + the lane's two products of a and b */
static inline __m512 v_dot_add(score_vec a, score_vec b, __m512 acc) { return _mm512_dpbf16_ps(acc, a, b); }

/* out[0..count) = x rounded to bf16 (to nearest, ties to even) */
static inline void v_round_to_bf16(const float *x, int64_t count, uint16_t *out) {
    int64_t j = 0;
    for (; j + 16 <= count; j += 16) _mm256_storeu_si256((__m256i *)(out + j), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + j)));
    if (j < count) {
        __mmask16 in = v_first_lanes(count - j);
        _mm256_mask_storeu_epi16(out + j, in, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(in, x + j)));
    }
}
/* A softmax weight as the weighted values use it (their sums too): rounded to bf16, kept as
 * float32, which holds it exactly. */
static inline vec v_as_weight(vec x) {
    __m256i rounded = (__m256i)_mm512_cvtneps_pbh(x);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(rounded), 16));
}
/* 16 columns of two bf16 value rows a and b as VDPBF16PS pairs them: a[c], b[c] side by side
 * (b NULL: zeros). */
static inline __m512bh v_pair_columns(const attn_elem *a, const attn_elem *b) {
    const __m512i side_by_side = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                                  37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    __m512i first = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a));
    __m512i second = b != NULL ? _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)b)) : _mm512_setzero_si512();
    return (__m512bh)_mm512_permutex2var_epi16(first, side_by_side, second);
}
/* The weights w_a and w_b (floats that are bf16 already) as one pair, in every lane */
static inline __m512bh v_pair_weights(float a, float b) {
    uint32_t low, high;
    memcpy(&low, &a, 4), memcpy(&high, &b, 4);
    return (__m512bh)_mm512_set1_epi32((int)((high & 0xFFFF0000u) | (low >> 16)));
}

/* The bf16 build's key cache, in blocks of KEY_BLOCK_ROWS rows (decoder_forward.c, store_key):
 * block b of a head holds its rows b * 16 .. b * 16 + 15, element pair p of all sixteen side by
 * side (one score_vec), so that one VDPBF16PS multiplies a query's pair p into sixteen keys, a
 * key a lane. Why: with keys in rows, each key's 16 lanes of products had to be summed across
 * lanes, and that shuffle tree cost as many instructions as the products (docs/BENCHMARKS.md). */
#define KEY_BLOCK_ROWS 16
/* v_dot_key_block: queries scored against a block at once, and the sums each keeps (a power of 2) */
#define BLOCK_HEADS 4
#ifndef KEY_SUMS
#define KEY_SUMS 4
#endif

/* Query pair p (elements 2p and 2p + 1) in every lane */
static inline score_vec v_query_pair(const attn_elem *query, int64_t p) {
    uint32_t pair;
    memcpy(&pair, query + 2 * p, sizeof(pair));
    return (__m512bh)_mm512_set1_epi32((int)pair);
}

/* Lane t of out[h]: queries[h] . key t of `block` (KEY_BLOCK_ROWS keys of `pairs` element pairs,
 * stored as above), for `heads` (at most BLOCK_HEADS) queries. Lane t sums its own key's
 * products only, in KEY_SUMS sums (pair p into sum p % KEY_SUMS, each in order of p; several, so
 * that many multiply-adds are in flight), then the sums pairwise. A key's score is the same bits
 * in whichever block lane, batch or query group it is read. */
static inline __attribute__((always_inline)) void v_dot_key_block(const attn_elem *const *queries, int heads,
                                                                  const attn_elem *block, int64_t pairs, __m512 *out) {
    __m512 sums[BLOCK_HEADS][KEY_SUMS];
    for (int h = 0; h < heads; h++)
        for (int c = 0; c < KEY_SUMS; c++) sums[h][c] = _mm512_setzero_ps();
    int64_t p = 0;
    for (; p + KEY_SUMS <= pairs; p += KEY_SUMS)
        for (int c = 0; c < KEY_SUMS; c++) {
            score_vec keys = v_load_scores(block + (p + c) * 2 * KEY_BLOCK_ROWS);
            for (int h = 0; h < heads; h++) sums[h][c] = v_dot_add(keys, v_query_pair(queries[h], p + c), sums[h][c]);
        }
    for (int c = 0; c < KEY_SUMS; c++) /* a count of pairs no multiple of KEY_SUMS (c stays a constant: the sums stay in registers) */
        if (p + c < pairs) {
            score_vec keys = v_load_scores(block + (p + c) * 2 * KEY_BLOCK_ROWS);
            for (int h = 0; h < heads; h++) sums[h][c] = v_dot_add(keys, v_query_pair(queries[h], p + c), sums[h][c]);
        }
    for (int h = 0; h < heads; h++) {
        for (int width = KEY_SUMS / 2; width > 0; width /= 2)
            for (int c = 0; c < width; c++) sums[h][c] = _mm512_add_ps(sums[h][c], sums[h][c + width]);
        out[h] = sums[h][0];
    }
}

#else
#define BF16_ATTENTION 0
typedef float attn_elem;
typedef __m512 score_vec;
static inline vec v_as_weight(vec x) { return x; }
#define SCORE_STEP 16
static inline float attn_float(attn_elem x) { return x; }
static inline score_vec v_load_scores(const attn_elem *p) { return _mm512_loadu_ps(p); }
static inline __m512 v_dot_add(score_vec a, score_vec b, __m512 acc) { return _mm512_fmadd_ps(a, b, acc); }
#endif

/* Query h . rows t and t + 1 (h < heads), over dim (a multiple of SCORE_STEP), summed lane by
 * lane in order of j, then the first step of the tree. */
static inline __attribute__((always_inline)) void v_dot_two_rows(const attn_elem *const *queries, int heads,
                                                                 const attn_elem *rows, int64_t dim, int64_t t,
                                                                 __m512 *pair) {
    __m512 first[SCORE_HEADS], second[SCORE_HEADS];
    for (int h = 0; h < heads; h++) first[h] = second[h] = _mm512_setzero_ps();
    for (int64_t j = 0; j < dim; j += SCORE_STEP) {
        score_vec one = v_load_scores(rows + t * dim + j), other = v_load_scores(rows + (t + 1) * dim + j);
        for (int h = 0; h < heads; h++) {
            score_vec x = v_load_scores(queries[h] + j);
            first[h] = v_dot_add(x, one, first[h]);
            second[h] = v_dot_add(x, other, second[h]);
        }
    }
    for (int h = 0; h < heads; h++) pair[h] = v_pair_sums(first[h], second[h]);
}

/* Lane t of out[h]: queries[h] . rows[t] over dim (a multiple of SCORE_STEP), rows `dim`
 * elements apart, for `heads` (at most SCORE_HEADS) queries: each key row is loaded once for all of them (a
 * prompt piece's queries had loaded every row once each), and each query's lanes are summed
 * as they would be alone, the tree walked as its sums come in so that few stay in registers. */
static inline __attribute__((always_inline)) void v_dot_eight_rows(const attn_elem *const *queries, int heads,
                                                                   const attn_elem *rows, int64_t dim, int64_t t,
                                                                   __m512 *half) {
    __m512 pair[2][SCORE_HEADS], quad[2][SCORE_HEADS];
    for (int u = 0; u < 2; u++) {
        v_dot_two_rows(queries, heads, rows, dim, t + 4 * u, pair[0]);
        v_dot_two_rows(queries, heads, rows, dim, t + 4 * u + 2, pair[1]);
        for (int h = 0; h < heads; h++) quad[u][h] = v_quad_sums(pair[0][h], pair[1][h]);
    }
    for (int h = 0; h < heads; h++) half[h] = v_half_sums(quad[0][h], quad[1][h]);
}

static inline __attribute__((always_inline)) void v_dot_rows_heads(const attn_elem *const *queries, int heads,
                                                                   const attn_elem *rows, int64_t dim, vec *out) {
    __m512 low[SCORE_HEADS], high[SCORE_HEADS];
    v_dot_eight_rows(queries, heads, rows, dim, 0, low);
    v_dot_eight_rows(queries, heads, rows, dim, 8, high);
    for (int h = 0; h < heads; h++) out[h] = v_last_sums(low[h], high[h]);
}

#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

#define LANES 8
/* 2 heads x 4 vectors of sums, the value row's 4 vectors and a weight: 13 of the 16 registers */
#define HEADS_AT_ONCE 2
typedef __m256 vec;
typedef __m256 lanes_mask; /* all ones in a lane that is in */

static inline vec v_zero(void) { return _mm256_setzero_ps(); }
static inline vec v_set(float x) { return _mm256_set1_ps(x); }
static inline vec v_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void v_store(float *p, vec x) { _mm256_storeu_ps(p, x); }
/* the lanes below `count` (0..8) as a mask for maskload/maskstore */
static inline __m256i v_first_lanes(int64_t count) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline vec v_load_first(const float *p, int64_t count) { return _mm256_maskload_ps(p, v_first_lanes(count)); }
static inline void v_store_first(float *p, int64_t count, vec x) { _mm256_maskstore_ps(p, v_first_lanes(count), x); }
static inline vec v_add(vec a, vec b) { return _mm256_add_ps(a, b); }
static inline vec v_sub(vec a, vec b) { return _mm256_sub_ps(a, b); }
static inline vec v_mul(vec a, vec b) { return _mm256_mul_ps(a, b); }
static inline vec v_div(vec a, vec b) { return _mm256_div_ps(a, b); }
static inline vec v_fmadd(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
static inline vec v_fnmadd(vec a, vec b, vec c) { return _mm256_fnmadd_ps(a, b, c); } /* c - a * b */
static inline vec v_min(vec a, vec b) { return _mm256_min_ps(a, b); }
static inline vec v_max(vec a, vec b) { return _mm256_max_ps(a, b); }
static inline vec v_round(vec x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
/* p * 2^n for whole |n| <= 151. AVX2 has no VSCALEFPS: 2^n is applied as two powers of two,
 * each a float's exponent bits, so a result below the normal range is rounded once, as scalef
 * rounds it. */
static inline vec v_times_power_of_two(vec p, vec n) {
    __m256i whole = _mm256_cvtps_epi32(n); /* a NaN's comes out as INT_MIN */
    __m256i half = _mm256_srai_epi32(whole, 1), rest = _mm256_sub_epi32(whole, half); /* each within +-76 */
    __m256 first = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
    __m256 second = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(rest, _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, first), second); /* a NaN's p is NaN: so is this */
}
static inline lanes_mask v_less(vec a, vec b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
static inline lanes_mask v_seen_lanes(const uint8_t *seen, int64_t rows, int64_t first, int64_t last) {
    int bits = 0;
    for (int64_t t = 0; t < rows; t++) bits |= (seen[t] && t >= first && t < last) << t;
    __m256i lane_bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    return _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(bits), lane_bits), lane_bits));
}
static inline vec v_select(lanes_mask where, vec chosen, vec otherwise) { return _mm256_blendv_ps(otherwise, chosen, where); }
/* the largest lane, a NaN lane passed over */
static inline float v_largest(vec x) {
    float lanes[8], top = -INFINITY;
    _mm256_storeu_ps(lanes, x);
    for (int t = 0; t < 8; t++)
        if (lanes[t] > top) top = lanes[t];
    return top;
}

/* Lane t: query . rows[t] over dim (a multiple of 8), rows `dim` floats apart; every lane
 * summed by the same tree of adds. */
static inline vec v_dot_rows(const float *query, const float *rows, int64_t dim) {
    __m256 acc[8];
    for (int t = 0; t < 8; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t j = 0; j < dim; j += 8) {
        __m256 x = _mm256_loadu_ps(query + j);
        for (int t = 0; t < 8; t++) acc[t] = _mm256_fmadd_ps(x, _mm256_loadu_ps(rows + t * dim + j), acc[t]);
    }
    __m256 pairs[4];
    for (int i = 0; i < 4; i++) pairs[i] = _mm256_hadd_ps(acc[2 * i], acc[2 * i + 1]);
    __m256 low = _mm256_hadd_ps(pairs[0], pairs[1]), high = _mm256_hadd_ps(pairs[2], pairs[3]);
    /* low's 128-bit halves: rows 0-3's sums over lanes 0-3 and 4-7; high's, rows 4-7's */
    return _mm256_add_ps(_mm256_permute2f128_ps(low, high, 0x20), _mm256_permute2f128_ps(low, high, 0x31));
}
#define SCORE_HEADS 1

#else /* the portable build: plain C, one lane (the compiler vectorises what it can) */

#define LANES 1
#define HEADS_AT_ONCE 4
typedef float vec;
typedef int lanes_mask;

static inline vec v_zero(void) { return 0.0f; }
static inline vec v_set(float x) { return x; }
static inline vec v_load(const float *p) { return *p; }
static inline void v_store(float *p, vec x) { *p = x; }
static inline vec v_load_first(const float *p, int64_t count) { return count > 0 ? *p : 0.0f; }
static inline void v_store_first(float *p, int64_t count, vec x) {
    if (count > 0) *p = x;
}
static inline vec v_add(vec a, vec b) { return a + b; }
static inline vec v_sub(vec a, vec b) { return a - b; }
static inline vec v_mul(vec a, vec b) { return a * b; }
static inline vec v_div(vec a, vec b) { return a / b; }
static inline vec v_fmadd(vec a, vec b, vec c) { return a * b + c; }
static inline vec v_fnmadd(vec a, vec b, vec c) { return c - a * b; }
static inline vec v_min(vec a, vec b) { return a < b ? a : b; }
static inline vec v_max(vec a, vec b) { return a > b ? a : b; }
static inline vec v_round(vec x) { return nearbyintf(x); } /* half to even, in the default rounding mode */
static inline vec v_times_power_of_two(vec p, vec n) { return isnan(n) ? n : ldexpf(p, (int)n); }
static inline lanes_mask v_less(vec a, vec b) { return a < b; }
static inline lanes_mask v_seen_lanes(const uint8_t *seen, int64_t rows, int64_t first, int64_t last) {
    return rows > 0 && first <= 0 && last > 0 && seen[0];
}
static inline vec v_select(lanes_mask where, vec chosen, vec otherwise) { return where ? chosen : otherwise; }
static inline float v_largest(vec x) { return x; }

static inline vec v_dot_rows(const float *query, const float *rows, int64_t dim) {
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j < dim; j++) dot += query[j] * rows[j];
    return dot;
}
#define SCORE_HEADS 1
#endif

#ifndef BF16_ATTENTION
#define BF16_ATTENTION 0
typedef float attn_elem; /* attention reads float32 queries, keys and values */
static inline vec v_as_weight(vec x) { return x; } /* the weights stay float32 */
#define SCORE_STEP LANES
static inline float attn_float(attn_elem x) { return x; }
#endif

#ifndef KEY_BLOCK_ROWS
#define KEY_BLOCK_ROWS 1 /* keys in rows, as torch keeps them */
#endif

#if SCORE_HEADS == 1
/* One query at a time where the ISA has no registers to spare for more. */
static inline void v_dot_rows_heads(const float *const *queries, int heads, const float *rows, int64_t dim, vec *out) {
    for (int h = 0; h < heads; h++) out[h] = v_dot_rows(queries[h], rows, dim);
}
#endif

/* Value columns weigh_values sums at a time: 4 vectors, each value row loaded once for a
 * token's heads. */
#define VALUE_VECTORS 4
#define VALUE_COLUMNS (VALUE_VECTORS * LANES)

/* e^x for each lane: Cephes' expf (2^n times a degree-7 polynomial of the remainder, within
 * ~1 ulp of libm's expf), e^-inf = 0, e^inf = inf, NaN stays NaN. Lane by lane, so a token's
 * values never depend on the tokens beside it. */
static inline vec v_exp(vec x) {
    /* max(lo, x) and min(hi, x) keep a NaN x (the second operand is returned on NaN) */
    vec clamped = v_min(v_set(104.0f), v_max(v_set(-104.0f), x));
    vec n = v_round(v_mul(clamped, v_set(1.44269504088896341f)));
    vec r = v_fnmadd(n, v_set(0.693359375f), clamped);
    r = v_fnmadd(n, v_set(-2.12194440e-4f), r);
    vec p = v_set(1.9875691500E-4f);
    p = v_fmadd(p, r, v_set(1.3981999507E-3f));
    p = v_fmadd(p, r, v_set(8.3334519073E-3f));
    p = v_fmadd(p, r, v_set(4.1665795894E-2f));
    p = v_fmadd(p, r, v_set(1.6666665459E-1f));
    p = v_fmadd(p, r, v_set(5.0000001201E-1f));
    p = v_fmadd(p, v_mul(r, r), v_add(r, v_set(1.0f)));
    return v_select(v_less(x, v_set(-104.0f)), v_zero(), v_times_power_of_two(p, n));
}

#endif
