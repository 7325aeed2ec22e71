/* test_plan.c: what the plan API promises beyond giving the one-shot
 * results (every forward/backward test runs through a reused plan as well,
 * see tu_forward in test_util.c): argument errors, the problem copied at
 * creation, length arrays, sinks and slopes re-read and re-checked at every run, workspace
 * allocated by the first run of each direction and never again, thread-count
 * changes between runs, and concurrent runs on one plan. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/attn.h"
#include "config/cpu.h"
#include "test_util.h"

typedef struct tensors {
    fmha_problem p;
    float *q, *k, *v, *d_o, *o, *lse, *dq, *dk, *dv;
    size_t o_span, lse_n;
} tensors;

static void tensors_new(tensors *t, int64_t B, int64_t H, int64_t Sq, int64_t Skv, int64_t D) {
    fmha_problem_init(&t->p, B, H, H, Sq, Skv, D, D, FMHA_LAYOUT_BSHD);
    t->q = tu_new_input(&t->p, 'q', -1, 1);
    t->k = tu_new_input(&t->p, 'k', -1, 1);
    t->v = tu_new_input(&t->p, 'v', -1, 1);
    t->d_o = tu_new_input(&t->p, 'o', -1, 1);
    t->o = tu_new_output(&t->p, 'o', 0.0f);
    t->dq = tu_new_output(&t->p, 'q', 0.0f);
    t->dk = tu_new_output(&t->p, 'k', 0.0f);
    t->dv = tu_new_output(&t->p, 'v', 0.0f);
    int64_t n[4];
    tu_shape(&t->p, 'o', n);
    t->o_span = tu_span(t->p.o_strides, n);
    t->lse_n = (size_t)(B * H * Sq);
    t->lse = calloc(t->lse_n, sizeof(float));
}

static void tensors_free(tensors *t) {
    free(t->q); free(t->k); free(t->v); free(t->d_o); free(t->o); free(t->lse);
    free(t->dq); free(t->dk); free(t->dv);
}

static void test_arguments(void) {
    tensors t;
    tensors_new(&t, 1, 2, 9, 9, 8);
    fmha_plan *plan = NULL;
    tu_check(fmha_plan_create(NULL, &plan) == FMHA_ERR_NULL_POINTER && plan == NULL, "plan_create(NULL problem)");
    tu_check(fmha_plan_create(&t.p, NULL) == FMHA_ERR_NULL_POINTER, "plan_create(NULL out)");
    fmha_problem bad = t.p;
    bad.heads_kv = 3;
    tu_check(fmha_plan_create(&bad, &plan) == FMHA_ERR_BAD_HEADS && plan == NULL, "plan_create validates");
    tu_check(fmha_plan_forward(NULL, t.q, t.k, t.v, t.o, t.lse) == FMHA_ERR_NULL_POINTER, "plan_forward(NULL)");
    tu_check(fmha_plan_backward(NULL, t.q, t.k, t.v, t.o, t.d_o, t.lse, t.dq, t.dk, t.dv, NULL) ==
                 FMHA_ERR_NULL_POINTER, "plan_backward(NULL)");
    tu_check(fmha_plan_forward_backward(NULL, t.q, t.k, t.v, t.d_o, t.o, t.lse, t.dq, t.dk, t.dv, NULL) ==
                 FMHA_ERR_NULL_POINTER, "plan_forward_backward(NULL)");
    tu_check(fmha_plan_problem(NULL) == NULL && fmha_plan_workspace_held(NULL) == 0, "NULL plan queries");
    fmha_plan_destroy(NULL);

    tu_check(fmha_plan_create(&t.p, &plan) == FMHA_OK, "plan_create");
    tu_check(fmha_plan_forward(plan, t.q, t.k, NULL, t.o, t.lse) == FMHA_ERR_NULL_POINTER, "run: NULL v");
    tu_check(fmha_plan_forward(plan, t.q, t.k, t.v, t.q, t.lse) == FMHA_ERR_OVERLAP, "run: O over Q");
    tu_check(fmha_plan_backward(plan, t.q, t.k, t.v, t.o, t.d_o, t.lse, t.dq, t.dk, t.q, NULL) ==
                 FMHA_ERR_OVERLAP, "run: dV over Q");
    tu_check(tu_count_not(t.o, t.o_span, 0.0f) == 0, "failed runs write nothing");
    /* the plan holds its own copy of the problem */
    int64_t seq = t.p.seq_q;
    t.p.seq_q = 1000;
    tu_check(fmha_plan_problem(plan)->seq_q == seq, "the plan copied the problem");
    t.p.seq_q = seq;
    fmha_plan_destroy(plan);
    tensors_free(&t);
}

