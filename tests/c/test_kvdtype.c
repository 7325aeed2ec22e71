/* test_kvdtype.c: a KV cache dtype of its own (fmha_problem.kv_dtype).
 *
 * K and V in bf16 or f16 beside float32 Q and O, against the float64
 * reference on the rounded K and V values: the decode driver (contiguous
 * and paged caches in shuffled page order, page sizes 1, 3, 16, 64, ragged
 * lengths, GQA 8/1 and 32/8, sinks, Sq = 1..16) and the tiled, dense and
 * portable forwards, every ISA of the registry. The output must also equal,
 * bit for bit, the float32 problem run on the widened K and V (widening is
 * exact and the kernels see the same values). Unknown values, mixed dtypes
 * beside bf16/f16 queries and the backward are clear errors, nothing written. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/attn.h"
#include "runtime/convert.h"
#include "config/cpu.h"
#include "fmha_ref_masks.h"
#include "test_util.h"

/* n elements of dtype t and the float values they hold (what the reference sees). */
typedef struct typed {
    void *data;
    float *value;
} typed;

static typed typed_new(fmha_dtype t, size_t n) {
    typed x = {malloc(n * fmha_dtype_size(t) + 1), malloc(n * sizeof(float) + 1)};
    for (size_t i = 0; i < n; i++) {
        fmha_store(x.data, t, (int64_t)i, (float)tu_uniform(-1, 1));
        x.value[i] = fmha_load(x.data, t, (int64_t)i);
    }
    return x;
}

static void typed_free(typed *x) { free(x->data), free(x->value); }

static fmha_kv_dtype kv_of(fmha_dtype t) { return (fmha_kv_dtype)(t + 1); }

typedef struct kv_case {
    int64_t B, hq, hkv, sq, skv, D, page; /* page 0: a contiguous cache */
    fmha_dtype kvt;
    fmha_strategy strategy;
    int causal, sinks;
} kv_case;

/* A pool [pages, page, Hkv, D] of cache c [B, Skv, Hkv, D] in dtype t, rows
 * of (b, pg) at page table[b * stride + pg]; unused rows hold NaN bits. */
static void *make_pool(const kv_case *kc, const void *c, const int32_t *table, int64_t stride, int64_t pages) {
    size_t row = (size_t)(kc->hkv * kc->D) * fmha_dtype_size(kc->kvt);
    char *pool = malloc((size_t)(pages * kc->page) * row);
    memset(pool, 0xff, (size_t)(pages * kc->page) * row);
    for (int64_t b = 0; b < kc->B; b++)
        for (int64_t j = 0; j < kc->skv; j++) {
            int32_t pg = table[b * stride + j / kc->page];
            if (pg >= 0)
                memcpy(pool + (size_t)(pg * kc->page + j % kc->page) * row,
                       (const char *)c + (size_t)(b * kc->skv + j) * row, row);
        }
    return pool;
}

