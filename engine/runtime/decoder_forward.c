/* A whole forward of a Llama-layout decoder with int8 weights over the static runtime's KV
 * cache, for a few tokens, in one call (engine/runtime/native_forward.py says when it runs).
 *
 * Why: with Tandem's int8 kernel a one-token forward of the demo target spends about half of
 * its time in its 121 weight products and the other half between them: torch's dispatch,
 * inductor's small fused kernels, dynamo's guards, the wrapper's Python (docs/BENCHMARKS.md).
 * Here the steps between the products are a few loops over a few hundred floats each.
 *
 * It computes what static_cache_forward.StaticCacheForward computes for these models, step for step:
 * - the products are `tandem_int8_linear` (int8_matmul*.c, built into the same library),
 *   then times the weight's per-row scale, plus the bias, as Int8Linear does: the same
 *   floats as the torch forward's products for the same inputs;
 * - RMSNorm, the rotary embedding (its cos/sin read from a table the model's own rotary
 *   module filled), attention, SiLU and the residual adds in float32, as torch does them but
 *   summed in another order, and with e^x from a polynomial within 1 ulp of libm's (the
 *   softmax and SiLU had been a tenth of an 8-token verify in scalar expf): logits agree with
 *   torch's to float32 rounding, not to the bit. Every one of these is elementwise or per
 *   token, so a token's logits are the same in a verify as in its step, to the bit.
 * The attention and e^x are written once, over simd.h's helpers: 16 lanes in the AVX-512
 * builds, 8 in the AVX2 ones, 1 in the portable build (plain C). The AVX-512 BF16 build keeps
 * its cache in bf16, its keys in blocks of 16 rows (simd.h, KEY_BLOCK_ROWS; key_blocks.py), and
 * multiplies attention in bf16 (simd.h, BF16_ATTENTION).
 * Keys and values are written at the given cache rows first, then every token attends to the
 * rows it sees (`visible`), so a tree verifies as a chain does.
 * The per-token steps between two products (the residual add and norm, SiLU) run on the next
 * product's threads as they round its rows (tandem_int8_linear's `prepare`), and the rotary
 * embedding and the merge of the attention's ranges on the attention's threads: run by one
 * thread while the other waited, they had been ~8% of an 8-token verify (perf).
 * Built with -ffp-contract=off, like the product; `omp simd` lets the compiler vectorise the
 * reductions without -ffast-math.
 */
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simd.h"
#include "tandem_abi.h"

int tandem_int8_linear(const float *x, int64_t m, int64_t k, const int8_t *w, int64_t n, int64_t w_stride,
                       const int32_t *row_sums, const float *row_scale, const float *bias, float *out,
                       void (*prepare)(const void *context, int64_t row), const void *context, int threads);
int tandem_int4_linear(const float *x, int64_t m, int64_t k, const uint8_t *packed, const uint8_t *group_scales,
                       int64_t n, const float *bias, float *out, void (*prepare)(const void *context, int64_t row),
                       const void *context, int threads);

/* Attention runs in ranges of RANGE_ROWS key rows, merged with rescaling (merge_ranges). A
 * token's range r holds the key rows it sees numbered r * RANGE_ROWS on, counted in cache-row
 * order: for a token at position p that sees its whole history, the rows of positions r * 256
 * to r * 256 + 255, wherever they sit. A step, a verified chain and a tree node at that position
 * then sum the same keys in the same ranges in the same order, and get the same bits. (Ranges
 * by cache row had put a tree node whose row lay past a border and position before it in
 * another range than its step would: a greedy reply could leave plain decoding's.) 256 rather
 * than 128: each range's partial sums are written, then read back by merge_ranges, 8 MB a layer
 * for a 64-token piece at 7,000 tokens with 128; halving them read such a prompt 1-12% faster
 * and the steps after it 7-9% (docs/BENCHMARKS.md). */
#define RANGE_ROWS 256

enum { TANDEM_OK = 0, TANDEM_NO_MEMORY = -1, TANDEM_BAD_INPUT = -2 };

/* out (m, rows) = x (m, width) times the layer's weight, scaled (and biased) as Int8Linear or
 * Int4Linear does; prepare(context, i), where not NULL, first writes row i of x (tandem_int8_linear). */
static int linear(const TandemInt8 *layer, const float *x, int64_t m, float *out, void (*prepare)(const void *, int64_t),
                  const void *context, int threads) {
    if (layer->packed != NULL)
        return tandem_int4_linear(x, m, layer->width, layer->packed, layer->group_scales, layer->rows, layer->bias, out, prepare,
                                  context, threads)
                   ? TANDEM_NO_MEMORY
                   : TANDEM_OK;
    return tandem_int8_linear(x, m, layer->width, layer->weight, layer->rows, layer->width, layer->row_sums, layer->scale,
                              layer->bias, out, prepare, context, threads)
               ? TANDEM_NO_MEMORY
               : TANDEM_OK;
}

static void rms_norm(const float *x, const float *weight, int64_t width, float eps, float *out) {
    float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
    for (int64_t j = 0; j < width; j++) squares += x[j] * x[j];
    float inverse = 1.0f / sqrtf(squares / (float)width + eps);
    for (int64_t j = 0; j < width; j++) out[j] = weight[j] * (x[j] * inverse);
}

/* x (head_dim) rotated in place: x * cos + rotate_half(x) * sin, transformers' Llama rule. */
static void rotate(float *x, const float *cos, const float *sin, int64_t head_dim) {
    int64_t half = head_dim / 2;
    for (int64_t j = 0; j < half; j++) {
        float first = x[j], second = x[j + half];
        x[j] = first * cos[j] + (-second) * sin[j];
        x[j + half] = second * cos[j + half] + first * sin[j + half];
    }
}

/* Attention of n tokens over one key/value head's cache rows first_row + [begin, end): every
 * query head of the group, every token, each key and value row read once for all of them (at a
 * long context the float32 cache, not the weights, is most of what a forward reads). Leaves
 * per (token, group head) the largest score, the sum of exp(score - largest) and the sum of
 * exp(score - largest) * value over this range, for `merge_ranges` to combine. */
typedef struct {
    const TandemDecoder *d;
    int64_t n, groups, q_width, visible_stride, first_row;
    /* token i's query head h at queries + i * query_stride + h * head_dim, as the scores read
     * it: the rotated queries in qkv, or their bf16 copy (copy_queries) */
    const attn_elem *queries;
    int64_t query_stride;
    const uint8_t *visible; /* (n, visible_stride) */
    /* (n, bound_stride): token i's range r is cache rows bounds[i][r] .. bounds[i][r + 1] - 1 */
    const int64_t *bounds;
    int64_t bound_stride;
} Attention;

/* row[s] = e^(row[s] - top), as_weights: rounded as the weighted values use it (v_as_weight) */
static inline __attribute__((always_inline)) void exp_shifted(float *row, int64_t count, float top, int as_weights) {
    int64_t s = 0;
    for (; s + LANES <= count; s += LANES) {
        vec e = v_exp(v_sub(v_load(row + s), v_set(top)));
        v_store(row + s, as_weights ? v_as_weight(e) : e);
    }
    if (s < count) {
        vec e = v_exp(v_sub(v_load_first(row + s, count - s), v_set(top)));
        v_store_first(row + s, count - s, as_weights ? v_as_weight(e) : e);
    }
}

/* out = e^x for `count` floats: the forward's own exponential, for its tests. */
void tandem_exp(const float *x, int64_t count, float *out) {
    memcpy(out, x, sizeof(float) * count);
    exp_shifted(out, count, 0.0f, 0);
}

/* out[j] = silu(gate[j]) * up[j] */
static void silu_times(const float *gate, const float *up, int64_t width, float *out) {
    int64_t j = 0;
    for (; j + LANES <= width; j += LANES) {
        vec g = v_load(gate + j);
        vec silu = v_div(g, v_add(v_set(1.0f), v_exp(v_sub(v_zero(), g))));
        v_store(out + j, v_mul(silu, v_load(up + j)));
    }
    for (; j < width; j++) out[j] = gate[j] / (1.0f + expf(-gate[j])) * up[j]; /* a width no multiple of LANES */
}

