/* test_util.h: what every C test shares: a seeded random generator (the seed
 * is printed so a failure can be replayed with FMHA_TEST_SEED), tolerance
 * checks against the float64 reference, a pass/fail tally, and strided
 * tensors in the layouts the tests cycle through. */
#ifndef FMHA_TEST_UTIL_H
#define FMHA_TEST_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "fmha.h"

/* Seed from FMHA_TEST_SEED or the clock; printed once. */
uint64_t tu_seed(void);
uint64_t tu_next(void);                          /* 64 random bits */
double tu_uniform(double lo, double hi);         /* uniform in [lo, hi) */
int64_t tu_int(int64_t lo, int64_t hi);          /* uniform integer in [lo, hi] */
void tu_fill(float *x, size_t n, double lo, double hi);

/* Largest |x - r| / (atol + rtol |r|) over n elements (<= 1 passes); NaN or
 * inf in x where r is finite counts as a failure (returns +inf). */
double tu_worst_ratio(const float *x, const double *r, size_t n, double atol, double rtol);
/* Relative L2 error ||x - r|| / ||r|| (0 when both are zero). */
double tu_rel_l2(const float *x, const double *r, size_t n);
/* ||x - r|| and ||r|| over the finite r. */
double tu_err_l2(const float *x, const double *r, size_t n);
double tu_norm_l2(const double *r, size_t n);

/* FMHA_TEST_QUICK=1 (the sanitized runs of CI) or 2: 1, else 0. The tests
 * then shrink sizes, counts and repeats, keeping every kind of case (every
 * code path) and every tolerance; tu_quick_pick(full, quick) is the one in
 * use. Printed once with the seed. */
int tu_quick(void);
int64_t tu_quick_pick(int64_t full, int64_t quick);
/* FMHA_TEST_QUICK=2 (the emulated runs, which test a table's kernels): 1.
 * tu_strategy_skipped(s) is then 1 for the strategies whose kernels the
 * native runs cover on their own: dense (the table's kernels that tiled
 * and auto run, over whole rows) and portable (the scalar kernels, the same
 * C on every architecture); auto and tiled still reach every kernel. */
int tu_emulated(void);
int tu_strategy_skipped(int s);
/* In a loop over tables (the current one forced): 1 for the portable
 * strategy on any table but scalar when the loop also runs the scalar
 * table, whose run has the same plan (portable runs the scalar kernels
 * whatever the table). */
int tu_strategy_repeats(int s);

/* Records one check; prints the message on failure. Returns cond. */
int tu_check(int cond, const char *fmt, ...);
/* Prints "N passed, N failed" and returns the process exit status. */
int tu_finish(void);

/* ---- strided tensors ------------------------------------------------------
 * Shapes are [batch, seq, head, dim] with the problem's element strides.
 * Inputs are allocated with NaN in every position that is not an element (so
 * reading padding shows up as NaN); outputs are filled with a sentinel so
 * writes outside the elements can be detected. */

enum { TU_LAYOUT_BSHD, TU_LAYOUT_BHSD, TU_LAYOUT_PADDED, TU_LAYOUT_PADDED2, TU_LAYOUT_COUNT };
const char *tu_layout_name(int layout);
/* Sets the four stride sets of p (sizes already filled) for a layout:
 * BSHD/BHSD contiguous; PADDED and PADDED2 permute the axes differently per
 * tensor, pad every extent and use non-unit innermost strides. */
void tu_set_layout(fmha_problem *p, int layout);
/* Fills *p like fmha_problem_init(.., FMHA_LAYOUT_BSHD) without the library
 * (no mask but the causal option, no bias). */
void tu_problem(fmha_problem *p, int64_t batch, int64_t heads_q, int64_t heads_kv, int64_t seq_q,
                int64_t seq_kv, int64_t head_dim, int64_t head_dim_v);