/* The first run of a direction allocates; later runs of it allocate nothing. */
static void test_workspace_held(void) {
    tensors t;
    tensors_new(&t, 2, 2, 70, 150, 16);
    fmha_plan *plan;
    if (!tu_check(fmha_plan_create(&t.p, &plan) == FMHA_OK, "plan_create")) return;
    tu_check(fmha_plan_workspace_held(plan) == 0, "no workspace before the first run");
    tu_check(fmha_plan_forward(plan, t.q, t.k, t.v, t.o, t.lse) == FMHA_OK, "forward");
    size_t fwd = fmha_plan_workspace_held(plan);
    size_t want;
    fmha_forward_workspace_size(&t.p, &want);
    tu_check(fwd == want, "the forward holds what fmha_forward_workspace_size says (%zu, %zu)", fwd, want);
    tu_check(fmha_plan_forward(plan, t.q, t.k, t.v, t.o, t.lse) == FMHA_OK &&
                 fmha_plan_workspace_held(plan) == fwd, "a second forward allocates nothing");
    tu_check(fmha_plan_backward(plan, t.q, t.k, t.v, t.o, t.d_o, t.lse, t.dq, t.dk, t.dv, NULL) == FMHA_OK,
             "backward");
    size_t both = fmha_plan_workspace_held(plan);
    tu_check(fmha_plan_forward(plan, t.q, t.k, t.v, t.o, t.lse) == FMHA_OK &&
                 fmha_plan_backward(plan, t.q, t.k, t.v, t.o, t.d_o, t.lse, t.dq, t.dk, t.dv, NULL) == FMHA_OK &&
                 fmha_plan_workspace_held(plan) == both, "later runs allocate nothing (%zu)", both);
    fmha_plan_destroy(plan);
    tensors_free(&t);
}

/* Lengths are read at every run: new contents give new results, bad ones
 * an error with nothing written. */
static void test_lengths_reread(void) {
    tensors t;
    tensors_new(&t, 2, 1, 20, 40, 8);
    int32_t kv_lengths[2] = {40, 17};
    t.p.masks.kv_lengths = kv_lengths;
    t.p.causal = FMHA_CAUSAL_BOTTOM_RIGHT;
    fmha_plan *plan;
    if (!tu_check(fmha_plan_create(&t.p, &plan) == FMHA_OK, "plan_create")) return;
    float *ref = malloc(t.o_span * sizeof(float)), *ref_lse = malloc(t.lse_n * sizeof(float));
    int32_t steps[3][2] = {{40, 17}, {5, 33}, {0, 40}};
    for (int s = 0; s < 3; s++) {
        kv_lengths[0] = steps[s][0];
        kv_lengths[1] = steps[s][1];
        fmha_forward(&t.p, t.q, t.k, t.v, t.o, t.lse, NULL, 0);
        memcpy(ref, t.o, t.o_span * sizeof(float));
        memcpy(ref_lse, t.lse, t.lse_n * sizeof(float));
        tu_check(fmha_plan_forward(plan, t.q, t.k, t.v, t.o, t.lse) == FMHA_OK &&
                     memcmp(ref, t.o, t.o_span * sizeof(float)) == 0 &&
                     memcmp(ref_lse, t.lse, t.lse_n * sizeof(float)) == 0,
                 "kv_lengths {%d, %d}: the plan reads the new lengths", steps[s][0], steps[s][1]);
    }
    kv_lengths[1] = 41;
    for (size_t i = 0; i < t.o_span; i++) t.o[i] = 7.0f;
    tu_check(fmha_plan_forward(plan, t.q, t.k, t.v, t.o, t.lse) == FMHA_ERR_BAD_MASK &&
                 tu_count_not(t.o, t.o_span, 7.0f) == 0,
             "a length past Skv at run time: FMHA_ERR_BAD_MASK, nothing written");
    fmha_plan_destroy(plan);
    /* sinks and slopes are re-read too: a NaN set after creation is refused */
    kv_lengths[1] = 17;
    float sinks[1] = {0.5f}, slopes[1] = {0.25f};
    t.p.sinks = sinks;
    t.p.biases.alibi_slopes = slopes;
    if (!tu_check(fmha_plan_create(&t.p, &plan) == FMHA_OK, "plan_create with sinks")) return;
    sinks[0] = NAN;
    tu_check(fmha_plan_forward(plan, t.q, t.k, t.v, t.o, t.lse) == FMHA_ERR_BAD_MASK &&
                 tu_count_not(t.o, t.o_span, 7.0f) == 0,
             "a NaN sink set after plan_create: FMHA_ERR_BAD_MASK, nothing written");
    sinks[0] = 0.5f;
    slopes[0] = INFINITY;
    tu_check(fmha_plan_forward(plan, t.q, t.k, t.v, t.o, t.lse) == FMHA_ERR_BAD_MASK &&
                 tu_count_not(t.o, t.o_span, 7.0f) == 0,
             "an infinite slope set after plan_create: FMHA_ERR_BAD_MASK, nothing written");
    free(ref);
    free(ref_lse);
    fmha_plan_destroy(plan);
    tensors_free(&t);
}