/* Columns j0..j0 + VALUE_COLUMNS - 1 of the weighted value rows for `heads` (at most
 * HEADS_AT_ONCE) query heads of one token: their sums side by side in registers, so each value
 * row is loaded once for all of them and the heads' multiply-adds overlap (one head at a time
 * waited on its own sums' latency). Each head's sum runs over the rows in the same order
 * whatever `heads` is. values: row s at values + s * dim; weights[h][s]: head h's weight of
 * row s. totals[h]: the sum of head h's weights over the rows it sees, one row after another
 * (sum_weights' order), beside the weighted rows: alone, that sum's chain of adds had been as
 * slow as all the weighing. */
#if !BF16_ATTENTION
static inline __attribute__((always_inline)) void weigh_values(const attn_elem *values, const uint16_t *pairs,
                                                               int64_t pairs_from, int64_t dim, const uint8_t *seen,
                                                               const float *const *weights, int heads, int64_t begin,
                                                               int64_t end, float *const *out, float *totals) {
    (void)pairs, (void)pairs_from;
    vec sum[HEADS_AT_ONCE][VALUE_VECTORS];
    float total[HEADS_AT_ONCE];
    for (int h = 0; h < heads; h++) {
        total[h] = 0.0f;
        for (int c = 0; c < VALUE_VECTORS; c++) sum[h][c] = v_zero();
    }
    for (int64_t s = begin; s < end; s++) {
        if (!seen[s]) continue;
        const attn_elem *value = values + s * dim;
        vec columns[VALUE_VECTORS];
        for (int c = 0; c < VALUE_VECTORS; c++) columns[c] = v_load(value + LANES * c);
        for (int h = 0; h < heads; h++) {
            total[h] += weights[h][s];
            vec weight = v_set(weights[h][s]);
            for (int c = 0; c < VALUE_VECTORS; c++) sum[h][c] = v_fmadd(weight, columns[c], sum[h][c]);
        }
    }
    for (int h = 0; h < heads; h++) {
        totals[h] = total[h];
        for (int c = 0; c < VALUE_VECTORS; c++) v_store(out[h] + LANES * c, sum[h][c]);
    }
}
#else
/* The bf16 build's weigh_values: the rows a token sees taken two by two in their order (a last
 * one with a zero row), each pair's products summed by one VDPBF16PS. Pairs follow the rows'
 * order among those the token sees, not where they sit in the cache, so a tree node and the
 * step that later writes its token pair the same rows. Where `pairs` is not NULL, rows
 * pairs_from + 2k, pairs_from + 2k + 1 come paired already (value_pairs); others are paired
 * here. */
static inline __attribute__((always_inline)) void weigh_values(const attn_elem *values, const uint16_t *pairs,
                                                               int64_t pairs_from, int64_t dim, const uint8_t *seen,
                                                               const float *const *weights, int heads, int64_t begin,
                                                               int64_t end, float *const *out, float *totals) {
    vec sum[HEADS_AT_ONCE][VALUE_VECTORS];
    float total[HEADS_AT_ONCE];
    for (int h = 0; h < heads; h++) {
        total[h] = 0.0f;
        for (int c = 0; c < VALUE_VECTORS; c++) sum[h][c] = v_zero();
    }
    int64_t held = -1; /* a seen row waiting for the next */
    for (int64_t s = begin; s <= end; s++) {
        if (s < end) {
            if (!seen[s]) continue;
            for (int h = 0; h < heads; h++) total[h] += weights[h][s];
            if (held < 0) {
                held = s;
                continue;
            }
        } else if (held < 0) {
            break;
        }
        int64_t other = s < end ? s : -1; /* past the last row: held pairs with zeros */
        __m512bh columns[VALUE_VECTORS];
        if (pairs != NULL && other == held + 1 && (held - pairs_from) % 2 == 0)
            for (int c = 0; c < VALUE_VECTORS; c++)
                columns[c] = (__m512bh)_mm512_loadu_si512(pairs + (held - pairs_from) * dim + 2 * LANES * c);
        else
            for (int c = 0; c < VALUE_VECTORS; c++)
                columns[c] = v_pair_columns(values + held * dim + LANES * c, other >= 0 ? values + other * dim + LANES * c : NULL);
        for (int h = 0; h < heads; h++) {
            __m512bh weight = v_pair_weights(weights[h][held], other >= 0 ? weights[h][other] : 0.0f);
            for (int c = 0; c < VALUE_VECTORS; c++) sum[h][c] = _mm512_dpbf16_ps(sum[h][c], weight, columns[c]);
        }
        held = -1;
    }
    for (int h = 0; h < heads; h++) {
        totals[h] = total[h];
        for (int c = 0; c < VALUE_VECTORS; c++) v_store(out[h] + LANES * c, sum[h][c]);
    }
}
#endif

/* weigh_values with a constant count of heads in each call: their sums stay in registers. */
static void weigh_heads(const attn_elem *values, const uint16_t *pairs, int64_t pairs_from, int64_t dim, const uint8_t *seen,
                        const float *const *weights, int heads, int64_t begin, int64_t end, float *const *out,
                        float *totals) {
#define WEIGH(count) weigh_values(values, pairs, pairs_from, dim, seen, weights, count, begin, end, out, totals)
    switch (heads) {
#if HEADS_AT_ONCE >= 4
    case 4: WEIGH(4); break;
    case 3: WEIGH(3); break;
#endif
    case 2: WEIGH(2); break;
    default: WEIGH(1); break;
    }
#undef WEIGH
}

/* The cache rows [first, past) that token i's range r may see (a task's rows hold the ranges
 * r of all its tokens). */
typedef struct {
    int64_t first, past;
} RowSpan;

static inline RowSpan range_of(const Attention *a, int64_t i, int64_t r) {
    const int64_t *bounds = a->bounds + i * a->bound_stride + r;
    return (RowSpan){bounds[0], bounds[1]};
}

/* Whether token i sees row s of its range `span`: a row outside its own range counts as one
 * it does not see. */
static inline int sees(const Attention *a, int64_t i, RowSpan span, int64_t s) {
    return a->visible[i * a->visible_stride + s] && s >= span.first && s < span.past;
}

static inline const attn_elem *query_of(const Attention *a, int64_t i, int64_t g, int64_t h) {
    return a->queries + i * a->query_stride + (g * a->groups + h) * a->d->head_dim;
}

/* Each thread's scratch for its attention tasks, reused task after task. */
typedef struct {
    float *scores; /* the task's scores, then its weights: per query, one per row */
    float *tops;   /* each query's running largest score per lane */
    attn_elem *padded; /* the row layout's last block of fewer than LANES key rows, and zeros (score_block) */
    uint16_t *pairs;    /* the bf16 build's value rows two by two (value_pairs) */
} Scratch;

#if BF16_ATTENTION
/* Token i's queries, rounded to bf16, into `out` (heads x head_dim): rounded once a layer, not
 * once for every block of keys that reads them. */
static void copy_queries(const TandemDecoder *d, const float *qkv, attn_elem *out) {
    for (int64_t h = 0; h < d->heads; h++) v_round_to_bf16(qkv + h * d->head_dim, d->head_dim, out + h * d->head_dim);
}

/* x (dim floats) rounded to bf16 into a value row. */
static inline void store_row(attn_elem *row, const float *x, int64_t dim) { v_round_to_bf16(x, dim, row); }

/* x (dim floats) rounded to bf16 as key row `row` of a head's cache (head_keys), in the blocks
 * the scores read (simd.h, KEY_BLOCK_ROWS): its element pair p at lane row % 16 of the block's
 * vector p. */
static void store_key(attn_elem *head_keys, int64_t row, const float *x, int64_t dim) {
    attn_elem rounded[512]; /* check_tokens: head_dim <= 512 */
    v_round_to_bf16(x, dim, rounded);
    attn_elem *block = head_keys + row / KEY_BLOCK_ROWS * KEY_BLOCK_ROWS * dim;
    for (int64_t p = 0; p < dim / 2; p++)
        memcpy(block + (p * KEY_BLOCK_ROWS + row % KEY_BLOCK_ROWS) * 2, rounded + 2 * p, 2 * sizeof(attn_elem));
}


