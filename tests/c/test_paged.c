/* test_paged.c: paged KV caches (fmha_problem.block_table).
 *
 * A cache [B, Skv, Hkv, D] is cut into pages of 1 to 256 keys that sit in a
 * pool in shuffled order (a spare page left unused, table entries past a
 * sequence's pages set to -1: never read). The paged forward must give the
 * contiguous cache's output and lse bit for bit (the same kernels see the
 * same values in the same order) and match the float64 reference: ragged
 * lengths, GQA 8/1 and 32/8, Sq = 1..16, bottom-right causal, windows,
 * sinks, float32/bf16/f16, every ISA, every strategy, one-shot and plans;
 * bf16 with pages of 128 keys or more on a matrix engine's decode (the
 * tiles, page by page: planned there, held to the reference);
 * head dims past 256 (MLA's D 576 / Dv 512, 128 query heads on one kv head).
 * Bad tables, page sizes and unsupported requests are clear errors with
 * nothing written. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/attn.h"
#include "runtime/convert.h"
#include "config/cpu.h"
#include "fmha_ref_masks.h"
#include "test_util.h"


/* A tensor in a dtype and the float values it holds (what the reference sees). */
typedef struct typed {
    size_t n;
    void *data;
    float *value;
} typed;

static typed typed_new(fmha_dtype t, size_t n) {
    typed x = {n, malloc(n * fmha_dtype_size(t) + 1), malloc(n * sizeof(float) + 1)};
    for (size_t i = 0; i < n; i++) {
        fmha_store(x.data, t, (int64_t)i, (float)tu_uniform(-1, 1));
        x.value[i] = fmha_load(x.data, t, (int64_t)i);
    }
    return x;
}

static void typed_free(typed *x) { free(x->data), free(x->value); }

typedef struct paged_case {
    int64_t B, hq, hkv, sq, skv, D, page;
    fmha_dtype dtype;
    int causal, window, sinks, biases; /* biases: softcap 20 and ALiBi */
    int64_t Dv;                        /* 0: D */
} paged_case;

/* The documented rule for a paged cache on the tiles (fmha.h's strategies):
 * a table with a matrix decode, bf16, pages of 128 keys or more, 8+ rows a
 * kv head, D a multiple of 32, no bias; otherwise the decode driver. */
static int tiles_expected(const paged_case *pc) {
    const fmha_ukernels *uk = fmha_cpu_kernels();
    return uk->matrix.decode && pc->dtype == FMHA_DTYPE_BF16 && pc->page >= 128 && pc->hq / pc->hkv * pc->sq >= 8 &&
           pc->D % 32 == 0 && !pc->biases && pc->sq <= 16 && pc->skv >= 8 * pc->sq;
}

/* The pool of a contiguous cache c [B, Skv, Hkv, len]: pool [pages, page, Hkv, len]
 * in the dtype, page of (b, pg) = table[b * stride + pg]. */
static void *make_pool(const paged_case *pc, const typed *c, int64_t len, const int32_t *table, int64_t stride,
                       int64_t pages) {
    size_t es = fmha_dtype_size(pc->dtype), row = (size_t)(pc->hkv * len) * es;
    char *pool = malloc((size_t)(pages * pc->page) * row);
    memset(pool, 0xff, (size_t)(pages * pc->page) * row); /* NaN in unused rows */
    for (int64_t b = 0; b < pc->B; b++)
        for (int64_t j = 0; j < pc->skv; j++) {
            int32_t pg = table[b * stride + j / pc->page];
            if (pg < 0) continue;
            memcpy(pool + (size_t)(pg * pc->page + j % pc->page) * row,
                   (const char *)c->data + (size_t)(b * pc->skv + j) * row, row);
        }
    return pool;
}

