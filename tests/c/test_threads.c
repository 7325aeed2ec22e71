/* test_threads.c: the forward's O and lse are bitwise identical for 1, 2 and
 * 7 threads (fmha_set_num_threads), as fmha.h promises, for every strategy
 * under every instruction set this CPU runs. Problems mix causal alignments,
 * GQA/MQA, decode, fully masked rows and sizes that are not tile multiples,
 * so work is split unevenly and some threads get nothing. The backward's
 * determinism is checked in test_backward.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/cpu.h"
#include "test_util.h"

int main(void) {
    tu_seed();
    static const struct {
        int64_t B, hq, hkv, sq, skv, d, dv;
        fmha_causal causal;
        int layout;
    } cs[] = {
        {2, 4, 2, 77, 131, 40, 24, FMHA_CAUSAL_TOP_LEFT, TU_LAYOUT_BSHD},
        {1, 3, 1, 200, 45, 64, 64, FMHA_CAUSAL_BOTTOM_RIGHT, TU_LAYOUT_BHSD},
        {1, 8, 2, 1, 1030, 128, 128, FMHA_CAUSAL_NONE, TU_LAYOUT_PADDED},
        {1, 1, 1, 333, 333, 96, 80, FMHA_CAUSAL_TOP_LEFT, TU_LAYOUT_BSHD},
        {3, 2, 2, 17, 300, 7, 9, FMHA_CAUSAL_BOTTOM_RIGHT, TU_LAYOUT_PADDED2},
        {1, 6, 3, 513, 129, 32, 32, FMHA_CAUSAL_NONE, TU_LAYOUT_BHSD},
    };
    const int threads[3] = {1, 2, 7};
    const char *isa_default = fmha_cpu_kernels()->isa;
    uint32_t bits = 0x7fc0beefu;
    float sent;
    memcpy(&sent, &bits, sizeof sent);
    for (int c = 0; c < (int)(sizeof cs / sizeof cs[0]); c++) {
        fmha_problem p;
        fmha_problem_init(&p, cs[c].B, cs[c].hq, cs[c].hkv, cs[c].sq, cs[c].skv, cs[c].d, cs[c].dv,
                          FMHA_LAYOUT_BSHD);
        p.causal = cs[c].causal;
        tu_set_layout(&p, cs[c].layout);
        float *q = tu_new_input(&p, 'q', -1, 1), *k = tu_new_input(&p, 'k', -1, 1);
        float *v = tu_new_input(&p, 'v', -1, 1);
        int64_t n[4];
        const size_t span = tu_span(tu_shape(&p, 'o', n), n);
        const size_t n_l = (size_t)(p.batch * p.heads_q * p.seq_q);
        /* every ISA of the registry that this CPU runs */
        for (size_t ii = 0; ii < fmha_isa_count(); ii++) {
            const fmha_isa *isa = fmha_isa_at(ii);
            if (!tu_isa_runs(isa)) {
                if (c == 0) printf("%s: not run here (unsupported, or another table has its kernels), skipped\n", isa->name);
                continue;
            }
            fmha_cpu_force_isa(isa->name);
            for (int s = 0; s < 4; s++) {
                if (tu_strategy_skipped(s) || tu_strategy_repeats(s)) continue;
                p.strategy = (fmha_strategy)s;
                /* o [span], lse [B, Hq, Sq] per thread count */
                float *o[3], *lse[3];
                int ok = 1;
                for (int t = 0; t < 3; t++) {
                    o[t] = tu_new_output(&p, 'o', sent);
                    lse[t] = malloc(n_l * sizeof(float));
                    fmha_set_num_threads(threads[t]);
                    ok &= fmha_forward(&p, q, k, v, o[t], lse[t], NULL, 0) == FMHA_OK;
                }
                tu_check(ok, "case %d [%s, %s]: forward failed", c, tu_strategy_name(s),
                         isa->name);
                for (int t = 1; t < 3; t++) {
                    tu_check(!memcmp(o[0], o[t], span * sizeof(float)),
                             "case %d [%s, %s]: O differs between 1 and %d threads", c,
                             tu_strategy_name(s), isa->name, threads[t]);
                    tu_check(!memcmp(lse[0], lse[t], n_l * sizeof(float)),
                             "case %d [%s, %s]: lse differs between 1 and %d threads", c,
                             tu_strategy_name(s), isa->name, threads[t]);
                }
                tu_check(tu_count_not(o[0], span, sent) > 0, "case %d: O not written", c);
                for (int t = 0; t < 3; t++) free(o[t]), free(lse[t]);
            }
        }
        fmha_cpu_force_isa(isa_default);
        free(q), free(k), free(v);
    }
    fmha_set_num_threads(0);
    return tu_finish();
}