/* Extents n[4] of tensor 'q', 'k', 'v' or 'o' of p; returns its strides. */
const int64_t *tu_shape(const fmha_problem *p, char which, int64_t n[4]);
size_t tu_numel(const int64_t n[4]);
/* Elements from the first to one past the last element: 1 + sum (n-1) st. */
size_t tu_span(const int64_t st[4], const int64_t n[4]);
/* Input tensor: elements uniform in [lo, hi), all other positions NaN. */
float *tu_new_input(const fmha_problem *p, char which, double lo, double hi);
/* Output tensor: every position (elements and padding) set to sentinel. */
float *tu_new_output(const fmha_problem *p, char which, float sentinel);
/* Pointer to element (b, s, h, d). */
float *tu_elem(float *x, const int64_t st[4], int64_t b, int64_t s, int64_t h, int64_t d);
/* Copies the elements of x into out [n0][n1][n2][n3], contiguous. */
void tu_gather(const float *x, const int64_t st[4], const int64_t n[4], float *out);
/* Positions of x's span that are not elements and no longer hold sentinel. */
size_t tu_padding_changed(const float *x, const int64_t st[4], const int64_t n[4], float sentinel);
/* Positions among x[0..n) whose bits differ from sentinel. */
size_t tu_count_not(const float *x, size_t n, float sentinel);
double tu_max_abs(const float *x, size_t n);
double tu_max_abs_d(const double *x, size_t n);
int tu_has_nan(const float *x, size_t n);
const char *tu_strategy_name(int strategy);
/* The name of the registry's first ISA this CPU runs (the default table). */
const char *tu_isa_best(void);
/* Runs fn(label) once per run of tu_isa_run (below) without the other
 * tile shapes: each ISA of the registry this CPU supports, forced
 * (FMHA_ISA's way), printing the skipped ones; the default table after.
 * FMHA_TEST_ISAS (comma-separated names) limits every test to those ISAs
 * (scalar stays available as the specification): the emulated runs of the
 * CI share the tables out. Of tables that differ only in the quantized
 * caches' integer and bf16 kernels (avx512vnni and avx512, avx2vnni and
 * avx2, neondot and neon) it runs the one with them, unless a test that
 * reads quantized caches sets tu_isa_variants. */
void tu_each_isa(void (*fn)(const char *isa));
/* tu_each_isa, and each table also on each other float32 tile shape its
 * tile part lists (tu_isa_run's shapes): the tests that walk tiles
 * (tuning, differential, ieee); the others keep to the own tiles, each
 * shape otherwise adding its share to their time. */
void tu_each_isa_shape(void (*fn)(const char *isa));
extern int tu_isa_variants;
/* 1 when the tests run isa: supported here and in FMHA_TEST_ISAS, and not
 * the variant tu_each_isa leaves out (the tests' own ISA loops ask this). */
struct fmha_isa;
int tu_isa_runs(const struct fmha_isa *isa);
/* The r-th run of the tests' ISA loops, made the context in use:
 *   for (size_t r = 0; tu_isa_run(r, 1, label, sizeof label); r++) ...
 * Each ISA tu_isa_runs admits, on its own tiles (label its name), then,
 * with `shapes` 1, on each other float32 tile shape its table lists
 * (fmha_uk_tile.shapes; once per tile part: on the first table that runs
 * that part, as the shapes' kernels are the part's): a trial context under its tuning with tile_mr x
 * tile_nr that shape (label "avx512vnni tile 12x32"). Past the last: 0,
 * the default table forced back. Plans made in a run must end in it (a
 * run's trial is reused). */
int tu_isa_run(size_t r, int shapes, char *label, size_t label_size);
/* A trial of isa (fmha_cpu_trial) under its tuning with tile_mr x tile_nr
 * the table's shape-th float32 tile shape (fmha_cpu_f32_tile_at); 0, or -1
 * when there is none or the trial's float32 tiles are not it. */