static void run_case(const kv_case *kc, const char *isa) {
    const int64_t B = kc->B, skv = kc->skv, D = kc->D, ps = kc->page;
    fmha_problem p;
    fmha_problem_init(&p, B, kc->hq, kc->hkv, kc->sq, skv, D, D, FMHA_LAYOUT_BSHD);
    p.strategy = kc->strategy;
    if (kc->causal) p.causal = FMHA_CAUSAL_BOTTOM_RIGHT;
    int32_t kv_len[4];
    tu_ragged_kv_lengths(B, skv, kv_len);
    p.masks.kv_lengths = kv_len;
    float sinks[32];
    tu_fill(sinks, 32, -1, 1);
    if (kc->sinks) p.sinks = sinks;

    size_t nq = (size_t)(B * kc->sq * kc->hq * D), nkv = (size_t)(B * skv * kc->hkv * D);
    size_t nl = (size_t)(B * kc->hq * kc->sq);
    typed q = typed_new(FMHA_DTYPE_F32, nq), k = typed_new(kc->kvt, nkv), v = typed_new(kc->kvt, nkv);
    double *ro = malloc(nq * sizeof(double)), *rl = malloc(nl * sizeof(double));
    fmha_ref_forward_full(&p, q.value, k.value, v.value, ro, rl);

    /* the float32 problem on the widened values: the bits to match */
    float *o_w = malloc(nq * sizeof(float)), *lse_w = malloc(nl * sizeof(float));
    fmha_status sw = fmha_forward(&p, q.data, k.value, v.value, o_w, lse_w, NULL, 0);

    fmha_problem pk = p;
    pk.kv_dtype = kv_of(kc->kvt);
    const void *kin = k.data, *vin = v.data;
    void *kp = NULL, *vp = NULL;
    int32_t *table = NULL;
    if (ps > 0) { /* a shuffled page table */
        int64_t stride, pages;
        table = tu_page_table(B, skv, ps, kv_len, &stride, &pages);
        kin = kp = make_pool(kc, k.data, table, stride, pages);
        vin = vp = make_pool(kc, v.data, table, stride, pages);
        pk.block_table = table;
        pk.block_table_stride = stride;
        pk.page_size = ps;
        pk.num_pages = pages;
        pk.k_strides[0] = pk.v_strides[0] = ps * kc->hkv * D;
    }
    float *o = malloc(nq * sizeof(float)), *lse = malloc(nl * sizeof(float));
    fmha_status st = tu_forward(&pk, q.data, kin, vin, o, lse, NULL, 0);
    int lse_ok = 1;
    for (size_t i = 0; i < nl; i++)
        lse_ok &= rl[i] == -INFINITY ? lse[i] == -INFINITY : fabs((double)lse[i] - rl[i]) <= 1e-5 * (1 + fabs(rl[i]));
    /* float32 accumulation error alone: K and V are exact in the reference */
    double ratio = tu_worst_ratio(o, ro, nq, 2e-5, 2e-5);
    int same_bits = sw == FMHA_OK && !memcmp(o, o_w, nq * sizeof(float)) && !memcmp(lse, lse_w, nl * sizeof(float));
    tu_check(st == FMHA_OK && ratio <= 1.0 && lse_ok && same_bits,
             "kv %s %s %s B %lld Hq %lld Hkv %lld Sq %lld Skv %lld page %lld%s%s: status %d, O ratio %g, lse %s, "
             "float32 bits %s",
             kc->kvt == FMHA_DTYPE_BF16 ? "bf16" : "f16", isa, tu_strategy_name(kc->strategy), (long long)B,
             (long long)kc->hq, (long long)kc->hkv, (long long)kc->sq, (long long)skv, (long long)ps,
             kc->causal ? " causal" : "", kc->sinks ? " sinks" : "", (int)st, ratio, lse_ok ? "ok" : "off",
             same_bits ? "same" : "differ");
    free(kp), free(vp), free(table), free(o), free(lse), free(o_w), free(lse_w), free(ro), free(rl);
    typed_free(&q), typed_free(&k), typed_free(&v);
}

static void test_cases(const char *isa) {
    static const fmha_dtype kvts[] = {FMHA_DTYPE_BF16, FMHA_DTYPE_F16};
    static const int64_t pages[] = {0, 1, 3, 16, 64};
    for (int ti = 0; ti < 2; ti++) {
        fmha_dtype t = kvts[ti];
        for (int pi = 0; pi < 5; pi++) {
            kv_case kc = {3, 8, 1, 1, 300, 64, pages[pi], t, FMHA_STRATEGY_AUTO, 1, 0}; /* GQA 8/1 */
            run_case(&kc, isa);
            kc = (kv_case){2, 32, 8, 4, 200, 32, pages[pi], t, FMHA_STRATEGY_AUTO, 1, 1}; /* 32/8, sinks */
            run_case(&kc, isa);
        }
        for (int64_t sq = 1; sq <= 16; sq += 5) {
            kv_case kc = {2, 4, 2, sq, 150, 16, sq == 11 ? 16 : 0, t, FMHA_STRATEGY_AUTO, 1, sq == 6};
            run_case(&kc, isa);
        }
        /* the tiled, dense and portable forwards (prefill shapes) */
        static const fmha_strategy strategies[] = {FMHA_STRATEGY_AUTO, FMHA_STRATEGY_TILED, FMHA_STRATEGY_DENSE,
                                                   FMHA_STRATEGY_PORTABLE};
        for (int si = 0; si < 4; si++) {
            kv_case kc = {2, 4, 2, 70, 150, 40, 0, t, strategies[si], si != 2, si == 1};
            run_case(&kc, isa);
        }
    }
}