/* Value rows begin + 2k and begin + 2k + 1 (a zero row past end) side by side as VDPBF16PS
 * pairs them, for the columns weigh_values sums (the first whole VALUE_COLUMNS of each row):
 * pair k's 16 columns from c at pairs + k * 2 * dim + 2 * c. Made where a task has several
 * tokens, which then share each pair; a step pairs the rows as it reads them (weigh_values),
 * as does a token that sees rows other than these two by two. NULL where not made. */
static const uint16_t *value_pairs(const Attention *a, const attn_elem *values, int64_t begin, int64_t end,
                                   uint16_t *pairs) {
    int64_t dim = a->d->head_dim, columns = dim / VALUE_COLUMNS * VALUE_COLUMNS;
    if (a->n < 2 || columns == 0) return NULL;
    for (int64_t s = begin; s < end; s += 2) {
        const attn_elem *first = values + (a->first_row + s) * dim, *second = s + 1 < end ? first + dim : NULL;
        uint16_t *pair = pairs + (s - begin) * dim;
        for (int64_t c = 0; c < columns; c += LANES)
            _mm512_storeu_si512(pair + 2 * c, (__m512i)v_pair_columns(first + c, second != NULL ? second + c : NULL));
    }
    return pairs;
}
#else
static void copy_queries(const TandemDecoder *d, const float *qkv, attn_elem *out) { (void)d, (void)qkv, (void)out; }
static inline void store_row(attn_elem *row, const float *x, int64_t dim) { memcpy(row, x, sizeof(float) * dim); }
/* The float32 builds keep keys in rows, as torch does. */
static void store_key(attn_elem *head_keys, int64_t row, const float *x, int64_t dim) { store_row(head_keys + row * dim, x, dim); }
static const uint16_t *value_pairs(const Attention *a, const attn_elem *values, int64_t begin, int64_t end,
                                   uint16_t *pairs) {
    (void)a, (void)values, (void)begin, (void)end, (void)pairs;
    return NULL;
}
#endif

#if KEY_BLOCK_ROWS > 1
/* v_dot_key_block with a constant count of heads, and the demo's head width, in each call: the
 * queries' sums stay in registers. */
static void dot_key_heads(const attn_elem *const *queries, int heads, const attn_elem *block, int64_t pairs, vec *out) {
    if (pairs == 32) {
        switch (heads) {
        case 4: v_dot_key_block(queries, 4, block, 32, out); return;
        case 3: v_dot_key_block(queries, 3, block, 32, out); return;
        case 2: v_dot_key_block(queries, 2, block, 32, out); return;
        default: v_dot_key_block(queries, 1, block, 32, out); return;
        }
    }
    switch (heads) {
    case 4: v_dot_key_block(queries, 4, block, pairs, out); return;
    case 3: v_dot_key_block(queries, 3, block, pairs, out); return;
    case 2: v_dot_key_block(queries, 2, block, pairs, out); return;
    default: v_dot_key_block(queries, 1, block, pairs, out); return;
    }
}

/* The lanes of the key block whose first row is `base` (counted as a task's rows are) that token
 * i sees in its range `span`. */
static inline lanes_mask seen_in_block(const Attention *a, int64_t i, RowSpan span, int64_t base) {
    int64_t first = span.first > base ? span.first - base : 0;
    int64_t last = span.past - base < KEY_BLOCK_ROWS ? span.past - base : KEY_BLOCK_ROWS;
    if (last <= first) return 0;
    const uint8_t *seen = a->visible + i * a->visible_stride + base + first;
    return (lanes_mask)(v_seen_lanes(seen, last - first, 0, last - first) << first);
}

/* The scores of range r's key rows begin..end-1 (of key/value head g, `keys` its cache) for
 * every token and query head of group g, into scores (per query, count = end - begin of them)
 * and each query's running largest per lane (tops: LANES floats a query; score_range takes the
 * largest lane once per range), one cache block (KEY_BLOCK_ROWS rows) at a time, the first and
 * last blocks only partly the range's. A block is read once for all the queries and stays in L1
 * across them; they are scored BLOCK_HEADS at a time, across tokens where a group has fewer
 * heads (a model with one query head per key/value head had scored one query at a time, too
 * few sums in flight); a batch of them none of which sees a row of the block skips its
 * products. A row a query's token does not see scores -inf. */
static void score_blocks(const Attention *a, int64_t g, int64_t r, const attn_elem *keys, int64_t begin, int64_t end,
                         float *scores, float *tops) {
    int64_t dim = a->d->head_dim, count = end - begin, queries = a->n * a->groups;
    int64_t first_block = (a->first_row + begin) / KEY_BLOCK_ROWS;
    int64_t past_block = (a->first_row + end + KEY_BLOCK_ROWS - 1) / KEY_BLOCK_ROWS;
    for (int64_t b = first_block; b < past_block; b++) {
        int64_t base = b * KEY_BLOCK_ROWS - a->first_row; /* the block's first row, counted as begin and end are */
        int64_t lo = begin > base ? begin - base : 0, hi = end - base < KEY_BLOCK_ROWS ? end - base : KEY_BLOCK_ROWS;
        const attn_elem *block = keys + b * KEY_BLOCK_ROWS * dim;
        int64_t token = -1; /* the token whose lanes `seen_now` holds */
        lanes_mask seen_now = 0;
        for (int64_t q0 = 0; q0 < queries; q0 += BLOCK_HEADS) {
            int batch = queries - q0 < BLOCK_HEADS ? (int)(queries - q0) : BLOCK_HEADS;
            const attn_elem *batch_queries[BLOCK_HEADS];
            lanes_mask seen[BLOCK_HEADS], any = 0;
            for (int k = 0; k < batch; k++) {
                int64_t i = (q0 + k) / a->groups;
                if (i != token) token = i, seen_now = seen_in_block(a, i, range_of(a, i, r), base);
                seen[k] = seen_now, any |= seen_now;
                batch_queries[k] = query_of(a, i, g, (q0 + k) % a->groups);
            }
            vec dots[BLOCK_HEADS];
            if (any) dot_key_heads(batch_queries, batch, block, dim / 2, dots);
            for (int k = 0; k < batch; k++) {
                int64_t q = q0 + k;
                vec scaled = seen[k] ? v_select(seen[k], v_mul(dots[k], v_set(a->d->attention_scale)), v_set(-INFINITY))
                                     : v_set(-INFINITY);
                float *out = scores + q * count + base + lo - begin; /* lane lo's score */
                if (lo == 0 && hi == KEY_BLOCK_ROWS) {
                    v_store(out, scaled);
                } else {
                    float lanes[LANES];
                    v_store(lanes, scaled);
                    memcpy(out, lanes + lo, sizeof(float) * (hi - lo));
                }
                float *top = tops + q * LANES; /* v_max keeps its second operand where a score is NaN */
                if (seen[k]) v_store(top, v_max(scaled, v_load(top)));
            }
        }
    }
}

/* Step 1 of attend_range: the range's scores, and each query's largest. */
static void score_range(const Attention *a, int64_t g, int64_t r, const attn_elem *keys, int64_t begin, int64_t end,
                        float *largest, const Scratch *scratch) {
    int64_t queries = a->n * a->groups;
    for (int64_t q = 0; q < queries; q++) v_store(scratch->tops + q * LANES, v_set(-INFINITY));
    score_blocks(a, g, r, keys, begin, end, scratch->scores, scratch->tops);
    for (int64_t q = 0; q < queries; q++) largest[q] = v_largest(v_load(scratch->tops + q * LANES)); /* no NaN lane: exact */
}
#else
/* v_dot_rows_heads with a constant count of heads, and the demo's head width, in each call:
 * the queries and their sums stay in registers. */