static void run_case(const paged_case *pc) {
    const int64_t B = pc->B, skv = pc->skv, D = pc->D, Dv = pc->Dv ? pc->Dv : D, ps = pc->page;
    fmha_problem p;
    fmha_problem_init(&p, B, pc->hq, pc->hkv, pc->sq, skv, D, Dv, FMHA_LAYOUT_BSHD);
    p.dtype = pc->dtype;
    if (pc->causal) p.causal = FMHA_CAUSAL_BOTTOM_RIGHT;
    if (pc->window) p.masks.window_left = 37;
    int32_t kv_len[4];
    tu_ragged_kv_lengths(B, skv, kv_len);
    p.masks.kv_lengths = kv_len;
    float sinks[32];
    for (int h = 0; h < 32; h++) sinks[h] = (float)tu_uniform(-1, 1);
    if (pc->sinks) p.sinks = sinks;
    float slopes[32];
    for (int h = 0; h < 32; h++) slopes[h] = (float)tu_uniform(0.01, 0.5);
    if (pc->biases) p.biases.softcap = 20.0f, p.biases.alibi_slopes = slopes;

    size_t nq = (size_t)(B * pc->sq * pc->hq * D), nkv = (size_t)(B * skv * pc->hkv * D);
    size_t no = (size_t)(B * pc->sq * pc->hq * Dv), nv = (size_t)(B * skv * pc->hkv * Dv);
    size_t nl = (size_t)(B * pc->hq * pc->sq);
    typed q = typed_new(pc->dtype, nq), k = typed_new(pc->dtype, nkv), v = typed_new(pc->dtype, nv);

    /* table [B, stride]: a shuffled permutation of the pool's pages, one spare */
    int64_t stride, pages;
    int32_t *table = tu_page_table(B, skv, ps, kv_len, &stride, &pages);
    void *kp = make_pool(pc, &k, D, table, stride, pages), *vp = make_pool(pc, &v, Dv, table, stride, pages);

    fmha_problem pp = p;
    pp.block_table = table;
    pp.block_table_stride = stride;
    pp.page_size = ps;
    pp.num_pages = pages;
    pp.k_strides[0] = ps * pc->hkv * D; /* [page, row, head, dim] */
    pp.v_strides[0] = ps * pc->hkv * Dv;

    size_t es = fmha_dtype_size(pc->dtype);
    void *o_c = malloc(no * es), *o_p = malloc(no * es);
    float *lse_c = malloc(nl * sizeof(float)), *lse_p = malloc(nl * sizeof(float)), *of = malloc(no * sizeof(float));
    double *ro = malloc(no * sizeof(double)), *rl = malloc(nl * sizeof(double));
    fmha_problem pf = p;
    pf.dtype = FMHA_DTYPE_F32;
    fmha_ref_forward_full(&pf, q.value, k.value, v.value, ro, rl);

    char what[160];
    snprintf(what, sizeof what, "paged %s B %lld Hq %lld Hkv %lld Sq %lld Skv %lld D %lld/%lld page %lld%s%s%s%s",
             pc->dtype == FMHA_DTYPE_F32 ? "f32" : pc->dtype == FMHA_DTYPE_BF16 ? "bf16" : "f16", (long long)B,
             (long long)pc->hq, (long long)pc->hkv, (long long)pc->sq, (long long)skv, (long long)D, (long long)Dv,
             (long long)ps,
             pc->causal ? " causal" : "", pc->window ? " window" : "", pc->sinks ? " sinks" : "",
             pc->biases ? " softcap + alibi" : "");
    tu_check(tu_planned_driver(&pp, tiles_expected(pc) ? &fmha_fwd_driver_matrix_decode : &fmha_fwd_driver_decode) == 1,
             "%s: planned on %s", what, tiles_expected(pc) ? "matrix_decode" : "decode");
    static const fmha_strategy strategies[] = {FMHA_STRATEGY_AUTO, FMHA_STRATEGY_TILED};
    for (int si = 0; si < 2; si++) {
        pp.strategy = strategies[si];
        fmha_status st = tu_forward(&pp, q.data, kp, vp, o_p, lse_p, NULL, 0);
        for (size_t i = 0; i < no; i++) of[i] = fmha_load(o_p, pc->dtype, (int64_t)i);
        /* float32: accumulation error; 2-byte: O rounded to the dtype */
        double tol = pc->dtype == FMHA_DTYPE_F32 ? 2e-5 : pc->dtype == FMHA_DTYPE_BF16 ? 8e-3 : 1e-3;
        int lse_ok = 1;
        for (size_t i = 0; i < nl; i++)
            lse_ok &= rl[i] == -INFINITY ? lse_p[i] == -INFINITY : fabs((double)lse_p[i] - rl[i]) <= 1e-5 * (1 + fabs(rl[i]));
        double ratio = tu_worst_ratio(of, ro, no, tol, tol);
        tu_check(st == FMHA_OK && ratio <= 1.0 && lse_ok, "%s %s: status %d, O ratio %g, lse %s", what,
                 tu_strategy_name(si), (int)st, ratio, lse_ok ? "ok" : "off");
    }
    /* the contiguous cache through the same driver: the same bits */
    p.strategy = pp.strategy = FMHA_STRATEGY_AUTO;
    if (tu_planned_driver(&p, &fmha_fwd_driver_decode) == 1) {
        fmha_status sc = fmha_forward(&p, q.data, k.data, v.data, o_c, lse_c, NULL, 0);
        fmha_status sp = fmha_forward(&pp, q.data, kp, vp, o_p, lse_p, NULL, 0);
        tu_check(sc == FMHA_OK && sp == FMHA_OK && !memcmp(o_c, o_p, no * es) &&
                     !memcmp(lse_c, lse_p, nl * sizeof(float)),
                 "%s: the contiguous cache's bits", what);
    }
    free(table), free(kp), free(vp), free(o_c), free(o_p), free(lse_c), free(lse_p), free(of);
    free(ro), free(rl);
    typed_free(&q), typed_free(&k), typed_free(&v);
}

