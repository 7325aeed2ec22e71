/* cpu_arm.c: the aarch64 ISAs and their checks, read from the kernel's
 * hardware capability words (getauxval(AT_HWCAP), AT_HWCAP2), preferred
 * first: neonbf16 (Advanced SIMD plus FEAT_BF16: BFDOT, BFMMLA, BFCVTN),
 * sve (SVE at any vector length), neon (Advanced SIMD, Armv8.0). The
 * capabilities are also reported by fmha_plan_describe. */
#include "config/cpu.h"

#if defined(__aarch64__)
#include <stdio.h>
#include <string.h>
#if defined(__linux__)
#include <sys/auxv.h>
#include <sys/prctl.h>
#endif

/* AT_HWCAP: ASIMD bit 1, FPHP bit 9, ASIMDDP bit 20, SVE bit 22;
 * AT_HWCAP2: SVE2 bit 1, I8MM bit 13, BF16 bit 14, SME bit 23 */
enum { HWCAP_BIT_ASIMD = 1, HWCAP_BIT_FPHP = 9, HWCAP_BIT_ASIMDDP = 20, HWCAP_BIT_SVE = 22 };
enum { HWCAP2_BIT_SVE2 = 1, HWCAP2_BIT_I8MM = 13, HWCAP2_BIT_BF16 = 14, HWCAP2_BIT_SME = 23 };

/* The capability word AT_HWCAP (word 1) or AT_HWCAP2 (word 2); 0 off Linux. */
static unsigned long arm_hwcap(int word) {
#if defined(__linux__)
    return getauxval(word == 2 ? AT_HWCAP2 : AT_HWCAP);
#else
    (void)word;
    return 0;
#endif
}

/* Advanced SIMD; the kernels assume a little-endian CPU. */
static int arm_has_neon(void) {
#if defined(__AARCH64EB__)
    return 0;
#else
    return (int)(arm_hwcap(1) >> HWCAP_BIT_ASIMD & 1);
#endif
}

#if FMHA_HAVE_NEONDOT
/* Advanced SIMD and the dot product (HWCAP_ASIMDDP: SDOT and UDOT at EL0). */
static int arm_has_neondot(void) { return arm_has_neon() && (arm_hwcap(1) >> HWCAP_BIT_ASIMDDP & 1); }
#endif

#if FMHA_HAVE_NEONBF16
#if defined(__linux__) && !defined(HWCAP2_BF16)
#define HWCAP2_BF16 (1UL << HWCAP2_BIT_BF16) /* older kernel headers lack it */
#endif
/* Advanced SIMD, the dot product (whose integer scores the table has; every
 * BF16 core has it) and FEAT_BF16 (HWCAP2_BF16: the BF16 instructions at EL0). */
static int arm_has_neonbf16(void) {
#if defined(__linux__) && FMHA_HAVE_NEONDOT
    return arm_has_neondot() && (arm_hwcap(2) & HWCAP2_BF16) != 0;
#else
    return 0;
#endif
}
#endif

#if FMHA_HAVE_SVE
#include "uk/sve/sve.h"
/* SVE (HWCAP_SVE: the SVE instructions at EL0) with vectors of 128 to 512
 * bits, and Advanced SIMD for the neon parts the table shares. */
static int arm_has_sve(void) { return arm_has_neon() && (arm_hwcap(1) >> HWCAP_BIT_SVE & 1) && fmha_sve_usable(); }
#endif

/* Preference: neonbf16 before sve. Every shipping core with BF16 and SVE
 * (Neoverse V1: 2 x 256-bit SVE pipes; V2, N2, Graviton 4, Grace: 128-bit
 * SVE) has the same float32 FMA peak through its 4 (V1, V2) or 2 (N2)
 * 128-bit Advanced SIMD pipes, and neonbf16 adds BFMMLA for bf16. sve is
 * chosen where it is wider than NEON and BF16 is absent (A64FX: 512 bits),
 * and by FMHA_ISA=sve anywhere. */
static const fmha_arch_isa arm_isas[] = {
#if FMHA_HAVE_NEONBF16
    {"neonbf16", arm_has_neonbf16, &fmha_isa_neonbf16, 0},
#endif
#if FMHA_HAVE_SVE
    {"sve", arm_has_sve, &fmha_isa_sve, 0},
#endif
#if FMHA_HAVE_NEONDOT
    {"neondot", arm_has_neondot, &fmha_isa_neondot, 0},
#endif
    {"neon", arm_has_neon, &fmha_isa_neon, 0},
};

size_t fmha_arch_isa_count(void) { return sizeof arm_isas / sizeof arm_isas[0]; }

const fmha_arch_isa *fmha_arch_isa_at(size_t i) { return i < fmha_arch_isa_count() ? &arm_isas[i] : NULL; }

/* MIDR_EL1: from sysfs (Linux 4.7+), else by MRS, which Linux emulates
 * for EL0 where HWCAP_CPUID (bit 11) is set; 0 when neither answers. */