static void dot_heads(const attn_elem *const *queries, int heads, const attn_elem *block, int64_t dim, vec *out) {
#if SCORE_HEADS >= 3
    if (dim == 64) {
        switch (heads) {
        case 3: v_dot_rows_heads(queries, 3, block, 64, out); return;
        case 2: v_dot_rows_heads(queries, 2, block, 64, out); return;
        default: v_dot_rows_heads(queries, 1, block, 64, out); return;
        }
    }
    switch (heads) {
    case 3: v_dot_rows_heads(queries, 3, block, dim, out); return;
    case 2: v_dot_rows_heads(queries, 2, block, dim, out); return;
    }
#endif
    v_dot_rows_heads(queries, heads, block, dim, out);
}

/* The scores of the LANES key rows from s (range r, rows begin..end-1) for every token and
 * query head of group g, into scores (per query, count = end - begin of them) and each
 * query's running largest per lane (tops: LANES floats a query; attend_range takes the
 * largest lane once per range: a horizontal max per block had been a tenth of the scoring's
 * instructions): the block stays in L1 across the queries, and each query's LANES dot
 * products come out of one reduction. A last block of fewer rows is copied into zeros at
 * `padded`: every score comes out of the same arithmetic whichever block a row falls in, so
 * a step's scores are a verify's. */
static void score_block(const Attention *a, int64_t g, int64_t r, const attn_elem *keys, int64_t begin, int64_t end,
                        int64_t s, float *scores, float *tops, attn_elem *padded) {
    int64_t dim = a->d->head_dim, count = end - begin, rows = end - s < LANES ? end - s : LANES;
    const attn_elem *block = keys + (s - begin) * dim;
    if (rows < LANES) {
        memset(padded, 0, sizeof(attn_elem) * LANES * dim);
        memcpy(padded, block, sizeof(attn_elem) * rows * dim);
        block = padded;
    }
    for (int64_t i = 0; i < a->n; i++) {
        RowSpan span = range_of(a, i, r); /* its range's rows from s: lanes first..last-1 */
        int64_t first = span.first > s ? span.first - s : 0, last = span.past - s < rows ? span.past - s : rows;
        lanes_mask seen = v_seen_lanes(a->visible + i * a->visible_stride + s, rows, first, last);
        for (int64_t h0 = 0; h0 < a->groups; h0 += SCORE_HEADS) {
            int heads = a->groups - h0 < SCORE_HEADS ? (int)(a->groups - h0) : SCORE_HEADS;
            const attn_elem *queries[SCORE_HEADS];
            vec dots[SCORE_HEADS];
            for (int h = 0; h < heads; h++) queries[h] = query_of(a, i, g, h0 + h);
            dot_heads(queries, heads, block, dim, dots);
            for (int h = 0; h < heads; h++) {
                int64_t q = i * a->groups + h0 + h;
                vec scaled = v_select(seen, v_mul(dots[h], v_set(a->d->attention_scale)), v_set(-INFINITY));
                v_store_first(scores + q * count + s - begin, rows, scaled);
                float *top = tops + q * LANES; /* v_max keeps its second operand where a score is NaN */
                v_store(top, v_max(scaled, v_load(top)));
            }
        }
    }
}

/* score_block for one row, for heads whose width is no multiple of LANES. */
static void score_row(const Attention *a, int64_t g, int64_t r, const attn_elem *keys, int64_t begin, int64_t end,
                      int64_t s, float *scores, float *largest) {
    int64_t dim = a->d->head_dim, count = end - begin;
    const attn_elem *key = keys + (s - begin) * dim;
    for (int64_t i = 0; i < a->n; i++) {
        int seen = sees(a, i, range_of(a, i, r), s);
        for (int64_t h = 0; h < a->groups; h++) {
            int64_t q = i * a->groups + h;
            float score = -INFINITY;
            if (seen) {
                const attn_elem *query = query_of(a, i, g, h);
                float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                for (int64_t j = 0; j < dim; j++) dot += attn_float(query[j]) * attn_float(key[j]);
                score = dot * a->d->attention_scale;
                if (score > largest[q]) largest[q] = score;
            }
            scores[q * count + s - begin] = score;
        }
    }
}

/* Step 1 of attend_range: the range's scores, each key row read once for every token and query
 * head of the group, and each query's largest. */
static void score_range(const Attention *a, int64_t g, int64_t r, const attn_elem *keys, int64_t begin, int64_t end,
                        float *largest, const Scratch *scratch) {
    int64_t queries = a->n * a->groups;
    const attn_elem *rows = keys + (a->first_row + begin) * a->d->head_dim;
    if (a->d->head_dim % SCORE_STEP == 0) {
        for (int64_t q = 0; q < queries; q++) v_store(scratch->tops + q * LANES, v_set(-INFINITY));
        for (int64_t s = begin; s < end; s += LANES)
            score_block(a, g, r, rows, begin, end, s, scratch->scores, scratch->tops, scratch->padded);
        for (int64_t q = 0; q < queries; q++) largest[q] = v_largest(v_load(scratch->tops + q * LANES)); /* no NaN lane: exact */
    } else {
        for (int64_t s = begin; s < end; s++) score_row(a, g, r, rows, begin, end, s, scratch->scores, largest);
    }
}
#endif

/* acc (per query, dim floats) += the range's value rows weighted by the queries' e^scores, and
 * total[q] their weights' sum where dim holds VALUE_COLUMNS (else sum_weights adds them up):
 * up to HEADS_AT_ONCE heads of a token at a time, VALUE_COLUMNS columns at a time (the range's
 * value rows, 32 KB at 64 columns, stay in L1 for the token's heads), then the columns past
 * those one row at a time. A head that sees nothing here keeps its zeros. */
static void weigh_range(const Attention *a, int64_t r, const attn_elem *values, const uint16_t *pairs, int64_t begin,
                        int64_t end, const float *scores, const float *largest, float *acc, float *total) {
    int64_t dim = a->d->head_dim, groups = a->groups, count = end - begin, j0 = 0;
    for (; j0 + VALUE_COLUMNS <= dim; j0 += VALUE_COLUMNS)
        for (int64_t i = 0; i < a->n; i++) {
            RowSpan span = range_of(a, i, r);
            const uint8_t *seen = a->visible + i * a->visible_stride;
            for (int64_t h0 = 0; h0 < groups; h0 += HEADS_AT_ONCE) {
                int heads = groups - h0 < HEADS_AT_ONCE ? (int)(groups - h0) : HEADS_AT_ONCE;
                const float *weights[HEADS_AT_ONCE];
                float *out[HEADS_AT_ONCE], ignored[HEADS_AT_ONCE][VALUE_COLUMNS], totals[HEADS_AT_ONCE];
                for (int h = 0; h < heads; h++) {
                    int64_t q = i * groups + h0 + h;
                    weights[h] = scores + q * count - begin;
                    out[h] = largest[q] == -INFINITY ? ignored[h] : acc + q * dim + j0;
                }
                weigh_heads(values + a->first_row * dim + j0, pairs != NULL ? pairs + 2 * j0 : NULL, begin, dim, seen, weights,
                            heads, span.first,
                            span.past, out, totals);
                if (j0 == 0) /* the later columns' passes sum the same weights again */
                    for (int h = 0; h < heads; h++) total[i * groups + h0 + h] = totals[h];
            }
        }
    for (int64_t s = begin; s < end && j0 < dim; s++) {
        const attn_elem *value = values + (a->first_row + s) * dim;
        for (int64_t i = 0; i < a->n; i++) {
            if (!sees(a, i, range_of(a, i, r), s)) continue;
            for (int64_t h = 0; h < groups; h++) {
                float *out = acc + (i * groups + h) * dim;
                float weight = scores[(i * groups + h) * count + s - begin];
#pragma omp simd
                for (int64_t j = j0; j < dim; j++) out[j] += weight * attn_float(value[j]);
            }
        }
    }
}

/* total[q]: the sum of query q's weights over the rows it sees in range r. For every query, so
 * that a range whose seen scores are all NaN or -inf (a broken model) leaves a NaN for
 * merge_ranges, as torch's softmax would. One row after another, as the values are summed: a
 * sum in lanes by slot depended on where a key sat, and a tree node that keep_slots moved
 * (slot 47 to 45, say) then gave the next step other logits than a chain of steps would (a
 * greedy reply of the demo pair left plain decoding's on a 0.002 near-tie, docs/BENCHMARKS.md). */