/* A plan made with one thread runs with more after fmha_set_num_threads,
 * with the same bits. */
static void test_thread_count_changes(void) {
    tensors t;
    tensors_new(&t, 1, 4, 100, 300, 32);
    fmha_set_num_threads(1);
    fmha_plan *plan;
    if (!tu_check(fmha_plan_create(&t.p, &plan) == FMHA_OK, "plan_create")) return;
    tu_check(fmha_plan_forward_backward(plan, t.q, t.k, t.v, t.d_o, t.o, t.lse, t.dq, t.dk, t.dv, NULL) == FMHA_OK,
             "one thread");
    int64_t n[4];
    tu_shape(&t.p, 'q', n);
    size_t nq = tu_span(t.p.q_strides, n);
    float *o1 = malloc(t.o_span * sizeof(float)), *dq1 = malloc(nq * sizeof(float));
    memcpy(o1, t.o, t.o_span * sizeof(float));
    memcpy(dq1, t.dq, nq * sizeof(float));
    size_t held1 = fmha_plan_workspace_held(plan);
    fmha_set_num_threads(3);
    tu_check(fmha_plan_forward_backward(plan, t.q, t.k, t.v, t.d_o, t.o, t.lse, t.dq, t.dk, t.dv, NULL) == FMHA_OK,
             "three threads");
    tu_check(memcmp(o1, t.o, t.o_span * sizeof(float)) == 0 && memcmp(dq1, t.dq, nq * sizeof(float)) == 0,
             "the same bits with 1 and 3 threads");
    tu_check(fmha_plan_workspace_held(plan) > held1, "the workspace grew with the thread count");
    fmha_set_num_threads(0);
    free(o1);
    free(dq1);
    fmha_plan_destroy(plan);
    tensors_free(&t);
}

/* Two user threads run one plan at once: runs take turns, results equal. */
typedef struct shared_run {
    fmha_plan *plan;
    tensors *t;
    float *o;
    float *lse;
    int ok;
} shared_run;

static void *run_many(void *arg) {
    shared_run *r = arg;
    r->ok = 1;
    for (int i = 0; i < 20; i++)
        r->ok &= fmha_plan_forward(r->plan, r->t->q, r->t->k, r->t->v, r->o, r->lse) == FMHA_OK;
    return NULL;
}

