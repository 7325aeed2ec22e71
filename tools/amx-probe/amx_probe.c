/* amx_probe.c: the costs the AMX kernels' cycle account is built from
 * (docs/design.md, "The matrix driver"), measured on this machine: a tile
 * product back to back and in a chain, tile loads from L1, L2 and L3, a
 * tile store, the forward's k-step (four products and their loads), loads
 * into tiles no product reads and a two-accumulator ping-pong schedule,
 * products beside AVX-512 work (the tile unit holds port 0), and the
 * hand-offs between tiles and vectors (S stored then read, P written then
 * tile-loaded). Each figure is
 * the best of 7 runs, in ns per operation and per thread, with N threads
 * running the same loop at once (N = 1 and N = the argument).
 *   usage: amx-probe [threads] [random]   (x86-64 with AMX-BF16; prints a table)
 * A measuring tool beside fmha-bench; nothing in the library uses it. */
#define _GNU_SOURCE
#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int amx_available(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !((d >> 24) & 1) || !((d >> 22) & 1)) return 0;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

/* palette 1, all eight tiles 16 rows x 64 bytes (the kernels' configuration),
 * one constant: ldtilecfg's intrinsic names only 8 bytes of its operand, so
 * stores filling a buffer could be dropped by the optimiser */
static const _Alignas(64) unsigned char tile_config[64] = {
    1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    64, 0, 64, 0, 64, 0, 64, 0, 64, 0, 64, 0, 64, 0, 64, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0,
};
static void configure(void) { _tile_loadconfig(tile_config); }

/* Buffers: 4 KiB (L1), 1 MiB (L2), 64 MiB (L3), walked a tile (1 KiB) at a time. */
enum { KIB = 1024 };
typedef struct {
    int kind;
    long iters;
    unsigned char *buf;
    size_t bytes;
    double ns; /* out: per operation */
} probe;

enum { PRODUCT, CHAIN, LOAD, STORE, KSTEP_L1, KSTEP_L2, PRODUCT_FMA, FMA_ONLY, LOAD_BESIDE, PINGPONG_L1, PINGPONG_L2, PRODUCT_FMA160, FMA160_ONLY, STORE_READ_SAME, STORE_READ_OTHER, VSTORE_TLOAD_SAME, VSTORE_TLOAD_OTHER, VSTORE_TLOAD_LATER, KINDS };
static const char *const names[KINDS] = {
    "tdpbf16ps, 4 accumulators (throughput)",
    "tdpbf16ps, 1 accumulator (latency)",
    "tileloadd",
    "tilestored",
    "k-step: 4 products + 4 loads (A, B in L1)",
    "k-step: 4 products + 2 loads in L1, 2 in L2",
    "4 products + 32 AVX-512 FMAs",
    "32 AVX-512 FMAs alone (8 chains)",
    "4 products + 4 loads into tiles none reads",
    "4 products, 2 accumulators, operands ping-pong",
    "the same, B from L2",
    "4 products + 160 AVX-512 FMAs (a softmax's share)",
    "160 AVX-512 FMAs alone",
    "tilestored, then AVX-512 loads of its 1 KiB",
    "tilestored, then AVX-512 loads of other 1 KiB",
    "16 AVX-512 stores, then tileloadd of them",
    "16 AVX-512 stores, then tileloadd of other 1 KiB",
    "16 AVX-512 stores, tileloadd of the 1 KiB before",
};

