/* test_util.c: seeded randomness, tolerance checks and the tally shared by
 * the C tests (see test_util.h). */
#include "test_util.h"
#include "config/cpu.h"
#include "core/attn.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t tu_state;
static int tu_seeded;
static int tu_passed, tu_failed;

uint64_t tu_seed(void) {
    if (!tu_seeded) {
        const char *env = getenv("FMHA_TEST_SEED");
        tu_state = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL);
        printf("seed: FMHA_TEST_SEED=%llu%s\n", (unsigned long long)tu_state,
               tu_quick() ? " (FMHA_TEST_QUICK: reduced sizes)" : "");
        fflush(stdout);
        tu_seeded = 1;
    }
    return tu_state;
}

int tu_quick(void) {
    const char *env = getenv("FMHA_TEST_QUICK");
    return env && atoi(env) != 0;
}

int tu_emulated(void) {
    const char *env = getenv("FMHA_TEST_QUICK");
    return env && atoi(env) >= 2;
}

int tu_strategy_skipped(int s) {
    return tu_emulated() && (s == FMHA_STRATEGY_DENSE || s == FMHA_STRATEGY_PORTABLE);
}

int tu_strategy_repeats(int s) {
    if (s != FMHA_STRATEGY_PORTABLE || !strcmp(fmha_cpu_kernels()->isa, "scalar")) return 0;
    for (size_t i = 0; i < fmha_isa_count(); i++)
        if (!strcmp(fmha_isa_at(i)->name, "scalar")) return tu_isa_runs(fmha_isa_at(i));
    return 0;
}

int64_t tu_quick_pick(int64_t full, int64_t quick) { return tu_quick() ? quick : full; }

uint64_t tu_next(void) { /* splitmix64 */
    tu_seed();
    uint64_t z = (tu_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double tu_uniform(double lo, double hi) {
    return lo + (hi - lo) * ((double)(tu_next() >> 11) * 0x1.0p-53);
}

int64_t tu_int(int64_t lo, int64_t hi) { return lo + (int64_t)(tu_next() % (uint64_t)(hi - lo + 1)); }

void tu_fill(float *x, size_t n, double lo, double hi) {
    for (size_t i = 0; i < n; i++) x[i] = (float)tu_uniform(lo, hi);
}

double tu_worst_ratio(const float *x, const double *r, size_t n, double atol, double rtol) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(r[i]) ? !isnan(x[i]) : (isinf(r[i]) ? x[i] != r[i] : !isfinite(x[i])))
            return INFINITY;
        if (!isfinite(r[i])) continue;
        double ratio = fabs((double)x[i] - r[i]) / (atol + rtol * fabs(r[i]));
        if (ratio > worst) worst = ratio;
    }
    return worst;
}

double tu_err_l2(const float *x, const double *r, size_t n) {
    double num = 0.0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(r[i])) num += ((double)x[i] - r[i]) * ((double)x[i] - r[i]);
    return sqrt(num);
}

double tu_norm_l2(const double *r, size_t n) {
    double den = 0.0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(r[i])) den += r[i] * r[i];
    return sqrt(den);
}

double tu_rel_l2(const float *x, const double *r, size_t n) {
    double err = tu_err_l2(x, r, n), norm = tu_norm_l2(r, n);
    return norm == 0.0 ? err : err / norm;
}

int tu_check(int cond, const char *fmt, ...) {
    if (cond) {
        tu_passed++;
    } else {
        tu_failed++;
        va_list ap;
        va_start(ap, fmt);
        printf("FAIL: ");
        vprintf(fmt, ap);
        printf("\n");
        va_end(ap);
        fflush(stdout);
    }
    return cond;
}

int tu_finish(void) {
    printf("%d passed, %d failed\n", tu_passed, tu_failed);
    return tu_failed ? 1 : 0;
}

/* ---- strided tensors ------------------------------------------------------ */

const char *tu_layout_name(int layout) {
    static const char *names[] = {"bshd", "bhsd", "padded", "padded2"};
    return layout >= 0 && layout < TU_LAYOUT_COUNT ? names[layout] : "?";
}

