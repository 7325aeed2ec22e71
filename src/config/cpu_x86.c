/* cpu_x86.c: the x86-64 ISAs and their checks. Each check reads cpuid and
 * XCR0 (the register state the OS saves); AMX also needs Linux's
 * permission for the tile data (arch_prctl ARCH_REQ_XCOMP_PERM, kernel >=
 * 5.16), asked once. The CPU's vendor, family and model name it for
 * fmha_plan_describe (and for tunings per microarchitecture). */
#include "config/cpu.h"

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

/* AVX2 plus AVX-VNNI (cpuid leaf 7, subleaf 1: eax bit 4). */
static int x86_has_avx2vnni(void) {
    unsigned int r[4];
    if (!x86_has_avx2()) return 0;
    x86_leaf7(1, r);
    return (r[0] >> 4) & 1;
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

/* AVX-512 as above plus AVX512-VNNI (cpuid leaf 7: ecx bit 11). */
static int x86_has_avx512vnni(void) {
    unsigned int r[4];
    if (!x86_has_avx512()) return 0;
    x86_leaf7(0, r);
    return (r[2] >> 11) & 1;
}

/* AVX-512 and AVX512-VNNI as above plus AVX512_BF16 (cpuid leaf 7,
 * subleaf 1) and AVX512-VBMI (leaf 7: ecx bit 1; the float8 kernels' byte
 * lookups): every CPU with BF16 has VNNI, whose cache parts the table
 * shares; Zen 4, Zen 5 and Sapphire Rapids on have VBMI, Cooper Lake
 * (BF16 without VBMI) runs the avx512vnni table. */
static int x86_has_avx512bf16(void) {
    unsigned int r[4];
    if (!x86_has_avx512vnni()) return 0;
    x86_leaf7(0, r);
    if (!((r[2] >> 1) & 1)) return 0;
    x86_leaf7(1, r);
    return (r[0] >> 5) & 1;
}

/* AMX-TILE, AMX-BF16 and AMX-INT8 in cpuid (the table's decode takes
 * integer scores on tiles; every AMX part so far has all three), the tile
 * state (XCR0 bits 17, 18) enabled, and on Linux the permission to use the
 * tile data: asked for with ARCH_REQ_XCOMP_PERM and confirmed with
 * ARCH_GET_XCOMP_PERM. A refusal answers 0 (the tables without tiles run),
 * never a fault. */
static int x86_has_amx_bf16(void) {
    unsigned int r[4];
    if (!x86_has_avx512bf16()) return 0;
    x86_leaf7(0, r);
    int tile = (r[3] >> 24) & 1, bf16 = (r[3] >> 22) & 1, int8 = (r[3] >> 25) & 1;
    if (!tile || !bf16 || !int8 || (x86_xgetbv0() & 0x60000) != 0x60000) return 0;
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

/* amx_emu's table is in the test builds alone (src/uk/amx_emu/CMakeLists.txt):
 * a weak reference, NULL in the shipped libraries, where cpu.c skips it. */
extern const fmha_isa_parts fmha_isa_amx_emu __attribute__((weak, visibility("hidden")));

static const fmha_arch_isa x86_isas[] = {
#if FMHA_HAVE_AMX
    {"amx", x86_has_amx_bf16, &fmha_isa_amx, 0},
#endif
    {"avx512bf16", x86_has_avx512bf16, &fmha_isa_avx512bf16, 0},
    {"avx512vnni", x86_has_avx512vnni, &fmha_isa_avx512vnni, 0},
    {"avx512", x86_has_avx512, &fmha_isa_avx512, 0},
#if FMHA_HAVE_AVX2VNNI
    {"avx2vnni", x86_has_avx2vnni, &fmha_isa_avx2vnni, 0},
#endif
    {"avx2", x86_has_avx2, &fmha_isa_avx2, 0},
    /* amx's kernels on the software tile unit: test builds, FMHA_ISA only */
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

/* Cache sizes from cpuid's deterministic cache parameters: leaf 4 (Intel),
 * leaf 0x8000001D (AMD's topology extensions), else AMD's 0x80000005 and
 * 0x80000006. */
void fmha_arch_cache_sizes(fmha_cache_sizes *c) {
    unsigned a = 0, b = 0, cx = 0, d = 0;
    c->l1d = c->l2 = 0;
    unsigned leaf = 0;
    if (__get_cpuid_max(0, NULL) >= 4) leaf = 4;
    if (__get_cpuid(0x80000001, &a, &b, &cx, &d) && (cx >> 22 & 1) && __get_cpuid_max(0x80000000, NULL) >= 0x8000001D)
        leaf = 0x8000001D;
    for (unsigned sub = 0; leaf && sub < 16; sub++) {
        __cpuid_count(leaf, sub, a, b, cx, d);
        const unsigned type = a & 0x1F, level = a >> 5 & 7;
        if (!type) break;
        const int64_t bytes = (int64_t)((b >> 22) + 1) * ((b >> 12 & 0x3FF) + 1) * ((b & 0xFFF) + 1) * ((int64_t)cx + 1);
        if (level == 1 && type == 1) c->l1d = bytes;
        if (level == 2 && (type == 3 || type == 1)) c->l2 = bytes;
    }
    if (!c->l1d && __get_cpuid_max(0x80000000, NULL) >= 0x80000006) {
        __get_cpuid(0x80000005, &a, &b, &cx, &d);
        c->l1d = (int64_t)(cx >> 24) << 10;
        __get_cpuid(0x80000006, &a, &b, &cx, &d);
        c->l2 = (int64_t)(cx >> 16) << 10;
    }
}

/* Tunings per microarchitecture, each measured with fmha-bench on the CPU
 * it names (design.md, "Tunings"), as {isa, vendor, family, models lo..hi,
 * name, fields over the defaults}; a CPU without one gets wisdom's or the
 * heuristic's.
 *   zen4: AuthenticAMD family 25 model 17 (EPYC): keys per tile of 64..256
 *         and the dense crossover measured within noise of generic, K read
 *         in place at 82-89% of the FMA peak: the generic values, but for
 *         decode's chunks of 16 rows or more (fmha-bench --tune, 2
 *         threads: 1024 keys 0.91x the time of 256 on a 4-position step).
 *   xeon-6-167: GenuineIntel family 6 model 167 as a KVM guest reports a
 *         Xeon with AMX (48 KiB L1D, 2 MiB L2): fmha-bench --tune, the
 *         measurements in design.md.
 *   xeon-6-207: GenuineIntel family 6 model 207 as a KVM guest reports a
 *         Xeon with AMX (48 KiB L1D, 2 MiB L2): fmha-bench --tune on the
 *         amx table, 2 threads, and K's copy from 256 KiB a head and
 *         decode's split at 1024 keys chosen by alternating runs
 *         (design.md); the same entry for the tables beneath amx on
 *         this CPU (FMHA_ISA), as for model 167. */
#define ZEN4 "zen4", "decode_split_keys_16rows=1024"
#define XEON_6_167 "xeon-6-167", "k_copy_bytes=262144,matrix_block_kv=256"
#define XEON_6_207                                                                                                     \
    "xeon-6-207", "k_copy_bytes=262144,decode_prefetch_f32_bytes=1125899906842624,decode_prefetch_h16_bytes=50331648,"  \
                  "decode_split_keys=1024,matrix_block_kv=256,matrix_overlap=0"
static const fmha_arch_tuning x86_tunings[] = {
    {"avx512bf16", "AuthenticAMD", 25, 17, 17, ZEN4},
    {"avx512", "AuthenticAMD", 25, 17, 17, ZEN4},
    {"avx2", "AuthenticAMD", 25, 17, 17, ZEN4},
    {"amx", "GenuineIntel", 6, 167, 167, XEON_6_167},
    {"avx512bf16", "GenuineIntel", 6, 167, 167, XEON_6_167},
    {"avx512", "GenuineIntel", 6, 167, 167, XEON_6_167},
    {"avx2", "GenuineIntel", 6, 167, 167, XEON_6_167},
    {"amx", "GenuineIntel", 6, 207, 207, XEON_6_207},
    {"avx512bf16", "GenuineIntel", 6, 207, 207, XEON_6_207},
    {"avx512", "GenuineIntel", 6, 207, 207, XEON_6_207},
    {"avx2", "GenuineIntel", 6, 207, 207, XEON_6_207},
};
#undef ZEN4
#undef XEON_6_167
#undef XEON_6_207

const fmha_arch_tuning *fmha_arch_tunings(size_t *n) {
    *n = sizeof x86_tunings / sizeof x86_tunings[0];
    return x86_tunings;
}

void fmha_arch_describe(char *buf, size_t n) {
    char vendor[16];
    unsigned family, model;
    fmha_arch_cpu_id(vendor, sizeof vendor, &family, &model);
    /* AMX-FP16 (leaf 7 subleaf 1, eax bit 21) has no kernels yet: named so
     * that a run says what it left unused */
    unsigned int r1[4];
    x86_leaf7(1, r1);
    const int amx = x86_has_amx_bf16();
    snprintf(buf, n,
             "%s family %u model %u: avx2 %s, avx-vnni %s, avx512 %s, avx512vnni %s, avx512bf16 %s, amx-bf16 %s, "
             "amx-int8 %s, amx-fp16 %s",
             vendor, family, model, x86_has_avx2() ? "yes" : "no", x86_has_avx2vnni() ? "yes" : "no",
             x86_has_avx512() ? "yes" : "no", x86_has_avx512vnni() ? "yes" : "no",
             x86_has_avx512bf16() ? "yes" : "no", amx ? "yes" : "no", amx ? "yes" : "no",
             amx && (r1[0] >> 21 & 1) ? "yes" : "no");
}
#endif
