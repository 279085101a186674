/* A whole forward of a Llama-layout decoder with int8 weights over the static runtime's KV
 * cache, for a few tokens, in one call (engine/runtime/native_forward.py says when it runs).
 *
 * Why: with Tandem's int8 kernel a one-token forward of the demo target spends about half of
 * its time in its 121 weight products and the other half between them: torch's dispatch,
 * inductor's small fused kernels, dynamo's guards, the wrapper's Python (docs/BENCHMARKS.md).
 * Here the steps between the products are a few loops over a few hundred floats each.
 *
 * It computes what torch_static.StaticCacheForward computes for these models, step for step:
 * - the products are `tandem_int8_product` (int8_matmul*.c, built into the same library),
 *   then times the weight's per-row scale, plus the bias, as Int8Linear does: the same
 *   floats as the torch forward's products for the same inputs;
 * - RMSNorm, the rotary embedding (its cos/sin read from a table the model's own rotary
 *   module filled), attention, SiLU and the residual adds in float32, as torch does them but
 *   summed in another order: logits agree with torch's to float32 rounding, not to the bit.
 * Keys and values are written at the given cache rows first, then every token attends to the
 * rows it sees (`visible`), so a tree verifies as a chain does.
 * Built with -ffp-contract=off, like the product; `omp simd` lets the compiler vectorise the
 * reductions without -ffast-math.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int tandem_int8_product(const float *x, int64_t m, int64_t k, const int8_t *w, int64_t n,
                        int64_t w_stride, const int32_t *row_sums, float *out, int threads);

typedef struct {
    const int8_t *weight;   /* (rows, width) row-major */
    const float *scale;     /* (rows,) */
    const int32_t *row_sums; /* (rows,) */
    const float *bias;      /* (rows,) or NULL */
    int64_t rows, width;
} TandemInt8;

typedef struct {
    const float *input_norm, *post_attention_norm; /* (hidden,) */
    TandemInt8 qkv;      /* queries, keys, values side by side */
    TandemInt8 output;   /* o_proj */
    TandemInt8 gate_up;  /* gate, up side by side */
    TandemInt8 down;
    float *keys, *values; /* (kv_heads, cache_rows, head_dim) */
} TandemLayer;

typedef struct {
    int64_t layers, hidden, heads, kv_heads, head_dim, intermediate, vocab, cache_rows;
    float eps, attention_scale;
    const int8_t *embedding; /* (vocab, hidden) */
    const float *embedding_scale; /* (vocab,) */
    const float *final_norm;
    TandemInt8 lm_head;
    const float *cos, *sin; /* (table_positions, head_dim) */
    int64_t table_positions;
    const TandemLayer *layer;
} TandemDecoder;

enum { TANDEM_OK = 0, TANDEM_NO_MEMORY = -1, TANDEM_BAD_INPUT = -2 };

/* out (m, rows) = x (m, width) times the layer's weight, scaled (and biased) as Int8Linear does. */
static int linear(const TandemInt8 *layer, const float *x, int64_t m, float *out, int threads) {
    if (tandem_int8_product(x, m, layer->width, layer->weight, layer->rows, layer->width, layer->row_sums, out, threads))
        return TANDEM_NO_MEMORY;
    for (int64_t i = 0; i < m; i++) {
        float *row = out + i * layer->rows;
        for (int64_t j = 0; j < layer->rows; j++) row[j] = row[j] * layer->scale[j];
        if (layer->bias != NULL)
            for (int64_t j = 0; j < layer->rows; j++) row[j] = row[j] + layer->bias[j];
    }
    return TANDEM_OK;
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
    float rotated[512];
    for (int64_t j = 0; j < half; j++) rotated[j] = -x[j + half], rotated[j + half] = x[j];
    for (int64_t j = 0; j < head_dim; j++) x[j] = x[j] * cos[j] + rotated[j] * sin[j];
}