const char *tu_strategy_name(int strategy) {
    static const char *names[] = {"auto", "tiled", "dense", "portable"};
    return strategy >= 0 && strategy < 4 ? names[strategy] : "?";
}

const char *tu_causal_name(int causal) {
    static const char *names[] = {"none", "top-left", "bottom-right"};
    return causal >= 0 && causal < 3 ? names[causal] : "?";
}

/* Strides for extents n[4]: axes nested as order[0] (outermost) .. order[3]
 * (innermost), each extent padded by pad[axis], innermost stride `inner`. */
static void tu_build_strides(const int64_t n[4], const int order[4], const int64_t pad[4],
                             int64_t inner, int64_t st[4]) {
    int64_t cur = inner;
    for (int k = 3; k >= 0; k--) {
        int axis = order[k];
        st[axis] = cur;
        cur *= n[axis] + pad[axis];
    }
}

void tu_set_layout(fmha_problem *p, int layout) {
    /* per tensor q, k, v, o: axis order (outermost first), padding, inner stride */
    static const int bshd[4] = {0, 1, 2, 3}, bhsd[4] = {0, 2, 1, 3};
    static const int64_t nopad[4] = {0, 0, 0, 0};
    static const int order_a[4][4] = {{2, 0, 1, 3}, {1, 0, 2, 3}, {2, 0, 3, 1}, {0, 2, 1, 3}};
    static const int64_t pad_a[4][4] = {{0, 1, 0, 3}, {1, 0, 1, 0}, {0, 0, 1, 2}, {1, 1, 0, 3}};
    static const int64_t inner_a[4] = {1, 2, 1, 1};
    static const int order_b[4][4] = {{0, 1, 3, 2}, {2, 1, 0, 3}, {0, 1, 2, 3}, {2, 3, 0, 1}};
    static const int64_t pad_b[4][4] = {{0, 0, 2, 0}, {0, 3, 0, 1}, {1, 1, 1, 1}, {0, 1, 0, 0}};
    static const int64_t inner_b[4] = {3, 1, 2, 2};
    const char which[4] = {'q', 'k', 'v', 'o'};
    for (int t = 0; t < 4; t++) {
        int64_t n[4];
        int64_t *st = (int64_t *)tu_shape(p, which[t], n);
        if (layout == TU_LAYOUT_BSHD) tu_build_strides(n, bshd, nopad, 1, st);
        else if (layout == TU_LAYOUT_BHSD) tu_build_strides(n, bhsd, nopad, 1, st);
        else if (layout == TU_LAYOUT_PADDED) tu_build_strides(n, order_a[t], pad_a[t], inner_a[t], st);
        else tu_build_strides(n, order_b[t], pad_b[t], inner_b[t], st);
    }
}

void tu_problem(fmha_problem *p, int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seq_q,
                int64_t seq_kv, int64_t head_dim, int64_t head_dim_v) {
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
    p->dtype = FMHA_DTYPE_F32;
    p->batch = batch;
    p->heads_q = heads_q;
    p->heads_kv = heads_kv;
    p->seq_q = seq_q;
    p->seq_kv = seq_kv;
    p->head_dim = head_dim;
    p->head_dim_v = head_dim_v;
    p->scale = 0.0f;
    p->causal = FMHA_CAUSAL_NONE;
    p->strategy = FMHA_STRATEGY_AUTO;
    p->masks.window_left = p->masks.window_right = -1; /* unbounded: no window */
    tu_set_layout(p, TU_LAYOUT_BSHD);
}

const int64_t *tu_shape(const fmha_problem *p, char which, int64_t n[4]) {
    n[0] = p->batch;
    switch (which) {
    case 'q':
        n[1] = p->seq_q, n[2] = p->heads_q, n[3] = p->head_dim;
        return p->q_strides;
    case 'k':
        n[1] = p->seq_kv, n[2] = p->heads_kv, n[3] = p->head_dim;
        return p->k_strides;
    case 'v':
        n[1] = p->seq_kv, n[2] = p->heads_kv, n[3] = p->head_dim_v;
        return p->v_strides;
    default:
        n[1] = p->seq_q, n[2] = p->heads_q, n[3] = p->head_dim_v;
        return p->o_strides;
    }
}