static void sum_weights(const Attention *a, int64_t r, const float *scores, int64_t begin, int64_t end, float *total) {
    int64_t count = end - begin, queries = a->n * a->groups;
    for (int64_t q = 0; q < queries; q++) {
        RowSpan span = range_of(a, q / a->groups, r);
        const uint8_t *seen = a->visible + (q / a->groups) * a->visible_stride;
        const float *weights = scores + q * count - begin;
        float sum = 0.0f; /* in a register: total[q] may alias what the loop reads */
        for (int64_t s = span.first; s < span.past; s++)
            if (seen[s]) sum += weights[s];
        total[q] = sum;
    }
}

/* The batch's tokens against their range r of key/value head g, which all lie in cache rows
 * begin..end-1: each (token, group head)'s scores, their exponentials (less the largest), the
 * largest, their sum and the weighted values, for merge_ranges. */
static void attend_range(const Attention *a, int64_t g, int64_t r, const attn_elem *keys, const attn_elem *values,
                         int64_t begin, int64_t end, float *largest, float *total, float *acc, const Scratch *scratch) {
    int64_t dim = a->d->head_dim, count = end - begin, queries = a->n * a->groups;
    float *scores = scratch->scores;
    for (int64_t q = 0; q < queries; q++) largest[q] = -INFINITY;
    for (int64_t j = 0; j < queries * dim; j++) acc[j] = 0.0f;
    /* 1. Scores. */
    score_range(a, g, r, keys, begin, end, largest, scratch);
    /* 2. Their exponentials. */
    for (int64_t q = 0; q < queries; q++)
        if (largest[q] != -INFINITY) { /* else it sees nothing here */
            exp_shifted(scores + q * count, count, largest[q], 1);
        }
    /* 3. The weighted values, and the weights' sums. */
    weigh_range(a, r, values, value_pairs(a, values, begin, end, scratch->pairs), begin, end, scores, largest, acc, total);
    if (a->d->head_dim < VALUE_COLUMNS) sum_weights(a, r, scores, begin, end, total);
}

/* The ranges' partial sums of query q of key/value head g (q: token q / groups, head
 * g * groups + q % groups) into that token and head's output. */
static void merge_ranges(const Attention *a, int64_t g, int64_t q, int64_t ranges, const float *largest,
                         const float *total, const float *acc, float *mixed) {
    int64_t dim = a->d->head_dim, queries = a->n * a->groups;
    float top = -INFINITY;
    for (int64_t r = 0; r < ranges; r++)
        if (largest[r * queries + q] > top) top = largest[r * queries + q];
    int64_t i = q / a->groups, h = g * a->groups + q % a->groups;
    float *out = mixed + i * a->q_width + h * dim;
    float sum = 0.0f;
    for (int64_t j = 0; j < dim; j++) out[j] = 0.0f;
    for (int64_t r = 0; r < ranges; r++) {
        if (total[r * queries + q] == 0.0f) continue; /* a range this token sees nothing of */
        float factor = expf(largest[r * queries + q] - top);
        sum += factor * total[r * queries + q];
        const float *part = acc + (r * queries + q) * dim;
        for (int64_t j = 0; j < dim; j++) out[j] += factor * part[j];
    }
    for (int64_t j = 0; j < dim; j++) out[j] = out[j] / sum;
}

/* What a forward's layers work in, sized for n tokens over `slots` cache rows and attention
 * inputs `input_width` floats wide (hidden for a decoder, 2 * hidden for an EAGLE-3 head). */
typedef struct {
    float *state;   /* (n, hidden) the residual stream */
    float *normed;  /* (n, input_width) the attention's (or the MLP's) normed input */
    float *wide;    /* qkv, then gate_up */
    float *mixed, *update;
    /* Attention runs as kv_heads x ranges tasks over all the tokens (see RANGE_ROWS). Token i's
     * range r: cache rows bounds[i * (ranges + 1) + r] on, up to its range r + 1. Task r reads
     * the range_rows[r] rows from range_first[r], where all the tokens' ranges r lie. The same
     * for every layer: they follow from `visible` alone. In span mode (independent sequences,
     * plan_spans) token i's ranges are its own: kv_heads x ranges tasks per token, and
     * range_first, range_rows unused. A task's scores live only while it runs: each thread
     * keeps them in its own scores_per_thread floats of `scores`, reused task after task (one
     * buffer for every task's scores had been 16 MB for a 64-token piece at 7,000 tokens, its
     * pages faulted in anew by every call and its scores read back from memory). */
    int64_t ranges, *bounds, *range_first, *range_rows, scores_per_thread, widest_task;
    float *scores, *tops, *largest, *totals, *partial; /* tops: n * groups * LANES floats a thread */
    attn_elem *padded, *queries; /* queries: the bf16 build's (copy_queries) */
    uint16_t *value_pairs;
} Work;

static void work_free(Work *w) {
    free(w->state), free(w->normed), free(w->wide), free(w->mixed), free(w->update);
    free(w->bounds), free(w->range_first), free(w->range_rows);
    free(w->scores), free(w->tops), free(w->largest), free(w->totals), free(w->partial);
    free(w->padded), free(w->queries), free(w->value_pairs);
}

/* Thread t's scratch (Scratch), for tasks of up to widest_task rows. */
static Scratch scratch_of(const Work *w, int64_t n, int64_t groups, int64_t dim, int t) {
    return (Scratch){w->scores + t * w->scores_per_thread, w->tops + t * n * groups * LANES,
                     KEY_BLOCK_ROWS == 1 ? w->padded + t * LANES * dim : NULL,
                     BF16_ATTENTION ? w->value_pairs + t * (w->widest_task + 1) * dim : NULL};
}

/* w's ranges for n tokens that see cache rows `visible` (n, visible_stride) of `slots`. */
static int plan_ranges(Work *w, int64_t n, int64_t groups, const uint8_t *visible, int64_t visible_stride, int64_t slots) {
    int64_t most_seen = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t seen = 0;
        for (int64_t s = 0; s < slots; s++) seen += visible[i * visible_stride + s] != 0;
        if (seen > most_seen) most_seen = seen;
    }
    int64_t ranges = most_seen > 0 ? (most_seen + RANGE_ROWS - 1) / RANGE_ROWS : 1, stride = ranges + 1;
    w->ranges = ranges;
    w->bounds = malloc(sizeof(int64_t) * n * stride);
    w->range_first = malloc(sizeof(int64_t) * ranges);
    w->range_rows = malloc(sizeof(int64_t) * ranges);
    if (!w->bounds || !w->range_first || !w->range_rows) return TANDEM_NO_MEMORY;
    for (int64_t i = 0; i < n; i++) {
        int64_t *bounds = w->bounds + i * stride, seen = 0, r = 0, past_last = 0;
        for (int64_t s = 0; s < slots; s++)
            if (visible[i * visible_stride + s]) {
                if (seen % RANGE_ROWS == 0) bounds[r++] = s;
                seen++;
                past_last = s + 1;
            }
        /* its last range ends after the last row it sees (a prompt's early tokens do not widen
         * the task's span over the rows after them); the ranges it sees nothing of are empty */
        while (r < stride) bounds[r++] = past_last;
    }
    int64_t widest = 0;
    for (int64_t r = 0; r < ranges; r++) {
        int64_t first = slots, last = 0;
        for (int64_t i = 0; i < n; i++) {
            const int64_t *bounds = w->bounds + i * stride;
            if (bounds[r] == bounds[r + 1]) continue;
            if (bounds[r] < first) first = bounds[r];
            if (bounds[r + 1] > last) last = bounds[r + 1];
        }
        w->range_first[r] = first < last ? first : 0;
        w->range_rows[r] = first < last ? last - first : 0;
        if (w->range_rows[r] > widest) widest = w->range_rows[r];
    }
    w->scores_per_thread = n * groups * widest;
    w->widest_task = widest;
    return TANDEM_OK;
}

