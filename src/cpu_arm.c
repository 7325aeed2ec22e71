/* cpu_arm.c: the aarch64 ISAs and their checks, read from the kernel's
 * hardware capability words (getauxval(AT_HWCAP), AT_HWCAP2). No aarch64
 * kernel table exists yet, so the registry holds scalar alone there; the
 * capabilities are reported by fmha_plan_describe. */
#include "cpu.h"

#if defined(__aarch64__)
#include <stdio.h>
#if defined(__linux__)
#include <sys/auxv.h>
#endif

size_t fmha_arch_isa_count(void) { return 0; }

const fmha_arch_isa *fmha_arch_isa_at(size_t i) { return NULL; }

void fmha_arch_describe(char *buf, size_t n) {
    unsigned long hw = 0, hw2 = 0;
#if defined(__linux__)
    hw = getauxval(AT_HWCAP);
    hw2 = getauxval(AT_HWCAP2);
#endif
    /* AT_HWCAP: ASIMD bit 1, FPHP bit 9, SVE bit 22; AT_HWCAP2: SVE2 bit 1,
     * I8MM bit 13, BF16 bit 14, SME bit 23 */
    snprintf(buf, n, "aarch64: asimd %s, fphp %s, bf16 %s, i8mm %s, sve %s, sve2 %s, sme %s", hw >> 1 & 1 ? "yes" : "no",
             hw >> 9 & 1 ? "yes" : "no", hw2 >> 14 & 1 ? "yes" : "no", hw2 >> 13 & 1 ? "yes" : "no",
             hw >> 22 & 1 ? "yes" : "no", hw2 >> 1 & 1 ? "yes" : "no", hw2 >> 23 & 1 ? "yes" : "no");
}
#endif