size_t tu_numel(const int64_t n[4]) { return (size_t)(n[0] * n[1] * n[2] * n[3]); }

size_t tu_span(const int64_t st[4], const int64_t n[4]) {
    size_t span = 1;
    for (int a = 0; a < 4; a++) {
        if (n[a] < 1) return 0;
        span += (size_t)((n[a] - 1) * st[a]);
    }
    return span;
}

float *tu_elem(float *x, const int64_t st[4], int64_t b, int64_t s, int64_t h, int64_t d) {
    return x + b * st[0] + s * st[1] + h * st[2] + d * st[3];
}

float *tu_new_input(const fmha_problem *p, char which, double lo, double hi) {
    int64_t n[4];
    const int64_t *st = tu_shape(p, which, n);
    size_t span = tu_span(st, n);
    float *x = malloc(span * sizeof(float));
    if (!x) abort();
    for (size_t i = 0; i < span; i++) x[i] = NAN;
    for (int64_t b = 0; b < n[0]; b++)
        for (int64_t s = 0; s < n[1]; s++)
            for (int64_t h = 0; h < n[2]; h++)
                for (int64_t d = 0; d < n[3]; d++)
                    *tu_elem(x, st, b, s, h, d) = (float)tu_uniform(lo, hi);
    return x;
}

float *tu_new_output(const fmha_problem *p, char which, float sentinel) {
    int64_t n[4];
    const int64_t *st = tu_shape(p, which, n);
    size_t span = tu_span(st, n);
    float *x = malloc(span * sizeof(float));
    if (!x) abort();
    for (size_t i = 0; i < span; i++) x[i] = sentinel;
    return x;
}

void tu_gather(const float *x, const int64_t st[4], const int64_t n[4], float *out) {
    size_t t = 0;
    for (int64_t b = 0; b < n[0]; b++)
        for (int64_t s = 0; s < n[1]; s++)
            for (int64_t h = 0; h < n[2]; h++)
                for (int64_t d = 0; d < n[3]; d++)
                    out[t++] = *tu_elem((float *)x, st, b, s, h, d);
}

size_t tu_padding_changed(const float *x, const int64_t st[4], const int64_t n[4], float sentinel) {
    size_t span = tu_span(st, n), changed = 0;
    unsigned char *is_elem = calloc(span ? span : 1, 1);
    if (!is_elem) abort();
    for (int64_t b = 0; b < n[0]; b++)
        for (int64_t s = 0; s < n[1]; s++)
            for (int64_t h = 0; h < n[2]; h++)
                for (int64_t d = 0; d < n[3]; d++)
                    is_elem[b * st[0] + s * st[1] + h * st[2] + d * st[3]] = 1;
    for (size_t i = 0; i < span; i++)
        if (!is_elem[i] && memcmp(&x[i], &sentinel, sizeof(float)) != 0) changed++;
    free(is_elem);
    return changed;
}

size_t tu_count_not(const float *x, size_t n, float sentinel) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&x[i], &sentinel, sizeof(float)) != 0) c++;
    return c;
}

double tu_max_abs(const float *x, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        if (fabs((double)x[i]) > m) m = fabs((double)x[i]);
    return m;
}

double tu_max_abs_d(const double *x, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(x[i]) && fabs(x[i]) > m) m = fabs(x[i]);
    return m;
}

int tu_has_nan(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (isnan(x[i])) return 1;
    return 0;
}

/* ---- logits near the float32 limit ---------------------------------------- */

