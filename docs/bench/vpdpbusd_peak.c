/* How many VPDPBUSD (512-bit) one core of this CPU retires per nanosecond, the ceiling of the
 * int8 kernel's multi-token products (issue 21, docs/BENCHMARKS.md): 16 independent
 * accumulators in registers, then the kernel's own pattern (a weight load from L1 feeding a
 * token's two rounding levels). One thread; compare with docs/bench/int8_matvec.py's rates.
 *
 *   cc -O2 -mavx512f -mavx512bw -mavx512vnni docs/bench/vpdpbusd_peak.c -o /tmp/peak && /tmp/peak
 */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int total(const __m512i acc[16]) {
    __m512i sum = acc[0];
    for (int i = 1; i < 16; i++) sum = _mm512_add_epi32(sum, acc[i]);
    return _mm512_reduce_add_epi32(sum);
}

int main(void) {
    enum { BLOCK = 16384, REPEATS = 5 };
    static char weights[BLOCK] __attribute__((aligned(64)));
    for (int i = 0; i < BLOCK; i++) weights[i] = (char)(i * 7);
    __m512i acc[16], x1 = _mm512_set1_epi8(3), x2 = _mm512_set1_epi8(5);
    const long rounds = 20000000;
    double best_registers = 0, best_loads = 0;
    for (int repeat = 0; repeat < REPEATS; repeat++) {
        for (int i = 0; i < 16; i++) acc[i] = _mm512_set1_epi32(i);
        double started = now();
        for (long j = 0; j < rounds; j++) {
            for (int i = 0; i < 16; i++) acc[i] = _mm512_dpbusd_epi32(acc[i], x1, x2);
            __asm__ volatile("" : "+v"(x1)); /* keep the loop from being folded */
        }
        double rate = rounds * 16.0 / (now() - started) / 1e9;
        if (rate > best_registers) best_registers = rate;
        printf("%s", total(acc) == 42 ? " " : "");

        started = now();
        long passes = rounds / (BLOCK / 512);
        for (long j = 0; j < passes; j++)
            for (int b = 0; b < BLOCK; b += 512)
                for (int r = 0; r < 8; r++) {
                    __m512i weight = _mm512_load_si512(weights + b + r * 64);
                    acc[r] = _mm512_dpbusd_epi32(acc[r], x1, weight);
                    acc[r + 8] = _mm512_dpbusd_epi32(acc[r + 8], x2, weight);
                }
        rate = passes * (BLOCK / 512) * 16.0 / (now() - started) / 1e9;
        if (rate > best_loads) best_loads = rate;
        printf("%s", total(acc) == 42 ? " " : "");
    }
    printf("VPDPBUSD per ns, one core, best of %d: %.2f in registers, %.2f with a weight load per two\n", REPEATS,
           best_registers, best_loads);
    return 0;
}
