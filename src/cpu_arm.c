/* cpu_arm.c: the aarch64 ISAs and their checks, read from the kernel's
 * hardware capability words (getauxval(AT_HWCAP), AT_HWCAP2), preferred
 * first: neonbf16 (Advanced SIMD plus FEAT_BF16: BFDOT, BFMMLA, BFCVTN),
 * sve (SVE at any vector length), neon (Advanced SIMD, Armv8.0). The
 * capabilities are also reported by fmha_plan_describe. */
#include "cpu.h"
#include "tuning.h"

#if defined(__aarch64__)
#include <stdio.h>
#if defined(__linux__)
#include <sys/auxv.h>
#include <sys/prctl.h>
#endif

/* AT_HWCAP: ASIMD bit 1, FPHP bit 9, ASIMDDP bit 20, SVE bit 22;
 * AT_HWCAP2: SVE2 bit 1, I8MM bit 13, BF16 bit 14, SME bit 23 */
enum { HWCAP_BIT_ASIMD = 1, HWCAP_BIT_FPHP = 9, HWCAP_BIT_ASIMDDP = 20, HWCAP_BIT_SVE = 22 };
enum { HWCAP2_BIT_SVE2 = 1, HWCAP2_BIT_I8MM = 13, HWCAP2_BIT_BF16 = 14, HWCAP2_BIT_SME = 23 };

static unsigned long arm_hwcap(void) {
#if defined(__linux__)
    return getauxval(AT_HWCAP);
#else
    return 0;
#endif
}

static unsigned long arm_hwcap2(void) {
#if defined(__linux__)
    return getauxval(AT_HWCAP2);
#else
    return 0;
#endif
}

/* Advanced SIMD; the kernels assume a little-endian CPU. */
static int arm_has_neon(void) {
#if defined(__AARCH64EB__)
    return 0;
#else
    return (int)(arm_hwcap() >> HWCAP_BIT_ASIMD & 1);
#endif
}

#if FMHA_HAVE_NEONDOT
/* Advanced SIMD and the dot product (HWCAP_ASIMDDP: SDOT and UDOT at EL0). */
static int arm_has_neondot(void) { return arm_has_neon() && (arm_hwcap() >> HWCAP_BIT_ASIMDDP & 1); }
#endif

#if FMHA_HAVE_NEONBF16
#if defined(__linux__) && !defined(HWCAP2_BF16)
#define HWCAP2_BF16 (1UL << HWCAP2_BIT_BF16) /* older kernel headers lack it */
#endif
/* Advanced SIMD, the dot product (whose integer scores the table has; every
 * BF16 core has it) and FEAT_BF16 (HWCAP2_BF16: the BF16 instructions at EL0). */
static int arm_has_neonbf16(void) {
#if defined(__linux__) && FMHA_HAVE_NEONDOT
    return arm_has_neondot() && (arm_hwcap2() & HWCAP2_BF16) != 0;
#else
    return 0;
#endif
}
#endif

#if FMHA_HAVE_SVE
#include "uk/sve/sve.h"
/* SVE (HWCAP_SVE: the SVE instructions at EL0) with vectors of 128 to 512
 * bits, and Advanced SIMD for the neon parts the table shares. */
static int arm_has_sve(void) { return arm_has_neon() && (arm_hwcap() >> HWCAP_BIT_SVE & 1) && fmha_sve_usable(); }
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

/* No aarch64 CPU has a tuning of its own yet: each runs the generic one. */
void fmha_arch_cpu_id(char *vendor, size_t vendor_size, unsigned *family, unsigned *model) {
    if (vendor_size) vendor[0] = '\0';
    *family = *model = 0;
}

const fmha_arch_tuning *fmha_arch_tunings(size_t *n) {
    *n = 0;
    return NULL;
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
    const unsigned long hw = arm_hwcap(), hw2 = arm_hwcap2();
    char sve[24] = "no";
    if (hw >> HWCAP_BIT_SVE & 1) snprintf(sve, sizeof sve, "%d bits", arm_sve_bits());
    snprintf(buf, n, "aarch64: asimd %s, fphp %s, asimddp %s, bf16 %s, i8mm %s, sve %s, sve2 %s, sme %s",
             hw >> HWCAP_BIT_ASIMD & 1 ? "yes" : "no", hw >> HWCAP_BIT_FPHP & 1 ? "yes" : "no",
             hw >> HWCAP_BIT_ASIMDDP & 1 ? "yes" : "no",
             hw2 >> HWCAP2_BIT_BF16 & 1 ? "yes" : "no", hw2 >> HWCAP2_BIT_I8MM & 1 ? "yes" : "no", sve,
             hw2 >> HWCAP2_BIT_SVE2 & 1 ? "yes" : "no", hw2 >> HWCAP2_BIT_SME & 1 ? "yes" : "no");
}
#endif