void tu_fill_argmax_logits(const fmha_problem *p, float *q, float *k, double target) {
    const int64_t D = p->head_dim, skv = p->seq_kv;
    const double scale = p->scale != 0.0f ? p->scale : 1.0 / sqrt((double)D);
    /* largest |integer score| is 2D (skv/2 + 1) + D */
    const double top = (double)(2 * D * (skv / 2 + 1) + D);
    const int e = (int)floor(log2(target / (scale * top)));
    const int ea = e / 2, eb = e - ea;
    /* c [Skv]: distinct key codes, shuffled per batch and head */
    int64_t *c = malloc((size_t)skv * sizeof(int64_t));
    if (!c) abort();
    for (int64_t b = 0; b < p->batch; b++) {
        for (int64_t h = 0; h < p->heads_kv; h++) {
            for (int64_t j = 0; j < skv; j++) c[j] = j - skv / 2;
            for (int64_t j = skv - 1; j > 0; j--) {
                int64_t r = tu_int(0, j), t = c[j];
                c[j] = c[r], c[r] = t;
            }
            for (int64_t j = 0; j < skv; j++)
                for (int64_t d = 0; d < D; d++)
                    *tu_elem(k, p->k_strides, b, j, h, d) =
                        ldexpf((float)(d == 0 ? c[j] : tu_int(-1, 1)), eb);
        }
        for (int64_t i = 0; i < p->seq_q; i++)
            for (int64_t h = 0; h < p->heads_q; h++)
                for (int64_t d = 0; d < D; d++) {
                    int64_t u = d == 0 ? (tu_int(0, 1) ? 2 * D : -2 * D) : tu_int(-1, 1);
                    *tu_elem(q, p->q_strides, b, i, h, d) = ldexpf((float)u, ea);
                }
    }
    free(c);
}

void tu_fill_tied_logits(const fmha_problem *p, float *q, float *k) {
    const float big = 0x1.0p62f;
    for (int64_t b = 0; b < p->batch; b++) {
        for (int64_t j = 0; j < p->seq_kv; j++)
            for (int64_t h = 0; h < p->heads_kv; h++) {
                *tu_elem(k, p->k_strides, b, j, h, 0) = tu_int(0, 1) ? big : -big;
                for (int64_t d = 1; d < p->head_dim; d++)
                    *tu_elem(k, p->k_strides, b, j, h, d) = (float)tu_uniform(-1, 1);
            }
        for (int64_t i = 0; i < p->seq_q; i++)
            for (int64_t h = 0; h < p->heads_q; h++)
                for (int64_t d = 0; d < p->head_dim; d++)
                    *tu_elem(q, p->q_strides, b, i, h, d) = d ? 0.0f : tu_int(0, 1) ? big : -big;
    }
}

/* ---- every call also through a plan ---- */

void fmha_tiles_reset(void);
long long fmha_tiles_computed(void);
void fmha_tiles_count(long long n);

/* One output of a call: the caller's tensor (one-shot results) and the
 * plan's copy, compared at the tensor's elements. */
typedef struct tu_out {
    const char *name;
    void *at;           /* the caller's */
    char *plan;         /* the plan's, prefilled with 0xA5 bytes */
    int64_t n[4], st[4];/* elements and strides */
    size_t elem;        /* bytes an element */
} tu_out;

enum { TU_OUTS = 8 }; /* o, lse, dq, dk, dv, d_dense, d_alibi, d_rel_table */

static size_t tu_dtype_bytes(fmha_dtype t) { return t == FMHA_DTYPE_F32 ? 4 : 2; }

static void tu_out_set(tu_out *o, const char *name, void *at, const int64_t n[4], const int64_t st[4],
                       size_t elem) {
    o->name = name;
    o->at = at;
    o->plan = NULL;
    o->elem = elem;
    for (int i = 0; i < 4; i++) {
        o->n[i] = n[i];
        o->st[i] = st[i];
    }
}

static void tu_out_tensor(tu_out *o, const fmha_problem *p, const char *name, char which, void *at) {
    int64_t n[4];
    const int64_t *st = tu_shape(p, which, n);
    tu_out_set(o, name, at, n, st, tu_dtype_bytes(p->dtype));
}

