/* The int8 layers' product for a few float rows, with AVX-512 VNNI: each row rounded to int8
 * in two levels, times the int8 weight with int32 sums (the integers torch._int_mm gives), and
 * scaled back to float32 (engine/runtime/int8_kernel.py, whose torch version is the reference).
 *
 * Why it is shaped this way (engine/runtime/int8_kernel.py says why it exists):
 * - VPDPBUSD multiplies unsigned by signed bytes, four at a time into each int32 lane. The
 *   rounded activations are stored shifted to unsigned (level + 128) and the shift is taken
 *   back as 128 * (the weight row's sum). The caller keeps those sums with the weight:
 *   computing them here was one more pass over the weight, 10% of a one-token forward.
 * - The weight stays in its row-major layout (no repacked copy), 16 rows a block. A token's
 *   two levels are taken together, 8 rows at a time: each 64 bytes of a weight row loaded once
 *   for both, 16 accumulators. A tree of unpacks and shuffles then turns the 16 accumulators
 *   into one vector (lane r: accumulator r's sum), so 16 sums cost ~30 instructions, not 16
 *   horizontal sums. Integer sums are exact: the order they are added in changes nothing.
 * - A block's rows are read from memory once, by the first token; the other tokens find them
 *   in L1. The first token's passes also fetch the next block into L2, a line for each weight
 *   load, so the memory keeps streaming while a block is busy with the tokens after the first:
 *   without it, an 8-token verify paid for its extra tokens' products and then waited for the
 *   memory again at every block (a fetched block made the demo target's step 0.8x and a verify
 *   of 2 to 8 tokens 0.85x of their time, docs/BENCHMARKS.md).
 * - Rounding inside the call, not in torch before it, saves the compiled graph its rounding
 *   kernels: at a few rows each costs about what its launch does.
 * - Built with -ffp-contract=off: a fused multiply-add would round differently from torch.
 * - OpenMP splits the blocks across threads. The library links libgomp.so.1 by name, the
 *   runtime torch itself has loaded, so its threads are torch's threads.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ROWS 16
#define CHUNK 64

/* One vector whose lane r is the sum of acc[r]'s 16 lanes. */
static inline __m512i sum_lanes_16(const __m512i acc[ROWS]) {
    __m512i pairs[8], quads[4];
    for (int i = 0; i < 8; i++) /* each 128-bit lane: two partial sums per row of a pair */
        pairs[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(acc[2 * i], acc[2 * i + 1]),
                                    _mm512_unpackhi_epi32(acc[2 * i], acc[2 * i + 1]));
    for (int i = 0; i < 4; i++) /* each 128-bit lane: one partial sum per row of a quad */
        quads[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(pairs[2 * i], pairs[2 * i + 1]),
                                    _mm512_unpackhi_epi64(pairs[2 * i], pairs[2 * i + 1]));
    /* add the four 128-bit lanes of each quad, and put quad q in 128-bit lane q */
    __m512i low = _mm512_add_epi32(_mm512_shuffle_i32x4(quads[0], quads[1], 0x44),
                                   _mm512_shuffle_i32x4(quads[0], quads[1], 0xEE));
    __m512i high = _mm512_add_epi32(_mm512_shuffle_i32x4(quads[2], quads[3], 0x44),
                                    _mm512_shuffle_i32x4(quads[2], quads[3], 0xEE));
    return _mm512_add_epi32(_mm512_shuffle_i32x4(low, high, 0x88),
                            _mm512_shuffle_i32x4(low, high, 0xDD));
}

/* Both levels of one token against the 16 rows at `rows` + r * stride, each weight load used
 * twice: 8 rows at a time, 16 accumulators (lanes 0-7: level one of the 8 rows, 8-15: level
 * two). Integer sums are exact, so the order they are added in changes nothing. */