/* One query head of one token over the cache rows it sees: out (head_dim). */
static void attend(const TandemDecoder *d, const float *query, const float *keys, const float *values,
                   const uint8_t *visible, int64_t first_row, int64_t slots, float *scores, float *out) {
    int64_t dim = d->head_dim;
    float largest = -INFINITY;
    for (int64_t s = 0; s < slots; s++) {
        if (!visible[s]) continue;
        const float *key = keys + (first_row + s) * dim;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t j = 0; j < dim; j++) dot += query[j] * key[j];
        scores[s] = dot * d->attention_scale;
        if (scores[s] > largest) largest = scores[s];
    }
    float total = 0.0f;
    for (int64_t j = 0; j < dim; j++) out[j] = 0.0f;
    for (int64_t s = 0; s < slots; s++) {
        if (!visible[s]) continue;
        float weight = expf(scores[s] - largest);
        total += weight;
        const float *value = values + (first_row + s) * dim;
#pragma omp simd
        for (int64_t j = 0; j < dim; j++) out[j] += weight * value[j];
    }
    for (int64_t j = 0; j < dim; j++) out[j] = out[j] / total;
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
    int64_t hidden = d->hidden, dim = d->head_dim, groups = d->heads / d->kv_heads;
    int64_t q_width = d->heads * dim, kv_width = d->kv_heads * dim, qkv_width = q_width + 2 * kv_width;
    if (n <= 0 || wanted_from < 0 || wanted_from > n || dim > 512 || first_row + slots > d->cache_rows) return TANDEM_BAD_INPUT;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= d->vocab || positions[i] < 0 || positions[i] >= d->table_positions ||
            rows[i] < 0 || rows[i] >= d->cache_rows)
            return TANDEM_BAD_INPUT;

    int64_t widest = qkv_width > 2 * d->intermediate ? qkv_width : 2 * d->intermediate;
    float *state = malloc(sizeof(float) * n * hidden);   /* the residual stream */
    float *normed = malloc(sizeof(float) * n * hidden);
    float *wide = malloc(sizeof(float) * n * widest);     /* qkv, then gate_up */
    float *mixed = malloc(sizeof(float) * n * (q_width > d->intermediate ? q_width : d->intermediate));
    float *update = malloc(sizeof(float) * n * hidden);
    float *scores = malloc(sizeof(float) * n * d->heads * (slots > 0 ? slots : 1));
    int status = TANDEM_OK;
    if (!state || !normed || !wide || !mixed || !update || !scores) {
        status = TANDEM_NO_MEMORY;
        goto done;
    }

    for (int64_t i = 0; i < n; i++) {
        const int8_t *row = d->embedding + ids[i] * hidden;
        float scale = d->embedding_scale[ids[i]];
        for (int64_t j = 0; j < hidden; j++) state[i * hidden + j] = (float)row[j] * scale;
    }

    for (int64_t index = 0; index < d->layers; index++) {
        const TandemLayer *layer = d->layer + index;
        for (int64_t f = 0; f < feature_count; f++)
            if (feature_layers[f] == index)
                for (int64_t i = 0; i < n; i++)
                    memcpy(features + (i * feature_count + f) * hidden, state + i * hidden, sizeof(float) * hidden);

        /* Attention: queries, keys and values; keys and values into the cache; then attend. */
        for (int64_t i = 0; i < n; i++) rms_norm(state + i * hidden, layer->input_norm, hidden, d->eps, normed + i * hidden);
        if ((status = linear(&layer->qkv, normed, n, wide, threads))) goto done;
        for (int64_t i = 0; i < n; i++) {
            float *qkv = wide + i * qkv_width;
            const float *cos = d->cos + positions[i] * dim, *sin = d->sin + positions[i] * dim;
            for (int64_t h = 0; h < d->heads; h++) rotate(qkv + h * dim, cos, sin, dim);
            for (int64_t g = 0; g < d->kv_heads; g++) {
                float *key = qkv + q_width + g * dim, *value = qkv + q_width + kv_width + g * dim;
                rotate(key, cos, sin, dim);
                memcpy(layer->keys + (g * d->cache_rows + rows[i]) * dim, key, sizeof(float) * dim);
                memcpy(layer->values + (g * d->cache_rows + rows[i]) * dim, value, sizeof(float) * dim);
            }
        }
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
        for (int64_t i = 0; i < n; i++)
            for (int64_t h = 0; h < d->heads; h++) {
                int64_t g = h / groups;
                attend(d, wide + i * qkv_width + h * dim, layer->keys + g * d->cache_rows * dim,
                       layer->values + g * d->cache_rows * dim, visible + i * visible_stride, first_row, slots,
                       scores + (i * d->heads + h) * slots, mixed + i * q_width + h * dim);
            }
        if ((status = linear(&layer->output, mixed, n, update, threads))) goto done;
        for (int64_t j = 0; j < n * hidden; j++) state[j] = state[j] + update[j];

        /* MLP: down(silu(gate) * up). */
        for (int64_t i = 0; i < n; i++)
            rms_norm(state + i * hidden, layer->post_attention_norm, hidden, d->eps, normed + i * hidden);
        if ((status = linear(&layer->gate_up, normed, n, wide, threads))) goto done;
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < d->intermediate; j++) {
                float gate = wide[i * 2 * d->intermediate + j], up = wide[i * 2 * d->intermediate + d->intermediate + j];
                mixed[i * d->intermediate + j] = gate / (1.0f + expf(-gate)) * up;
            }
        if ((status = linear(&layer->down, mixed, n, update, threads))) goto done;
        for (int64_t j = 0; j < n * hidden; j++) state[j] = state[j] + update[j];
    }

    int64_t wanted = n - wanted_from;
    for (int64_t i = 0; i < wanted; i++)
        rms_norm(state + (wanted_from + i) * hidden, d->final_norm, hidden, d->eps, normed + i * hidden);
    if (final_hidden != NULL) memcpy(final_hidden, normed, sizeof(float) * wanted * hidden);
    if (wanted > 0) status = linear(&d->lm_head, normed, wanted, logits, threads);

done:
    free(state), free(normed), free(wide), free(mixed), free(update), free(scores);
    return status;
}