static void tu_out_array(tu_out *o, const char *name, void *at, int64_t count) {
    int64_t n[4] = {1, 1, 1, count}, st[4] = {0, 0, 0, 1};
    tu_out_set(o, name, at, n, st, sizeof(float));
}

static void tu_outs_of(tu_out out[TU_OUTS], const fmha_problem *p, void *o, float *lse, void *dq,
                       void *dk, void *dv, const fmha_param_grads *g) {
    tu_out_tensor(&out[0], p, "o", 'o', o);
    tu_out_array(&out[1], "lse", lse, p->batch * p->heads_q * p->seq_q);
    tu_out_tensor(&out[2], p, "dq", 'q', dq);
    tu_out_tensor(&out[3], p, "dk", 'k', dk);
    tu_out_tensor(&out[4], p, "dv", 'v', dv);
    int64_t n[4] = {p->batch, p->heads_q, p->seq_q, p->seq_kv};
    for (int i = 0; i < 4; i++)
        if (g && g->d_dense_strides[i] == 0) n[i] = 1;
    tu_out_set(&out[5], "d_dense", g ? g->d_dense : NULL, n, g ? g->d_dense_strides : n, sizeof(float));
    tu_out_array(&out[6], "d_alibi", g ? g->d_alibi : NULL, p->heads_q);
    tu_out_array(&out[7], "d_rel_table", g ? g->d_rel_table : NULL, p->heads_q * p->biases.rel_num_buckets);
}

/* Fresh plan buffers (OK calls only: the caller's pointers are valid). */
static void tu_outs_alloc(tu_out out[TU_OUTS], void *ptr[TU_OUTS]) {
    for (int i = 0; i < TU_OUTS; i++) {
        ptr[i] = NULL;
        if (!out[i].at) continue;
        size_t bytes = tu_span(out[i].st, out[i].n) * out[i].elem;
        out[i].plan = malloc(bytes);
        if (!out[i].plan) abort();
        memset(out[i].plan, 0xA5, bytes);
        ptr[i] = out[i].plan;
    }
}

/* Elements of the plan's outputs against the one-shot's, bit for bit. */
static void tu_outs_compare(tu_out out[TU_OUTS], const char *what) {
    for (int i = 0; i < TU_OUTS; i++) {
        const tu_out *o = &out[i];
        if (!o->plan) continue;
        size_t differ = 0;
        for (int64_t a = 0; a < o->n[0]; a++)
            for (int64_t b = 0; b < o->n[1]; b++)
                for (int64_t c = 0; c < o->n[2]; c++)
                    for (int64_t d = 0; d < o->n[3]; d++) {
                        size_t at = (size_t)(a * o->st[0] + b * o->st[1] + c * o->st[2] + d * o->st[3]) * o->elem;
                        differ += memcmp((char *)o->at + at, o->plan + at, o->elem) != 0;
                    }
        tu_check(differ == 0, "%s: a reused plan's %s differs from the one-shot call's in %zu elements",
                 what, o->name, differ);
    }
}

static void tu_outs_free(tu_out out[TU_OUTS]) {
    for (int i = 0; i < TU_OUTS; i++) free(out[i].plan);
}

typedef enum { TU_FWD, TU_BWD, TU_FUSED } tu_kind;

typedef struct tu_call {
    const void *q, *k, *v, *o_in, *d_o;
    const float *lse_in;
    void *o, *dq, *dk, *dv;
    float *lse;
    const fmha_param_grads *grads;
} tu_call;

static fmha_status tu_plan_run(fmha_plan *plan, tu_kind kind, const tu_call *c, void *ptr[TU_OUTS],
                               const fmha_param_grads *g) {
    switch (kind) {
    case TU_FWD: return fmha_plan_forward(plan, c->q, c->k, c->v, ptr[0], ptr[1]);
    case TU_BWD:
        return fmha_plan_backward(plan, c->q, c->k, c->v, c->o_in, c->d_o, c->lse_in, ptr[2], ptr[3],
                                  ptr[4], g);
    case TU_FUSED:
        return fmha_plan_forward_backward(plan, c->q, c->k, c->v, c->d_o, ptr[0], ptr[1], ptr[2],
                                          ptr[3], ptr[4], g);
    }
    return FMHA_ERR_BAD_OPTION;
}