/* w's ranges for n tokens of which token i sees the span_rows[i] cache rows of its own span
 * (span mode): its range r is rows r * RANGE_ROWS on of that span, as a token that sees its
 * whole history in tandem_decoder_forward has them, so it gets the same bits. */
static int plan_spans(Work *w, int64_t n, int64_t groups, const int64_t *span_rows) {
    int64_t most_seen = 1;
    for (int64_t i = 0; i < n; i++)
        if (span_rows[i] > most_seen) most_seen = span_rows[i];
    int64_t ranges = (most_seen + RANGE_ROWS - 1) / RANGE_ROWS, stride = ranges + 1;
    w->ranges = ranges;
    w->bounds = malloc(sizeof(int64_t) * n * stride);
    if (!w->bounds) return TANDEM_NO_MEMORY;
    for (int64_t i = 0; i < n; i++)
        for (int64_t r = 0; r < stride; r++) w->bounds[i * stride + r] = r * RANGE_ROWS < span_rows[i] ? r * RANGE_ROWS : span_rows[i];
    w->scores_per_thread = groups * RANGE_ROWS; /* a task: one token's group of heads over one range */
    w->widest_task = RANGE_ROWS;
    return TANDEM_OK;
}

/* span_rows NULL: tokens that see `visible` (plan_ranges); else span mode (plan_spans). */
static int work_alloc(Work *w, const TandemDecoder *d, int64_t n, const uint8_t *visible, int64_t visible_stride,
                      int64_t slots, const int64_t *span_rows, int64_t input_width, int threads) {
    int64_t dim = d->head_dim, groups = d->heads / d->kv_heads, q_width = d->heads * dim;
    int64_t qkv_width = q_width + 2 * d->kv_heads * dim;
    int64_t widest = qkv_width > 2 * d->intermediate ? qkv_width : 2 * d->intermediate;
    memset(w, 0, sizeof(*w));
    if (span_rows ? plan_spans(w, n, groups, span_rows) : plan_ranges(w, n, groups, visible, visible_stride, slots)) {
        work_free(w);
        return TANDEM_NO_MEMORY;
    }
    int64_t tasks = d->kv_heads * w->ranges;
    w->state = malloc(sizeof(float) * n * d->hidden);
    w->normed = malloc(sizeof(float) * n * (input_width > d->hidden ? input_width : d->hidden));
    w->wide = malloc(sizeof(float) * n * widest);
    w->mixed = malloc(sizeof(float) * n * (q_width > d->intermediate ? q_width : d->intermediate));
    w->update = malloc(sizeof(float) * n * d->hidden);
    w->scores = malloc(sizeof(float) * (threads * w->scores_per_thread + 1));
    w->tops = malloc(sizeof(float) * threads * n * groups * LANES);
    w->largest = malloc(sizeof(float) * tasks * n * groups);
    w->totals = malloc(sizeof(float) * tasks * n * groups);
    w->partial = malloc(sizeof(float) * tasks * n * groups * dim);
    /* the bf16 build's copies (+ 1: malloc(0) may give NULL) */
    int64_t copies = BF16_ATTENTION ? threads : 0;
    /* the row layout's last block of key rows (score_block) */
    w->padded = malloc(sizeof(attn_elem) * ((KEY_BLOCK_ROWS == 1 ? threads * LANES * dim : 0) + 1));
    w->value_pairs = malloc(sizeof(uint16_t) * (copies * (w->widest_task + 1) * dim + 1));
    w->queries = malloc(sizeof(attn_elem) * ((BF16_ATTENTION ? n * d->heads * dim : 0) + 1));
    if (!w->state || !w->normed || !w->wide || !w->mixed || !w->update || !w->scores || !w->padded || !w->tops || !w->largest ||
        !w->totals || !w->partial || !w->value_pairs || !w->queries) {
        work_free(w);
        return TANDEM_NO_MEMORY;
    }
    return TANDEM_OK;
}

/* The checks every entry point makes of its tokens: the C code trusts its indices. Two tokens
 * at one cache row are refused too: the threads write the tokens' keys and values at once. */
static int check_tokens(const TandemDecoder *d, int64_t n, const int64_t *ids, const int64_t *positions,
                        const int64_t *rows, int64_t first_row, int64_t slots, int64_t wanted_from) {
    if (n <= 0 || slots <= 0 || first_row < 0 || wanted_from < 0 || wanted_from > n || d->head_dim > 512 ||
        d->head_dim % 2 || d->heads % d->kv_heads || first_row + slots > d->cache_rows || d->cache_rows % KEY_BLOCK_ROWS)
        return TANDEM_BAD_INPUT;
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= d->vocab || positions[i] < 0 || positions[i] >= d->table_positions ||
            rows[i] < 0 || rows[i] >= d->cache_rows)
            return TANDEM_BAD_INPUT;
        for (int64_t j = 0; j < i; j++)
            if (rows[j] == rows[i]) return TANDEM_BAD_INPUT;
    }
    return TANDEM_OK;
}

/* A layer's steps between its products, for one token each: what the product's threads do to
 * a row before they round it (tandem_int8_linear's `prepare`), so that no thread waits while
 * one of them runs these for every token. */
typedef struct {
    const TandemDecoder *d;
    const TandemLayer *layer;
    Work *w;
} LayerSteps;

/* The MLP's input: the attention's output added to the residual stream, then the norm. */
static void mlp_input(const void *context, int64_t i) {
    const LayerSteps *steps = context;
    int64_t hidden = steps->d->hidden;
    float *state = steps->w->state + i * hidden;
    const float *update = steps->w->update + i * hidden;
    for (int64_t j = 0; j < hidden; j++) state[j] = state[j] + update[j];
    rms_norm(state, steps->layer->post_attention_norm, hidden, steps->d->eps, steps->w->normed + i * hidden);
}

/* The down projection's input: silu(gate) * up. */
static void mlp_middle(const void *context, int64_t i) {
    const LayerSteps *steps = context;
    int64_t width = steps->d->intermediate;
    const float *gate_up = steps->w->wide + i * 2 * width;
    silu_times(gate_up, gate_up + width, width, steps->w->mixed + i * width);
}

/* A token's queries and key normed (where the model norms them) and rotated; its key and value
 * into the cache at `row`; in the bf16 build its queries rounded into `queries` (copy_queries). */
static void place_token(const TandemDecoder *d, const TandemLayer *layer, float *qkv, int64_t position, int64_t row,
                        attn_elem *queries) {
    int64_t dim = d->head_dim, q_width = d->heads * dim, kv_width = d->kv_heads * dim;
    const float *cos = d->cos + position * dim, *sin = d->sin + position * dim;
    for (int64_t h = 0; h < d->heads; h++) {
        if (layer->q_norm != NULL) rms_norm(qkv + h * dim, layer->q_norm, dim, d->eps, qkv + h * dim);
        rotate(qkv + h * dim, cos, sin, dim);
    }
    for (int64_t g = 0; g < d->kv_heads; g++) {
        float *key = qkv + q_width + g * dim, *value = qkv + q_width + kv_width + g * dim;
        if (layer->k_norm != NULL) rms_norm(key, layer->k_norm, dim, d->eps, key);
        rotate(key, cos, sin, dim);
        store_key((attn_elem *)layer->keys + g * d->cache_rows * dim, row, key, dim);
        store_row((attn_elem *)layer->values + (g * d->cache_rows + row) * dim, value, dim);
    }
    copy_queries(d, qkv, queries);
}

/* Span mode's attention, on the threads of run_layer's parallel region: token i alone over its
 * own span, kv_heads x (its ranges) tasks per token, with tandem_decoder_forward's loops for a
 * token that sees its whole history (`all_seen`: ones, as long as the longest span). */
static void attend_spans(const TandemDecoder *d, const TandemLayer *layer, const Attention *shared,
                         const int64_t *span_first, Work *w) {
    int64_t dim = d->head_dim, groups = shared->groups, ranges = w->ranges, stride = ranges + 1;
#define OWN(i) {d, 1, groups, shared->q_width, 0, span_first[i], shared->queries + (i) * shared->query_stride, \
                shared->query_stride, shared->visible, w->bounds + (i) * stride, stride}
