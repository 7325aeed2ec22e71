/* test_errors.c: every documented error of the entry points. Each case has
 * exactly one thing wrong and must return its status, leave every output
 * (O, lse, dQ, dK, dV, filled with a sentinel) untouched, and agree with
 * fmha_problem_check and the workspace size queries where those apply. Also
 * fmha_status_string (non-empty, distinct texts) and fmha_set_num_threads
 * bounds. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"

#define BUF 8192 /* floats per buffer: room for every (even wrong) shape used */

static float sent;
/* q, k, v, o, d_o inputs/outputs and lse; dq, dk, dv gradients */
static float *q, *k, *v, *o, *d_o, *lse, *dq, *dk, *dv;

static void reset_outputs(void) {
    float *outs[5] = {o, lse, dq, dk, dv};
    for (int t = 0; t < 5; t++)
        for (int i = 0; i < BUF; i++) outs[t][i] = sent;
}

static int outputs_untouched(void) {
    return tu_count_not(o, BUF, sent) == 0 && tu_count_not(lse, BUF, sent) == 0 &&
           tu_count_not(dq, BUF, sent) == 0 && tu_count_not(dk, BUF, sent) == 0 &&
           tu_count_not(dv, BUF, sent) == 0;
}

/* The valid problem every case starts from: GQA 4/2, Sq 5, Skv 7, D 8, Dv 6. */
static fmha_problem base(void) {
    fmha_problem p;
    fmha_problem_init(&p, 2, 4, 2, 5, 7, 8, 6, FMHA_LAYOUT_BSHD);
    return p;
}

/* Forward with its arguments; checks the status and that nothing was written. */
static void expect_fwd(const char *what, const fmha_problem *p, const void *qq, const void *kk,
                       const void *vv, void *oo, float *ll, void *ws, size_t ws_bytes,
                       fmha_status want) {
    reset_outputs();
    fmha_status st = tu_forward(p, qq, kk, vv, oo, ll, ws, ws_bytes);
    tu_check(st == want, "forward, %s: status %d (%s), want %d", what, (int)st,
             fmha_status_string(st), (int)want);
    if (want != FMHA_OK) tu_check(outputs_untouched(), "forward, %s: an output was written", what);
    /* the detail: a sentence after a failure, "" after a success */
    st = fmha_forward(p, qq, kk, vv, oo, ll, ws, ws_bytes);
    const char *msg = fmha_last_error_message();
    tu_check(st == want && msg && (want == FMHA_OK) == (msg[0] == '\0'),
             "forward, %s: fmha_last_error_message \"%s\" after status %d", what, msg ? msg : "(NULL)", (int)st);
}

/* The detail names the argument at fault and what it got. */
static void expect_message(const char *what, const fmha_problem *p, const char *part1, const char *part2) {
    fmha_status st = fmha_problem_check(p);
    const char *msg = fmha_last_error_message();
    tu_check(st != FMHA_OK && strstr(msg, part1) && strstr(msg, part2),
             "%s: the message \"%s\" names \"%s\" and \"%s\"", what, msg, part1, part2);
}

