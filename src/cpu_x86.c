/* cpu_x86.c: the x86-64 ISAs and their checks. Each check reads cpuid and
 * XCR0 (the register state the OS saves); AMX also needs Linux's
 * permission for the tile data (arch_prctl ARCH_REQ_XCOMP_PERM, kernel >=
 * 5.16), asked once. The CPU's vendor, family and model name it for
 * fmha_plan_describe (and for tunings per microarchitecture). */
#include "cpu.h"
#include "tuning.h"

#if FMHA_HAVE_X86
#include <cpuid.h>
#include <stdio.h>
#include <string.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

static unsigned long long x86_xgetbv0(void) {
    unsigned int lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((unsigned long long)hi << 32) | lo;
}

/* cpuid leaf 7's registers for a subleaf (zeros when the leaf is absent). */
static void x86_leaf7(unsigned sub, unsigned r[4]) {
    r[0] = r[1] = r[2] = r[3] = 0;
    if (__get_cpuid_max(0, NULL) >= 7) __get_cpuid_count(7, sub, &r[0], &r[1], &r[2], &r[3]);
}

/* AVX2 + FMA, and the OS saves the ymm state. */
static int x86_has_avx2(void) {
    unsigned int a, b, c, d, r[4];
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    int osxsave = (c >> 27) & 1, fma = (c >> 12) & 1, avx = (c >> 28) & 1;
    if (!osxsave || !fma || !avx || (x86_xgetbv0() & 0x6) != 0x6) return 0;
    x86_leaf7(0, r);
    return (r[1] >> 5) & 1;
}

/* AVX2 plus AVX-512 F, DQ, BW, VL, and the OS saves the zmm state. */
static int x86_has_avx512(void) {
    unsigned int r[4];
    if (!x86_has_avx2() || (x86_xgetbv0() & 0xE6) != 0xE6) return 0;
    x86_leaf7(0, r);
    int avx512f = (r[1] >> 16) & 1, avx512dq = (r[1] >> 17) & 1;
    int avx512bw = (r[1] >> 30) & 1, avx512vl = (r[1] >> 31) & 1;
    return avx512f && avx512dq && avx512bw && avx512vl;
}

/* AVX-512 as above plus AVX512_BF16 (cpuid leaf 7, subleaf 1). */
static int x86_has_avx512bf16(void) {
    unsigned int r[4];
    if (!x86_has_avx512()) return 0;
    x86_leaf7(1, r);
    return (r[0] >> 5) & 1;
}

/* AMX-TILE and AMX-BF16 in cpuid, the tile state (XCR0 bits 17, 18)
 * enabled, and on Linux the permission to use the tile data: asked for
 * with ARCH_REQ_XCOMP_PERM and confirmed with ARCH_GET_XCOMP_PERM. A
 * refusal answers 0 (the tables without tiles run), never a fault. */
static int x86_has_amx_bf16(void) {
    unsigned int r[4];
    if (!x86_has_avx512bf16()) return 0;
    x86_leaf7(0, r);
    int tile = (r[3] >> 24) & 1, bf16 = (r[3] >> 22) & 1;
    if (!tile || !bf16 || (x86_xgetbv0() & 0x60000) != 0x60000) return 0;
#if defined(__linux__) && defined(SYS_arch_prctl)
    enum { ARCH_GET_XCOMP_PERM = 0x1022, ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    unsigned long long perm = 0;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return 0;
    if (syscall(SYS_arch_prctl, ARCH_GET_XCOMP_PERM, &perm) != 0) return 0;
    return (perm >> XFEATURE_XTILEDATA) & 1;
#else
    return 0;
#endif
}

static const fmha_arch_isa x86_isas[] = {
#if FMHA_HAVE_AMX
    {"amx", x86_has_amx_bf16, &fmha_isa_amx, 0},
#endif
    {"avx512bf16", x86_has_avx512bf16, &fmha_isa_avx512bf16, 0},
    {"avx512", x86_has_avx512, &fmha_isa_avx512, 0},
    {"avx2", x86_has_avx2, &fmha_isa_avx2, 0},
    {"avx512_12x32", x86_has_avx512, &fmha_isa_avx512_12x32, 1},
    {"avx512_14x32", x86_has_avx512, &fmha_isa_avx512_14x32, 1},
    /* amx's kernels on the software tile unit: tests and FMHA_ISA only */
    {"amx_emu", x86_has_avx512bf16, &fmha_isa_amx_emu, 1},
};

size_t fmha_arch_isa_count(void) { return sizeof x86_isas / sizeof x86_isas[0]; }

const fmha_arch_isa *fmha_arch_isa_at(size_t i) { return i < fmha_arch_isa_count() ? &x86_isas[i] : NULL; }

void fmha_arch_cpu_id(char *vendor, size_t vendor_size, unsigned *family, unsigned *model) {
    unsigned int a = 0, b = 0, c = 0, d = 0;
    char v[13] = {0};
    __get_cpuid(0, &a, &b, &c, &d);
    memcpy(v, &b, 4);
    memcpy(v + 4, &d, 4);
    memcpy(v + 8, &c, 4);
    snprintf(vendor, vendor_size, "%s", v);
    *family = *model = 0;
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        *family = (a >> 8) & 0xF;
        *model = (a >> 4) & 0xF;
        if (*family == 0xF) *family += (a >> 20) & 0xFF;
        if (*family == 0x6 || *family >= 0xF) *model |= ((a >> 16) & 0xF) << 4;
    }
}

/* Tunings per microarchitecture, each measured with fmha-bench on the CPU
 * it names (design.md, "Tunings"), as {isa, vendor, family, models lo..hi,
 * {name, block_kv, dense_max_scores}}; every other CPU runs the generic
 * one. None yet: on Zen 4 (AuthenticAMD family 25 model 17) keys per tile
 * of 64..256 and the dense crossover measured within noise of the generic
 * values, and no Intel core has been measured. */
static const fmha_arch_tuning *const x86_tunings = NULL;
static const size_t x86_n_tunings = 0;

const fmha_arch_tuning *fmha_arch_tunings(size_t *n) {
    *n = x86_n_tunings;
    return x86_tunings;
}

void fmha_arch_describe(char *buf, size_t n) {
    char vendor[16];
    unsigned family, model;
    fmha_arch_cpu_id(vendor, sizeof vendor, &family, &model);
    snprintf(buf, n, "%s family %u model %u: avx2 %s, avx512 %s, avx512bf16 %s, amx-bf16 %s", vendor, family,
             model, x86_has_avx2() ? "yes" : "no", x86_has_avx512() ? "yes" : "no",
             x86_has_avx512bf16() ? "yes" : "no", x86_has_amx_bf16() ? "yes" : "no");
}
#endif
