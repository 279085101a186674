/* How many 512-bit float multiply-adds (VFMADD231PS, 16 lanes) the cores retire per second when
 * nothing else limits them: 16 independent accumulators, one operand loaded from L1, as the
 * native forward's attention feeds them (a query against cached keys and values). The floor of
 * a long prompt's attention in float32 (issue 45, item 5).
 *
 *     cc -O2 -mavx512f -mfma -fopenmp docs/bench/fma_peak.c -o fma_peak && ./fma_peak 1 && ./fma_peak 2
 */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    const long passes = 400000;
    enum { BLOCK = 4096 }; /* floats: 16 KB, in L1 */
    double started = omp_get_wtime();
    float total = 0.0f;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
        static float data[BLOCK] __attribute__((aligned(64)));
#pragma omp single
        for (int i = 0; i < BLOCK; i++) data[i] = 1e-3f * (float)(i % 7);
        __m512 acc[16], x = _mm512_set1_ps(0.999f);
        for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
        for (long j = 0; j < passes; j++)
            for (int b = 0; b < BLOCK; b += 256)
#pragma GCC unroll 16
                for (int r = 0; r < 16; r++) acc[r] = _mm512_fmadd_ps(x, _mm512_load_ps(data + b + r * 16), acc[r]);
        __m512 sum = acc[0];
        for (int i = 1; i < 16; i++) sum = _mm512_add_ps(sum, acc[i]);
        total += _mm512_reduce_add_ps(sum);
    }
    double seconds = omp_get_wtime() - started;
    double instructions = (double)threads * passes * (BLOCK / 16);
    printf("%d thread(s): %.2f G 512-bit FMAs/s (%.1f GFLOP/s float32) [%g]\n", threads, instructions / seconds / 1e9,
           instructions * 32 / seconds / 1e9, (double)total);
    return 0;
}