static void check_messages(void) {
    fmha_problem e = base();
    e.head_dim = 1000;
    expect_message("head_dim", &e, "head_dim must lie in 1..", "got 1000");
    e = base();
    e.heads_kv = 3;
    expect_message("heads", &e, "heads_q must be a multiple of heads_kv", "got 4 and 3");
    e = base();
    int32_t lens[2] = {7, 20};
    e.masks.kv_lengths = lens;
    expect_message("kv_lengths", &e, "masks.kv_lengths[1] must lie in 0..seq_kv = 7", "got 20");
    e = base();
    e.k_strides[1] = -1;
    expect_message("k stride", &e, "k_strides[1] must not be negative", "got -1");
    e = base();
    e.scale = NAN;
    expect_message("scale", &e, "scale must be finite", "nan");
    e = base();
    e.struct_size = 12;
    expect_message("struct_size", &e, "struct_size must be sizeof(fmha_problem)", "got 12");
    e = base();
    float slopes[4] = {1, 2, INFINITY, 4};
    e.biases.alibi_slopes = slopes;
    expect_message("alibi", &e, "biases.alibi_slopes[2] must be finite", "inf");
    e = base();
    tu_check(fmha_forward(&e, q, NULL, v, NULL, lse, NULL, 0) == FMHA_ERR_NULL_POINTER &&
                 !strcmp(fmha_last_error_message(), "k, o must not be NULL"),
             "null pointers named: \"%s\"", fmha_last_error_message());
    e = base();
    tu_check(fmha_forward(&e, q, k, v, q, lse, NULL, 0) == FMHA_ERR_OVERLAP &&
                 !strcmp(fmha_last_error_message(), "the output o overlaps the input q in memory"),
             "overlap named: \"%s\"", fmha_last_error_message());
    tu_check(fmha_forward(&e, q, k, v, o, lse, NULL, 0) == FMHA_OK && !strcmp(fmha_last_error_message(), ""),
             "a successful call clears the message");
    /* a paged problem with seq_kv near INT64_MAX: the table's width is
     * checked without overflowing seq_kv + page_size - 1 (UBSan failed the
     * old arithmetic here) */
    e = base();
    int32_t table[4] = {0, 1, 2, 3};
    e.block_table = table;
    e.block_table_stride = 4;
    e.page_size = 4;
    e.num_pages = 4;
    e.seq_kv = INT64_MAX - 1;
    tu_check(fmha_problem_check(&e) == FMHA_ERR_BAD_PAGE &&
                 strstr(fmha_last_error_message(), "block_table_stride must be at least ceil(seq_kv / page_size)"),
             "seq_kv near INT64_MAX with a block table: \"%s\"", fmha_last_error_message());
    tu_check(fmha_set_num_threads(-3) == FMHA_ERR_BAD_THREAD_COUNT && strstr(fmha_last_error_message(), "got -3"),
             "thread count named: \"%s\"", fmha_last_error_message());
}

/* A problem-level error: the forward, both size queries and fmha_problem_check
 * all report it (and the queries leave *bytes alone). */
static void expect_problem(const char *what, const fmha_problem *p, fmha_status want) {
    expect_fwd(what, p, q, k, v, o, lse, NULL, 0, want);
    tu_check(fmha_problem_check(p) == want, "problem_check, %s: status %d, want %d", what,
             (int)fmha_problem_check(p), (int)want);
    tu_check((want == FMHA_OK) == (fmha_last_error_message()[0] == '\0'), "problem_check, %s: message \"%s\"", what,
             fmha_last_error_message());
    size_t bytes = 12345;
    fmha_status st = fmha_forward_workspace_size(p, &bytes);
    tu_check(st == want && (want == FMHA_OK || bytes == 12345),
             "forward_workspace_size, %s: status %d", what, (int)st);
    bytes = 12345;
    st = fmha_backward_workspace_size(p, &bytes);
    tu_check(st == want && (want == FMHA_OK || bytes == 12345),
             "backward_workspace_size, %s: status %d", what, (int)st);
    reset_outputs();
    st = tu_backward(p, q, k, v, o, d_o, lse, dq, dk, dv, NULL, NULL, 0);
    tu_check(st == want && (want == FMHA_OK || outputs_untouched()),
             "backward, %s: status %d, want %d", what, (int)st, (int)want);
    reset_outputs();
    st = tu_forward_backward(p, q, k, v, d_o, o, lse, dq, dk, dv, NULL);
    tu_check(st == want && (want == FMHA_OK || outputs_untouched()),
             "forward_backward, %s: status %d, want %d", what, (int)st, (int)want);
}

static void check_status_strings(void) {
    const char *texts[FMHA_ERR_CALLBACK + 1];
    for (int s = 0; s <= FMHA_ERR_CALLBACK; s++) {
        texts[s] = fmha_status_string((fmha_status)s);
        tu_check(texts[s] && texts[s][0], "status %d has no text", s);
        for (int t = 0; t < s; t++)
            tu_check(!texts[s] || !texts[t] || strcmp(texts[s], texts[t]) != 0,
                     "statuses %d and %d share the text \"%s\"", t, s, texts[s]);
    }
    const char *unknown = fmha_status_string((fmha_status)999);
    tu_check(unknown && unknown[0], "an unknown status has no text");
}