/* The same call through a plan, run twice. A failing one-shot call must
 * fail the same way (the plan gets the caller's own pointers); a valid one
 * gives the plan fresh outputs to compare. Bias callbacks that accumulate
 * gradients are left out (each run would accumulate again). */
static void tu_through_plan(const fmha_problem *p, tu_kind kind, const tu_call *c, fmha_status one_shot) {
    static const char *what[3] = {"forward", "backward", "forward_backward"};
    if (!p || p->biases.callback.accumulate_grad || one_shot == FMHA_ERR_WORKSPACE_TOO_SMALL ||
        one_shot == FMHA_ERR_OUT_OF_MEMORY)
        return;
    if (fmha_problem_check(p) != FMHA_OK) {
        fmha_plan *plan = NULL;
        fmha_status st = fmha_plan_create(p, &plan);
        tu_check(st == fmha_problem_check(p) && plan == NULL,
                 "%s: fmha_plan_create gave %d for a problem fmha_problem_check rejects with %d", what[kind],
                 st, fmha_problem_check(p));
        fmha_plan_destroy(plan);
        return;
    }
    /* emulated runs (a table's kernels): a plan runs the one-shot call's
     * planner and run function, so its bits are a property of that generic
     * code, which the native runs check on every table */
    if (tu_emulated()) return;
    long long tiles = fmha_tiles_computed();
    tu_out out[TU_OUTS];
    void *ptr[TU_OUTS] = {c->o, c->lse, c->dq, c->dk, c->dv, NULL, NULL, NULL};
    fmha_param_grads mine;
    const fmha_param_grads *g = c->grads;
    tu_outs_of(out, p, c->o, c->lse, c->dq, c->dk, c->dv, c->grads);
    if (one_shot == FMHA_OK) {
        tu_outs_alloc(out, ptr);
        if (g) {
            mine = *g;
            mine.d_dense = ptr[5];
            mine.d_alibi = ptr[6];
            mine.d_rel_table = ptr[7];
            g = &mine;
        }
    }
    fmha_plan *plan = NULL;
    fmha_status st = fmha_plan_create(p, &plan);
    if (st == FMHA_OK) {
        st = tu_plan_run(plan, kind, c, ptr, g);
        fmha_status again = tu_plan_run(plan, kind, c, ptr, g);
        tu_check(again == st, "%s: a plan's second run returned %d, its first %d", what[kind], again, st);
    }
    fmha_plan_destroy(plan);
    tu_check(st == one_shot, "%s: the plan returned %d (%s), the one-shot call %d (%s)", what[kind], st,
             fmha_status_string(st), one_shot, fmha_status_string(one_shot));
    if (one_shot == FMHA_OK && st == FMHA_OK) tu_outs_compare(out, what[kind]);
    tu_outs_free(out);
    fmha_tiles_reset();
    fmha_tiles_count(tiles);
}

fmha_status tu_forward(const fmha_problem *p, const void *q, const void *k, const void *v, void *o,
                       float *lse, void *workspace, size_t workspace_bytes) {
    fmha_status st = fmha_forward(p, q, k, v, o, lse, workspace, workspace_bytes);
    tu_call c = {.q = q, .k = k, .v = v, .o = o, .lse = lse};
    tu_through_plan(p, TU_FWD, &c, st);
    return st;
}

fmha_status tu_backward(const fmha_problem *p, const void *q, const void *k, const void *v,
                        const void *o, const void *d_o, const float *lse, void *dq, void *dk,
                        void *dv, const fmha_param_grads *grads, void *workspace,
                        size_t workspace_bytes) {
    fmha_status st = fmha_backward(p, q, k, v, o, d_o, lse, dq, dk, dv, grads, workspace, workspace_bytes);
    tu_call c = {.q = q, .k = k, .v = v, .o_in = o, .d_o = d_o, .lse_in = lse, .dq = dq, .dk = dk,
                 .dv = dv, .grads = grads};
    tu_through_plan(p, TU_BWD, &c, st);
    return st;
}