static void run_kind(probe *p) {
    configure();
    unsigned char *buf = p->buf;
    const size_t tiles = p->bytes / KIB;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, buf, 64);
    _tile_loadd(5, buf + KIB, 64);
    _tile_loadd(6, buf + 2 * KIB, 64);
    _tile_loadd(7, buf + 3 * KIB, 64);
    __m512 f0 = _mm512_set1_ps(1.0f), f1 = _mm512_set1_ps(2.0f), f2 = _mm512_set1_ps(3.0f), f3 = _mm512_set1_ps(4.0f);
    __m512 f4 = _mm512_set1_ps(5.0f), f5 = _mm512_set1_ps(6.0f), f6 = _mm512_set1_ps(7.0f), f7 = _mm512_set1_ps(8.0f);
    const __m512 mul = _mm512_set1_ps(0.999f), add = _mm512_set1_ps(1e-3f);
    double t0 = now_ns();
    long ops = 0;
    size_t at = 0;
    switch (p->kind) {
    case PRODUCT:
        for (long k = 0; k < p->iters; k++) {
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 5, 6);
            _tile_dpbf16ps(2, 4, 7);
            _tile_dpbf16ps(3, 5, 7);
        }
        ops = 4 * p->iters;
        break;
    case CHAIN:
        for (long k = 0; k < p->iters; k++) _tile_dpbf16ps(0, 4, 6);
        ops = p->iters;
        break;
    case LOAD:
        for (long k = 0; k < p->iters; k++) {
            _tile_loadd(4, buf + at * KIB, 64);
            at = at + 1 == tiles ? 0 : at + 1;
            _tile_loadd(5, buf + at * KIB, 64);
            at = at + 1 == tiles ? 0 : at + 1;
        }
        ops = 2 * p->iters;
        break;
    case STORE:
        for (long k = 0; k < p->iters; k++) {
            _tile_stored(0, buf + at * KIB, 64);
            at = at + 1 == tiles ? 0 : at + 1;
        }
        ops = p->iters;
        break;
    case KSTEP_L1:
    case KSTEP_L2: {
        /* A from the first 4 KiB, B from the buffer (L1 or L2); loads for
         * the next step right after the last product reading the tile */
        const int far = p->kind == KSTEP_L2;
        for (long k = 0; k < p->iters; k++) {
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 5, 6);
            _tile_loadd(6, far ? buf + at * KIB : buf + 2 * KIB, 64);
            at = at + 1 == tiles ? 0 : at + 1;
            _tile_dpbf16ps(2, 4, 7);
            _tile_loadd(4, buf, 64);
            _tile_dpbf16ps(3, 5, 7);
            _tile_loadd(5, buf + KIB, 64);
            _tile_loadd(7, far ? buf + at * KIB : buf + 3 * KIB, 64);
            at = at + 1 == tiles ? 0 : at + 1;
        }
        ops = p->iters;
        break;
    }
    case LOAD_BESIDE:
        /* products on tiles 0-3, loads into 4-7: do loads queue behind products they do not wait for? */
        for (long k = 0; k < p->iters; k++) {
            _tile_dpbf16ps(0, 2, 3);
            _tile_loadd(4, buf, 64);
            _tile_dpbf16ps(1, 2, 3);
            _tile_loadd(5, buf + KIB, 64);
            _tile_dpbf16ps(0, 2, 3);
            _tile_loadd(6, buf + 2 * KIB, 64);
            _tile_dpbf16ps(1, 2, 3);
            _tile_loadd(7, buf + 3 * KIB, 64);
        }
        ops = p->iters;
        break;
    case PINGPONG_L1:
    case PINGPONG_L2: {
        /* C in tiles 0, 1 (16 rows x 2 column tiles); A in 2 | 3 and B in
         * 4, 5 | 6, 7 by turns: each step's loads go to the tiles the step
         * does not read */
        const int far = p->kind == PINGPONG_L2;
        _tile_loadd(2, buf, 64);
        _tile_loadd(3, buf, 64);
        for (long k = 0; k < p->iters; k++) {
            _tile_dpbf16ps(0, 2, 4);
            _tile_loadd(3, buf + KIB, 64);
            _tile_dpbf16ps(1, 2, 5);
            _tile_loadd(6, far ? buf + at * KIB : buf + 2 * KIB, 64);
            at = at + 1 == tiles ? 0 : at + 1;
            _tile_loadd(7, far ? buf + at * KIB : buf + 3 * KIB, 64);
            at = at + 1 == tiles ? 0 : at + 1;
            _tile_dpbf16ps(0, 3, 6);
            _tile_loadd(2, buf, 64);
            _tile_dpbf16ps(1, 3, 7);
            _tile_loadd(4, far ? buf + at * KIB : buf + 2 * KIB, 64);
            at = at + 1 == tiles ? 0 : at + 1;
            _tile_loadd(5, far ? buf + at * KIB : buf + 3 * KIB, 64);
            at = at + 1 == tiles ? 0 : at + 1;
        }
        ops = p->iters;
        break;
    }
    case STORE_READ_SAME:
    case STORE_READ_OTHER: {
        /* the scores' hand-off: a tile stored, its rows read by the softmax */
        const size_t other = p->kind == STORE_READ_OTHER ? 2 * KIB : 0;
        for (long k = 0; k < p->iters; k++) {
            _tile_stored(0, buf, 64);
            for (int r = 0; r < 16; r += 4) { /* four chains: the adds must not set the pace */
                f0 = _mm512_add_ps(f0, _mm512_load_ps(buf + other + 64 * r));
                f1 = _mm512_add_ps(f1, _mm512_load_ps(buf + other + 64 * r + 64));
                f2 = _mm512_add_ps(f2, _mm512_load_ps(buf + other + 64 * r + 128));
                f3 = _mm512_add_ps(f3, _mm512_load_ps(buf + other + 64 * r + 192));
            }
        }
        ops = p->iters;
        break;
    }
    case VSTORE_TLOAD_LATER:
        /* P's case: the tile loaded was written a step earlier (16 stores ago) */
        for (long k = 0; k < p->iters; k++) {
            unsigned char *w = buf + (size_t)(k & 1) * 2 * KIB, *r = buf + (size_t)(~k & 1) * 2 * KIB;
            for (int i = 0; i < 16; i++) _mm512_store_ps(w + 64 * i, f0);
            f0 = _mm512_add_ps(f0, add);
            _tile_loadd(4, r, 64);
            _tile_dpbf16ps(0, 4, 6);
        }
        ops = p->iters;
        break;
    case VSTORE_TLOAD_SAME:
    case VSTORE_TLOAD_OTHER: {
        /* P's hand-off: rows written by the softmax, loaded as a tile */
        const size_t other = p->kind == VSTORE_TLOAD_OTHER ? 2 * KIB : 0;
        for (long k = 0; k < p->iters; k++) {
            for (int r = 0; r < 16; r++) _mm512_store_ps(buf + 64 * r, f0);
            f0 = _mm512_add_ps(f0, add);
            _tile_loadd(4, buf + other, 64);
            _tile_dpbf16ps(0, 4, 6);
        }
        ops = p->iters;
        break;
    }
    case PRODUCT_FMA:
    case FMA_ONLY:
    case PRODUCT_FMA160:
    case FMA160_ONLY: {
        /* the softmax's vector work per four products of a 32 x 128 block
         * is about 160 AVX-512 operations (2560 for 64 products) */
        const int rounds = p->kind == PRODUCT_FMA160 || p->kind == FMA160_ONLY ? 20 : 4;
        for (long k = 0; k < p->iters; k++) {
            if (p->kind == PRODUCT_FMA || p->kind == PRODUCT_FMA160) {
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 5, 6);
                _tile_dpbf16ps(2, 4, 7);
                _tile_dpbf16ps(3, 5, 7);
            }
            for (int r = 0; r < rounds; r++) { /* named registers: an array of them goes through the stack */
                f0 = _mm512_fmadd_ps(f0, mul, add);
                f1 = _mm512_fmadd_ps(f1, mul, add);
                f2 = _mm512_fmadd_ps(f2, mul, add);
                f3 = _mm512_fmadd_ps(f3, mul, add);
                f4 = _mm512_fmadd_ps(f4, mul, add);
                f5 = _mm512_fmadd_ps(f5, mul, add);
                f6 = _mm512_fmadd_ps(f6, mul, add);
                f7 = _mm512_fmadd_ps(f7, mul, add);
            }
        }
        ops = p->iters;
        break;
    }
    }
    p->ns = (now_ns() - t0) / (double)ops;
    _Alignas(64) float out[256];
    _tile_stored(0, out, 64);
    _tile_release();
    float sink = out[5];
    sink += _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(f0, f1), _mm512_add_ps(f2, f3)),
                                               _mm512_add_ps(_mm512_add_ps(f4, f5), _mm512_add_ps(f6, f7))));
    if (sink == 1.2345f) putchar('!');
}

