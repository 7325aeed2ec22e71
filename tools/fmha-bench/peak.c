/* peak.c: this machine's arithmetic ceiling, measured by fmha-bench so that
 * every record carries the peak its GFLOP/s are judged against: float32
 * (AVX-512 or AVX2 FMA, by what the CPU has) and bf16 (vdpbf16ps) dot
 * products, on as many threads as the library uses, best of a few short
 * runs. One FMA counts as 2 flops per lane, one vdpbf16ps as 4. With
 * --peaks it also measures memory read bandwidth, the ceiling of decoding's
 * K/V GB/s. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define PEAK_X86 1
#endif

#define PEAK_ACC 16 /* independent accumulators: hides FMA latency */
#define PEAK_ITERS 2000000L

static double peak_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#ifdef PEAK_X86
__attribute__((target("avx512f"))) static float peak_fma512(long iters) {
    __m512 a[PEAK_ACC], b = _mm512_set1_ps(0.999f), c = _mm512_set1_ps(1e-3f);
    for (int i = 0; i < PEAK_ACC; i++) a[i] = _mm512_set1_ps((float)i);
    for (long k = 0; k < iters; k++)
#pragma GCC unroll 16
        for (int i = 0; i < PEAK_ACC; i++) a[i] = _mm512_fmadd_ps(a[i], b, c);
    float s = 0;
    for (int i = 0; i < PEAK_ACC; i++) s += _mm512_reduce_add_ps(a[i]);
    return s;
}

__attribute__((target("avx2,fma"))) static float peak_fma256(long iters) {
    __m256 a[PEAK_ACC], b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(1e-3f);
    for (int i = 0; i < PEAK_ACC; i++) a[i] = _mm256_set1_ps((float)i);
    for (long k = 0; k < iters; k++)
#pragma GCC unroll 16
        for (int i = 0; i < PEAK_ACC; i++) a[i] = _mm256_fmadd_ps(a[i], b, c);
    float out[8], s = 0;
    for (int i = 0; i < PEAK_ACC; i++) {
        _mm256_storeu_ps(out, a[i]);
        for (int j = 0; j < 8; j++) s += out[j];
    }
    return s;
}

__attribute__((target("avx512f,avx512bf16"))) static float peak_dpbf16(long iters) {
    __m512 a[PEAK_ACC];
    __m512bh b = (__m512bh)_mm512_set1_epi16(0x3f80);
    for (int i = 0; i < PEAK_ACC; i++) a[i] = _mm512_set1_ps((float)i);
    for (long k = 0; k < iters; k++)
#pragma GCC unroll 16
        for (int i = 0; i < PEAK_ACC; i++) a[i] = _mm512_dpbf16_ps(a[i], b, b);
    float s = 0;
    for (int i = 0; i < PEAK_ACC; i++) s += _mm512_reduce_add_ps(a[i]);
    return s;
}
#endif

typedef struct peak_job {
    int kind; /* 0 avx512 fma, 1 avx2 fma, 2 bf16 */
    volatile float sink;
} peak_job;

static void *peak_thread(void *arg) {
    peak_job *job = arg;
#ifdef PEAK_X86
    job->sink = job->kind == 0 ? peak_fma512(PEAK_ITERS)
                : job->kind == 1 ? peak_fma256(PEAK_ITERS)
                                 : peak_dpbf16(PEAK_ITERS);
#endif
    return NULL;
}

/* GFLOP/s of one kind on `threads` threads, best of 3. */
static double peak_run(int kind, int threads) {
    enum { MAX_THREADS = 256 };
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    double flops_per_iter = kind == 0 ? 32.0 : kind == 1 ? 16.0 : 64.0;
    double best = 0.0;
    for (int rep = 0; rep < 3; rep++) {
        pthread_t th[MAX_THREADS];
        peak_job jobs[MAX_THREADS];
        double t0 = peak_now();
        int started = 0;
        for (int i = 0; i < threads; i++) {
            jobs[i].kind = kind;
            if (pthread_create(&th[i], NULL, peak_thread, &jobs[i]) == 0) started++;
            else break;
        }
        for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
        double dt = peak_now() - t0;
        double g = started * (double)PEAK_ITERS * PEAK_ACC * flops_per_iter / dt / 1e9;
        if (g > best) best = g;
    }
    return best;
}

void bench_peak_gflops(int threads, double *f32, double *bf16) {
    *f32 = *bf16 = 0.0;
#ifdef PEAK_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) *f32 = peak_run(0, threads);
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) *f32 = peak_run(1, threads);
    if (__builtin_cpu_supports("avx512bf16")) *bf16 = peak_run(2, threads);
#else
    (void)threads;
#endif
}

/* ---- memory read bandwidth ---- */

#define MEM_BYTES ((size_t)512 << 20) /* well past any last-level cache */

typedef struct mem_job {
    const uint64_t *words;
    size_t n;
    volatile uint64_t sink;
} mem_job;

/* Sums n words with 8 independent chains: loads, not additions, bound it. */
static void *mem_thread(void *arg) {
    mem_job *job = arg;
    uint64_t acc[8] = {0};
    for (size_t i = 0; i + 8 <= job->n; i += 8)
        for (int j = 0; j < 8; j++) acc[j] += job->words[i + (size_t)j];
    job->sink = acc[0] ^ acc[1] ^ acc[2] ^ acc[3] ^ acc[4] ^ acc[5] ^ acc[6] ^ acc[7];
    return NULL;
}

double bench_peak_mem_read_gbs(int threads) {
    enum { MAX_THREADS = 256 };
    if (threads < 1) threads = 1;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    uint64_t *words = malloc(MEM_BYTES);
    if (!words) return 0.0;
    memset(words, 1, MEM_BYTES); /* touch every page before timing */
    size_t per = MEM_BYTES / sizeof(uint64_t) / (size_t)threads / 8 * 8;
    double best = 0.0;
    for (int rep = 0; rep < 3; rep++) {
        pthread_t th[MAX_THREADS];
        mem_job jobs[MAX_THREADS];
        int started = 0;
        double t0 = peak_now();
        for (int i = 0; i < threads; i++) {
            jobs[i].words = words + (size_t)i * per;
            jobs[i].n = per;
            if (pthread_create(&th[i], NULL, mem_thread, &jobs[i]) == 0) started++;
            else break;
        }
        for (int i = 0; i < started; i++) pthread_join(th[i], NULL);
        double dt = peak_now() - t0;
        double gbs = (double)started * (double)per * sizeof(uint64_t) / dt / 1e9;
        if (gbs > best) best = gbs;
    }
    free(words);
    return best;
}