static void check_threads(void) {
    tu_check(fmha_set_num_threads(3) == FMHA_OK && fmha_get_num_threads() == 3, "set 3 threads");
    tu_check(fmha_set_num_threads(-1) == FMHA_ERR_BAD_THREAD_COUNT, "set -1 threads");
    tu_check(fmha_set_num_threads(100000) == FMHA_ERR_BAD_THREAD_COUNT, "set 100000 threads");
    tu_check(fmha_set_num_threads(1025) == FMHA_ERR_BAD_THREAD_COUNT, "set 1025 threads");
    tu_check(fmha_get_num_threads() == 3, "a refused count changed the thread count to %d",
             fmha_get_num_threads());
    tu_check(fmha_set_num_threads(0) == FMHA_OK && fmha_get_num_threads() >= 1,
             "set 0 (default) threads");
}

static void forward_errors(void) {
    fmha_problem p = base(), e;
    /* the base problem is valid */
    expect_problem("no error", &p, FMHA_OK);
    /* NULL pointers */
    expect_fwd("q NULL", &p, NULL, k, v, o, lse, NULL, 0, FMHA_ERR_NULL_POINTER);
    expect_fwd("k NULL", &p, q, NULL, v, o, lse, NULL, 0, FMHA_ERR_NULL_POINTER);
    expect_fwd("v NULL", &p, q, k, NULL, o, lse, NULL, 0, FMHA_ERR_NULL_POINTER);
    expect_fwd("o NULL", &p, q, k, v, NULL, lse, NULL, 0, FMHA_ERR_NULL_POINTER);
    expect_fwd("problem NULL", NULL, q, k, v, o, lse, NULL, 0, FMHA_ERR_NULL_POINTER);
    tu_check(fmha_problem_check(NULL) == FMHA_ERR_NULL_POINTER, "problem_check(NULL)");
    size_t bytes = 12345;
    tu_check(fmha_forward_workspace_size(NULL, &bytes) == FMHA_ERR_NULL_POINTER && bytes == 12345,
             "forward_workspace_size(NULL, ..)");
    tu_check(fmha_forward_workspace_size(&p, NULL) == FMHA_ERR_NULL_POINTER,
             "forward_workspace_size(.., NULL)");
    tu_check(fmha_backward_workspace_size(&p, NULL) == FMHA_ERR_NULL_POINTER,
             "backward_workspace_size(.., NULL)");
    /* sizes (strides kept from the valid problem: they stay valid for smaller extents) */
    static const struct { const char *what; int field; int64_t value; } sizes[] = {
        {"batch 0", 0, 0},     {"batch -1", 0, -1},   {"heads_q 0", 1, 0},
        {"heads_q -4", 1, -4}, {"heads_kv 0", 2, 0},  {"heads_kv -2", 2, -2},
        {"seq_q 0", 3, 0},     {"seq_q -5", 3, -5},   {"seq_kv 0", 4, 0},
        {"seq_kv -1", 4, -1},
    };
    for (int i = 0; i < (int)(sizeof sizes / sizeof sizes[0]); i++) {
        e = p;
        int64_t *f[5] = {&e.batch, &e.heads_q, &e.heads_kv, &e.seq_q, &e.seq_kv};
        *f[sizes[i].field] = sizes[i].value;
        expect_problem(sizes[i].what, &e, FMHA_ERR_BAD_SIZE);
    }
    /* heads (strides rebuilt for the new head counts) */
    fmha_problem_init(&e, 2, 6, 4, 5, 7, 8, 6, FMHA_LAYOUT_BSHD);
    expect_problem("heads 6 / 4", &e, FMHA_ERR_BAD_HEADS);
    fmha_problem_init(&e, 2, 2, 4, 5, 7, 8, 6, FMHA_LAYOUT_BSHD);
    expect_problem("heads 2 / 4", &e, FMHA_ERR_BAD_HEADS);
    /* head dims */
    e = p;
    e.head_dim = 0;
    expect_problem("head_dim 0", &e, FMHA_ERR_BAD_HEAD_DIM);
    fmha_problem_init(&e, 2, 4, 2, 5, 7, 577, 6, FMHA_LAYOUT_BSHD);
    expect_problem("head_dim 577", &e, FMHA_ERR_BAD_HEAD_DIM);
    e = p;
    e.head_dim_v = 0;
    expect_problem("head_dim_v 0", &e, FMHA_ERR_BAD_HEAD_DIM);
    fmha_problem_init(&e, 2, 4, 2, 5, 7, 8, 577, FMHA_LAYOUT_BSHD);
    expect_problem("head_dim_v 577", &e, FMHA_ERR_BAD_HEAD_DIM);
    fmha_problem_init(&e, 1, 1, 1, 2, 2, 576, 576, FMHA_LAYOUT_BSHD);
    expect_problem("head dims 576 (valid)", &e, FMHA_OK);
    /* scale */
    const float bad_scales[3] = {NAN, INFINITY, -INFINITY};
    for (int i = 0; i < 3; i++) {
        e = p;
        e.scale = bad_scales[i];
        char what[32];
        snprintf(what, sizeof what, "scale %g", (double)bad_scales[i]);
        expect_problem(what, &e, FMHA_ERR_BAD_SCALE);
    }
    e = p;
    e.scale = -0.5f;
    expect_problem("scale -0.5 (valid)", &e, FMHA_OK);
    /* strides */
    e = p;
    e.q_strides[1] = -e.q_strides[1];
    expect_problem("negative q seq stride", &e, FMHA_ERR_BAD_STRIDE);
    e = p;
    e.k_strides[3] = -1;
    expect_problem("negative k dim stride", &e, FMHA_ERR_BAD_STRIDE);
    e = p;
    e.v_strides[0] = -1;
    expect_problem("negative v batch stride", &e, FMHA_ERR_BAD_STRIDE);
    e = p;
    e.o_strides[2] = -6;
    expect_problem("negative o head stride", &e, FMHA_ERR_BAD_STRIDE);
    e = p;
    e.o_strides[1] = 0;
    expect_fwd("o seq stride 0", &e, q, k, v, o, lse, NULL, 0, FMHA_ERR_BAD_STRIDE);
    tu_check(fmha_problem_check(&e) == FMHA_ERR_BAD_STRIDE, "problem_check, o seq stride 0");
    e = p;
    e.o_strides[2] = 1; /* heads 1 apart with 6 contiguous dims: elements overlap */
    expect_fwd("o head stride 1", &e, q, k, v, o, lse, NULL, 0, FMHA_ERR_BAD_STRIDE);
    e = p;
    e.o_strides[3] = 0;
    expect_fwd("o dim stride 0", &e, q, k, v, o, lse, NULL, 0, FMHA_ERR_BAD_STRIDE);
    e = p;
    e.k_strides[0] = e.v_strides[0] = 0;
    e.q_strides[2] = 0;
    expect_fwd("input strides 0 (broadcast, valid)", &e, q, k, v, o, NULL, NULL, 0, FMHA_OK);
    /* overlap of outputs with inputs */
    expect_fwd("o is q", &p, q, k, v, q, lse, NULL, 0, FMHA_ERR_OVERLAP);
    expect_fwd("o inside k", &p, q, k, v, k + 3, lse, NULL, 0, FMHA_ERR_OVERLAP);
    expect_fwd("o overlaps the end of v", &p, q, k, v, v + 2 * 7 * 2 * 6 - 1, lse, NULL, 0,
               FMHA_ERR_OVERLAP);
    expect_fwd("lse is q", &p, q, k, v, o, q, NULL, 0, FMHA_ERR_OVERLAP);
    /* options */
    static const struct { const char *what; int field, value; } opts[] = {
        {"strategy 4", 0, 4}, {"strategy -1", 0, -1}, {"strategy 99", 0, 99},
        {"causal 3", 1, 3},   {"causal -1", 1, -1},   {"dtype 3", 2, 3},
        {"dtype -1", 2, -1},  {"dtype 77", 2, 77},   {"precision 4", 3, 4},
        {"precision -1", 3, -1},
    };
    for (int i = 0; i < (int)(sizeof opts / sizeof opts[0]); i++) {
        e = p;
        if (opts[i].field == 0) e.strategy = (fmha_strategy)opts[i].value;
        else if (opts[i].field == 1) e.causal = (fmha_causal)opts[i].value;
        else if (opts[i].field == 2) e.dtype = (fmha_dtype)opts[i].value;
        else e.precision = (fmha_precision)opts[i].value;
        expect_problem(opts[i].what, &e, FMHA_ERR_BAD_OPTION);
    }
    /* workspace */
    for (int s = 0; s < 4; s++) {
        e = p;
        e.strategy = (fmha_strategy)s;
        if (!tu_check(fmha_forward_workspace_size(&e, &bytes) == FMHA_OK, "workspace size")) continue;
        unsigned char *ws = malloc(bytes + 1);
        char what[64];
        snprintf(what, sizeof what, "workspace %zu - 1 bytes (%s)", bytes, tu_strategy_name(s));
        if (bytes > 0) expect_fwd(what, &e, q, k, v, o, lse, ws, bytes - 1, FMHA_ERR_WORKSPACE_TOO_SMALL);
        if (bytes > 0)
            expect_fwd("workspace of 0 bytes", &e, q, k, v, o, lse, ws, 0,
                       FMHA_ERR_WORKSPACE_TOO_SMALL);
        reset_outputs();
        tu_check(tu_forward(&e, q, k, v, o, lse, ws, bytes) == FMHA_OK,
                 "workspace of exactly %zu bytes (%s)", bytes, tu_strategy_name(s));
        free(ws);
    }
}