static void test_cases(void) {
    static const int64_t pages[] = {1, 3, 16, 32, 64, 256};
    static const fmha_dtype dtypes[] = {FMHA_DTYPE_F32, FMHA_DTYPE_BF16, FMHA_DTYPE_F16};
    for (int di = 0; di < 3; di++)
        for (int pi = 0; pi < 6; pi++) {
            paged_case pc = {3, 8, 1, 1, 300, 64, pages[pi], dtypes[di], 1, 0, 0, 0, 0}; /* GQA 8/1, decode */
            run_case(&pc);
            pc = (paged_case){2, 32, 8, 4, 200, 32, pages[pi], dtypes[di], 1, 0, 1, 0, 0}; /* 32/8, sinks */
            run_case(&pc);
        }
    for (int64_t sq = 1; sq <= 16; sq += 5) { /* speculative decoding, chunked prefill */
        paged_case pc = {2, 4, 2, sq, 150, 16, 16, FMHA_DTYPE_F32, 1, sq == 6, sq == 11, 0, 0};
        run_case(&pc);
    }
    paged_case pc = {2, 4, 4, 40, 90, 8, 5, FMHA_DTYPE_F32, 1, 0, 0, 0, 0}; /* Sq beyond decode's: still decode */
    run_case(&pc);
    pc = (paged_case){4, 2, 1, 1, 500, 128, 16, FMHA_DTYPE_BF16, 0, 1, 0, 0, 0}; /* no causal, window */
    run_case(&pc);
    /* bf16 on a matrix engine with pages of 128 and 320 keys: the tiles, page by page */
    pc = (paged_case){2, 32, 8, 4, 1000, 64, 128, FMHA_DTYPE_BF16, 1, 1, 0, 0, 0};
    run_case(&pc);
    pc = (paged_case){3, 16, 2, 2, 700, 128, 320, FMHA_DTYPE_BF16, 1, 0, 1, 0, 0};
    run_case(&pc);
    /* MLA's head dims (D 576, Dv 512), 128 query heads on one kv head; Gemma's 512 */
    pc = (paged_case){2, 128, 1, 1, 150, 576, 16, FMHA_DTYPE_BF16, 1, 0, 0, 0, 512};
    run_case(&pc);
    pc = (paged_case){2, 16, 1, 2, 150, 576, 7, FMHA_DTYPE_F32, 1, 0, 0, 0, 512};
    run_case(&pc);
    pc = (paged_case){2, 8, 2, 1, 100, 512, 16, FMHA_DTYPE_F16, 0, 1, 0, 1, 0};
    run_case(&pc);
    /* softcap and ALiBi (Gemma 2, BLOOM): on the decode driver too */
    for (int di = 0; di < 3; di++) {
        pc = (paged_case){3, 8, 2, 1, 300, 64, 16, dtypes[di], 1, 1, 0, 1, 0};
        run_case(&pc);
        pc = (paged_case){2, 4, 2, 6, 150, 32, 5, dtypes[di], 1, 0, 1, 1, 0};
        run_case(&pc);
    }
}