static inline __attribute__((always_inline)) __m512i dot_half(const uint8_t *first_level, const uint8_t *second_level,
                                                              const int8_t *rows, int64_t stride, int64_t k, const int8_t *next) {
    __m512i acc[ROWS];
    for (int r = 0; r < ROWS; r++) acc[r] = _mm512_setzero_si512();
    int64_t start = 0;
    for (; start + CHUNK <= k; start += CHUNK) {
        __m512i x1 = _mm512_loadu_si512(first_level + start), x2 = _mm512_loadu_si512(second_level + start);
        for (int r = 0; r < ROWS / 2; r++) {
            if (next != NULL) _mm_prefetch((const char *)(next + r * stride + start), _MM_HINT_T1);
            __m512i weight = _mm512_loadu_si512(rows + r * stride + start);
            acc[r] = _mm512_dpbusd_epi32(acc[r], x1, weight);
            acc[r + ROWS / 2] = _mm512_dpbusd_epi32(acc[r + ROWS / 2], x2, weight);
        }
    }
    if (start < k) {
        __mmask64 tail = _bzhi_u64(~0ULL, (unsigned)(k - start));
        __m512i x1 = _mm512_maskz_loadu_epi8(tail, first_level + start), x2 = _mm512_maskz_loadu_epi8(tail, second_level + start);
        for (int r = 0; r < ROWS / 2; r++) {
            if (next != NULL) _mm_prefetch((const char *)(next + r * stride + start), _MM_HINT_T1);
            __m512i weight = _mm512_maskz_loadu_epi8(tail, rows + r * stride + start);
            acc[r] = _mm512_dpbusd_epi32(acc[r], x1, weight);
            acc[r + ROWS / 2] = _mm512_dpbusd_epi32(acc[r + ROWS / 2], x2, weight);
        }
    }
    return sum_lanes_16(acc);
}

/* One row's two rounding levels, as unsigned bytes (value + 128) with their scales, computed
 * as engine/runtime/int8_kernel.py's torch version computes them, operation for operation in
 * float32, so both give the same bytes and scales: a token's product does not depend on which
 * of them ran it. */
/* torch's amax(...).clamp(min=1e-30) / 127 of the values whose largest |value| is `largest`
 * (NaN where any value was NaN, as amax and clamp keep a NaN). */
static inline float scale_of(__m512 largest, __mmask16 any_nan) {
    float most = any_nan ? NAN : _mm512_reduce_max_ps(largest);
    return (most < 1e-30f ? 1e-30f : most) / 127.0f;
}

static inline __mmask16 lanes_from(int64_t j, int64_t k) {
    return k - j >= 16 ? 0xFFFF : (__mmask16)((1u << (k - j)) - 1);
}

/* level + 128 as bytes, for 16 levels */
static inline void store_level(uint8_t *to, __mmask16 lanes, __m512 level) {
    __m512i shifted = _mm512_add_epi32(_mm512_cvtps_epi32(level), _mm512_set1_epi32(128));
    _mm_mask_storeu_epi8(to, lanes, _mm512_cvtepi32_epi8(shifted));
}

static void round_row(const float *x, int64_t k, uint8_t *first, uint8_t *second, float *leftover,
                      float scales[2]) {
    const int nearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC; /* half to even, as torch.round */
    __m512 largest = _mm512_setzero_ps();
    __mmask16 any_nan = 0;
    for (int64_t j = 0; j < k; j += 16) {
        __m512 values = _mm512_maskz_loadu_ps(lanes_from(j, k), x + j);
        any_nan |= _mm512_cmp_ps_mask(values, values, _CMP_UNORD_Q);
        largest = _mm512_max_ps(largest, _mm512_abs_ps(values));
    }
    float scale = scale_of(largest, any_nan);
    /* times the scale's reciprocal, not divided by the scale: a division per value had been a
     * third of the rounding's time (torch_product does the same) */
    __m512 first_scale = _mm512_set1_ps(scale), first_inverse = _mm512_set1_ps(1.0f / scale);
    __m512 left_largest = _mm512_setzero_ps();
    __mmask16 left_nan = 0;
    for (int64_t j = 0; j < k; j += 16) {
        __mmask16 lanes = lanes_from(j, k);
        __m512 values = _mm512_maskz_loadu_ps(lanes, x + j);
        __m512 level = _mm512_roundscale_ps(_mm512_mul_ps(values, first_inverse), nearest);
        store_level(first + j, lanes, level);
        __m512 left = _mm512_sub_ps(values, _mm512_mul_ps(level, first_scale));
        _mm512_mask_storeu_ps(leftover + j, lanes, left);
        left_nan |= _mm512_mask_cmp_ps_mask(lanes, left, left, _CMP_UNORD_Q);
        left_largest = _mm512_max_ps(left_largest, _mm512_abs_ps(left));
    }
    float left_scale = scale_of(left_largest, left_nan);
    __m512 second_inverse = _mm512_set1_ps(1.0f / left_scale);
    for (int64_t j = 0; j < k; j += 16) {
        __mmask16 lanes = lanes_from(j, k);
        __m512 left = _mm512_maskz_loadu_ps(lanes, leftover + j);
        store_level(second + j, lanes, _mm512_roundscale_ps(_mm512_mul_ps(left, second_inverse), nearest));
    }
    scales[0] = scale;
    scales[1] = left_scale;
}

