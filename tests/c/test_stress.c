/* test_stress.c: many user threads calling fmha at once while another thread
 * keeps changing the thread count. fmha.h promises that concurrent calls are
 * safe and that results are bitwise identical for every thread count, so
 * every result must equal, bit for bit, the one the same call gave when run
 * alone with one thread.
 *
 * Six caller threads loop over forward, backward and forward_backward
 * calls of mixed shapes (GQA, causal alignments, windows, Sq != Skv, tails
 * off every block size) in float32, bfloat16 and float16, and every
 * strategy; some calls pass a caller-owned workspace sized just before the
 * call, which may then be too small because the count changed in between:
 * that call must answer FMHA_ERR_WORKSPACE_TOO_SMALL and write nothing. A
 * seventh thread cycles fmha_set_num_threads through 1, 2, 3, 5, 8 and 0.
 * The serial float32 results are also checked against the float64
 * reference (O within 1e-5 + 1e-4 |r| per element). Sized to take a few
 * seconds under ASan on two cores. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/convert.h"
#include "fmha_ref.h"
#include "test_util.h"

#define N_CALLERS 6
#define ROUNDS 30

typedef enum { OP_FWD, OP_BWD, OP_FWDBWD } op_kind;

typedef struct scase {
    fmha_problem p;
    op_kind op;
    void *q, *k, *v, *d_o;  /* inputs in the case's dtype */
    void *o_in;             /* backward: O of the serial forward */
    float *lse_in;          /* backward: lse of the serial forward */
    size_t n_q, n_k, n_v, n_o, n_l, esz;
    /* serial results: o, lse (forward, forward_backward), dq, dk, dv */
    void *o, *dq, *dk, *dv;
    float *lse;
} scase;

static scase cases[12];
static int n_cases;
static atomic_int stop_changer;
static atomic_int mismatches, errors, too_small;

static void *xcalloc(size_t n, size_t s) {
    void *x = calloc(n ? n : 1, s);
    if (!x) abort();
    return x;
}

static void *new_input(const fmha_problem *p, size_t n, size_t esz) {
    void *x = xcalloc(n, esz);
    for (size_t i = 0; i < n; i++) fmha_store(x, p->dtype, (int64_t)i, (float)tu_uniform(-1, 1));
    return x;
}

static size_t tensor_len(const fmha_problem *p, char which) {
    int64_t n[4];
    const int64_t *st = tu_shape(p, which, n);
    return tu_span(st, n);
}

static void add_case(int64_t B, int64_t hq, int64_t hkv, int64_t sq, int64_t skv, int64_t d,
                     int64_t dv, fmha_dtype dtype, fmha_causal causal, int64_t window, int layout,
                     fmha_strategy strategy, op_kind op) {
    scase *c = &cases[n_cases++];
    fmha_problem_init(&c->p, B, hq, hkv, sq, skv, d, dv, FMHA_LAYOUT_BSHD);
    tu_set_layout(&c->p, layout);
    c->p.dtype = dtype;
    c->p.causal = causal;
    c->p.strategy = strategy;
    c->p.masks.window_left = window;
    c->op = op;
    c->esz = fmha_dtype_size(dtype);
    c->n_q = tensor_len(&c->p, 'q'), c->n_k = tensor_len(&c->p, 'k');
    c->n_v = tensor_len(&c->p, 'v'), c->n_o = tensor_len(&c->p, 'o');
    c->n_l = (size_t)(B * hq * sq);
    c->q = new_input(&c->p, c->n_q, c->esz), c->k = new_input(&c->p, c->n_k, c->esz);
    c->v = new_input(&c->p, c->n_v, c->esz), c->d_o = new_input(&c->p, c->n_o, c->esz);
}

/* Output buffers of one call, zero-filled. */
typedef struct outs { void *o, *dq, *dk, *dv; float *lse; } outs;

static outs outs_new(const scase *c) {
    return (outs){xcalloc(c->n_o, c->esz), xcalloc(c->n_q, c->esz), xcalloc(c->n_k, c->esz),
                  xcalloc(c->n_v, c->esz), xcalloc(c->n_l, sizeof(float))};
}

static void outs_free(outs *r) { free(r->o), free(r->dq), free(r->dk), free(r->dv), free(r->lse); }

