/* What one core's AMX unit does here, apart from Tandem's kernel (issue 21): TDPBSUD's
 * throughput with one, two and four independent sums tiles, and how fast tile loads stream
 * 16 MB from beyond L2, as contiguous 1 KB tiles and as the kernel reads a row-major weight
 * (16 rows 576 bytes apart, 64 bytes of each). Why: to tell whether the kernel's 8-token
 * products wait on the tile unit or on the memory (docs/BENCHMARKS.md).
 *
 *   gcc -O2 -mamx-tile -mamx-int8 docs/bench/amx_peak.c -o /tmp/amx_peak && /tmp/amx_peak
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
} TileConfig;

static const TileConfig TILES = {.palette = 1, .bytes_per_row = {64, 64, 64, 64, 64, 64}, .rows = {16, 16, 16, 16, 16, 16}};
static uint8_t buffer[1 << 24] __attribute__((aligned(64)));

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

__attribute__((target("amx-tile,amx-int8"))) int main(void) {
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) != 0) {
        puts("this CPU or kernel grants no AMX tiles");
        return 1;
    }
    _tile_loadconfig(&TILES);
    memset(buffer, 1, sizeof buffer);
    const long calls = 2000000;
    _tile_loadd(0, buffer, 64);
    _tile_loadd(1, buffer + 1024, 64);
    _tile_zero(2);
    _tile_zero(3);
    _tile_zero(4);
    _tile_zero(5);
    double started = now();
    for (long i = 0; i < calls; i++) _tile_dpbsud(2, 0, 1);
    double one = (now() - started) / calls;
    started = now();
    for (long i = 0; i < calls; i++) {
        _tile_dpbsud(2, 0, 1);
        _tile_dpbsud(3, 0, 1);
    }
    double two = (now() - started) / calls / 2;
    started = now();
    for (long i = 0; i < calls; i++) {
        _tile_dpbsud(2, 0, 1);
        _tile_dpbsud(3, 0, 1);
        _tile_dpbsud(4, 0, 1);
        _tile_dpbsud(5, 0, 1);
    }
    double four = (now() - started) / calls / 4;
    printf("TDPBSUD, ns each: one sums tile %.2f, two %.2f, four %.2f\n", one * 1e9, two * 1e9, four * 1e9);
    for (int pass = 0; pass < 3; pass++) { /* the first pass also brings the buffer from memory */
        started = now();
        for (long at = 0; at + 1024 <= (long)sizeof buffer; at += 1024) _tile_loadd(0, buffer + at, 64);
        double contiguous = now() - started;
        started = now();
        for (long block = 0; block + 9216 <= (long)sizeof buffer; block += 9216)
            for (int chunk = 0; chunk < 9; chunk++) _tile_loadd(0, buffer + block + chunk * 64, 576);
        double row_major = now() - started;
        printf("pass %d, 16 MB by tile loads: contiguous %.1f GB/s, row-major blocks %.1f GB/s\n", pass,
               sizeof buffer / contiguous * 1e-9, sizeof buffer / row_major * 1e-9);
    }
    int32_t sums[256];
    _tile_stored(2, sums, 64);
    _tile_release();
    return sums[0] == 42; /* keeps the products */
}