/* A block's products times the layer's per-row scale, plus its bias, where given: what
 * Int8Linear does after the product, the same float operations in the same order, done here
 * while the 16 floats are in a register rather than in another pass over the output. */
static inline __m512 scaled(__m512 product, const float *row_scale, const float *bias, __mmask16 lanes) {
    if (row_scale != NULL) product = _mm512_mul_ps(product, _mm512_maskz_loadu_ps(lanes, row_scale));
    if (bias != NULL) product = _mm512_add_ps(product, _mm512_maskz_loadu_ps(lanes, bias));
    return product;
}

/* One block of 16 weight rows, ready for the products: where its rows are (the last rows
 * of a weight copied into zeros, so that every block is 16 rows), which rows to fetch while it
 * runs, and what its outputs are scaled, shifted and biased by. */
typedef struct {
    const int8_t *rows, *next;
    int8_t *copy; /* the zero-padded copy of a short last block, or NULL */
    int64_t stride;
    __mmask16 lanes;
    __m512i shift; /* 128 * the rows' sums */
    const float *scale, *bias;
    float *out; /* the block's first output of token 0 */
} Block;

/* Block `index` of the weight; fetching the block `ahead` blocks on. Returns -1 where memory
 * for a short last block's copy could not be had. */
static int block_at(int64_t index, int64_t ahead, const int8_t *w, int64_t n, int64_t k, int64_t w_stride,
                    const int32_t *row_sums, const float *row_scale, const float *bias, float *out, Block *b) {
    int64_t first = index * ROWS, padded = (k + CHUNK - 1) / CHUNK * CHUNK;
    int count = n - first < ROWS ? (int)(n - first) : ROWS;
    b->rows = w + first * w_stride, b->stride = w_stride, b->copy = NULL;
    if (count < ROWS) {
        b->copy = calloc((size_t)ROWS * padded, 1);
        if (b->copy == NULL) return -1;
        for (int r = 0; r < count; r++) memcpy(b->copy + r * padded, b->rows + r * w_stride, (size_t)k);
        b->rows = b->copy, b->stride = padded;
    }
    b->next = first + (ahead + 1) * ROWS <= n ? b->rows + ahead * ROWS * b->stride : NULL;
    b->lanes = (__mmask16)((1u << count) - 1);
    b->shift = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(b->lanes, row_sums + first), 7);
    b->scale = row_scale != NULL ? row_scale + first : NULL;
    b->bias = bias != NULL ? bias + first : NULL;
    b->out = out + first;
    return 0;
}

/* --- AMX: several tokens' products on the tile unit -------------------------------------
 *
 * Why: past the first token, each token's two levels cost the vector unit 2 x rows x k / 64
 * VPDPBUSD, and those (not the memory) set a verify's price (docs/BENCHMARKS.md: a verify of
 * 8 tokens cost 3.1x a step). A CPU with AMX multiplies a 16 x 64 int8 tile by a 64 x 16 one
 * in one TDPBSUD: up to 8 tokens' two levels (16 columns) against 16 weight rows at once, so
 * a verify of up to 8 tokens reads its weights once at about a step's speed.
 * The weight is the A tile as it lies (16 rows, `stride` apart, 64 bytes of each); the
 * rounded activations are repacked into B tiles (row r: 4 bytes k = 4r..4r+3 of each column,
 * column c < 8: level one of token c, c >= 8: level two of token c - 8). The sums are the
 * same integers the vector path gives, scaled by the same float operations, so the floats
 * are the same to the bit whichever path ran.
 * Used for 2 or more tokens where k is a multiple of 64 and the kernel lets this process use
 * the tiles (Linux asks a process to request them: ARCH_REQ_XCOMP_PERM). */