/* Runs case c into r; ws/ws_bytes as the caller chose. */
static fmha_status run(const scase *c, outs *r, void *ws, size_t ws_bytes) {
    const fmha_problem *p = &c->p;
    switch (c->op) {
    case OP_FWD: return fmha_forward(p, c->q, c->k, c->v, r->o, r->lse, ws, ws_bytes);
    case OP_BWD:
        return fmha_backward(p, c->q, c->k, c->v, c->o_in, c->d_o, c->lse_in, r->dq, r->dk, r->dv,
                             NULL, ws, ws_bytes);
    default:
        return fmha_forward_backward(p, c->q, c->k, c->v, c->d_o, r->o, r->lse, r->dq, r->dk, r->dv,
                                     NULL);
    }
}

static int same_as_serial(const scase *c, const outs *r) {
    int fwd = c->op != OP_BWD, bwd = c->op != OP_FWD;
    return (!fwd || (!memcmp(r->o, c->o, c->n_o * c->esz) &&
                     !memcmp(r->lse, c->lse, c->n_l * sizeof(float)))) &&
           (!bwd || (!memcmp(r->dq, c->dq, c->n_q * c->esz) && !memcmp(r->dk, c->dk, c->n_k * c->esz) &&
                     !memcmp(r->dv, c->dv, c->n_v * c->esz)));
}

static int all_zero(const void *x, size_t bytes) {
    const unsigned char *b = x;
    for (size_t i = 0; i < bytes; i++)
        if (b[i]) return 0;
    return 1;
}

static void *caller(void *arg) {
    int id = (int)(size_t)arg;
    for (int round = 0; round < ROUNDS; round++)
        for (int i = 0; i < n_cases; i++) {
            const scase *c = &cases[(i + id * 5) % n_cases];
            outs r = outs_new(c);
            /* every third call brings a workspace sized for the count of the moment */
            size_t bytes = 0;
            void *ws = NULL;
            if ((i + round + id) % 3 == 0 && c->op != OP_FWDBWD) {
                fmha_status st = c->op == OP_FWD ? fmha_forward_workspace_size(&c->p, &bytes)
                                                 : fmha_backward_workspace_size(&c->p, &bytes);
                if (st != FMHA_OK) atomic_fetch_add(&errors, 1);
                ws = malloc(bytes ? bytes : 1);
            }
            fmha_status st = run(c, &r, ws, bytes);
            if (st == FMHA_ERR_WORKSPACE_TOO_SMALL && ws) {
                atomic_fetch_add(&too_small, 1);
                if (!all_zero(r.o, c->n_o * c->esz) || !all_zero(r.dq, c->n_q * c->esz) ||
                    !all_zero(r.lse, c->n_l * sizeof(float)))
                    atomic_fetch_add(&mismatches, 1);
            } else if (st != FMHA_OK) {
                atomic_fetch_add(&errors, 1);
            } else if (!same_as_serial(c, &r)) {
                atomic_fetch_add(&mismatches, 1);
            }
            free(ws);
            outs_free(&r);
        }
    return NULL;
}

static void *changer(void *arg) {
    (void)arg;
    const int counts[6] = {1, 2, 3, 5, 8, 0};
    for (int i = 0; !atomic_load(&stop_changer); i++) {
        fmha_set_num_threads(counts[i % 6]);
        nanosleep(&(struct timespec){0, 300 * 1000}, NULL);
    }
    return NULL;
}