static void *thread_main(void *arg) {
    probe *p = arg;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) p->ns = -1;
    else run_kind(p);
    return NULL;
}

/* Operands: the bytes 0x3c (bf16 0.0115, as ../shared/tools/peak feeds
 * the unit) or, with `random`, values in [-2, 2): the unit's rate depends
 * on the data. */
static int random_data;

/* ns per operation of `kind` with n threads at once (the best of 7 runs; the slowest thread's). */
static double measure(int kind, size_t bytes, int n) {
    pthread_t th[64];
    probe pr[64];
    unsigned char *bufs[64];
    for (int t = 0; t < n; t++) {
        bufs[t] = aligned_alloc(64, bytes);
        if (random_data) { /* bf16 of uniform values in [-2, 2): attention's kind of operand */
            unsigned x = 12345u + (unsigned)t;
            for (size_t i = 0; i + 1 < bytes; i += 2) {
                x = x * 1664525u + 1013904223u;
                float f = ((float)(x >> 8) / 16777216.0f) * 4.0f - 2.0f;
                unsigned w;
                memcpy(&w, &f, 4);
                bufs[t][i] = (unsigned char)(w >> 16);
                bufs[t][i + 1] = (unsigned char)(w >> 24);
            }
        } else {
            memset(bufs[t], 0x3c, bytes);
        }
    }
    const long iters = kind == LOAD || kind == STORE ? (long)(8 * bytes / KIB) + 20000 : 200000;
    double best = 1e30;
    for (int rep = 0; rep < 7; rep++) {
        for (int t = 0; t < n; t++) {
            pr[t] = (probe){kind, iters, bufs[t], bytes, 0};
            pthread_create(&th[t], NULL, thread_main, &pr[t]);
        }
        double worst = 0;
        for (int t = 0; t < n; t++) {
            pthread_join(th[t], NULL);
            if (pr[t].ns > worst) worst = pr[t].ns;
        }
        if (worst < best) best = worst;
    }
    for (int t = 0; t < n; t++) free(bufs[t]);
    return best;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    if (threads < 1 || threads > 64) threads = 2;
    random_data = argc > 2 && strcmp(argv[2], "random") == 0;
    if (!amx_available()) {
        printf("amx-probe: no AMX-BF16 here (or the OS refuses the tile data)\n");
        return 0;
    }
    struct {
        int kind;
        size_t bytes;
        const char *where;
    } rows[] = {
        {PRODUCT, 4 * KIB, ""},        {CHAIN, 4 * KIB, ""},          {LOAD, 4 * KIB, "L1"},
        {LOAD, 1024 * KIB, "L2"},      {LOAD, 65536 * KIB, "L3"},     {STORE, 4 * KIB, "L1"},
        {STORE, 1024 * KIB, "L2"},     {KSTEP_L1, 4 * KIB, ""},       {KSTEP_L2, 1024 * KIB, ""},
        {PRODUCT_FMA, 4 * KIB, ""},    {FMA_ONLY, 4 * KIB, ""},       {LOAD_BESIDE, 4 * KIB, ""},
        {PINGPONG_L1, 4 * KIB, ""},    {PINGPONG_L2, 1024 * KIB, ""}, {PRODUCT_FMA160, 4 * KIB, ""},
        {FMA160_ONLY, 4 * KIB, ""},    {STORE_READ_SAME, 4 * KIB, ""}, {STORE_READ_OTHER, 4 * KIB, ""},
        {VSTORE_TLOAD_SAME, 4 * KIB, ""}, {VSTORE_TLOAD_OTHER, 4 * KIB, ""}, {VSTORE_TLOAD_LATER, 4 * KIB, ""},
    };
    printf("%-48s %-4s %12s %12s\n", "operation", "from", "ns, 1 thread", "ns, threads");
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
        printf("%-48s %-4s %12.2f %12.2f\n", names[rows[r].kind], rows[r].where, measure(rows[r].kind, rows[r].bytes, 1),
               measure(rows[r].kind, rows[r].bytes, threads));
    printf("(threads = %d; per thread, the slowest thread of the best of 7 runs; operands %s)\n", threads,
           random_data ? "random in [-2, 2)" : "bytes 0x3c");
    return 0;
}
