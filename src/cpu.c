/* cpu.c: cpuid once (pthread_once), then the microkernel table to use.
 * AVX-512 needs F+BW+VL+DQ and OS support for the zmm state (XCR0); AVX2
 * needs AVX2+FMA and the ymm state; "avx512bf16" is the AVX-512 table plus
 * the bf16 pair kernels (AVX512_BF16). */
#include "cpu.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if FMHA_HAVE_X86
#include <cpuid.h>

#include "uk/avx512bf16/bf16.h"
#endif

static int cpu_avx2, cpu_avx512, cpu_avx512bf16;
/* The AVX-512 table plus the bf16 pair kernels, for CPUs with AVX512_BF16. */
static fmha_ukernels cpu_avx512bf16_table;
static const fmha_ukernels *cpu_selected;
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

#if FMHA_HAVE_X86
static unsigned long long cpu_xgetbv0(void) {
    unsigned int lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}
#endif

static const fmha_ukernels *cpu_table_named(const char *isa);

static void cpu_detect(void) {
#if FMHA_HAVE_X86
    unsigned int a, b, c, d;
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        int osxsave = (c >> 27) & 1, fma = (c >> 12) & 1, avx = (c >> 28) & 1;
        unsigned long long xcr0 = osxsave ? cpu_xgetbv0() : 0;
        int ymm_ok = (xcr0 & 0x6) == 0x6, zmm_ok = (xcr0 & 0xE6) == 0xE6;
        if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
            int avx2 = (b >> 5) & 1;
            int avx512f = (b >> 16) & 1, avx512dq = (b >> 17) & 1;
            int avx512bw = (b >> 30) & 1, avx512vl = (b >> 31) & 1;
            cpu_avx2 = avx && avx2 && fma && ymm_ok;
            cpu_avx512 = cpu_avx2 && avx512f && avx512dq && avx512bw && avx512vl && zmm_ok;
        }
        if (cpu_avx512 && __get_cpuid_count(7, 1, &a, &b, &c, &d)) cpu_avx512bf16 = (a >> 5) & 1;
    }
#endif
    cpu_selected = &fmha_ukernels_scalar;
#if FMHA_HAVE_X86
    cpu_avx512bf16_table = fmha_ukernels_avx512;
    cpu_avx512bf16_table.isa = "avx512bf16";
    cpu_avx512bf16_table.gemm_bf16 = fmha_bf16_gemm_ukernel_6x64__avx512bf16;
    cpu_avx512bf16_table.pair_rows_bf16 = fmha_bf16_pair_rows_ukernel_64__avx512bf16;
    cpu_avx512bf16_table.pair_rows_split_bf16 = fmha_bf16_pair_rows_split_ukernel_64__avx512bf16;
    if (cpu_avx512bf16) cpu_selected = &cpu_avx512bf16_table;
    else if (cpu_avx512) cpu_selected = &fmha_ukernels_avx512;
    else if (cpu_avx2) cpu_selected = &fmha_ukernels_avx2;
#endif
    const char *env = getenv("FMHA_ISA");
    if (env && *env) {
        const fmha_ukernels *forced = cpu_table_named(env);
        if (forced) cpu_selected = forced;
    }
}

const fmha_ukernels *fmha_cpu_kernels_for(const char *isa) {
    pthread_once(&cpu_once, cpu_detect);
    return cpu_table_named(isa);
}

/* The table for a name once detection has run (called inside cpu_detect too,
 * so it must not wait on cpu_once). */
static const fmha_ukernels *cpu_table_named(const char *isa) {
    if (!isa) return NULL;
    if (!strcmp(isa, "scalar")) return &fmha_ukernels_scalar;
#if FMHA_HAVE_X86
    if (!strcmp(isa, "avx2") && cpu_avx2) return &fmha_ukernels_avx2;
    if (!strcmp(isa, "avx512") && cpu_avx512) return &fmha_ukernels_avx512;
    if (!strcmp(isa, "avx512bf16") && cpu_avx512bf16) return &cpu_avx512bf16_table;
#endif
    return NULL;
}

const fmha_ukernels *fmha_cpu_kernels(void) {
    pthread_once(&cpu_once, cpu_detect);
    return cpu_selected;
}

int fmha_cpu_force_isa(const char *isa) {
    const fmha_ukernels *t = fmha_cpu_kernels_for(isa);
    if (!t) return -1;
    cpu_selected = t;
    return 0;
}