#if defined(__GNUC__) && __GNUC__ >= 11 && defined(__x86_64__) && defined(__linux__)
#define TANDEM_AMX 1
#define AMX_TARGET __attribute__((target("amx-tile,amx-int8")))
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define GROUP 8 /* tokens per B tile: two levels each fill its 16 columns */

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
} TileConfig;

static int amx_state = -1; /* -1 unknown, 0 off, 1 on */
static int amx_wanted = 1; /* tandem_int8_use_amx: tests compare both paths */

static int amx_available(void) {
    if (amx_state < 0) {
        unsigned a, b, c, d;
        __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
        int cpu = (d >> 24) & 1 && (d >> 25) & 1; /* AMX-TILE, AMX-INT8 */
        int state = cpu && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
        __atomic_store_n(&amx_state, state, __ATOMIC_SEQ_CST);
    }
    return amx_state;
}

/* Whether AMX runs the products of several tokens (on = 0 turns it off, 1 back on where the
 * CPU and the kernel allow it, -1 only asks). */
int tandem_int8_use_amx(int on) {
    if (on >= 0) amx_wanted = on;
    return amx_wanted && amx_available();
}

/* B tile `tile` (packed[group][chunk], 16 x 64 bytes, as the header says) from the levels of
 * its group's tokens; a token past m (the last group's spare columns) gets zeros. A tile per
 * call, so threads packing different tiles never write the same cache line. */
static void pack_tile(const uint8_t *levels, int64_t m, int64_t padded, int64_t tile, uint8_t *packed) {
    int64_t chunks = padded / CHUNK, group = tile / chunks, c = tile % chunks;
    uint8_t *to = packed + tile * 1024;
    for (int column = 0; column < 2 * GROUP; column++) {
        int64_t i = group * GROUP + column % GROUP;
        const uint8_t *from = levels + (2 * i + column / GROUP) * padded + c * CHUNK;
        for (int r = 0; r < 16; r++)
            if (i < m)
                memcpy(to + r * 64 + column * 4, from + r * 4, 4);
            else
                memset(to + r * 64 + column * 4, 0, 4);
    }
}

/* The 16 x 16 sums with rows and columns swapped: column[j] lane r = sums[r][j]. Four rounds
 * of shuffles (64 in all), where 16 gathers of a column each had cost the epilogue more than
 * the tile products of a block. */
static inline void columns_of(const int32_t sums[16][16], __m512i column[16]) {
    __m512i row[16], pair[16], quad[16];
    for (int r = 0; r < 16; r++) row[r] = _mm512_load_si512(sums[r]);
    for (int r = 0; r < 16; r += 2) { /* each 128-bit lane: rows r, r+1 of two columns */
        pair[r] = _mm512_unpacklo_epi32(row[r], row[r + 1]);
        pair[r + 1] = _mm512_unpackhi_epi32(row[r], row[r + 1]);
    }
    for (int r = 0; r < 16; r += 4) { /* quad[r + c] lane l: rows r..r+3 of column 4l + c */
        quad[r] = _mm512_unpacklo_epi64(pair[r], pair[r + 2]);
        quad[r + 1] = _mm512_unpackhi_epi64(pair[r], pair[r + 2]);
        quad[r + 2] = _mm512_unpacklo_epi64(pair[r + 1], pair[r + 3]);
        quad[r + 3] = _mm512_unpackhi_epi64(pair[r + 1], pair[r + 3]);
    }
    for (int c = 0; c < 4; c++) { /* gather each column's four 128-bit lanes */
        __m512i low_lo = _mm512_shuffle_i32x4(quad[c], quad[4 + c], 0x44), low_hi = _mm512_shuffle_i32x4(quad[c], quad[4 + c], 0xEE);
        __m512i high_lo = _mm512_shuffle_i32x4(quad[8 + c], quad[12 + c], 0x44);
        __m512i high_hi = _mm512_shuffle_i32x4(quad[8 + c], quad[12 + c], 0xEE);
        column[c] = _mm512_shuffle_i32x4(low_lo, high_lo, 0x88);
        column[c + 4] = _mm512_shuffle_i32x4(low_lo, high_lo, 0xDD);
        column[c + 8] = _mm512_shuffle_i32x4(low_hi, high_hi, 0x88);
        column[c + 12] = _mm512_shuffle_i32x4(low_hi, high_hi, 0xDD);
    }
}