#pragma omp for collapse(3) schedule(dynamic)
    for (int64_t i = 0; i < shared->n; i++)
        for (int64_t g = 0; g < d->kv_heads; g++)
            for (int64_t r = 0; r < ranges; r++) {
                Attention own = OWN(i);
                int64_t begin = own.bounds[r], end = own.bounds[r + 1], task = (i * d->kv_heads + g) * ranges + r;
                if (begin == end) continue; /* past its span: merge_ranges stops before it */
                Scratch scratch = scratch_of(w, 1, groups, dim, omp_get_thread_num());
                attend_range(&own, g, r, (const attn_elem *)layer->keys + g * d->cache_rows * dim,
                             (const attn_elem *)layer->values + g * d->cache_rows * dim,
                             begin, end, w->largest + task * groups, w->totals + task * groups,
                             w->partial + task * groups * dim, &scratch);
            }
#pragma omp for collapse(3) schedule(static)
    for (int64_t i = 0; i < shared->n; i++)
        for (int64_t g = 0; g < d->kv_heads; g++)
            for (int64_t q = 0; q < groups; q++) {
                Attention own = OWN(i);
                int64_t first_task = (i * d->kv_heads + g) * ranges, own_ranges = (own.bounds[ranges] + RANGE_ROWS - 1) / RANGE_ROWS;
                merge_ranges(&own, g, q, own_ranges, w->largest + first_task * groups, w->totals + first_task * groups,
                             w->partial + first_task * groups * dim, w->mixed + i * shared->q_width);
            }
#undef OWN
}

/* One decoder layer over w->state. Its attention reads w->normed (n, layer->qkv.width), the
 * normed input the caller wrote there; keys and values go to the cache at `rows` first, then
 * token i attends to cache row first_row + s where visible[i * visible_stride + s], in the
 * ranges w planned from that; in span mode (span_first not NULL) to its own span of rows. */
static int run_layer(const TandemDecoder *d, const TandemLayer *layer, int64_t n, const int64_t *positions,
                     const int64_t *rows, const uint8_t *visible, int64_t visible_stride, int64_t first_row,
                     const int64_t *span_first, Work *w, int threads) {
    int64_t hidden = d->hidden, dim = d->head_dim, groups = d->heads / d->kv_heads;
    int64_t q_width = d->heads * dim, kv_width = d->kv_heads * dim, qkv_width = q_width + 2 * kv_width;
    LayerSteps steps = {d, layer, w};
    int status;
    /* Attention: queries, keys and values; keys and values into the cache; then attend. */
    if ((status = linear(&layer->qkv, w->normed, n, w->wide, NULL, NULL, threads))) return status;
    /* the scores read the rotated queries in qkv, or the bf16 build's copy of them */
    const attn_elem *queries_read = BF16_ATTENTION ? w->queries : (const attn_elem *)w->wide;
    int64_t query_stride = BF16_ATTENTION ? d->heads * dim : qkv_width;
    Attention attention = {d, n, groups, q_width, visible_stride, first_row, queries_read, query_stride,
                           visible, w->bounds, w->ranges + 1};
    int64_t ranges = w->ranges, queries = n * groups;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int64_t i = 0; i < n; i++)
            place_token(d, layer, w->wide + i * qkv_width, positions[i], rows[i],
                        BF16_ATTENTION ? w->queries + i * query_stride : NULL);
        if (span_first != NULL) {
            attend_spans(d, layer, &attention, span_first, w);
        } else {
            /* kv_heads x ranges tasks, each over all the tokens: a range's keys and values are read
             * by one thread (splitting the tokens between threads as well measured 4% slower at 8) */
#pragma omp for collapse(2) schedule(static)
            for (int64_t g = 0; g < d->kv_heads; g++)
                for (int64_t r = 0; r < ranges; r++) {
                    int64_t task = g * ranges + r, begin = w->range_first[r], end = begin + w->range_rows[r];
                    Scratch scratch = scratch_of(w, n, groups, dim, omp_get_thread_num());
                    attend_range(&attention, g, r, (const attn_elem *)layer->keys + g * d->cache_rows * dim,
                                 (const attn_elem *)layer->values + g * d->cache_rows * dim, begin, end, w->largest + task * queries,
                                 w->totals + task * queries, w->partial + task * queries * dim, &scratch);
                }
#pragma omp for collapse(2) schedule(static)
            for (int64_t g = 0; g < d->kv_heads; g++)
                for (int64_t q = 0; q < queries; q++)
                    merge_ranges(&attention, g, q, ranges, w->largest + g * ranges * queries, w->totals + g * ranges * queries,
                                 w->partial + g * ranges * queries * dim, w->mixed);
        }
    }
    if ((status = linear(&layer->output, w->mixed, n, w->update, NULL, NULL, threads))) return status;

    /* MLP: down(silu(gate) * up), each product's input prepared by its threads. */
    if ((status = linear(&layer->gate_up, w->normed, n, w->wide, mlp_input, &steps, threads))) return status;
    if ((status = linear(&layer->down, w->mixed, n, w->update, mlp_middle, &steps, threads))) return status;
    for (int64_t j = 0; j < n * hidden; j++) w->state[j] = w->state[j] + w->update[j];
    return TANDEM_OK;
}

/* The final norm of the tokens from wanted_from on (into final_hidden when it is not NULL),
 * then the LM head's logits. */
static int finish(const TandemDecoder *d, int64_t n, int64_t wanted_from, Work *w, float *logits, float *final_hidden,
                  int threads) {
    int64_t hidden = d->hidden, wanted = n - wanted_from;
    for (int64_t i = 0; i < wanted; i++)
        rms_norm(w->state + (wanted_from + i) * hidden, d->final_norm, hidden, d->eps, w->normed + i * hidden);
    if (final_hidden != NULL) memcpy(final_hidden, w->normed, sizeof(float) * wanted * hidden);
    return wanted > 0 ? linear(&d->lm_head, w->normed, wanted, logits, NULL, NULL, threads) : TANDEM_OK;
}

/* The layers and the LM head over n tokens whose attention w was planned for (visible, or
 * span_first in span mode); as tandem_decoder_forward describes. */
static int decode(const TandemDecoder *d, int64_t n, const int64_t *ids, const int64_t *positions, const int64_t *rows,
                  const uint8_t *visible, int64_t visible_stride, int64_t first_row, const int64_t *span_first,
                  int64_t wanted_from, float *logits, float *final_hidden, const int64_t *feature_layers,
                  int64_t feature_count, float *features, Work *w, int threads) {
    int64_t hidden = d->hidden;
    int status = TANDEM_OK;
    for (int64_t i = 0; i < n; i++) {
        const int8_t *row = d->embedding + ids[i] * hidden;
        float scale = d->embedding_scale[ids[i]];
        for (int64_t j = 0; j < hidden; j++) w->state[i * hidden + j] = (float)row[j] * scale;
    }
    for (int64_t index = 0; index < d->layers && status == TANDEM_OK; index++) {
        const TandemLayer *layer = d->layer + index;
        for (int64_t f = 0; f < feature_count; f++)
            if (feature_layers[f] == index)
                for (int64_t i = 0; i < n; i++)
                    memcpy(features + (i * feature_count + f) * hidden, w->state + i * hidden, sizeof(float) * hidden);
        for (int64_t i = 0; i < n; i++) rms_norm(w->state + i * hidden, layer->input_norm, hidden, d->eps, w->normed + i * hidden);
        status = run_layer(d, layer, n, positions, rows, visible, visible_stride, first_row, span_first, w, threads);
    }
    return status == TANDEM_OK ? finish(d, n, wanted_from, w, logits, final_hidden, threads) : status;
}