struct fmha_trial;
int tu_isa_shape(const struct fmha_isa *isa, size_t shape, struct fmha_trial *trial);
const char *tu_causal_name(int causal);
/* 1 when p's forward plans on `driver`, 0 when on another, -1 when p
 * does not plan. */
struct fmha_fwd_driver;
int tu_planned_driver(const fmha_problem *p, const struct fmha_fwd_driver *driver);
/* line [n] = fmha_plan_describe of p's plan, empty when p does not plan. */
void tu_plan_line(const fmha_problem *p, char *line, size_t n);
/* 1 when a plan of p takes its scores on a quantized query: integer
 * (q8_0) or bf16 (fmha_plan_describe's scores=). */
int tu_quantized_query(const fmha_problem *p);

/* ---- every call also through a plan ----------------------------------------
 * Drop-in for fmha_forward, fmha_backward and fmha_forward_backward: makes
 * the one-shot call, then the same call through a plan run twice into fresh
 * outputs (prefilled like the caller's), and checks that the plan gives the
 * one-shot's status and, on success, its outputs bit for bit. Returns the
 * one-shot status; the caller's outputs hold the one-shot results. Skipped
 * (one-shot only) when a bias callback accumulates gradients (three runs
 * would accumulate three times), and for valid problems in the emulated
 * runs (FMHA_TEST_QUICK=2: the plan is generic code, the same planner and
 * run function as the one-shot call's, checked natively on every table). */
fmha_status tu_forward(const fmha_problem *p, const void *q, const void *k, const void *v, void *o,
                       float *lse, void *workspace, size_t workspace_bytes);
fmha_status tu_backward(const fmha_problem *p, const void *q, const void *k, const void *v,
                        const void *o, const void *d_o, const float *lse, void *dq, void *dk,
                        void *dv, const fmha_param_grads *grads, void *workspace,
                        size_t workspace_bytes);
fmha_status tu_forward_backward(const fmha_problem *p, const void *q, const void *k, const void *v,
                                const void *d_o, void *o, float *lse, void *dq, void *dk, void *dv,
                                const fmha_param_grads *grads);

/* ---- logits near the float32 limit ----------------------------------------
 * Both fillers overwrite the elements of q and k (strides of p) so that every
 * product and partial sum of q . k is exact in float32 in any order, and the
 * scale must be a power of two (explicit, or 1/sqrt(D) with D a power of 4):
 * every correct float32 implementation then sees exactly the scores the
 * reference sees.
 * argmax: |scores| up to ~target, the largest visible score of each query
 *   is unique and ahead of the next by >= 2 scale 2^(a+b), so softmax is
 *   one-hot. q = (+-2D, noise) 2^a, k_j = (c_j distinct, noise) 2^b with
 *   noise in {-1, 0, 1}; scores are integers < 2^24 times 2^(a+b) scale.
 * tied: q = (+-2^62, 0, ..., 0), k_j = (+-2^62, anything): every score is
 *   +-2^124 scale, so the winning keys of a query tie exactly and O is the
 *   mean of their V rows. */
void tu_fill_argmax_logits(const fmha_problem *p, float *q, float *k, double target);
void tu_fill_tied_logits(const fmha_problem *p, float *q, float *k);

/* ---- paged caches ----------------------------------------------------------
 * Ragged key lengths [B]: b = 0 holds skv keys, b = 2 from 0, the rest from 1. */
void tu_ragged_kv_lengths(int64_t B, int64_t skv, int32_t *kv_len);
/* A block table [B, *stride] (malloc'ed) over a pool of *pages pages of
 * `page` keys, one spare: each sequence's pages in shuffled pool order,
 * entries past its kv_len[b] keys -1 (never read). */
int32_t *tu_page_table(int64_t B, int64_t skv, int64_t page, const int32_t *kv_len, int64_t *stride,
                       int64_t *pages);

#endif /* FMHA_TEST_UTIL_H */