/* A block's products for all m tokens: a group of 8 tokens at a time, its sums in one tile. */
AMX_TARGET static void amx_block(const Block *b, int64_t k, const uint8_t *packed, int64_t m, const float *scales,
                                 int64_t n) {
    int64_t chunks = k / CHUNK;
    int32_t sums[16][16] __attribute__((aligned(64)));
    for (int64_t group = 0; group * GROUP < m; group++) {
        const uint8_t *tiles = packed + group * chunks * 1024;
        _tile_zero(2);
        for (int64_t c = 0; c < chunks; c++) {
            if (b->next != NULL && group == 0)
                for (int r = 0; r < ROWS; r++) _mm_prefetch((const char *)(b->next + r * b->stride + c * CHUNK), _MM_HINT_T1);
            _tile_loadd(0, b->rows + c * CHUNK, b->stride);
            _tile_loadd(1, tiles + c * 1024, 64);
            _tile_dpbsud(2, 0, 1);
        }
        _tile_stored(2, sums, 64);
        /* column t of the 16 x 16 sums: token t's level one for the 16 rows; t + 8: level two */
        __m512i column[16];
        columns_of(sums, column);
        for (int64_t t = 0; t < GROUP && group * GROUP + t < m; t++) {
            int64_t i = group * GROUP + t;
            __m512i level_sums = _mm512_sub_epi32(column[t], b->shift);
            __m512i left_sums = _mm512_sub_epi32(column[t + GROUP], b->shift);
            __m512 first_part = _mm512_mul_ps(_mm512_cvtepi32_ps(level_sums), _mm512_set1_ps(scales[2 * i]));
            __m512 second_part = _mm512_mul_ps(_mm512_cvtepi32_ps(left_sums), _mm512_set1_ps(scales[2 * i + 1]));
            __m512 product = scaled(_mm512_add_ps(first_part, second_part), b->scale, b->bias, b->lanes);
            _mm512_mask_storeu_ps(b->out + i * n, b->lanes, product);
        }
    }
}

/* Tiles 0 (weights), 1 (activations) and 2 (sums): 16 rows of 64 bytes each. Static data:
 * GCC 12 dropped the stores into a stack copy as dead (it does not see LDTILECFG read them). */
static const TileConfig TILES = {.palette = 1, .bytes_per_row = {64, 64, 64}, .rows = {16, 16, 16}};

/* The threads are OpenMP's, shared with torch and any other library in the process; ggml's
 * AMX kernels configure a thread's tiles once and expect them to stay configured. So each
 * thread's configuration is kept and given back afterwards (not its tile data: no one keeps
 * data in tiles between calls), and a thread that had none is released. */
AMX_TARGET static void amx_start(TileConfig *theirs) {
    _tile_storeconfig(theirs);
    _tile_loadconfig(&TILES);
}

AMX_TARGET static void amx_end(const TileConfig *theirs) {
    if (theirs->palette != 0)
        _tile_loadconfig(theirs);
    else
        _tile_release();
}
#else
int tandem_int8_use_amx(int on) { (void)on; return 0; } /* no AMX in this build */
#endif

/* out (m, n) float32 = the float rows x (m, k), each rounded to int8 in two levels, times the
 * int8 weight rows (n of k bytes, `w_stride` apart) transposed: sums1 * scale1 + sums2 * scale2,
 * then times row_scale[j] and plus bias[j] for output j where those are not NULL.
 * row_sums: the n weight rows' sums. Where `prepare` is not NULL, prepare(context, i) first
 * writes row i of x: the decoder forward's steps between two products, run by the threads that
 * round the rows (decoder_forward.c). Returns 0, or -1 where memory for the rounded rows could
 * not be had. */
