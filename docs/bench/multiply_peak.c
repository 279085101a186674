/* What the vector unit multiplies here, apart from Tandem's code: VPDPBUSD (the int8 products'
 * instruction, 64 byte products into 16 int32 sums) and VDPBF16PS (the bf16 attention's, 32
 * bf16 products into 16 float32 sums), 512 bits wide, on every thread at once (OpenMP). Each
 * thread runs 12 independent sums, enough to cover either instruction's latency, unrolled so
 * that they stay in registers (a loop over them had kept them in memory, and timed the store
 * forwarding): what comes out is the throughput the cores give, instructions per second, all
 * threads together.
 * docs/bench/read_floor.py turns it into the least time a prompt's read can take.
 *
 *   gcc -O2 -fopenmp -mavx512f -mavx512bw -mavx512vnni -mavx512bf16 docs/bench/multiply_peak.c -o /tmp/multiply_peak
 *   OMP_NUM_THREADS=2 /tmp/multiply_peak
 */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>

#define SUMS 12 /* the unroll pragmas name it: they take a number */
#define ROUNDS 100000000L

static double int8_round(void) {
    double started = omp_get_wtime();
    long checksum = 0;
#pragma omp parallel reduction(+ : checksum)
    {
        __m512i sums[SUMS], x = _mm512_set1_epi8(1), w = _mm512_set1_epi8(2);
        for (int i = 0; i < SUMS; i++) sums[i] = _mm512_set1_epi32(i);
        for (long n = 0; n < ROUNDS; n++) {
#pragma GCC unroll 12
            for (int i = 0; i < SUMS; i++) sums[i] = _mm512_dpbusd_epi32(sums[i], x, w);
            __asm__ volatile("" : "+v"(x)); /* x may change: the compiler keeps every round */
        }
        for (int i = 0; i < SUMS; i++) checksum += _mm512_reduce_add_epi32(sums[i]);
    }
    double seconds = omp_get_wtime() - started;
    if (checksum == 42) printf("\n"); /* uses the sums */
    return (double)ROUNDS * SUMS * omp_get_max_threads() / seconds;
}

static double bf16_round(void) {
    double started = omp_get_wtime();
    float checksum = 0.0f;
#pragma omp parallel reduction(+ : checksum)
    {
        __m512 sums[SUMS];
        __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3000);
        for (int i = 0; i < SUMS; i++) sums[i] = _mm512_set1_ps((float)i);
        for (long n = 0; n < ROUNDS; n++) {
#pragma GCC unroll 12
            for (int i = 0; i < SUMS; i++) sums[i] = _mm512_dpbf16_ps(sums[i], a, b);
            __asm__ volatile("" : "+v"(a));
        }
        for (int i = 0; i < SUMS; i++) checksum += _mm512_reduce_add_ps(sums[i]);
    }
    double seconds = omp_get_wtime() - started;
    if (checksum == 42.0f) printf("\n");
    return (double)ROUNDS * SUMS * omp_get_max_threads() / seconds;
}

int main(void) {
    printf("threads %d\n", omp_get_max_threads());
    printf("vpdpbusd %.4g per second\n", int8_round());
    printf("vdpbf16ps %.4g per second\n", bf16_round());
    return 0;
}