/* Bad values and requests: clear errors, nothing written. */
static void test_errors(void) {
    const int64_t B = 1, H = 2, S = 40, D = 8;
    fmha_problem p;
    fmha_problem_init(&p, B, H, H, 1, S, D, D, FMHA_LAYOUT_BSHD);
    p.kv_dtype = FMHA_KV_DTYPE_BF16;
    size_t nq = (size_t)(B * H * D), nkv = (size_t)(B * S * H * D);
    typed q = typed_new(FMHA_DTYPE_F32, nq), k = typed_new(FMHA_DTYPE_BF16, nkv), v = typed_new(FMHA_DTYPE_BF16, nkv);
    float o[16], lse[2], dq[16], dk[640], dv[640];
    tu_check(fmha_forward(&p, q.data, k.data, v.data, o, lse, NULL, 0) == FMHA_OK, "kv_dtype: the good call runs");

    fmha_problem b = p;
    b.kv_dtype = (fmha_kv_dtype)4;
    for (int i = 0; i < 16; i++) o[i] = 7.0f;
    tu_check(fmha_forward(&b, q.data, k.data, v.data, o, lse, NULL, 0) == FMHA_ERR_BAD_OPTION &&
                 fmha_problem_check(&b) == FMHA_ERR_BAD_OPTION && tu_count_not(o, 16, 7.0f) == 0,
             "kv_dtype: an unknown value is FMHA_ERR_BAD_OPTION, nothing written");
    b = p;
    b.dtype = FMHA_DTYPE_BF16;
    b.kv_dtype = FMHA_KV_DTYPE_F16;
    fmha_plan *plan = NULL;
    tu_check(fmha_forward(&b, q.data, k.data, v.data, o, lse, NULL, 0) == FMHA_ERR_UNSUPPORTED &&
                 fmha_plan_create(&b, &plan) == FMHA_ERR_UNSUPPORTED && plan == NULL && tu_count_not(o, 16, 7.0f) == 0,
             "kv_dtype: f16 K, V beside bf16 Q is FMHA_ERR_UNSUPPORTED");
    b.kv_dtype = FMHA_KV_DTYPE_BF16; /* the problem's own dtype, named */
    tu_check(fmha_problem_check(&b) == FMHA_OK, "kv_dtype: naming the problem's dtype is allowed");

    /* the backward of a mixed problem: unsupported, nothing written */
    for (int i = 0; i < 16; i++) dq[i] = 7.0f;
    size_t bytes = 5;
    tu_check(fmha_backward(&p, q.data, k.data, v.data, o, o, lse, dq, dk, dv, NULL, NULL, 0) == FMHA_ERR_UNSUPPORTED &&
                 fmha_forward_backward(&p, q.data, k.data, v.data, o, o, lse, dq, dk, dv, NULL) ==
                     FMHA_ERR_UNSUPPORTED &&
                 fmha_backward_workspace_size(&p, &bytes) == FMHA_ERR_UNSUPPORTED && bytes == 5 &&
                 tu_count_not(dq, 16, 7.0f) == 0,
             "kv_dtype: the backward is FMHA_ERR_UNSUPPORTED");

    /* K and V are sized in their own dtype: an output right after the bf16
     * K is no overlap, one inside its bytes is */
    uint16_t *kv = malloc(nkv * 2 * sizeof(uint16_t) + 64);
    memcpy(kv, k.data, nkv * sizeof(uint16_t));
    float *after = (float *)(kv + nkv);
    tu_check(fmha_forward(&p, q.data, kv, v.data, after, lse, NULL, 0) == FMHA_OK &&
                 fmha_forward(&p, q.data, kv, v.data, (float *)(kv + nkv - 2), lse, NULL, 0) == FMHA_ERR_OVERLAP,
             "kv_dtype: K's extent counts 2-byte elements");
    free(kv);

    /* a problem from before kv_dtype (its struct_size) is read without it: SAME */
    fmha_problem old = p;
    old.struct_size = offsetof(fmha_problem, kv_dtype);
    float *kf = k.value, *vf = v.value;
    tu_check(fmha_forward(&old, q.data, kf, vf, o, lse, NULL, 0) == FMHA_OK,
             "kv_dtype: the previous struct size is accepted");
    typed_free(&q), typed_free(&k), typed_free(&v);
}

int main(void) {
    tu_seed();
    tu_each_isa(test_cases);
    test_errors();
    return tu_finish();
}