int tandem_int8_linear(const float *x, int64_t m, int64_t k, const int8_t *w, int64_t n, int64_t w_stride,
                       const int32_t *row_sums, const float *row_scale, const float *bias, float *out,
                       void (*prepare)(const void *context, int64_t row), const void *context, int threads) {
    int64_t padded = (k + CHUNK - 1) / CHUNK * CHUNK;
    uint8_t *levels = malloc((size_t)(2 * m) * padded); /* row i: levels 2i and 2i+1 */
    float *scales = malloc(sizeof(float) * 2 * m);
    float *leftover = malloc(sizeof(float) * m * k);
    int failed = 0;
    if (levels == NULL || scales == NULL || leftover == NULL) {
        free(levels), free(scales), free(leftover);
        return -1;
    }
    int64_t blocks = (n + ROWS - 1) / ROWS;
    uint8_t *packed = NULL;
#ifdef TANDEM_AMX
    int64_t groups = (m + GROUP - 1) / GROUP;
    if (m >= 2 && k % CHUNK == 0 && amx_wanted && amx_available())
        packed = malloc((size_t)(groups * (padded / CHUNK) * 1024));
#endif
    /* One token is rounded before the threads start; several are rounded (and packed) by the
     * threads: for a verify the rounding was a tenth of the forward, with one thread waiting. */
    int rounded_by_threads = m > 1;
    if (!rounded_by_threads)
        for (int64_t i = 0; i < m; i++) {
            if (prepare != NULL) prepare(context, i);
            round_row(x + i * k, k, levels + 2 * i * padded, levels + (2 * i + 1) * padded, leftover + i * k, scales + 2 * i);
        }
#pragma omp parallel num_threads(threads)
    {
    if (rounded_by_threads) {
#pragma omp for schedule(static)
        for (int64_t i = 0; i < m; i++) {
            if (prepare != NULL) prepare(context, i);
            round_row(x + i * k, k, levels + 2 * i * padded, levels + (2 * i + 1) * padded, leftover + i * k, scales + 2 * i);
        }
    }
#ifdef TANDEM_AMX
    TileConfig theirs __attribute__((aligned(64)));
    if (packed != NULL) {
#pragma omp for schedule(static)
        for (int64_t tile = 0; tile < groups * (padded / CHUNK); tile++) pack_tile(levels, m, padded, tile, packed);
        amx_start(&theirs);
    }
#endif
#pragma omp for schedule(static)
    for (int64_t index = 0; index < blocks; index++) {
        Block block;
        if (block_at(index, 1, w, n, k, w_stride, row_sums, row_scale, bias, out, &block)) {
#pragma omp atomic write
            failed = 1;
            continue;
        }
#ifdef TANDEM_AMX
        if (packed != NULL) {
            /* GCC's tile loads are asm with register inputs only: make a copied block visible */
            __asm__ volatile("" ::: "memory");
            amx_block(&block, k, packed, m, scales, n);
            free(block.copy);
            continue;
        }
#endif
        for (int64_t i = 0; i < m; i++) {
            const uint8_t *first_level = levels + 2 * i * padded, *second_level = first_level + padded;
            /* rows 0-7 and 8-15, both levels each; the first token's passes fetch the next block
             * (half of it in each) */
            const int8_t *fetch = i == 0 ? block.next : NULL;
            __m512i low = dot_half(first_level, second_level, block.rows, block.stride, k, fetch);
            __m512i high = dot_half(first_level, second_level, block.rows + 8 * block.stride, block.stride, k,
                                    fetch == NULL ? NULL : fetch + 8 * block.stride);
            /* level one: low's lanes 0-7 then high's 0-7; level two: their lanes 8-15 */
            __m512i sums = _mm512_sub_epi32(_mm512_shuffle_i64x2(low, high, 0x44), block.shift);
            __m512i left_sums = _mm512_sub_epi32(_mm512_shuffle_i64x2(low, high, 0xEE), block.shift);
            __m512 first_part = _mm512_mul_ps(_mm512_cvtepi32_ps(sums), _mm512_set1_ps(scales[2 * i]));
            __m512 second_part = _mm512_mul_ps(_mm512_cvtepi32_ps(left_sums), _mm512_set1_ps(scales[2 * i + 1]));
            __m512 product = scaled(_mm512_add_ps(first_part, second_part), block.scale, block.bias, block.lanes);
            _mm512_mask_storeu_ps(block.out + i * n, block.lanes, product);
        }
        free(block.copy);
    }
#ifdef TANDEM_AMX
    if (packed != NULL) amx_end(&theirs);
#endif
    }
    free(levels), free(scales), free(leftover), free(packed);
    return failed ? -1 : 0;
}

/* The product alone (no scale, no bias): int8_kernel.py's operator. */
int tandem_int8_product(const float *x, int64_t m, int64_t k, const int8_t *w, int64_t n,
                        int64_t w_stride, const int32_t *row_sums, float *out, int threads) {
    return tandem_int8_linear(x, m, k, w, n, w_stride, row_sums, NULL, NULL, out, NULL, NULL, threads);
}
