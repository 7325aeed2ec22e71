/* cpu.c: the ISA registry and the choice of microkernel table. Each ISA's
 * check reads cpuid (and XCR0 for the OS's register state); the checks run
 * once (pthread_once), then the first supported ISA of the registry is the
 * table in use unless FMHA_ISA names another supported one. */
#include "cpu.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if FMHA_HAVE_X86
#include <cpuid.h>

static unsigned long long cpu_xgetbv0(void) {
    unsigned int lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

/* AVX2 + FMA, and the OS saves the ymm state. */
static int cpu_has_avx2(void) {
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    int osxsave = (c >> 27) & 1, fma = (c >> 12) & 1, avx = (c >> 28) & 1;
    if (!osxsave || !fma || !avx || (cpu_xgetbv0() & 0x6) != 0x6) return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return (b >> 5) & 1;
}

/* AVX2 plus AVX-512 F, DQ, BW, VL, and the OS saves the zmm state. */
static int cpu_has_avx512(void) {
    unsigned int a, b, c, d;
    if (!cpu_has_avx2() || (cpu_xgetbv0() & 0xE6) != 0xE6) return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    int avx512f = (b >> 16) & 1, avx512dq = (b >> 17) & 1;
    int avx512bw = (b >> 30) & 1, avx512vl = (b >> 31) & 1;
    return avx512f && avx512dq && avx512bw && avx512vl;
}

/* AVX-512 as above plus AVX512_BF16 (cpuid leaf 7, subleaf 1). */
static int cpu_has_avx512bf16(void) {
    unsigned int a, b, c, d;
    if (!cpu_has_avx512() || !__get_cpuid_count(7, 1, &a, &b, &c, &d)) return 0;
    return (a >> 5) & 1;
}
#endif

static int cpu_always(void) { return 1; }

static const fmha_isa cpu_registry[] = {
#if FMHA_HAVE_X86
    {"avx512bf16", cpu_has_avx512bf16, &fmha_ukernels_avx512bf16},
    {"avx512", cpu_has_avx512, &fmha_ukernels_avx512},
    {"avx2", cpu_has_avx2, &fmha_ukernels_avx2},
#endif
    {"scalar", cpu_always, &fmha_ukernels_scalar},
};
enum { CPU_N_ISA = sizeof cpu_registry / sizeof cpu_registry[0] };

static int cpu_supported[CPU_N_ISA];
static const fmha_ukernels *cpu_selected;
static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

/* The registry entry for a name that this CPU supports, or NULL (once the
 * checks have run; called inside cpu_detect too, so it must not wait on
 * cpu_once). */
static const fmha_isa *cpu_supported_named(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < CPU_N_ISA; i++)
        if (!strcmp(cpu_registry[i].name, name)) return cpu_supported[i] ? &cpu_registry[i] : NULL;
    return NULL;
}

static void cpu_detect(void) {
    cpu_selected = NULL;
    for (size_t i = 0; i < CPU_N_ISA; i++) {
        cpu_supported[i] = cpu_registry[i].detect() != 0;
        if (cpu_supported[i] && !cpu_selected) cpu_selected = cpu_registry[i].table;
    }
    /* An unknown or unsupported FMHA_ISA leaves the best supported table. */
    const fmha_isa *forced = cpu_supported_named(getenv("FMHA_ISA"));
    if (forced) cpu_selected = forced->table;
}

size_t fmha_isa_count(void) { return CPU_N_ISA; }

const fmha_isa *fmha_isa_at(size_t i) { return i < CPU_N_ISA ? &cpu_registry[i] : NULL; }

int fmha_isa_supported(const fmha_isa *isa) {
    pthread_once(&cpu_once, cpu_detect);
    for (size_t i = 0; i < CPU_N_ISA; i++)
        if (isa == &cpu_registry[i]) return cpu_supported[i];
    return 0;
}

const fmha_ukernels *fmha_cpu_kernels(void) {
    pthread_once(&cpu_once, cpu_detect);
    return cpu_selected;
}

const fmha_ukernels *fmha_cpu_kernels_for(const char *isa) {
    pthread_once(&cpu_once, cpu_detect);
    const fmha_isa *entry = cpu_supported_named(isa);
    return entry ? entry->table : NULL;
}

int fmha_cpu_force_isa(const char *isa) {
    const fmha_ukernels *t = fmha_cpu_kernels_for(isa);
    if (!t) return -1;
    cpu_selected = t;
    return 0;
}
