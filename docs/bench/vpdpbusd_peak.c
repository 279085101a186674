/* How many 512-bit VPDPBUSD one core retires per nanosecond when nothing else limits it: 16
 * independent accumulators, a weight load from L1 feeding a token's two rounding levels, as
 * the int8 kernel's inner loop does (engine/runtime/int8_matmul.c). The ceiling of the
 * kernel's multi-token products (issue 21); docs/bench/vpdpbusd_peak.py builds this, and
 * times it against the kernel in one process.
 */
#include <immintrin.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* VPDPBUSD per ns over `passes` passes of a 16 KB block (32 instructions per 1 KB). */
double tandem_vpdpbusd_rate(long passes) {
    enum { BLOCK = 16384 };
    static char weights[BLOCK] __attribute__((aligned(64)));
    for (int i = 0; i < BLOCK; i++) weights[i] = (char)(i * 7);
    __m512i acc[16], x1 = _mm512_set1_epi8(3), x2 = _mm512_set1_epi8(5);
    for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_si512();
    double started = now();
    for (long j = 0; j < passes; j++)
        for (int b = 0; b < BLOCK; b += 512)
#pragma GCC unroll 8 /* the accumulators stay in registers */
            for (int r = 0; r < 8; r++) {
                __m512i weight = _mm512_load_si512(weights + b + r * 64);
                acc[r] = _mm512_dpbusd_epi32(acc[r], x1, weight);
                acc[r + 8] = _mm512_dpbusd_epi32(acc[r + 8], x2, weight);
            }
    double seconds = now() - started;
    __m512i sum = acc[0];
    for (int i = 1; i < 16; i++) sum = _mm512_add_epi32(sum, acc[i]);
    volatile int keep = _mm512_reduce_add_epi32(sum); /* the sums are used: the loop stays */
    (void)keep;
    return passes * (BLOCK / 512) * 16.0 / seconds / 1e9;
}