static void expect_bwd(const char *what, const fmha_problem *p, const void *oo, const void *dd,
                       const float *ll, void *gq, void *gk, void *gv, void *ws, size_t ws_bytes,
                       fmha_status want) {
    float *dq0 = dq, *dk0 = dk, *dv0 = dv;
    /* sentinel in the gradient buffers only: o and lse are inputs here */
    for (int i = 0; i < BUF; i++) dq0[i] = dk0[i] = dv0[i] = sent;
    fmha_status st = tu_backward(p, q, k, v, oo, dd, ll, gq, gk, gv, NULL, ws, ws_bytes);
    tu_check(st == want, "backward, %s: status %d (%s), want %d", what, (int)st,
             fmha_status_string(st), (int)want);
    st = fmha_backward(p, q, k, v, oo, dd, ll, gq, gk, gv, NULL, ws, ws_bytes);
    tu_check((want == FMHA_OK) == (fmha_last_error_message()[0] == '\0'), "backward, %s: message \"%s\"", what,
             fmha_last_error_message());
    tu_check(tu_count_not(dq, BUF, sent) == 0 && tu_count_not(dk, BUF, sent) == 0 &&
                 tu_count_not(dv, BUF, sent) == 0,
             "backward, %s: a gradient was written", what);
}

static void backward_errors(void) {
    fmha_problem p = base(), e;
    /* o and lse from a valid forward; saved to detect writes to them */
    if (!tu_check(tu_forward(&p, q, k, v, o, lse, NULL, 0) == FMHA_OK, "forward for backward"))
        return;
    float *o_copy = malloc(BUF * sizeof(float)), *lse_copy = malloc(BUF * sizeof(float));
    memcpy(o_copy, o, BUF * sizeof(float));
    memcpy(lse_copy, lse, BUF * sizeof(float));
    expect_bwd("lse NULL", &p, o, d_o, NULL, dq, dk, dv, NULL, 0, FMHA_ERR_NULL_POINTER);
    expect_bwd("d_o NULL", &p, o, NULL, lse, dq, dk, dv, NULL, 0, FMHA_ERR_NULL_POINTER);
    expect_bwd("o NULL", &p, NULL, d_o, lse, dq, dk, dv, NULL, 0, FMHA_ERR_NULL_POINTER);
    expect_bwd("dq NULL", &p, o, d_o, lse, NULL, dk, dv, NULL, 0, FMHA_ERR_NULL_POINTER);
    expect_bwd("dk NULL", &p, o, d_o, lse, dq, NULL, dv, NULL, 0, FMHA_ERR_NULL_POINTER);
    expect_bwd("dv NULL", &p, o, d_o, lse, dq, dk, NULL, NULL, 0, FMHA_ERR_NULL_POINTER);
    expect_bwd("problem NULL", NULL, o, d_o, lse, dq, dk, dv, NULL, 0, FMHA_ERR_NULL_POINTER);
    reset_outputs();
    tu_check(tu_backward(&p, NULL, k, v, o, d_o, lse, dq, dk, dv, NULL, NULL, 0) ==
                 FMHA_ERR_NULL_POINTER && outputs_untouched(),
             "backward, q NULL");
    memcpy(o, o_copy, BUF * sizeof(float));
    memcpy(lse, lse_copy, BUF * sizeof(float));
    /* gradients overlapping inputs or each other */
    expect_bwd("dq is q", &p, o, d_o, lse, q, dk, dv, NULL, 0, FMHA_ERR_OVERLAP);
    expect_bwd("dk inside v", &p, o, d_o, lse, dq, v + 5, dv, NULL, 0, FMHA_ERR_OVERLAP);
    expect_bwd("dv is d_o", &p, o, d_o, lse, dq, dk, (void *)d_o, NULL, 0, FMHA_ERR_OVERLAP);
    expect_bwd("dq is o", &p, o, d_o, lse, dq, dk, o, NULL, 0, FMHA_ERR_OVERLAP);
    expect_bwd("dq is lse", &p, o, d_o, lse, lse, dk, dv, NULL, 0, FMHA_ERR_OVERLAP);
    expect_bwd("dk is dv", &p, o, d_o, lse, dq, dk, dk, NULL, 0, FMHA_ERR_OVERLAP);
    tu_check(!memcmp(o, o_copy, BUF * sizeof(float)) && !memcmp(lse, lse_copy, BUF * sizeof(float)),
             "backward errors wrote o or lse");
    /* a gradient's strides must not overlap its own elements */
    e = p;
    e.k_strides[0] = 0;
    expect_bwd("k batch stride 0 (dk elements overlap)", &e, o, d_o, lse, dq, dk, dv, NULL, 0,
               FMHA_ERR_BAD_STRIDE);
    e = p;
    e.q_strides[2] = 0;
    expect_bwd("q head stride 0 (dq elements overlap)", &e, o, d_o, lse, dq, dk, dv, NULL, 0,
               FMHA_ERR_BAD_STRIDE);
    /* workspace */
    size_t bytes = 0;
    if (tu_check(fmha_backward_workspace_size(&p, &bytes) == FMHA_OK, "backward workspace size") &&
        bytes > 0) {
        unsigned char *ws = malloc(bytes);
        expect_bwd("workspace one byte short", &p, o, d_o, lse, dq, dk, dv, ws, bytes - 1,
                   FMHA_ERR_WORKSPACE_TOO_SMALL);
        free(ws);
    }
    /* forward_backward: nothing written on an error */
    reset_outputs();
    tu_check(tu_forward_backward(&p, q, k, v, d_o, o, NULL, dq, dk, dv, NULL) == FMHA_ERR_NULL_POINTER &&
                 outputs_untouched(),
             "forward_backward, lse NULL");
    reset_outputs();
    tu_check(tu_forward_backward(&p, q, k, v, NULL, o, lse, dq, dk, dv, NULL) == FMHA_ERR_NULL_POINTER &&
                 outputs_untouched(),
             "forward_backward, d_o NULL");
    reset_outputs();
    tu_check(tu_forward_backward(&p, q, k, v, d_o, o, lse, q, dk, dv, NULL) == FMHA_ERR_OVERLAP &&
                 outputs_untouched(),
             "forward_backward, dq is q");
    reset_outputs();
    tu_check(tu_forward_backward(&p, q, k, v, d_o, o, lse, dq, dk, o, NULL) == FMHA_ERR_OVERLAP &&
                 outputs_untouched(),
             "forward_backward, dv is o");
    reset_outputs();
    tu_check(tu_forward_backward(&p, q, k, v, d_o, d_o, lse, dq, dk, dv, NULL) == FMHA_ERR_OVERLAP &&
                 outputs_untouched(),
             "forward_backward, o is d_o");
    free(o_copy), free(lse_copy);
}

int main(void) {
    tu_seed();
    uint32_t bits = 0x7fc0beefu;
    memcpy(&sent, &bits, sizeof sent);
    float **bufs[9] = {&q, &k, &v, &o, &d_o, &lse, &dq, &dk, &dv};
    for (int t = 0; t < 9; t++) {
        *bufs[t] = malloc(BUF * sizeof(float));
        tu_fill(*bufs[t], BUF, -1, 1);
    }
    check_status_strings();
    check_threads();
    forward_errors();
    backward_errors();
    check_messages();
    for (int t = 0; t < 9; t++) free(*bufs[t]);
    return tu_finish();
}
