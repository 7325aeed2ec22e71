/* strided.c: the arithmetic of strided tensors every layer checks its
 * arguments with (the attention calls, fmha_kv_quantize, fmha_merge):
 * how far a tensor reaches and whether its elements are distinct. */
#include "runtime/strided.h"

/* Largest element offset of a tensor, or -1 on overflow. */
int64_t fmha_strided_span(const int64_t ext[4], const int64_t st[4]) {
    int64_t span = 0;
    for (int i = 0; i < 4; i++) {
        if (st[i] != 0 && ext[i] - 1 > (INT64_MAX / 8 - span) / st[i]) return -1;
        span += st[i] * (ext[i] - 1);
    }
    return span;
}

/* 1 if distinct indices always map to distinct offsets in the nested sense:
 * dims sorted by stride, each stride exceeds the reach of the smaller ones. */
int fmha_strided_injective(const int64_t ext[4], const int64_t st[4]) {
    int order[4] = {0, 1, 2, 3};
    for (int i = 1; i < 4; i++)
        for (int j = i; j > 0 && st[order[j]] < st[order[j - 1]]; j--) {
            int t = order[j]; order[j] = order[j - 1]; order[j - 1] = t;
        }
    int64_t reach = 0;
    for (int i = 0; i < 4; i++) {
        int d = order[i];
        if (ext[d] == 1) continue;
        if (st[d] <= reach) return 0;
        reach += st[d] * (ext[d] - 1);
    }
    return 1;
}