static void test_concurrent_runs(void) {
    tensors t;
    tensors_new(&t, 1, 2, 90, 90, 16);
    fmha_plan *plan;
    if (!tu_check(fmha_plan_create(&t.p, &plan) == FMHA_OK, "plan_create")) return;
    fmha_forward(&t.p, t.q, t.k, t.v, t.o, t.lse, NULL, 0);
    shared_run r[2];
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        r[i] = (shared_run){plan, &t, calloc(t.o_span, sizeof(float)), calloc(t.lse_n, sizeof(float)), 0};
        pthread_create(&th[i], NULL, run_many, &r[i]);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        tu_check(r[i].ok && memcmp(r[i].o, t.o, t.o_span * sizeof(float)) == 0 &&
                     memcmp(r[i].lse, t.lse, t.lse_n * sizeof(float)) == 0,
                 "thread %d: concurrent runs on one plan give the one-shot bits", i);
        free(r[i].o);
        free(r[i].lse);
    }
    fmha_plan_destroy(plan);
    tensors_free(&t);
}

/* A table's per-thread hooks run around every driver's tasks: the tiled
 * forward, the backward and the decode driver call begin before a thread's
 * first task and end after its last, balanced, and the results keep their
 * bits. */
static atomic_int hooks_begun, hooks_ended, hooks_unbalanced;
static _Thread_local int hooks_inside;

static void count_begin(void) {
    hooks_unbalanced += hooks_inside;
    hooks_inside = 1;
    hooks_begun++;
}

static void count_end(void) {
    hooks_unbalanced += !hooks_inside;
    hooks_inside = 0;
    hooks_ended++;
}

static void test_thread_hooks(void) {
    for (int decode = 0; decode < 2; decode++) {
        tensors t;
        tensors_new(&t, 1, 4, decode ? 1 : 100, 300, 32);
        float *o1 = calloc(t.o_span, sizeof(float)), *dq1 = NULL;
        int64_t n[4];
        tu_shape(&t.p, 'q', n);
        size_t nq = tu_span(t.p.q_strides, n);
        fmha_plan *plan;
        if (!tu_check(fmha_plan_create(&t.p, &plan) == FMHA_OK, "plan_create")) return;
        tu_check(fmha_plan_forward_backward(plan, t.q, t.k, t.v, t.d_o, t.o, t.lse, t.dq, t.dk, t.dv, NULL) ==
                     FMHA_OK,
                 "without hooks");
        memcpy(o1, t.o, t.o_span * sizeof(float));
        dq1 = malloc(nq * sizeof(float));
        memcpy(dq1, t.dq, nq * sizeof(float));
        fmha_ukernels hooked = *plan->uk;
        hooked.thread = (fmha_uk_thread){count_begin, count_end, NULL};
        plan->uk = &hooked;
        hooks_begun = hooks_ended = 0;
        tu_check(fmha_plan_forward(plan, t.q, t.k, t.v, t.o, t.lse) == FMHA_OK, "forward with hooks");
        tu_check(hooks_begun >= 1 && hooks_begun == hooks_ended && (plan->driver == &fmha_fwd_driver_decode) == decode,
                 "%s forward: %d begins, %d ends", decode ? "decode" : "tiled", (int)hooks_begun, (int)hooks_ended);
        tu_check(fmha_plan_forward_backward(plan, t.q, t.k, t.v, t.d_o, t.o, t.lse, t.dq, t.dk, t.dv, NULL) ==
                     FMHA_OK,
                 "forward and backward with hooks");
        tu_check(hooks_begun >= 2 && hooks_begun == hooks_ended && !hooks_unbalanced,
                 "backward: %d begins, %d ends, %d unbalanced", (int)hooks_begun, (int)hooks_ended,
                 (int)hooks_unbalanced);
        tu_check(!memcmp(o1, t.o, t.o_span * sizeof(float)) && !memcmp(dq1, t.dq, nq * sizeof(float)),
                 "the same bits with hooks");
        fmha_plan_destroy(plan);
        free(o1);
        free(dq1);
        tensors_free(&t);
    }
}

/* fmha_plan_describe names the driver, the table, the path and the formats,
 * and truncates as snprintf does. */