/* Bad tables and requests: clear errors, nothing written. */
static void test_errors(void) {
    const int64_t B = 2, H = 2, S = 20, D = 8, ps = 4, pages = 12, stride = 5;
    fmha_problem p;
    fmha_problem_init(&p, B, H, H, 1, S, D, D, FMHA_LAYOUT_BSHD);
    int32_t table[10], kv_len[2] = {20, 6};
    for (int i = 0; i < 10; i++) table[i] = i;
    p.block_table = table;
    p.block_table_stride = stride;
    p.page_size = ps;
    p.num_pages = pages;
    p.masks.kv_lengths = kv_len;
    p.k_strides[0] = p.v_strides[0] = ps * H * D;
    size_t npool = (size_t)(pages * ps * H * D), nq = (size_t)(B * H * D);
    float *kp = malloc(npool * sizeof(float)), *vp = malloc(npool * sizeof(float)), *q = malloc(nq * sizeof(float));
    float *o = malloc(nq * sizeof(float)), lse[4];
    tu_fill(kp, npool, -1, 1), tu_fill(vp, npool, -1, 1), tu_fill(q, nq, -1, 1);
    tu_check(fmha_forward(&p, q, kp, vp, o, lse, NULL, 0) == FMHA_OK, "paged errors: the good call runs");
    struct { const char *what; int64_t stride, page, pages; int32_t entry_at, entry; fmha_status want; } bad[] = {
        {"page size 0", stride, 0, pages, -1, 0, FMHA_ERR_BAD_PAGE},
        {"no pages", stride, ps, 0, -1, 0, FMHA_ERR_BAD_PAGE},
        {"a table too narrow for seq_kv", 4, ps, pages, -1, 0, FMHA_ERR_BAD_PAGE},
        {"an entry past the pool", stride, ps, pages, 3, 12, FMHA_ERR_BAD_PAGE},
        {"a negative entry", stride, ps, pages, 6, -1, FMHA_ERR_BAD_PAGE},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fmha_problem b = p;
        int32_t t2[10];
        memcpy(t2, table, sizeof t2);
        if (bad[i].entry_at >= 0) t2[bad[i].entry_at] = bad[i].entry;
        b.block_table = t2;
        b.block_table_stride = bad[i].stride;
        b.page_size = bad[i].page;
        b.num_pages = bad[i].pages;
        for (size_t x = 0; x < nq; x++) o[x] = 7.0f;
        fmha_plan *plan = NULL;
        tu_check(fmha_forward(&b, q, kp, vp, o, lse, NULL, 0) == bad[i].want &&
                     fmha_plan_create(&b, &plan) == bad[i].want && tu_count_not(o, nq, 7.0f) == 0,
                 "paged: %s is FMHA_ERR_BAD_PAGE, nothing written", bad[i].what);
    }
    /* entries past a sequence's pages are never read or checked */
    int32_t t3[10];
    memcpy(t3, table, sizeof t3);
    t3[5 + 2] = -7; /* batch 1 holds 6 keys: pages 0 and 1 */
    fmha_problem b = p;
    b.block_table = t3;
    tu_check(fmha_forward(&b, q, kp, vp, o, lse, NULL, 0) == FMHA_OK, "paged: unused entries are not read");
    /* a plan re-reads the table at every run */
    fmha_plan *plan = NULL;
    tu_check(fmha_plan_create(&b, &plan) == FMHA_OK, "paged: plan");
    t3[5 + 1] = 99;
    for (size_t x = 0; x < nq; x++) o[x] = 7.0f;
    tu_check(fmha_plan_forward(plan, q, kp, vp, o, lse) == FMHA_ERR_BAD_PAGE && tu_count_not(o, nq, 7.0f) == 0,
             "paged: a plan run checks the table again");
    fmha_plan_destroy(plan);
    /* forward only; masks and biases the decode driver has not: unsupported */
    float *dq = malloc(nq * sizeof(float)), *dk = malloc(npool * sizeof(float)), *dv = malloc(npool * sizeof(float));
    for (size_t x = 0; x < nq; x++) dq[x] = 7.0f;
    size_t bytes = 5;
    tu_check(fmha_backward(&p, q, kp, vp, o, o, lse, dq, dk, dv, NULL, NULL, 0) == FMHA_ERR_UNSUPPORTED &&
                 fmha_forward_backward(&p, q, kp, vp, o, o, lse, dq, dk, dv, NULL) == FMHA_ERR_UNSUPPORTED &&
                 fmha_backward_workspace_size(&p, &bytes) == FMHA_ERR_UNSUPPORTED && bytes == 5 &&
                 tu_count_not(dq, nq, 7.0f) == 0,
             "paged: the backward is FMHA_ERR_UNSUPPORTED");
    float table_bias[2 * 4] = {0};
    b = p;
    b.biases.rel_table = table_bias, b.biases.rel_num_buckets = 4, b.biases.rel_max_distance = 8;
    tu_check(fmha_forward(&b, q, kp, vp, o, lse, NULL, 0) == FMHA_ERR_UNSUPPORTED,
             "paged: biases besides softcap and ALiBi are FMHA_ERR_UNSUPPORTED");
    /* the pool is an input: an output inside it is an overlap */
    tu_check(fmha_forward(&p, q, kp, vp, kp + 8, lse, NULL, 0) == FMHA_ERR_OVERLAP &&
                 fmha_forward(&p, q, kp, vp, o, (float *)table, NULL, 0) == FMHA_ERR_OVERLAP,
             "paged: outputs overlapping the pool or the table are refused");
    tu_check(strstr(fmha_status_string(FMHA_ERR_BAD_PAGE), "block table") != NULL, "paged: the status string");
    free(kp), free(vp), free(q), free(o), free(dq), free(dk), free(dv);
}

int main(void) {
    tu_seed();
    const char *isa_default = fmha_isa_name();
    for (size_t ii = 0; ii < fmha_isa_count(); ii++) {
        if (!tu_isa_runs(fmha_isa_at(ii)) || fmha_cpu_force_isa(fmha_isa_at(ii)->name) != 0) continue;
        test_cases();
    }
    fmha_cpu_force_isa(isa_default);
    test_errors();
    return tu_finish();
}