static unsigned long long arm_midr(void) {
    unsigned long long midr = 0;
#if defined(__linux__)
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/regs/identification/midr_el1", "r");
    if (f) {
        if (fscanf(f, "%llx", &midr) != 1) midr = 0;
        fclose(f);
    }
    if (!midr && (arm_hwcap(1) >> 11 & 1)) __asm__ volatile("mrs %0, midr_el1" : "=r"(midr));
#endif
    return midr;
}

/* The CPU's key from MIDR: the implementer's name (its code in hex when
 * unknown), the implementer code as the family and the part number as the
 * model (Neoverse N1: "ARM" family 65 model 3340 = 0xd0c). */
void fmha_arch_cpu_id(char *vendor, size_t vendor_size, unsigned *family, unsigned *model) {
    static const struct { unsigned code; const char *name; } implementers[] = {
        {0x41, "ARM"}, {0x42, "Broadcom"}, {0x43, "Cavium"}, {0x46, "Fujitsu"}, {0x48, "HiSilicon"},
        {0x4E, "NVIDIA"}, {0x51, "Qualcomm"}, {0x61, "Apple"}, {0x6D, "Microsoft"}, {0xC0, "Ampere"},
    };
    const unsigned long long midr = arm_midr();
    const unsigned code = (unsigned)(midr >> 24 & 0xFF);
    *family = code;
    *model = (unsigned)(midr >> 4 & 0xFFF);
    if (vendor_size) vendor[0] = '\0';
    if (!midr) return;
    snprintf(vendor, vendor_size, "0x%02x", code);
    for (size_t i = 0; i < sizeof implementers / sizeof implementers[0]; i++)
        if (implementers[i].code == code) snprintf(vendor, vendor_size, "%s", implementers[i].name);
}

/* No aarch64 CPU has a tuning of its own yet: each runs wisdom's, the
 * heuristic's or the generic one. */
const fmha_arch_tuning *fmha_arch_tunings(size_t *n) {
    *n = 0;
    return NULL;
}

/* A size in sysfs' words ("48K", "1024K", "2M") in bytes, 0 if unreadable. */
static int64_t arm_sysfs_size(const char *path) {
    FILE *f = fopen(path, "r");
    long long v = 0;
    char unit = 0;
    if (!f) return 0;
    if (fscanf(f, "%lld%c", &v, &unit) < 1) v = 0;
    fclose(f);
    return unit == 'K' ? v << 10 : unit == 'M' ? v << 20 : v;
}

/* L1D and L2 from /sys/devices/system/cpu/cpu0/cache/index<i>/{level,type,size}. */
void fmha_arch_cache_sizes(fmha_cache_sizes *c) {
    c->l1d = c->l2 = 0;
#if defined(__linux__)
    for (int i = 0; i < 8; i++) {
        char path[96], type[16] = "";
        int level = 0;
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        FILE *f = fopen(path, "r");
        if (!f) break;
        if (fscanf(f, "%d", &level) != 1) level = 0;
        fclose(f);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/type", i);
        if ((f = fopen(path, "r"))) {
            if (fscanf(f, "%15s", type) != 1) type[0] = '\0';
            fclose(f);
        }
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        if (level == 1 && !strcmp(type, "Data")) c->l1d = arm_sysfs_size(path);
        if (level == 2 && (!strcmp(type, "Unified") || !strcmp(type, "Data"))) c->l2 = arm_sysfs_size(path);
    }
#endif
}

/* This thread's SVE vector length in bits (PR_SVE_GET_VL), 0 without SVE. */
static int arm_sve_bits(void) {
#if defined(__linux__)
    enum { SVE_GET_VL = 51, SVE_VL_LEN_MASK = 0xffff }; /* PR_SVE_GET_VL, PR_SVE_VL_LEN_MASK */
    const int vl = prctl(SVE_GET_VL, 0, 0, 0, 0);
    return vl > 0 ? (vl & SVE_VL_LEN_MASK) * 8 : 0;
#else
    return 0;
#endif
}

void fmha_arch_describe(char *buf, size_t n) {
    const unsigned long hw = arm_hwcap(1), hw2 = arm_hwcap(2);
    char sve[24] = "no";
    if (hw >> HWCAP_BIT_SVE & 1) snprintf(sve, sizeof sve, "%d bits", arm_sve_bits());
    char vendor[16];
    unsigned implementer, part;
    fmha_arch_cpu_id(vendor, sizeof vendor, &implementer, &part);
    snprintf(buf, n, "aarch64 %s family %u model %u: asimd %s, fphp %s, asimddp %s, bf16 %s, i8mm %s, sve %s, sve2 %s, "
             "sme %s",
             vendor[0] ? vendor : "unknown", implementer, part, hw >> HWCAP_BIT_ASIMD & 1 ? "yes" : "no",
             hw >> HWCAP_BIT_FPHP & 1 ? "yes" : "no", hw >> HWCAP_BIT_ASIMDDP & 1 ? "yes" : "no",
             hw2 >> HWCAP2_BIT_BF16 & 1 ? "yes" : "no", hw2 >> HWCAP2_BIT_I8MM & 1 ? "yes" : "no", sve,
             hw2 >> HWCAP2_BIT_SVE2 & 1 ? "yes" : "no", hw2 >> HWCAP2_BIT_SME & 1 ? "yes" : "no");
}
#endif