static void test_describe(void) {
    char line[1024], tiny[8];
    fmha_problem p;
    fmha_problem_init(&p, 1, 8, 2, 300, 400, 64, 64, FMHA_LAYOUT_BSHD);
    fmha_plan *plan;
    if (!tu_check(fmha_plan_create(&p, &plan) == FMHA_OK, "plan_create")) return;
    size_t n = fmha_plan_describe(plan, line, sizeof line);
    char want[64];
    snprintf(want, sizeof want, "isa=%s ", fmha_isa_name());
    tu_check(n == strlen(line) && strstr(line, "driver=tiled ") && strstr(line, want) && strstr(line, "path=f32 ") &&
                 strstr(line, "k_format=f32 v_format=f32 ") && strstr(line, "cpu=\""),
             "describe, tiled float32: %s", line);
    tu_check(fmha_plan_describe(plan, tiny, sizeof tiny) == n && strlen(tiny) == sizeof tiny - 1 &&
                 !strncmp(tiny, line, sizeof tiny - 1) && fmha_plan_describe(plan, NULL, 0) == n,
             "describe truncates as snprintf and returns the whole length");
    fmha_plan_destroy(plan);
    p.seq_q = 1;
    p.dtype = FMHA_DTYPE_F32;
    p.kv_dtype = FMHA_KV_DTYPE_BF16;
    if (tu_check(fmha_plan_create(&p, &plan) == FMHA_OK, "plan_create decode")) {
        fmha_plan_describe(plan, line, sizeof line);
        tu_check(strstr(line, "k_format=bf16 v_format=bf16 ") &&
                     strstr(line, fmha_cpu_kernels()->decode.softmax ? "driver=decode " : "driver="),
                 "describe, a bf16 cache: %s", line);
        fmha_plan_destroy(plan);
    }
    fmha_problem_init(&p, 1, 2, 2, 8, 8, 16, 16, FMHA_LAYOUT_BSHD);
    p.dtype = FMHA_DTYPE_BF16;
    if (tu_check(fmha_plan_create(&p, &plan) == FMHA_OK, "plan_create dense")) {
        fmha_plan_describe(plan, line, sizeof line);
        tu_check(strstr(line, "driver=dense ") &&
                     strstr(line, fmha_cpu_kernels()->bf16.gemm ? "path=bf16 precision=fast " : "path=widened "),
                 "describe, small bf16: %s", line);
        fmha_plan_destroy(plan);
    }
    n = fmha_plan_describe(NULL, line, sizeof line);
    tu_check(n == strlen(line) && !strncmp(line, "no plan; cpu=\"", 14), "describe NULL: %s", line);
    printf("%s\n", line);
}

/* After each caller's callback the table's foreign hook runs (AMX tiles are
 * configured again before the next tile instruction). */
static atomic_int foreign_calls;
static void count_foreign(void) { foreign_calls++; }
static int all_partial(void *ctx, const fmha_tile *t) { return FMHA_TILE_CLASS_PARTIAL; }
static void all_visible(void *ctx, const fmha_tile *t, uint8_t *vis) {}

static void test_foreign_hook(void) {
    tensors t;
    tensors_new(&t, 1, 2, 70, 150, 16);
    t.p.masks.callback.classify = all_partial;
    t.p.masks.callback.fill = all_visible;
    fmha_plan *plan;
    if (!tu_check(fmha_plan_create(&t.p, &plan) == FMHA_OK, "plan_create")) return;
    float *o1 = calloc(t.o_span, sizeof(float));
    tu_check(fmha_plan_forward(plan, t.q, t.k, t.v, o1, t.lse) == FMHA_OK, "forward");
    fmha_ukernels hooked = *plan->uk;
    hooked.thread = (fmha_uk_thread){count_begin, count_end, count_foreign};
    plan->uk = &hooked;
    foreign_calls = 0;
    tu_check(fmha_plan_forward(plan, t.q, t.k, t.v, t.o, t.lse) == FMHA_OK, "forward with hooks");
    tu_check(foreign_calls >= 2 && !memcmp(o1, t.o, t.o_span * sizeof(float)),
             "a mask callback's tiles: %d foreign hooks, the same bits", (int)foreign_calls);
    fmha_plan_destroy(plan);
    free(o1);
    tensors_free(&t);
}

int main(void) {
    tu_seed();
    test_foreign_hook();
    test_describe();
    test_thread_hooks();
    test_arguments();
    test_workspace_held();
    test_lengths_reread();
    test_thread_count_changes();
    test_concurrent_runs();
    return tu_finish();
}