fmha_status tu_forward_backward(const fmha_problem *p, const void *q, const void *k, const void *v,
                                const void *d_o, void *o, float *lse, void *dq, void *dk, void *dv,
                                const fmha_param_grads *grads) {
    fmha_status st = fmha_forward_backward(p, q, k, v, d_o, o, lse, dq, dk, dv, grads);
    tu_call c = {.q = q, .k = k, .v = v, .d_o = d_o, .o = o, .lse = lse, .dq = dq, .dk = dk, .dv = dv,
                 .grads = grads};
    tu_through_plan(p, TU_FUSED, &c, st);
    return st;
}

void tu_ragged_kv_lengths(int64_t B, int64_t skv, int32_t *kv_len) {
    for (int64_t b = 0; b < B; b++) kv_len[b] = (int32_t)(b == 0 ? skv : tu_int(b == 2 ? 0 : 1, skv));
}

int32_t *tu_page_table(int64_t B, int64_t skv, int64_t page, const int32_t *kv_len, int64_t *stride,
                       int64_t *pages) {
    int64_t w = (skv + page - 1) / page + 1, n = B * (w - 1) + 1;
    /* perm [n]: a shuffled order of the pool's pages */
    int32_t *perm = malloc((size_t)n * sizeof(int32_t)), *table = malloc((size_t)(B * w) * sizeof(int32_t));
    for (int64_t i = 0; i < n; i++) perm[i] = (int32_t)i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = tu_int(0, i);
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t pg = 0; pg < w; pg++) table[b * w + pg] = pg * page < kv_len[b] ? perm[b * (w - 1) + pg] : -1;
    free(perm);
    *stride = w;
    *pages = n;
    return table;
}

int tu_planned_driver(const fmha_problem *p, const struct fmha_fwd_driver *driver) {
    fmha_plan *plan = NULL;
    if (fmha_plan_create(p, &plan) != FMHA_OK) return -1;
    const int on = plan->driver == driver;
    fmha_plan_destroy(plan);
    return on;
}

void tu_plan_line(const fmha_problem *p, char *line, size_t n) {
    fmha_plan *plan = NULL;
    line[0] = '\0';
    if (fmha_plan_create(p, &plan) == FMHA_OK) fmha_plan_describe(plan, line, n);
    fmha_plan_destroy(plan);
}

int tu_quantized_query(const fmha_problem *p) {
    char line[1024];
    tu_plan_line(p, line, sizeof line);
    return strstr(line, " scores=integer") != NULL || strstr(line, " scores=bf16") != NULL;
}

const char *tu_isa_best(void) {
    for (size_t i = 0; i < fmha_isa_count(); i++)
        if (fmha_isa_supported(fmha_isa_at(i))) return fmha_isa_at(i)->name;
    return "scalar";
}

/* FMHA_TEST_ISAS=a,b: the tests run only these ISAs (scalar, the
 * specification, stays available by name); set before any test's first
 * call. */
__attribute__((constructor)) static void tu_limit_isas(void) {
    const char *only = getenv("FMHA_TEST_ISAS");
    if (only && *only) fmha_cpu_limit_isas(only);
}

int tu_isa_variants;

/* 1 when tables a and b differ in no more than the quantized caches'
 * integer and bf16 kernels (avx512vnni and avx512, neondot and neon). */
static int tu_same_but_quantized(const fmha_ukernels *a, const fmha_ukernels *b) {
    fmha_ukernels x = *a, y = *b;
    for (int f = 0; f < FMHA_FORMAT_COUNT; f++) {
        x.cache[f].scores_q8 = y.cache[f].scores_q8 = NULL;
        x.cache[f].values_int = y.cache[f].values_int = NULL;
        x.cache[f].scores_bf16 = y.cache[f].scores_bf16 = NULL;
    }
    x.isa = y.isa = NULL, x.tuning = y.tuning = NULL;
    return !memcmp(&x, &y, sizeof x);
}

