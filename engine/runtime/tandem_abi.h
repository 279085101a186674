/* The structs Python hands the native forward (engine/runtime/native_forward.py's ctypes
 * Int8Struct, LayerStruct, DecoderStruct mirror them field for field), and the ABI version.
 *
 * Why a header, a version and a report: the layouts are written twice, once here and once in
 * ctypes, and a field added on one side only would be read as another field's bytes. Bump
 * TANDEM_ABI_VERSION with any change here. The library reports the version, the structs' sizes
 * and every field's offset through tandem_abi() (decoder_forward.c), and Python compares them
 * with its ctypes structs once, when it loads the library (engine/runtime/kernel_abi.py):
 * a library that differs in any of them is refused, and torch does the work. */
#ifndef TANDEM_ABI_H
#define TANDEM_ABI_H

#include <stdint.h>

#define TANDEM_ABI_VERSION 5

/* A linear layer: int8 (weight, scale, row_sums) or, where `packed` is not NULL, int4 (packed and
 * group_scales in int4_weights.py's layout; weight, scale and row_sums unused). */
typedef struct {
    const int8_t *weight;   /* (rows, width) row-major */
    const float *scale;     /* (rows,) */
    const int32_t *row_sums; /* (rows,) */
    const float *bias;      /* (rows,) or NULL */
    int64_t rows, width;
    const uint8_t *packed;         /* int4: (rows / 16 rounded up, width / 32, 256) */
    const uint8_t *group_scales;   /* int4: (rows / 16 rounded up, 64 x super-blocks + 32 x groups): factors and codes */
} TandemInt8;

typedef struct {
    const float *input_norm, *post_attention_norm; /* (hidden,) */
    TandemInt8 qkv;      /* queries, keys, values side by side */
    TandemInt8 output;   /* o_proj */
    TandemInt8 gate_up;  /* gate, up side by side */
    TandemInt8 down;
    /* values (kv_heads, cache_rows, head_dim): float32, or bf16 in a build whose attention
     * multiplies in bf16 (tandem_cache_element_bytes). keys: the same, in rows where
     * tandem_key_block_rows() is 1, else in its blocks of rows (simd.h, KEY_BLOCK_ROWS):
     * (kv_heads, cache_rows / 16, head_dim / 2, 16, 2), cache_rows whole blocks. */
    void *keys, *values;
    const float *q_norm, *k_norm; /* (head_dim,): RMSNorm of each query and key head (Qwen3), or NULL */
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

/* What the library was built with, in this order: TANDEM_ABI_VERSION; the sizes in bytes of
 * TandemInt8, TandemLayer and TandemDecoder; then the offset of each of their fields, struct
 * by struct, in the order they are declared above. Writes at most `count` of them into `out`
 * and returns how many there are (TANDEM_ABI_FIELDS). */
#define TANDEM_ABI_FIELDS (4 + 8 + 10 + 18)
int64_t tandem_abi(int64_t *out, int64_t count);

#endif