/* The forward of n tokens. ids, positions, rows: (n,); token i writes its keys and values at
 * cache row rows[i] and sees cache row first_row + s where visible[i * visible_stride + s]
 * (s < slots). Writes logits (n - wanted_from, vocab) of the rows from wanted_from on, their
 * final-norm hidden states into final_hidden when it is not NULL, and, when feature_count > 0,
 * the residual stream entering each of feature_layers into features (n, feature_count, hidden). */
int tandem_decoder_forward(const TandemDecoder *d, int64_t n, const int64_t *ids, const int64_t *positions,
                           const int64_t *rows, const uint8_t *visible, int64_t visible_stride, int64_t first_row,
                           int64_t slots, int64_t wanted_from, float *logits, float *final_hidden,
                           const int64_t *feature_layers, int64_t feature_count, float *features, int threads) {
    int status = check_tokens(d, n, ids, positions, rows, first_row, slots, wanted_from);
    if (status) return status;
    if (threads < 1) threads = 1;
    Work w;
    if ((status = work_alloc(&w, d, n, visible, visible_stride, slots, NULL, d->hidden, threads))) return status;
    status = decode(d, n, ids, positions, rows, visible, visible_stride, first_row, NULL, wanted_from, logits,
                    final_hidden, feature_layers, feature_count, features, &w, threads);
    work_free(&w);
    return status;
}

/* The forward of n tokens of independent sequences at once (many replies written together,
 * engine/tools/distill/native_batch.py): token i writes its keys and values at cache row
 * rows[i] and sees the span_rows[i] rows from span_first[i], its own sequence's, up to and
 * including its own row. The products run over all n tokens, the attention over each token's
 * span alone; a token's logits are those tandem_decoder_forward gives it with the same rows
 * visible, to the bit. Logits and features as there. */
int tandem_decoder_forward_spans(const TandemDecoder *d, int64_t n, const int64_t *ids, const int64_t *positions,
                                 const int64_t *rows, const int64_t *span_first, const int64_t *span_rows,
                                 int64_t wanted_from, float *logits, const int64_t *feature_layers,
                                 int64_t feature_count, float *features, int threads) {
    int status = check_tokens(d, n, ids, positions, rows, 0, d->cache_rows, wanted_from);
    if (status) return status;
    int64_t longest = 1;
    for (int64_t i = 0; i < n; i++) {
        if (span_rows[i] < 1 || span_first[i] < 0 || span_first[i] + span_rows[i] > d->cache_rows ||
            rows[i] < span_first[i] || rows[i] >= span_first[i] + span_rows[i])
            return TANDEM_BAD_INPUT;
        if (span_rows[i] > longest) longest = span_rows[i];
    }
    if (threads < 1) threads = 1;
    uint8_t *all_seen = malloc(longest + 16); /* + a block's masked load past the end */
    if (!all_seen) return TANDEM_NO_MEMORY;
    memset(all_seen, 1, longest + 16);
    Work w;
    if ((status = work_alloc(&w, d, n, NULL, 0, 0, span_rows, d->hidden, threads))) {
        free(all_seen);
        return status;
    }
    status = decode(d, n, ids, positions, rows, all_seen, 0, 0, span_first, wanted_from, logits, NULL, feature_layers,
                    feature_count, features, &w, threads);
    work_free(&w);
    free(all_seen);
    return status;
}

/* An EAGLE-3 head's step (engine/runtime/eagle3_native.py): d holds the head's one decoder layer,
 * whose q/k/v read [input_norm(token embedding) ‖ hidden_norm(input feature)], 2 * hidden wide,
 * and whose residual stream starts at the input feature (`inputs`, (n, hidden): the target's
 * fused features or the head's own outputs); its LM head is over the draft vocabulary, its
 * embedding the target's. Writes each token's layer output into outputs (n, hidden), the
 * feature a drafted child reads, and the logits of the tokens from wanted_from on. Tokens,
 * cache rows and visibility as in tandem_decoder_forward. */
int tandem_eagle3_forward(const TandemDecoder *d, const float *hidden_norm, int64_t n, const int64_t *ids,
                          const float *inputs, const int64_t *positions, const int64_t *rows, const uint8_t *visible,
                          int64_t visible_stride, int64_t first_row, int64_t slots, int64_t wanted_from,
                          float *logits, float *outputs, int threads) {
    int64_t hidden = d->hidden;
    int status = check_tokens(d, n, ids, positions, rows, first_row, slots, wanted_from);
    if (status) return status;
    if (d->layers != 1 || d->layer[0].qkv.width != 2 * hidden) return TANDEM_BAD_INPUT;
    if (threads < 1) threads = 1;
    Work w;
    if ((status = work_alloc(&w, d, n, visible, visible_stride, slots, NULL, 2 * hidden, threads))) return status;

    const TandemLayer *layer = d->layer;
    float *embedding = w.update; /* free until the layer's first product */
    memcpy(w.state, inputs, sizeof(float) * n * hidden);
    for (int64_t i = 0; i < n; i++) {
        const int8_t *row = d->embedding + ids[i] * hidden;
        float scale = d->embedding_scale[ids[i]];
        for (int64_t j = 0; j < hidden; j++) embedding[j] = (float)row[j] * scale;
        rms_norm(embedding, layer->input_norm, hidden, d->eps, w.normed + i * 2 * hidden);
        rms_norm(inputs + i * hidden, hidden_norm, hidden, d->eps, w.normed + i * 2 * hidden + hidden);
    }
    status = run_layer(d, layer, n, positions, rows, visible, visible_stride, first_row, NULL, &w, threads);
    if (status == TANDEM_OK) {
        memcpy(outputs, w.state, sizeof(float) * n * hidden);
        status = finish(d, n, wanted_from, &w, logits, NULL, threads);
    }
    work_free(&w);
    return status;
}

/* The bytes of a cache element: 4 (float32), or 2 where the cache holds bf16 (BF16_ATTENTION). */
int64_t tandem_cache_element_bytes(void) { return sizeof(attn_elem); }

/* The rows of a key cache block (simd.h, KEY_BLOCK_ROWS): 1 where keys are kept in rows. */
int64_t tandem_key_block_rows(void) { return KEY_BLOCK_ROWS; }

/* The key rows a token's attention range holds (RANGE_ROWS), for the tests that place tokens
 * across a range's border. */
int64_t tandem_attention_range_rows(void) { return RANGE_ROWS; }

int64_t tandem_abi(int64_t *out, int64_t count) {
#define AT(type, field) (int64_t) offsetof(type, field)
    const int64_t abi[TANDEM_ABI_FIELDS] = {
        TANDEM_ABI_VERSION, sizeof(TandemInt8), sizeof(TandemLayer), sizeof(TandemDecoder),
        AT(TandemInt8, weight), AT(TandemInt8, scale), AT(TandemInt8, row_sums), AT(TandemInt8, bias),
        AT(TandemInt8, rows), AT(TandemInt8, width), AT(TandemInt8, packed), AT(TandemInt8, group_scales),
        AT(TandemLayer, input_norm), AT(TandemLayer, post_attention_norm), AT(TandemLayer, qkv), AT(TandemLayer, output),
        AT(TandemLayer, gate_up), AT(TandemLayer, down), AT(TandemLayer, keys), AT(TandemLayer, values),
        AT(TandemLayer, q_norm), AT(TandemLayer, k_norm),
        AT(TandemDecoder, layers), AT(TandemDecoder, hidden), AT(TandemDecoder, heads), AT(TandemDecoder, kv_heads),
        AT(TandemDecoder, head_dim), AT(TandemDecoder, intermediate), AT(TandemDecoder, vocab),
        AT(TandemDecoder, cache_rows), AT(TandemDecoder, eps), AT(TandemDecoder, attention_scale),
        AT(TandemDecoder, embedding), AT(TandemDecoder, embedding_scale), AT(TandemDecoder, final_norm),
        AT(TandemDecoder, lm_head), AT(TandemDecoder, cos), AT(TandemDecoder, sin), AT(TandemDecoder, table_positions),
        AT(TandemDecoder, layer),
    };
#undef AT
    for (int64_t i = 0; i < count && i < TANDEM_ABI_FIELDS; i++) out[i] = abi[i];
    return TANDEM_ABI_FIELDS;
}
