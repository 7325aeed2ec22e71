/* cpu_arm.c: the aarch64 ISAs and their checks, read from the kernel's
 * hardware capability words (getauxval(AT_HWCAP), AT_HWCAP2), most capable
 * first: neonbf16 (Advanced SIMD plus FEAT_BF16: BFDOT, BFMMLA, BFCVTN),
 * neon (Advanced SIMD, Armv8.0). The capabilities are also reported by
 * fmha_plan_describe. */
#include "cpu.h"
#include "tuning.h"

#if defined(__aarch64__)
#include <stdio.h>
#if defined(__linux__)
#include <sys/auxv.h>
#endif

/* AT_HWCAP: ASIMD bit 1, FPHP bit 9, SVE bit 22; AT_HWCAP2: SVE2 bit 1,
 * I8MM bit 13, BF16 bit 14, SME bit 23 */
enum { HWCAP_BIT_ASIMD = 1, HWCAP_BIT_FPHP = 9, HWCAP_BIT_SVE = 22 };
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

#if FMHA_HAVE_NEONBF16
#if defined(__linux__) && !defined(HWCAP2_BF16)
#define HWCAP2_BF16 (1UL << HWCAP2_BIT_BF16) /* older kernel headers lack it */
#endif
/* Advanced SIMD and FEAT_BF16 (HWCAP2_BF16: the BF16 instructions at EL0). */
static int arm_has_neonbf16(void) {
#if defined(__linux__)
    return arm_has_neon() && (arm_hwcap2() & HWCAP2_BF16) != 0;
#else
    return 0;
#endif
}
#endif

static const fmha_arch_isa arm_isas[] = {
#if FMHA_HAVE_NEONBF16
    {"neonbf16", arm_has_neonbf16, &fmha_isa_neonbf16},
#endif
    {"neon", arm_has_neon, &fmha_isa_neon},
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

void fmha_arch_describe(char *buf, size_t n) {
    const unsigned long hw = arm_hwcap(), hw2 = arm_hwcap2();
    snprintf(buf, n, "aarch64: asimd %s, fphp %s, bf16 %s, i8mm %s, sve %s, sve2 %s, sme %s",
             hw >> HWCAP_BIT_ASIMD & 1 ? "yes" : "no", hw >> HWCAP_BIT_FPHP & 1 ? "yes" : "no",
             hw2 >> HWCAP2_BIT_BF16 & 1 ? "yes" : "no", hw2 >> HWCAP2_BIT_I8MM & 1 ? "yes" : "no",
             hw >> HWCAP_BIT_SVE & 1 ? "yes" : "no", hw2 >> HWCAP2_BIT_SVE2 & 1 ? "yes" : "no",
             hw2 >> HWCAP2_BIT_SME & 1 ? "yes" : "no");
}
#endif