int tu_isa_runs(const fmha_isa *isa) {
    if (!fmha_isa_supported(isa)) return 0;
    /* a table that differs from another only in the quantized caches'
     * kernels runs once: the one with them (or the first) */
    const int mine = isa->table->cache[FMHA_FORMAT_INT8].scores_q8 != NULL;
    for (size_t j = 0; j < fmha_isa_count() && !tu_isa_variants; j++) {
        const fmha_isa *other = fmha_isa_at(j);
        const int theirs = other->table->cache[FMHA_FORMAT_INT8].scores_q8 != NULL;
        if (other != isa && fmha_isa_supported(other) && tu_same_but_quantized(isa->table, other->table) &&
            (theirs > mine || (theirs == mine && other < isa)))
            return 0;
    }
    return 1;
}

int tu_isa_shape(const fmha_isa *isa, size_t shape, fmha_trial *trial) {
    const fmha_uk_tile *t = fmha_cpu_f32_tile_at(isa->table, shape);
    if (!t) return -1;
    fmha_tuning tuning = *isa->table->tuning;
    tuning.tile_mr = (int64_t)t->mr, tuning.tile_nr = (int64_t)t->nr;
    if (fmha_cpu_trial(isa->name, &tuning, trial) != 0) return -1;
    /* the trial's float32 tiles are the shape's */
    return trial->ctx.f32->tile.gemm == t->gemm ? 0 : -1;
}

/* The trial of the run in use (tu_isa_run); plans made in a run end in it. */
static fmha_trial tu_trial;

int tu_isa_run(size_t r, int shapes, char *label, size_t label_size) {
    const int first = r == 0;
    for (size_t i = 0; i < fmha_isa_count(); i++) {
        const fmha_isa *isa = fmha_isa_at(i);
        if (!tu_isa_runs(isa)) {
            if (first)
                printf("skip: %s (this CPU lacks it, FMHA_TEST_ISAS leaves it out, or another table has its kernels)\n",
                       isa->name);
            continue;
        }
        /* the other shapes once per tile part: on the first table that runs them */
        int walked = 0;
        for (size_t j = 0; j < i && shapes; j++)
            walked |= tu_isa_runs(fmha_isa_at(j)) && fmha_isa_at(j)->table->tile.shapes &&
                      fmha_isa_at(j)->table->tile.shapes == isa->table->tile.shapes;
        const fmha_uk_tile *t;
        for (size_t s = 0; (t = fmha_cpu_f32_tile_at(isa->table, s)) != NULL && (s == 0 || (shapes && !walked));
             s++, r--) {
            if (r) continue;
            if (s == 0) {
                snprintf(label, label_size, "%s", isa->name);
                fmha_cpu_force_isa(isa->name);
                return 1;
            }
            snprintf(label, label_size, "%s tile %zux%zu", isa->name, t->mr, t->nr);
            if (!tu_check(tu_isa_shape(isa, s, &tu_trial) == 0, "%s: a trial on float32 tile %zux%zu", isa->name,
                          t->mr, t->nr)) {
                snprintf(label, label_size, "%s", isa->name); /* the own tiles again: a failure is reported */
                fmha_cpu_force_isa(isa->name);
                return 1;
            }
            fmha_cpu_force_context(&tu_trial.ctx);
            return 1;
        }
    }
    fmha_cpu_force_isa(tu_isa_best());
    return 0;
}

void tu_each_isa(void (*fn)(const char *isa)) {
    char label[64];
    for (size_t r = 0; tu_isa_run(r, 0, label, sizeof label); r++) fn(label);
}

void tu_each_isa_shape(void (*fn)(const char *isa)) {
    char label[64];
    for (size_t r = 0; tu_isa_run(r, 1, label, sizeof label); r++) fn(label);
}