int main(void) {
    tu_seed();
    const fmha_dtype F = FMHA_DTYPE_F32, BF = FMHA_DTYPE_BF16, H = FMHA_DTYPE_F16;
    const fmha_causal N = FMHA_CAUSAL_NONE, TL = FMHA_CAUSAL_TOP_LEFT, BR = FMHA_CAUSAL_BOTTOM_RIGHT;
    const fmha_strategy A = FMHA_STRATEGY_AUTO, T = FMHA_STRATEGY_TILED, D = FMHA_STRATEGY_DENSE,
                        P = FMHA_STRATEGY_PORTABLE;
    add_case(2, 4, 2, 37, 70, 32, 24, F, TL, -1, TU_LAYOUT_BSHD, T, OP_FWD);
    add_case(1, 3, 1, 50, 33, 16, 16, BF, BR, -1, TU_LAYOUT_BHSD, A, OP_FWD);
    add_case(1, 2, 2, 1, 130, 64, 64, H, N, -1, TU_LAYOUT_PADDED, T, OP_FWD);
    add_case(2, 2, 1, 40, 40, 8, 12, F, N, 5, TU_LAYOUT_PADDED2, D, OP_FWD);
    add_case(1, 4, 4, 29, 45, 24, 8, F, BR, -1, TU_LAYOUT_BSHD, T, OP_BWD);
    add_case(1, 2, 1, 33, 33, 32, 32, BF, TL, 7, TU_LAYOUT_BHSD, T, OP_BWD);
    add_case(2, 2, 2, 20, 50, 16, 16, H, N, -1, TU_LAYOUT_BSHD, D, OP_BWD);
    add_case(1, 3, 3, 64, 17, 8, 8, F, N, -1, TU_LAYOUT_PADDED, P, OP_BWD);
    add_case(1, 2, 1, 45, 60, 16, 24, F, TL, -1, TU_LAYOUT_BSHD, A, OP_FWDBWD);
    add_case(1, 2, 2, 30, 30, 32, 16, BF, BR, -1, TU_LAYOUT_BHSD, T, OP_FWDBWD);
    add_case(1, 1, 1, 70, 20, 8, 8, H, TL, 3, TU_LAYOUT_PADDED2, T, OP_FWDBWD);

    /* serial results, one thread */
    fmha_set_num_threads(1);
    for (int i = 0; i < n_cases; i++) {
        scase *c = &cases[i];
        if (c->op == OP_BWD) {
            outs f = outs_new(c);
            tu_check(fmha_forward(&c->p, c->q, c->k, c->v, f.o, f.lse, NULL, 0) == FMHA_OK,
                     "case %d: serial forward failed", i);
            c->o_in = f.o, c->lse_in = f.lse;
            free(f.dq), free(f.dk), free(f.dv);
        }
        outs r = outs_new(c);
        tu_check(run(c, &r, NULL, 0) == FMHA_OK, "case %d: serial call failed", i);
        c->o = r.o, c->lse = r.lse, c->dq = r.dq, c->dk = r.dk, c->dv = r.dv;
        if (c->op != OP_BWD && c->p.dtype == FMHA_DTYPE_F32 && c->p.masks.window_left < 0) {
            int64_t n[4];
            tu_shape(&c->p, 'o', n);
            size_t len = tu_numel(n);
            double *ro = xcalloc(len, sizeof(double));
            float *og = xcalloc(len, sizeof(float));
            if (fmha_ref_forward(&c->p, c->q, c->k, c->v, ro, NULL) != 0) abort();
            tu_gather(c->o, c->p.o_strides, n, og);
            tu_check(tu_worst_ratio(og, ro, len, 1e-5, 1e-4) <= 1.0,
                     "case %d: serial O differs from the reference", i);
            free(ro), free(og);
        }
    }

    pthread_t callers[N_CALLERS], ch;
    atomic_store(&stop_changer, 0);
    int ok = pthread_create(&ch, NULL, changer, NULL) == 0;
    int started = 0;
    for (int t = 0; t < N_CALLERS; t++)
        if (pthread_create(&callers[t], NULL, caller, (void *)(size_t)t) == 0) started++;
        else break;
    tu_check(ok && started == N_CALLERS, "could not start the threads");
    for (int t = 0; t < started; t++) pthread_join(callers[t], NULL);
    atomic_store(&stop_changer, 1);
    if (ok) pthread_join(ch, NULL);

    tu_check(atomic_load(&errors) == 0, "%d concurrent calls failed", atomic_load(&errors));
    tu_check(atomic_load(&mismatches) == 0,
             "%d concurrent results differ from the serial ones (or a refused call wrote)",
             atomic_load(&mismatches));
    printf("%d calls, %d refused a workspace made too small by a thread count change\n",
           N_CALLERS * ROUNDS * n_cases, atomic_load(&too_small));
    fmha_set_num_threads(0);
    for (int i = 0; i < n_cases; i++) {
        scase *c = &cases[i];
        free(c->q), free(c->k), free(c->v), free(c->d_o), free(c->o_in), free(c->lse_in);
        free(c->o), free(c->dq), free(c->dk), free(c->dv), free(c->lse);
    }
    return tu_finish();
}
