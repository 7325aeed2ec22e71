/* fuzz_api.c: libFuzzer target for the public API (scripts/fuzz.sh builds and
 * runs it under AddressSanitizer and UndefinedBehaviorSanitizer).
 *
 * Each input is decoded into one call: sizes (small, or now and then an
 * extreme int64), a dtype, causal alignment, the alignment of windows and
 * biases (fmha_problem.alignment, now and then one that contradicts causal's
 * or is unknown), strategy, precision (now and then float32's BF16X3 or
 * BF16, held to bfloat16's bound at BF16), scale,
 * thread count and instruction set; strides per tensor (contiguous, padded,
 * permuted, arbitrary small ones that overlap or broadcast, or an extreme
 * value); windows of any int64 value, key/query lengths, segment ids, a
 * dense mask and a dense bias with their own strides, ALiBi, a T5 table,
 * softcap, mask and bias callbacks (one kind answers an invalid class); the
 * entry point (forward, backward after a forward, forward_backward) and the
 * bias gradients wanted; after a forward, the same problem on K and V
 * quantized into drawn cache formats (check_formats), now and then in page
 * pools behind a shuffled block table. Every buffer is allocated to exactly the extent its
 * strides reach, so a read or write outside it is caught by ASan.
 *
 * Checks on every input:
 *   - a call that fails writes nothing: every output is prefilled with a
 *     byte pattern and compared whole afterwards;
 *   - its status is fmha_problem_check's (or FMHA_ERR_CALLBACK for a bad
 *     classify answer, or a gradient argument error for the backward);
 *   - a call that succeeds leaves every position of an output that is not
 *     an element untouched, and matches the float64 reference
 *     (tests/ref/fmha_ref_masks.h) computed from the same (rounded) inputs:
 *     per element |x - r| <= tol (1 + M), M the largest |r| of that output
 *     (for gradients, also the largest size P (|dP| + |sum P dP|) of the
 *     terms that dS sums, collected like the output), tol = 2e-4 for
 *     float32, 1e-2 for float16 and 6e-2 for bfloat16 and for float32 at
 *     BF16 (unit roundoff 2^-8, stored or rounded operands and P rounded to
 *     it); lse to tol (1 + |r|) and exactly
 *     -inf on fully masked rows, whose O is exactly 0;
 *   - now and then one NaN or inf is put into Q, K, V, the dense bias, a
 *     quantized cache's block d or float8 byte (any position, read or not):
 *     O and lse must hold the reference's NaN and infinities (fmha.h's
 *     IEEE rule) and its finite values within the tolerances above.
 * Any failure aborts, so libFuzzer saves the input.
 *
 * Seeds (tests/fuzz/corpus/): random inputs, plus inputs that reproduce
 * fixed defects: finding3_* (a window of INT64_MAX with a partial tile),
 * finding4_* (sizes whose stride products overflowed in
 * fmha_problem_init), finding5_* (dense mask, bias and bias-gradient
 * extents past int64), unit_dim_stride_int64_max (a stride of INT64_MAX
 * on an extent-1 dimension, which made a kernel's pointer step wrap),
 * finding6_* (an inf block d of a padded q4_0 K: the reference missed the
 * padding's NaN), finding7_* (a NaN query against a quantized cache) and
 * finding8_* (a -inf in a float16 Q on the tiles' split inputs, whose
 * residual inf - inf is NaN), finding9_* (a NaN in an fp8 V at a key
 * whose P underflows to 0 in float32 but not in float64: 0 x NaN) and
 * finding10_* (the same with an inf: NaN in float32, inf in float64; O is
 * held to either reference where the float64 one is not finite:
 * fmha_ref_forward_full_f32_weights). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/convert.h"
#include "config/cpu.h"
#include "format/format.h"
#include "fmha.h"
#include "fmha_ref_masks.h"

#define CAP_ELEMS ((int64_t)1 << 20) /* larger tensors are only validated, not run */

static void fail(const char *what) {
    fprintf(stderr, "fuzz_api: %s\n", what);
    fflush(stderr);
    abort();
}

/* ---- statistics (FMHA_FUZZ_STATS=1 prints them at exit) ---- */

static long long n_inputs, n_ran, n_fwd_ok, n_bwd_ok, n_dtype_ok[3], n_status[16], n_poisoned, n_paged, n_paged_refused;

static void print_stats(void) {
    fprintf(stderr, "fuzz_api: %lld inputs, %lld run on tensors, %lld forwards and %lld backwards "
            "compared (float32 %lld, bfloat16 %lld, float16 %lld), %lld holding a NaN or inf, %lld quantized "
            "caches in page pools (%lld refused as documented); statuses:",
            n_inputs, n_ran, n_fwd_ok, n_bwd_ok, n_dtype_ok[0], n_dtype_ok[1], n_dtype_ok[2], n_poisoned, n_paged,
            n_paged_refused);
    for (int i = 0; i < 16; i++)
        if (n_status[i]) fprintf(stderr, " %d:%lld", i, n_status[i]);
    fprintf(stderr, "\n");
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *env = getenv("FMHA_FUZZ_STATS");
    if (env && *env == '1') atexit(print_stats);
    return 0;
}

/* ---- input decoding ---- */

typedef struct reader { const uint8_t *p; size_t n; } reader;

static uint64_t take(reader *r, int bytes) {
    uint64_t x = 0;
    for (int i = 0; i < bytes && r->n; i++, r->p++, r->n--) x |= (uint64_t)*r->p << (8 * i);
    return x;
}

static int64_t take_in(reader *r, int64_t lo, int64_t hi) {
    return lo + (int64_t)(take(r, 1) % (uint64_t)(hi - lo + 1));
}

static const int64_t extremes[] = {0, -1, -2, 1, 2, 257, (int64_t)1 << 31, (int64_t)1 << 32,
                                   ((int64_t)1 << 40) + 1, (int64_t)1 << 62, INT64_MAX - 1,
                                   INT64_MAX, INT64_MIN, INT64_MIN + 1};
#define N_EXTREMES ((int)(sizeof extremes / sizeof extremes[0]))

static int64_t take_extreme(reader *r) { return extremes[take(r, 1) % N_EXTREMES]; }

/* st[i] = value, i read before the value */
static void set_stride(reader *r, int64_t st[4], int extreme) {
    int i = (int)(take(r, 1) % 4);
    st[i] = extreme ? take_extreme(r) : 0;
}

/* splitmix64 stream for tensor contents, seeded from the input */
static uint64_t rng_state;
static uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* multiples of 1/64 in [-1, 1]: exact in every dtype */
static float rng_value(void) { return (float)((int64_t)(rng_next() % 129) - 64) / 64.0f; }

/* ---- extents ---- */

#define EXT_TOO_BIG (-1)  /* valid perhaps, but larger than CAP_ELEMS: not run */
#define EXT_INVALID (-2)  /* a size < 1, a stride < 0 or an extent past INT64_MAX / 8: the
                           * library must refuse it, so it runs on a 1-element buffer */

/* Elements from offset 0 to the last element + 1, or EXT_TOO_BIG / EXT_INVALID. */
static int64_t extent(const int64_t n[4], const int64_t st[4]) {
    int64_t span = 0, step;
    for (int i = 0; i < 4; i++)
        if (n[i] < 1 || st[i] < 0) return EXT_INVALID;
    for (int i = 0; i < 4; i++)
        if (__builtin_mul_overflow(st[i], n[i] - 1, &step) ||
            __builtin_add_overflow(span, step, &span) || span > INT64_MAX / 8)
            return EXT_INVALID;
    return span >= CAP_ELEMS ? EXT_TOO_BIG : span + 1;
}

/* Elements to allocate for an extent (1 for an invalid one). */
static size_t alloc_len(int64_t ext) { return ext > 0 ? (size_t)ext : 1; }

static void tensor_shape(const fmha_problem *p, char which, int64_t n[4], const int64_t **st) {
    int qside = which == 'q' || which == 'o';
    n[0] = p->batch;
    n[1] = qside ? p->seq_q : p->seq_kv;
    n[2] = qside ? p->heads_q : p->heads_kv;
    n[3] = which == 'q' || which == 'k' ? p->head_dim : p->head_dim_v;
    *st = which == 'q' ? p->q_strides : which == 'k' ? p->k_strides
        : which == 'v' ? p->v_strides : p->o_strides;
}

/* Strides for extents n: 0 contiguous BSHD, 1 BHSD-like, 2 padded, 3 random
 * order with gaps, 4 arbitrary in [0, 40] (may overlap or broadcast). */
static void make_strides(reader *r, const int64_t n[4], int64_t st[4]) {
    int mode = (int)take_in(r, 0, 4);
    int order[4] = {3, 2, 1, 0}; /* innermost first */
    if (mode == 1) order[1] = 1, order[2] = 2;
    if (mode == 3)
        for (int i = 3; i > 0; i--) {
            int j = (int)take_in(r, 0, i), t = order[i];
            order[i] = order[j], order[j] = t;
        }
    if (mode == 4) {
        for (int i = 0; i < 4; i++) st[i] = take_in(r, 0, 40);
        return;
    }
    int64_t s = mode == 2 ? take_in(r, 1, 3) : 1;
    for (int k = 0; k < 4; k++) {
        int d = order[k];
        st[d] = s;
        s = s * (n[d] > 0 && n[d] < 64 ? n[d] : 1) + (mode >= 2 ? take_in(r, 0, 3) : 0);
    }
}

/* ---- callbacks: functions of (b, h, i, j) only, so any tiling agrees ---- */

typedef struct cb_ctx {
    int64_t B, Hq, Sq, Skv;
    uint32_t salt;
    int classify_mode; /* 0 none, 1 exact, 2 an invalid answer on the first tile */
    double *grad;      /* [B, Hq, Sq, Skv] accumulate_grad sums, or NULL */
} cb_ctx;

static uint32_t hash4(uint32_t salt, int64_t b, int64_t h, int64_t i, int64_t j) {
    uint64_t x = salt ^ ((uint64_t)b << 48) ^ ((uint64_t)h << 32) ^ ((uint64_t)i << 16) ^ (uint64_t)j;
    x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ull, x ^= x >> 33;
    return (uint32_t)x;
}

static int cb_hidden(const cb_ctx *c, int64_t b, int64_t h, int64_t i, int64_t j) {
    return hash4(c->salt, b, h, i, j) % 4 == 0;
}

static int mask_classify(void *ctx, const fmha_tile *t) {
    const cb_ctx *c = ctx;
    if (c->classify_mode == 2 && t->batch == 0 && t->head_q == 0 && t->q0 == 0 && t->k0 == 0) return 7;
    int any_on = 0, any_off = 0;
    for (int64_t i = 0; i < t->nq; i++)
        for (int64_t r = 0; r < t->nk; r++) {
            if (cb_hidden(c, t->batch, t->head_q, t->q0 + i, t->k0 + r)) any_off = 1;
            else any_on = 1;
        }
    return !any_on ? FMHA_TILE_CLASS_EMPTY : any_off ? FMHA_TILE_CLASS_PARTIAL : FMHA_TILE_CLASS_FULL;
}

static void mask_fill(void *ctx, const fmha_tile *t, uint8_t *vis) {
    const cb_ctx *c = ctx;
    for (int64_t i = 0; i < t->nq; i++)
        for (int64_t r = 0; r < t->nk; r++)
            if (cb_hidden(c, t->batch, t->head_q, t->q0 + i, t->k0 + r))
                vis[i * t->q_stride + r * t->k_stride] = 0;
}

static void bias_fill(void *ctx, const fmha_tile *t, float *s) {
    const cb_ctx *c = ctx;
    for (int64_t i = 0; i < t->nq; i++)
        for (int64_t r = 0; r < t->nk; r++)
            s[i * t->q_stride + r * t->k_stride] +=
                (float)((int)(hash4(c->salt + 1, t->batch, t->head_q, t->q0 + i, t->k0 + r) % 33) - 16) / 8.0f;
}

static void bias_grad(void *ctx, const fmha_tile *t, const float *ds) {
    const cb_ctx *c = ctx;
    for (int64_t i = 0; i < t->nq; i++)
        for (int64_t r = 0; r < t->nk; r++) {
            int64_t at = ((t->batch * c->Hq + t->head_q) * c->Sq + t->q0 + i) * c->Skv + t->k0 + r;
            c->grad[at] += ds[i * t->q_stride + r * t->k_stride];
        }
}

/* ---- buffers ---- */

typedef struct buf {
    void *p;          /* exactly n bytes (NULL when n == 0) */
    uint8_t *before;  /* copy of the prefill, outputs only */
    size_t n;
} buf;

static void buf_alloc(buf *b, size_t n, int output) {
    b->n = n;
    b->p = n ? malloc(n) : NULL;
    b->before = output && n ? malloc(n) : NULL;
    if (n && (!b->p || (output && !b->before))) fail("out of memory");
    if (output) {
        for (size_t i = 0; i < n; i++) ((uint8_t *)b->p)[i] = (uint8_t)(0xA5 ^ (i * 37));
        memcpy(b->before, b->p, n);
    }
}

static int buf_untouched(const buf *b) { return !b->n || !memcmp(b->p, b->before, b->n); }

static void buf_free(buf *b) {
    free(b->p), free(b->before);
    *b = (buf){0};
}

/* 1 where offset e of a [B,S,H,D]-strided tensor is an element. */
static uint8_t *element_map(const int64_t n[4], const int64_t st[4], int64_t len) {
    uint8_t *m = calloc((size_t)len, 1);
    if (!m) fail("out of memory");
    for (int64_t a = 0; a < n[0]; a++)
        for (int64_t b = 0; b < n[1]; b++)
            for (int64_t c = 0; c < n[2]; c++)
                for (int64_t d = 0; d < n[3]; d++)
                    m[a * st[0] + b * st[1] + c * st[2] + d * st[3]] = 1;
    return m;
}

/* Outside the elements, the output kept its prefill. */
static int padding_untouched(const buf *b, const int64_t n[4], const int64_t st[4], size_t esz) {
    int64_t len = (int64_t)(b->n / esz);
    uint8_t *m = element_map(n, st, len);
    int ok = 1;
    for (int64_t e = 0; e < len && ok; e++)
        if (!m[e] && memcmp((uint8_t *)b->p + e * esz, b->before + e * esz, esz)) ok = 0;
    free(m);
    return ok;
}

/* ---- comparison ---- */

static double tol_of(fmha_dtype t) { return t == FMHA_DTYPE_F32 ? 2e-4 : t == FMHA_DTYPE_F16 ? 1e-2 : 6e-2; }

/* x against the reference r: the same NaN, the same infinity, or within tol. */
static int agrees(double x, double r, double tol) {
    return isnan(r) ? isnan(x) : isinf(r) ? x == r : fabs(x - r) <= tol;
}

/* One NaN, +inf or -inf (drawn) into a random position of x [n] and of its
 * float32 copy f (NULL: none) in dtype t: an element or padding, which a
 * call never reads. */
static void poison_one(reader *r, void *x, float *f, fmha_dtype t, size_t n) {
    static const float values[3] = {NAN, INFINITY, -INFINITY};
    const float v = values[take(r, 1) % 3];
    const int64_t at = (int64_t)(rng_next() % n);
    fmha_store(x, t, at, v);
    if (f) f[at] = fmha_load(x, t, at);
}

/* The reference with float32's weights where the float64 one (r, n values)
 * has a NaN or an infinity, for compare_tensor; NULL where it has none
 * (compare_tensor reads it only there), so most inputs skip it. */
static double *f32_weights_where_needed(const fmha_problem *p, const float *q, const float *k, const float *v,
                                        const double *r, size_t n) {
    size_t e = 0;
    while (e < n && isfinite(r[e])) e++;
    if (e == n) return NULL;
    double *r32 = malloc(n * sizeof(double));
    if (!r32 || fmha_ref_forward_full_f32_weights(p, q, k, v, r32, NULL) != 0) fail("reference failed");
    return r32;
}

/* x (dtype t, strides st over n) against r (contiguous [n0][n1][n2][n3]):
 * NaN where r is NaN, r's infinities, the finite values within
 * tol (1 + M), M the largest finite |r| (or extra_scale). r32 (NULL: none)
 * is the reference with float32's weights (fmha_ref_forward_full_f32_weights):
 * where r is not finite, r32's NaN or infinity is taken too. */
static void compare_tensor(const char *what, const void *x, fmha_dtype t, const int64_t n[4],
                           const int64_t st[4], const double *r, const double *r32, double extra_scale, double tol) {
    size_t len = (size_t)(n[0] * n[1] * n[2] * n[3]);
    double m = extra_scale;
    for (size_t e = 0; e < len; e++)
        if (isfinite(r[e])) m = fmax(m, fabs(r[e]));
    size_t e = 0;
    for (int64_t a = 0; a < n[0]; a++)
        for (int64_t b = 0; b < n[1]; b++)
            for (int64_t c = 0; c < n[2]; c++)
                for (int64_t d = 0; d < n[3]; d++, e++) {
                    double v = fmha_load(x, t, a * st[0] + b * st[1] + c * st[2] + d * st[3]);
                    if (!agrees(v, r[e], tol * (1.0 + m)) && !(r32 && !isfinite(r[e]) && agrees(v, r32[e], 0.0))) {
                        fprintf(stderr, "%s[%lld,%lld,%lld,%lld] = %.9g, reference %.9g (scale %g)\n",
                                what, (long long)a, (long long)b, (long long)c, (long long)d, v, r[e], m);
                        fail("an output differs from the reference");
                    }
                }
}

/* ---- one input ---- */

static void check_untouched(const buf *b, const char *what) {
    if (!buf_untouched(b)) fail(what);
}

/* A quantized cache: K and V of p (float32 values f32[1], f32[2] at p's
 * strides) written by fmha_kv_quantize into drawn formats, contiguous, with
 * head dims padded with zeros to whole GGUF blocks (the scores and the first
 * Dv columns of O do not change), buffers of exactly their size. The forward
 * on them must match the float64 reference on the values they hold (the
 * format's dequantisation times its scales), or, for a bad scale drawn now
 * and then, refuse the call with O untouched. A call whose scores take a
 * quantized query (precision FAST: q8_0 for int8, q8_0 or q4_0 keys, bf16
 * for float8 ones) may also err by twice the largest error llama.cpp's
 * arithmetic makes on that output (the reference on the query as ggml's
 * q8_0 blocks). */
/* check_formats' caches as page pools (fmha.h, "Paged KV cache"): pages of
 * a drawn size in a shuffled order, rows no sequence reads 0xff bytes (a
 * NaN d or float8 NaN if read) and NaN scales, block table entries past a
 * sequence's pages -1 or past the pool (never read). int8's per-key
 * scales become a pool beside the values; per-head scales stay. */
typedef struct page_pool {
    buf data[2], scales[2];
    int32_t *table;
} page_pool;

static void page_caches(reader *r, fmha_problem *pf, const buf stored[2], const buf scales[2], const int64_t row[2],
                        const int per_key[2], page_pool *pl) {
    static const int64_t page_sizes[5] = {1, 2, 3, 5, 16};
    const int64_t B = pf->batch, skv = pf->seq_kv, Hkv = pf->heads_kv, ps = page_sizes[take(r, 1) % 5];
    const int64_t w = (skv + ps - 1) / ps + (int64_t)(take(r, 1) % 2), n = B * w; /* table width, pool pages */
    int32_t *perm = malloc((size_t)n * sizeof(int32_t));
    pl->table = malloc((size_t)n * sizeof(int32_t));
    if (!perm || !pl->table) fail("out of memory");
    for (int64_t i = 0; i < n; i++) perm[i] = (int32_t)i;
    for (int64_t i = n - 1; i > 0; i--) {
        const int64_t j = (int64_t)(rng_next() % (uint64_t)(i + 1));
        const int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    /* len [B] the keys each sequence reads */
    int64_t *len = malloc((size_t)B * sizeof(int64_t));
    if (!len) fail("out of memory");
    for (int64_t b = 0; b < B; b++) len[b] = pf->masks.kv_lengths ? pf->masks.kv_lengths[b] : skv;
    for (int64_t b = 0; b < B; b++)
        for (int64_t g = 0; g < w; g++)
            pl->table[b * w + g] = g * ps < len[b] ? perm[b * w + g] : rng_next() % 2 ? -1 : (int32_t)(n + 7);
    free(perm);
    for (int t = 0; t < 2; t++) {
        const int64_t rb = row[t];
        buf_alloc(&pl->data[t], (size_t)(n * ps * Hkv * rb), 0);
        memset(pl->data[t].p, 0xff, pl->data[t].n);
        if (per_key[t]) {
            buf_alloc(&pl->scales[t], (size_t)(n * ps * Hkv) * sizeof(float), 0);
            for (int64_t e = 0; e < n * ps * Hkv; e++) ((float *)pl->scales[t].p)[e] = NAN;
        }
        for (int64_t b = 0; b < B; b++) {
            for (int64_t j = 0; j < len[b]; j++)
                for (int64_t h = 0; h < Hkv; h++) {
                    const int64_t from = (b * skv + j) * Hkv + h, to = (pl->table[b * w + j / ps] * ps + j % ps) * Hkv + h;
                    memcpy((uint8_t *)pl->data[t].p + to * rb, (const uint8_t *)stored[t].p + from * rb, (size_t)rb);
                    if (per_key[t]) ((float *)pl->scales[t].p)[to] = ((const float *)scales[t].p)[from];
                }
        }
        int64_t *st = t ? pf->v_strides : pf->k_strides, *ss = t ? pf->v_scale_strides : pf->k_scale_strides;
        st[0] = ps * Hkv * rb, st[1] = Hkv * rb, st[2] = rb, st[3] = 1;
        if (per_key[t]) {
            ss[0] = ps * Hkv, ss[1] = Hkv, ss[2] = 1;
            *(t ? &pf->v_scales : &pf->k_scales) = pl->scales[t].p;
        }
    }
    free(len);
    pf->block_table = pl->table;
    pf->block_table_stride = w;
    pf->page_size = ps;
    pf->num_pages = n;
}

static void check_formats(reader *r, const fmha_problem *p, float *const f32[4], const void *q_in, double tol) {
    const fmha_kv_format fk = (fmha_kv_format)(FMHA_KV_FORMAT_INT8 + take(r, 1) % 5),
                         fv = (fmha_kv_format)(FMHA_KV_FORMAT_INT8 + take(r, 1) % 5);
    const int bad_scale = take(r, 1) % 16 == 0;
    const int64_t B = p->batch, Hq = p->heads_q, Hkv = p->heads_kv, sq = p->seq_q, skv = p->seq_kv;
    const int64_t D = p->head_dim, Dv = p->head_dim_v, Dp = (D + 31) / 32 * 32, Dvp = (Dv + 31) / 32 * 32;
    if (B * skv * Hkv * Dvp > CAP_ELEMS || B * skv * Hkv * Dp > CAP_ELEMS || B * sq * Hq * Dp > CAP_ELEMS) return;
    /* q [B, Sq, Hq, Dp] float32 zero-padded; x [B, Skv, Hkv, Dp or Dvp] K's and V's values */
    float *q = calloc((size_t)(B * sq * Hq * Dp), sizeof(float));
    float *x[2] = {calloc((size_t)(B * skv * Hkv * Dp), sizeof(float)), calloc((size_t)(B * skv * Hkv * Dvp), sizeof(float))};
    float *val[2] = {malloc((size_t)(B * skv * Hkv * D) * sizeof(float)), malloc((size_t)(B * skv * Hkv * Dv) * sizeof(float))};
    if (!q || !x[0] || !x[1] || !val[0] || !val[1]) fail("out of memory");
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < sq; i++)
            for (int64_t h = 0; h < Hq; h++)
                for (int64_t e = 0; e < D; e++)
                    q[((b * sq + i) * Hq + h) * Dp + e] = fmha_load(q_in, p->dtype, b * p->q_strides[0] + i * p->q_strides[1] +
                                                                                        h * p->q_strides[2] + e * p->q_strides[3]);
    const fmha_kv_format fmt[2] = {fk, fv};
    const int64_t dim[2] = {D, Dv}, dimp[2] = {Dp, Dvp};
    buf stored[2] = {{0}}, scales[2] = {{0}};
    fmha_problem pf = *p, pr = *p;
    pf.dtype = FMHA_DTYPE_F32, pr.dtype = FMHA_DTYPE_F32;
    pf.head_dim = Dp, pf.head_dim_v = Dvp;
    uint32_t scale_bits; /* +0 means 1/sqrt(head_dim): the unpadded one */
    memcpy(&scale_bits, &p->scale, sizeof scale_bits);
    if (scale_bits == 0) pf.scale = (float)(1.0 / sqrt((double)D));
    for (int d = 0; d < 4; d++) pf.q_strides[d] = (int64_t[4]){sq * Hq * Dp, Hq * Dp, Dp, 1}[d];
    for (int t = 0; t < 2; t++) {
        const int64_t *st = t ? p->v_strides : p->k_strides, n = dim[t], np = dimp[t];
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < skv; j++)
                for (int64_t h = 0; h < Hkv; h++)
                    for (int64_t e = 0; e < n; e++)
                        x[t][((b * skv + j) * Hkv + h) * np + e] = f32[1 + t][b * st[0] + j * st[1] + h * st[2] + e * st[3]];
        const int64_t row = (int64_t)fmha_kv_format_row_bytes(fmt[t], np), rows = B * skv * Hkv;
        buf_alloc(&stored[t], (size_t)(rows * row), 0);
        const int per_key = fmt[t] == FMHA_KV_FORMAT_INT8, per_head = fmt[t] == FMHA_KV_FORMAT_FP8_E4M3 ||
                                                                      fmt[t] == FMHA_KV_FORMAT_FP8_E5M2;
        if (per_key || per_head) buf_alloc(&scales[t], (size_t)(per_key ? rows : Hkv) * sizeof(float), 0);
        float *sc = scales[t].p;
        for (int64_t h = 0; per_head && h < Hkv; h++) sc[h] = 0.25f + (float)h;
        const int64_t xs[3] = {Hkv * np, np, 1}, vs[3] = {Hkv * row, row, 1}, ss[2] = {per_key ? Hkv : 0, 1};
        /* a NaN or inf (poisoned K or V) is refused where it would set a scale */
        int finite = 1;
        for (int64_t e = 0; e < B * skv * Hkv * np; e++) finite &= isfinite(x[t][e]) != 0;
        const int refuses = !finite && (per_key || fmt[t] == FMHA_KV_FORMAT_Q8_0 || fmt[t] == FMHA_KV_FORMAT_Q4_0);
        const fmha_status qs = fmha_kv_quantize(fmt[t], B * skv, Hkv, np, x[t], xs, stored[t].p, vs, sc, sc ? ss : NULL);
        if (refuses) {
            if (qs != FMHA_ERR_BAD_SCALE) fail("fmha_kv_quantize took a NaN or inf that sets a scale");
            for (int u = 0; u < 2; u++) buf_free(&stored[u]), buf_free(&scales[u]), free(x[u]), free(val[u]);
            free(q);
            return;
        }
        if (qs != FMHA_OK) fail("fmha_kv_quantize refused a good row");
        const fmha_cache_format *f = fmha_cache_format_at((fmha_cache_format_id)(fmt[t] - FMHA_KV_FORMAT_F32));
        for (int64_t rr = 0; rr < rows; rr++)
            for (int64_t e = 0; e < n; e++)
                val[t][rr * n + e] = f->dequant((const uint8_t *)stored[t].p + rr * row, e) *
                                     (per_key ? sc[rr] : per_head ? sc[rr % Hkv] : 1.0f);
        int64_t *fst = t ? pf.v_strides : pf.k_strides, *rst = t ? pr.v_strides : pr.k_strides;
        for (int d = 0; d < 4; d++) {
            fst[d] = (int64_t[4]){skv * Hkv * row, Hkv * row, row, 1}[d];
            rst[d] = (int64_t[4]){skv * Hkv * n, Hkv * n, n, 1}[d];
        }
        *(t ? &pf.v_format : &pf.k_format) = fmt[t];
        *(t ? &pf.v_scales : &pf.k_scales) = sc;
        int64_t *pss = t ? pf.v_scale_strides : pf.k_scale_strides;
        pss[0] = skv * Hkv, pss[1] = Hkv, pss[2] = 1;
    }
    /* now and then one NaN or inf in K's or V's cache: a q8_0 / q4_0
     * block's d or a float8 byte (data, fmha.h), the values it holds
     * dequantised again for the reference */
    if (!bad_scale && take(r, 1) % 4 == 0) {
        const int t = (int)(take(r, 1) % 2);
        const int64_t row = (int64_t)fmha_kv_format_row_bytes(fmt[t], dimp[t]), rr = (int64_t)(rng_next() % (uint64_t)(B * skv * Hkv));
        const int64_t e = (int64_t)(rng_next() % (uint64_t)dim[t]);
        uint8_t *bytes = (uint8_t *)stored[t].p + rr * row;
        const uint8_t pick = (uint8_t)take(r, 1);
        const fmha_cache_format *f = fmha_cache_format_at((fmha_cache_format_id)(fmt[t] - FMHA_KV_FORMAT_F32));
        const float *sc = scales[t].p;
        if (fmt[t] == FMHA_KV_FORMAT_Q8_0 || fmt[t] == FMHA_KV_FORMAT_Q4_0) {
            const uint16_t d = fmha_f32_to_f16(pick % 3 == 0 ? NAN : pick % 3 == 1 ? INFINITY : -INFINITY);
            memcpy(bytes + e / 32 * (int64_t)fmha_kv_format_row_bytes(fmt[t], 32), &d, 2);
        } else if (fmt[t] != FMHA_KV_FORMAT_INT8) { /* E4M3: NaN only; E5M2: inf and NaN */
            static const uint8_t e4m3[2] = {0x7f, 0xff}, e5m2[4] = {0x7c, 0xfc, 0x7e, 0xfe};
            bytes[e] = fmt[t] == FMHA_KV_FORMAT_FP8_E4M3 ? e4m3[pick % 2] : e5m2[pick % 4];
        }
        for (int64_t j = 0; j < dim[t]; j++)
            val[t][rr * dim[t] + j] = f->dequant(bytes, j) * (fmt[t] == FMHA_KV_FORMAT_INT8 ? sc[rr] : sc ? sc[rr % Hkv] : 1.0f);
        /* K's padding columns hold d x 0: NaN for a d that is not finite,
         * which makes the key's score NaN against the query's zero padding
         * (IEEE); the reference, on the unpadded head dim, gets the same
         * score from one of the block's columns made NaN */
        const int64_t b0 = e / 32 * 32;
        if (t == 0 && b0 + 32 > dim[t] && !isfinite(f->dequant(bytes, dimp[t] - 1)))
            val[t][rr * dim[t] + b0] = NAN;
        n_poisoned++;
    }
    /* O [B, Sq, Hq, Dvp] float32 */
    buf o = {0};
    buf_alloc(&o, (size_t)(B * sq * Hq * Dvp) * sizeof(float), 1);
    for (int d = 0; d < 4; d++) pf.o_strides[d] = (int64_t[4]){sq * Hq * Dvp, Hq * Dvp, Dvp, 1}[d];
    float *poisoned = NULL;
    if (bad_scale && (scales[0].p || scales[1].p)) { /* the first key's scale of head 0: every call reads it */
        poisoned = scales[0].p ? scales[0].p : scales[1].p;
        poisoned[0] = (float)(take(r, 1) % 2 ? NAN : -1.0);
    }
    /* now and then the caches in page pools; a block table serves no dense
     * mask or bias, segment ids, callbacks or relative-position table
     * (FMHA_ERR_UNSUPPORTED), and one read entry made invalid is
     * FMHA_ERR_BAD_PAGE (poisoned scales aside: which refusal comes first
     * is not documented) */
    page_pool pl = {0};
    const int paged = take(r, 1) % 2;
    const int64_t rows_bytes[2] = {(int64_t)fmha_kv_format_row_bytes(fk, Dp), (int64_t)fmha_kv_format_row_bytes(fv, Dvp)};
    const int per_key[2] = {fk == FMHA_KV_FORMAT_INT8, fv == FMHA_KV_FORMAT_INT8};
    int bad_page = 0, paged_refused = 0;
    if (paged) {
        page_caches(r, &pf, stored, scales, rows_bytes, per_key, &pl);
        paged_refused = p->masks.dense || p->biases.dense || p->masks.q_segment_ids || p->masks.kv_segment_ids ||
                        p->masks.callback.fill || p->biases.callback.fill || p->biases.rel_table;
        const int64_t len0 = p->masks.kv_lengths ? p->masks.kv_lengths[0] : skv;
        if (!poisoned && !paged_refused && len0 > 0 && take(r, 1) % 8 == 0) {
            const int64_t g = (int64_t)(rng_next() % (uint64_t)((len0 + pf.page_size - 1) / pf.page_size));
            pl.table[g] = rng_next() % 2 ? -1 : (int32_t)pf.num_pages;
            bad_page = 1;
        }
        n_paged++;
    }
    fmha_status st = fmha_forward(&pf, q, paged ? pl.data[0].p : stored[0].p, paged ? pl.data[1].p : stored[1].p,
                                  o.p, NULL, NULL, 0);
    int kv_empty = 0; /* a first sequence with no keys never reads the poisoned scale */
    if (p->masks.kv_lengths && p->masks.kv_lengths[0] == 0) kv_empty = 1;
    if (paged_refused) {
        if (st != FMHA_ERR_UNSUPPORTED && !(poisoned && st == FMHA_ERR_BAD_SCALE))
            fail("formats: a block table beside a feature it does not serve was not refused as unsupported");
        check_untouched(&o, "formats: a refused paged call wrote O");
        n_paged_refused++;
    } else if (bad_page) {
        if (st != FMHA_ERR_BAD_PAGE) fail("formats: a block table entry outside the pool was not refused");
        check_untouched(&o, "formats: a refused paged call wrote O");
        n_paged_refused++;
    } else if (poisoned && !kv_empty) {
        if (st != FMHA_ERR_BAD_SCALE) fail("formats: a bad scale was not refused");
        check_untouched(&o, "formats: a refused call wrote O");
    } else if (poisoned) {
        /* its status depends on what the call reads: only check that a refusal wrote nothing */
        if (st != FMHA_OK) check_untouched(&o, "formats: a refused call wrote O");
    } else {
        if (st != FMHA_OK) fail("formats: the quantized forward failed where the float32 one ran");
        size_t n_o = (size_t)(B * sq * Hq * Dv);
        double *ro = malloc(n_o * sizeof(double)), *rl = malloc((size_t)(B * Hq * sq) * sizeof(double));
        float *qr = malloc((size_t)(B * sq * Hq * D) * sizeof(float));
        if (!ro || !rl || !qr) fail("out of memory");
        for (int64_t rr = 0; rr < B * sq * Hq; rr++) memcpy(qr + rr * D, q + rr * Dp, (size_t)D * sizeof(float));
        for (int d = 0; d < 4; d++) pr.q_strides[d] = (int64_t[4]){sq * Hq * D, Hq * D, D, 1}[d];
        if (fmha_ref_forward_full(&pr, qr, val[0], val[1], ro, rl) != 0) fail("reference failed");
        double *ro32 = f32_weights_where_needed(&pr, qr, val[0], val[1], ro, n_o); /* on the same query */
        const int64_t n4[4] = {B, sq, Hq, Dv};
        fmha_plan *plan = NULL;
        char line[1024] = "";
        if (fmha_plan_create(&pf, &plan) == FMHA_OK) fmha_plan_describe(plan, line, sizeof line);
        fmha_plan_destroy(plan);
        if (strstr(line, " scores=integer") || strstr(line, " scores=bf16")) {
            /* the query quantized (q8_0) or rounded (bf16): twice the error of the padded query's blocks
             * as ggml's q8_0 (a half scale), which a bf16 query's is below */
            double *rq = malloc(n_o * sizeof(double)), worst = 0.0, m = 0.0;
            if (!rq) fail("out of memory");
            for (int64_t rr = 0; rr < B * sq * Hq; rr++)
                for (int64_t e0 = 0; e0 < Dp; e0 += 32) {
                    int8_t qi[32];
                    float finite = 0.0f; /* x * 0: 0 for finite x; a row with a NaN or inf takes the float path */
                    for (int64_t e = e0; e < e0 + 32; e++) finite += q[rr * Dp + e] * 0.0f;
                    if (finite != 0.0f) continue;
                    const float dh = fmha_f16_to_f32(fmha_f32_to_f16(fmha_q8_0_block(q + rr * Dp + e0, qi)));
                    for (int64_t e = e0; e < e0 + 32 && e < D; e++) qr[rr * D + e] = (float)qi[e - e0] * dh;
                }
            if (fmha_ref_forward_full(&pr, qr, val[0], val[1], rq, rl) != 0) fail("reference failed");
            /* over the finite outputs: a NaN or inf in the cache (a poisoned block) makes
             * some infinite, which would take the model's scale m to inf and its term to 0 */
            for (size_t e = 0; e < n_o; e++)
                if (isfinite(ro[e]) && isfinite(rq[e])) worst = fmax(worst, fabs(rq[e] - ro[e])), m = fmax(m, fabs(ro[e]));
            tol += 2.0 * worst / (1.0 + m);
            free(rq);
        }
        compare_tensor("formats O", o.p, FMHA_DTYPE_F32, n4, pf.o_strides, ro, ro32, 0.0, tol);
        free(ro32);
        free(ro), free(rl), free(qr);
    }
    buf_free(&o);
    for (int t = 0; t < 2; t++)
        buf_free(&stored[t]), buf_free(&scales[t]), buf_free(&pl.data[t]), buf_free(&pl.scales[t]), free(x[t]), free(val[t]);
    free(pl.table), free(q);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    reader in = {data, size};
    rng_state = take(&in, 8);
    n_inputs++;

    /* sizes (one of them extreme now and then) and options */
    fmha_problem p;
    int64_t sz[7]; /* B, Hq, Hkv, Sq, Skv, D, Dv, read in this order */
    sz[0] = take_in(&in, 1, 3);
    sz[2] = take_in(&in, 1, 2);
    sz[1] = sz[2] * take_in(&in, 1, 3);
    sz[3] = take_in(&in, 1, 24);
    sz[4] = take_in(&in, 1, 24);
    sz[5] = take_in(&in, 1, 20);
    sz[6] = take_in(&in, 1, 20);
    /* decode shapes now and then (few queries, Skv >= 8 Sq: the decode driver) */
    uint64_t extra = take(&in, 1);
    if (extra % 4 == 0) {
        sz[3] = take_in(&in, 1, 4);
        sz[4] = 8 * sz[3] + take_in(&in, 0, 40);
    }
    uint64_t wild = take(&in, 1);
    if (wild % 8 == 0) sz[wild / 8 % 7] = take_extreme(&in);
    fmha_problem_init(&p, sz[0], sz[1], sz[2], sz[3], sz[4], sz[5], sz[6], FMHA_LAYOUT_BSHD);
    int small = 1; /* sizes the harness can build arrays and a reference for */
    for (int i = 0; i < 7; i++) small &= sz[i] >= 1 && sz[i] <= 300;
    small &= small && sz[1] % sz[2] == 0;
    const int64_t B = sz[0], Hq = sz[1], sq = sz[3], skv = sz[4];
    uint64_t opt = take(&in, 2);
    p.dtype = (fmha_dtype)(opt % 3);
    if (opt % 61 == 0) p.dtype = (fmha_dtype)3; /* unknown */
    p.causal = (fmha_causal)(opt / 3 % 3);
    p.strategy = (fmha_strategy)(opt / 9 % 4);
    p.precision = (fmha_precision)(opt / 36 % 2);
    /* one input in 13 at the float32 precisions of the bf16 products:
     * BF16X3 (from ACCURATE's draws) or BF16 (from FAST's) */
    if (opt % 13 == 0) p.precision = p.precision == FMHA_PRECISION_FAST ? FMHA_PRECISION_BF16 : FMHA_PRECISION_BF16X3;
    static const float scales[8] = {0.0f, 0.5f, 0.125f, -0.25f, 1.0f, 0.0f, NAN, INFINITY};
    p.scale = scales[opt / 72 % 8];
    if ((isnan(p.scale) || isinf(p.scale)) && opt / 576 % 4) p.scale = 0.0f;
    /* alignment: causal's (7 in 16), bottom-right (5), top-left (3), unknown (1);
     * one that contradicts causal's is kept 1 time in 4 */
    static const int64_t aligns[16] = {0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 1, 1, 1, 3};
    p.alignment = aligns[opt / 2304 % 16];
    if (((p.causal == FMHA_CAUSAL_TOP_LEFT && p.alignment == FMHA_ALIGN_BOTTOM_RIGHT) ||
         (p.causal == FMHA_CAUSAL_BOTTOM_RIGHT && p.alignment == FMHA_ALIGN_TOP_LEFT)) &&
        rng_next() % 4)
        p.alignment = FMHA_ALIGN_CAUSAL;
    /* any ISA of the registry (one this CPU lacks keeps the default) */
    const char *isa = fmha_isa_at(take(&in, 1) % fmha_isa_count())->name;
    int threads = (int)take_in(&in, 1, 3);
    int op = (int)take_in(&in, 0, 2); /* forward, backward after a forward, forward_backward */

    /* strides (one of them extreme now and then) */
    int64_t n[4];
    const int64_t *cst;
    int64_t *sts[4] = {p.q_strides, p.k_strides, p.v_strides, p.o_strides};
    const char names[4] = {'q', 'k', 'v', 'o'};
    for (int t = 0; t < 4; t++) {
        tensor_shape(&p, names[t], n, &cst);
        make_strides(&in, n, sts[t]);
    }
    if (wild % 8 == 1) set_stride(&in, sts[wild / 8 % 4], 1);

    /* masks */
    cb_ctx ctx = {B, Hq, sq, skv, 0, 0, NULL};
    uint64_t mflags = take(&in, 2);
    static const int64_t windows[10] = {-1, 0, 1, 3, 7, INT64_MAX, INT64_MAX - 1, (int64_t)1 << 62,
                                        -2, INT64_MIN};
    if (mflags & 1) {
        uint64_t w = take(&in, 2);
        p.masks.window_left = windows[w % 10];
        p.masks.window_right = windows[w / 10 % 10];
        if (w % 10 >= 8 && w / 100 % 4) p.masks.window_left = INT64_MAX; /* bad ones rarely */
        if (w / 10 % 10 >= 8 && w / 400 % 4) p.masks.window_right = INT64_MAX;
    }
    int32_t *kv_len = NULL, *q_len = NULL, *qseg = NULL, *kvseg = NULL;
    if (small && (mflags & 2)) {
        kv_len = malloc((size_t)B * sizeof(int32_t));
        if (!kv_len) fail("out of memory");
        for (int64_t b = 0; b < B; b++) kv_len[b] = (int32_t)take_in(&in, 0, skv + (take(&in, 1) % 16 == 0));
        p.masks.kv_lengths = kv_len;
    }
    if (small && (mflags & 4)) {
        q_len = malloc((size_t)B * sizeof(int32_t));
        if (!q_len) fail("out of memory");
        for (int64_t b = 0; b < B; b++) q_len[b] = (int32_t)take_in(&in, 0, sq);
        p.masks.q_lengths = q_len;
    }
    if (small && (mflags & 8)) {
        qseg = malloc((size_t)(B * sq) * sizeof(int32_t));
        kvseg = malloc((size_t)(B * skv) * sizeof(int32_t));
        if (!qseg || !kvseg) fail("out of memory");
        for (int64_t i = 0; i < B * sq; i++) qseg[i] = (int32_t)(rng_next() % 3);
        for (int64_t i = 0; i < B * skv; i++) kvseg[i] = (int32_t)(rng_next() % 3);
        p.masks.q_segment_ids = qseg;
        p.masks.kv_segment_ids = (mflags & 16) && take(&in, 1) % 8 == 0 ? NULL : kvseg;
    }
    const int64_t dext[4] = {B, Hq, sq, skv};
    buf mask = {0}, bias = {0};
    int64_t mask_len = 0, bias_len = 0;
    if (small && (mflags & 32)) {
        make_strides(&in, dext, p.masks.dense_strides);
        if (take(&in, 1) % 4 == 0) set_stride(&in, p.masks.dense_strides, 0); /* broadcast */
        if (take(&in, 1) % 16 == 0) set_stride(&in, p.masks.dense_strides, 1);
        mask_len = extent(dext, p.masks.dense_strides);
        buf_alloc(&mask, alloc_len(mask_len), 0);
        for (size_t i = 0; i < mask.n; i++) ((uint8_t *)mask.p)[i] = rng_next() % 5 != 0;
        p.masks.dense = mask.p;
    }
    if (mflags & 64) {
        ctx.classify_mode = (int)take_in(&in, 0, 2);
        p.masks.callback.fill = mask_fill;
        p.masks.callback.classify = ctx.classify_mode ? mask_classify : NULL;
        p.masks.callback.ctx = &ctx;
        if (take(&in, 1) % 32 == 0) p.masks.callback.fill = NULL; /* classify without fill */
    }

    /* biases */
    float *slopes = NULL, *rel = NULL;
    if (small && (mflags & 128)) {
        make_strides(&in, dext, p.biases.dense_strides);
        if (take(&in, 1) % 4 == 0) set_stride(&in, p.biases.dense_strides, 0);
        if (take(&in, 1) % 16 == 0) set_stride(&in, p.biases.dense_strides, 1);
        bias_len = extent(dext, p.biases.dense_strides);
        buf_alloc(&bias, alloc_len(bias_len) * sizeof(float), 0);
        for (size_t i = 0; i < bias.n / sizeof(float); i++) ((float *)bias.p)[i] = 2.0f * rng_value();
        p.biases.dense = bias.p;
    }
    if (small && (mflags & 256)) {
        slopes = malloc((size_t)Hq * sizeof(float));
        if (!slopes) fail("out of memory");
        for (int64_t h = 0; h < Hq; h++) slopes[h] = (float)(rng_next() % 9) / 16.0f;
        if (take(&in, 1) % 32 == 0) slopes[0] = NAN;
        p.biases.alibi_slopes = slopes;
    }
    if (small && (mflags & 512)) {
        rel = malloc((size_t)Hq * 16 * sizeof(float));
        if (!rel) fail("out of memory");
        for (int64_t i = 0; i < Hq * 16; i++) rel[i] = rng_value();
        p.biases.rel_table = rel;
        p.biases.rel_num_buckets = (int32_t)take_in(&in, 0, 16);
        p.biases.rel_max_distance = (int32_t)take_in(&in, 0, 40);
        p.biases.rel_bidirectional = (int32_t)(take(&in, 1) & 1);
    }
    if (mflags & 1024) {
        static const float caps[6] = {1.0f, 5.0f, 30.0f, -1.0f, NAN, INFINITY};
        uint64_t c = take(&in, 1);
        p.biases.softcap = caps[c % 24 < 3 ? 3 + c % 3 : c % 3];
    }
    if (mflags & 2048) {
        p.biases.callback.fill = bias_fill;
        p.biases.callback.accumulate_grad = bias_grad;
        p.biases.callback.ctx = &ctx;
        if (take(&in, 1) % 32 == 0) p.biases.callback.fill = NULL; /* gradient without bias */
    }
    ctx.salt = (uint32_t)rng_next();

    /* attention sinks (now and then one that is not finite) and dropout
     * (now and then a probability outside [0, 1)) */
    float *sinks = NULL;
    if (small && extra / 4 % 4 == 0) {
        sinks = malloc((size_t)Hq * sizeof(float));
        if (!sinks) fail("out of memory");
        for (int64_t h = 0; h < Hq; h++) sinks[h] = 4.0f * rng_value();
        if (take(&in, 1) % 32 == 0) sinks[0] = INFINITY;
        p.sinks = sinks;
    }
    if (extra / 16 % 8 == 0) {
        static const float ps[6] = {0.25f, 0.5f, 0.0625f, 1.0f, -0.5f, NAN};
        uint64_t dp = take(&in, 1);
        p.dropout_p = ps[dp % 24 < 3 ? 3 + dp % 3 : dp % 3];
        p.dropout_seed = rng_next();
        p.dropout_offset = rng_next() >> 8;
    }

    /* bias gradients wanted (some without their bias, some with an extreme stride) */
    uint64_t gflags = take(&in, 1);
    fmha_param_grads grads = {0};
    int64_t dgrad_len = 0;
    int want_dense = small && (gflags & 1) && (p.biases.dense || (gflags & 16));
    if (want_dense) {
        int64_t s = 1; /* contiguous over the dims the bias does not broadcast */
        for (int i = 3; i >= 0; i--) {
            int bc = p.biases.dense && p.biases.dense_strides[i] == 0;
            grads.d_dense_strides[i] = bc ? 0 : s;
            s *= bc ? 1 : dext[i];
        }
        if (gflags & 8) set_stride(&in, grads.d_dense_strides, 1);
        dgrad_len = extent(dext, grads.d_dense_strides);
    }
    int want_alibi = small && (gflags & 2) && (p.biases.alibi_slopes || (gflags & 16));
    int want_rel = small && (gflags & 4) && (p.biases.rel_table || (gflags & 16));

    fmha_cpu_force_isa(isa);
    fmha_set_num_threads(threads);

    /* validation alone: every entry point that needs no tensor */
    fmha_status check = fmha_problem_check(&p);
    /* (the size queries ask a classify callback about every tile: not on huge problems) */
    if (small || !p.masks.callback.classify || check != FMHA_OK) {
        size_t ws_bytes = 0;
        fmha_status sw = fmha_forward_workspace_size(&p, &ws_bytes);
        if (sw != check && !(check == FMHA_OK && sw == FMHA_ERR_CALLBACK))
            fail("forward_workspace_size disagrees with problem_check");
        fmha_status sb = fmha_backward_workspace_size(&p, &ws_bytes);
        if (sb != sw) fail("backward_workspace_size disagrees with forward_workspace_size");
    }
    if ((mask_len == EXT_INVALID || bias_len == EXT_INVALID) && check == FMHA_OK)
        fail("problem_check accepted a dense mask or bias beyond int64");

    /* tensors, exactly as large as their strides reach (1 element when invalid) */
    int64_t len[4];
    int runnable = small && p.dtype <= FMHA_DTYPE_F16 && mask_len != EXT_TOO_BIG &&
                   bias_len != EXT_TOO_BIG && dgrad_len != EXT_TOO_BIG;
    int any_invalid = mask_len == EXT_INVALID || bias_len == EXT_INVALID;
    for (int t = 0; t < 4; t++) {
        tensor_shape(&p, names[t], n, &cst);
        len[t] = extent(n, cst);
        if (len[t] == EXT_TOO_BIG) runnable = 0;
        if (len[t] == EXT_INVALID) any_invalid = 1;
    }
    if (any_invalid && check == FMHA_OK) fail("problem_check accepted a tensor beyond int64");
    n_status[(unsigned)check < 16 ? check : 15]++;
    if (!runnable) goto done;
    n_ran++;

    size_t esz = fmha_dtype_size(p.dtype);
    size_t n_lse = (size_t)(B * Hq * sq);
    int64_t n_scores = B * Hq * sq * skv;
    int64_t nb = p.biases.rel_num_buckets > 0 ? p.biases.rel_num_buckets : 1;
    buf in_t[4], o = {0}, lse = {0}, g_out[3] = {{0}}, d_dense = {0}, d_alibi = {0}, d_rel = {0};
    float *f32[4];
    for (int t = 0; t < 4; t++) {
        /* q, k, v, d_o in their dtype, and float32 copies the reference reads */
        buf_alloc(&in_t[t], alloc_len(len[t]) * esz, 0);
        f32[t] = malloc(alloc_len(len[t]) * sizeof(float));
        if (!f32[t]) fail("out of memory");
        for (size_t e = 0; e < alloc_len(len[t]); e++) {
            fmha_store(in_t[t].p, p.dtype, (int64_t)e, rng_value());
            f32[t][e] = fmha_load(in_t[t].p, p.dtype, (int64_t)e);
        }
    }
    buf_alloc(&o, alloc_len(len[3]) * esz, 1);
    buf_alloc(&lse, n_lse * sizeof(float), 1);
    for (int t = 0; t < 3; t++) buf_alloc(&g_out[t], alloc_len(len[t]) * esz, 1);
    if (want_dense) buf_alloc(&d_dense, alloc_len(dgrad_len) * sizeof(float), 1), grads.d_dense = d_dense.p;
    if (want_alibi) buf_alloc(&d_alibi, (size_t)Hq * sizeof(float), 1), grads.d_alibi = d_alibi.p;
    if (want_rel) buf_alloc(&d_rel, (size_t)(Hq * nb) * sizeof(float), 1), grads.d_rel_table = d_rel.p;
    const fmha_param_grads *gp = (gflags & 7) ? &grads : NULL;
    double *cb_grad = calloc((size_t)n_scores, sizeof(double));
    if (!cb_grad) fail("out of memory");

    /* a forward now and then with one NaN or inf in Q, K, V or the dense
     * bias, at any key (seen, masked, past kv_lengths) or in padding:
     * O and lse must follow fmha.h's IEEE rule as the reference does */
    if (op == 0 && take(&in, 1) % 4 == 0) {
        const uint64_t t = take(&in, 1) % (p.biases.dense ? 4 : 3);
        if (t < 3) poison_one(&in, in_t[t].p, f32[t], p.dtype, alloc_len(len[t]));
        else poison_one(&in, bias.p, NULL, FMHA_DTYPE_F32, bias.n / sizeof(float));
        n_poisoned++;
    }

    /* the call */
    float *lse_arg = op == 0 && (gflags & 32) ? NULL : lse.p;
    fmha_status fwd = FMHA_OK, bwd = FMHA_OK;
    ctx.grad = cb_grad;
    if (op == 2) {
        fwd = bwd = fmha_forward_backward(&p, in_t[0].p, in_t[1].p, in_t[2].p, in_t[3].p, o.p,
                                          lse.p, g_out[0].p, g_out[1].p, g_out[2].p, gp);
        if ((fwd != FMHA_OK) != (fmha_last_error_message()[0] != '\0'))
            fail("forward_backward: a failure without a message, or a message after success");
    } else {
        fwd = fmha_forward(&p, in_t[0].p, in_t[1].p, in_t[2].p, o.p, lse_arg, NULL, 0);
        if ((fwd != FMHA_OK) != (fmha_last_error_message()[0] != '\0'))
            fail("forward: a failure without a message, or a message after success");
        if (fwd != check && !(check == FMHA_OK && fwd == FMHA_ERR_CALLBACK))
            fail("forward's status differs from problem_check's");
    }
    /* a failed call writes nothing; the forward leaves a NULL lse's buffer alone */
    if (fwd != FMHA_OK) check_untouched(&o, "a failed call wrote O");
    if (fwd != FMHA_OK || !lse_arg) check_untouched(&lse, "a failed call wrote lse");
    if (op == 1) {
        memcpy(o.before, o.p, o.n); /* o and lse are the backward's inputs */
        memcpy(lse.before, lse.p, lse.n);
        bwd = fmha_backward(&p, in_t[0].p, in_t[1].p, in_t[2].p, o.p, in_t[3].p, lse.p, g_out[0].p,
                            g_out[1].p, g_out[2].p, gp, NULL, 0);
        if ((bwd != FMHA_OK) != (fmha_last_error_message()[0] != '\0'))
            fail("backward: a failure without a message, or a message after success");
        if (fwd != FMHA_OK && bwd == FMHA_OK) fail("backward accepted what forward refused");
        check_untouched(&o, "the backward wrote O");
        check_untouched(&lse, "the backward wrote lse");
    }
    ctx.grad = NULL; /* the reference calls the bias callback too */
    if (check != FMHA_OK && (fwd == FMHA_OK || (op != 0 && bwd == FMHA_OK)))
        fail("a call accepted what problem_check refused");
    if (op == 0 || bwd != FMHA_OK) {
        for (int t = 0; t < 3; t++) check_untouched(&g_out[t], "a failed call wrote dQ, dK or dV");
        check_untouched(&d_dense, "a failed call wrote the dense bias gradient");
        check_untouched(&d_alibi, "a failed call wrote the ALiBi gradient");
        check_untouched(&d_rel, "a failed call wrote the relative-position gradient");
        for (int64_t e = 0; e < n_scores; e++)
            if (cb_grad[e] != 0.0) fail("a failed call gave the bias callback a gradient");
    }

    /* a successful forward: O's padding untouched, values as the reference's */
    /* float32 at BF16 rounds Q, K, V and P (dO and dS) to bf16: bf16's bound */
    const int f32_as_bf16 = p.dtype == FMHA_DTYPE_F32 && p.precision == FMHA_PRECISION_BF16;
    double tol = tol_of(f32_as_bf16 ? FMHA_DTYPE_BF16 : p.dtype);
    fmha_problem p32 = p;
    p32.dtype = FMHA_DTYPE_F32;
    if (fwd == FMHA_OK) {
        n_fwd_ok++, n_dtype_ok[p.dtype]++;
        tensor_shape(&p, 'o', n, &cst);
        if (!padding_untouched(&o, n, cst, esz)) fail("the forward wrote O's padding");
        size_t n_o = (size_t)(n[0] * n[1] * n[2] * n[3]);
        double *ro = malloc(n_o * sizeof(double)), *rl = malloc(n_lse * sizeof(double));
        if (!ro || !rl) fail("out of memory");
        if (fmha_ref_forward_full(&p32, f32[0], f32[1], f32[2], ro, rl) != 0) fail("reference failed");
        /* with dropout O is P Z V (the reference has no Z); lse is still P's */
        double *ro32 = f32_weights_where_needed(&p32, f32[0], f32[1], f32[2], ro, n_o);
        if (p.dropout_p == 0.0f) compare_tensor("O", o.p, p.dtype, n, cst, ro, ro32, 0.0, tol);
        free(ro32);
        for (size_t i = 0; lse_arg && i < n_lse; i++) {
            float x = ((float *)lse.p)[i];
            if (!agrees(x, rl[i], tol * (1.0 + (isfinite(rl[i]) ? fabs(rl[i]) : 0.0))))
                fail("lse differs from the reference");
        }
        free(ro), free(rl);
    }

    /* the same forward on K and V quantized into drawn formats */
    if (fwd == FMHA_OK && op == 0 && p.dropout_p == 0.0f) check_formats(&in, &p, f32, in_t[0].p, tol_of(f32_as_bf16 ? FMHA_DTYPE_BF16 : FMHA_DTYPE_F32));

    /* a successful backward: padding untouched, gradients as the reference's */
    if (op != 0 && bwd == FMHA_OK && p.dropout_p == 0.0f) {
        n_bwd_ok++;
        int64_t gn[3][4];
        const int64_t *gs[3];
        for (int t = 0; t < 3; t++) {
            tensor_shape(&p, names[t], gn[t], &gs[t]);
            if (!padding_untouched(&g_out[t], gn[t], gs[t], esz)) fail("the backward wrote padding");
        }
        double *rg[3];
        for (int t = 0; t < 3; t++) {
            rg[t] = malloc((size_t)(gn[t][0] * gn[t][1] * gn[t][2] * gn[t][3]) * sizeof(double));
            if (!rg[t]) fail("out of memory");
        }
        double *rdb = malloc((size_t)n_scores * sizeof(double));
        double *rds = malloc((size_t)n_scores * sizeof(double));
        double *ral = malloc((size_t)Hq * sizeof(double));
        double *rrel = malloc((size_t)(Hq * nb) * sizeof(double));
        if (!rdb || !rds || !ral || !rrel) fail("out of memory");
        if (fmha_ref_backward_full_ex(&p32, f32[0], f32[1], f32[2], f32[3], rg[0], rg[1], rg[2],
                                      rdb, ral, p.biases.rel_table ? rrel : NULL, rds, NULL) != 0)
            fail("reference failed");
        /* the size of the terms each gradient sums: ds_scale bounds |dS| terms,
         * |q|, |k| <= 1, Skv (Sq times the group) of them per dQ (dK) element */
        double ds_max = 0.0;
        for (int64_t e = 0; e < n_scores; e++) ds_max = fmax(ds_max, rds[e]);
        double sc = fabs(fmha_ref_full_scale(&p));
        const char *gnames[3] = {"dQ", "dK", "dV"};
        const double term[3] = {sc * ds_max * (double)skv, sc * ds_max * (double)(sq * (Hq / sz[2])), 0.0};
        for (int t = 0; t < 3; t++)
            compare_tensor(gnames[t], g_out[t].p, p.dtype, gn[t], gs[t], rg[t], NULL, term[t], tol);
        if (grads.d_dense) {
            /* the per-score reference gradient summed where the gradient broadcasts */
            int64_t gl = dgrad_len;
            double *sum = calloc((size_t)gl, sizeof(double)), *mag = calloc((size_t)gl, sizeof(double));
            uint8_t *emap = calloc((size_t)gl, 1);
            if (!sum || !mag || !emap) fail("out of memory");
            const int64_t *gsd = grads.d_dense_strides;
            for (int64_t b = 0, e = 0; b < B; b++)
                for (int64_t h = 0; h < Hq; h++)
                    for (int64_t i = 0; i < sq; i++)
                        for (int64_t j = 0; j < skv; j++, e++) {
                            int64_t at = b * gsd[0] + h * gsd[1] + i * gsd[2] + j * gsd[3];
                            sum[at] += rdb[e], mag[at] += rds[e], emap[at] = 1;
                        }
            double m = 0.0;
            for (int64_t e = 0; e < gl; e++) m = fmax(m, fmax(mag[e], fabs(sum[e])));
            for (int64_t e = 0; e < gl; e++) {
                float x = ((float *)d_dense.p)[e];
                if (emap[e] ? !(fabs(x - sum[e]) <= tol * (1.0 + m))
                            : memcmp(&x, d_dense.before + e * sizeof(float), sizeof(float)) != 0)
                    fail("the dense bias gradient differs from the reference (or its padding changed)");
            }
            free(sum), free(mag), free(emap);
        }
        if (grads.d_alibi || grads.d_rel_table) {
            /* sizes of the terms per entry: sums of ds_scale (times |a| for ALiBi) */
            double m_al = 0.0, m_rel = 0.0;
            /* a = i + off - j at the problem's alignment, each sequence's own lengths */
            const int br = p.causal == FMHA_CAUSAL_BOTTOM_RIGHT || p.alignment == FMHA_ALIGN_BOTTOM_RIGHT;
            for (int64_t h = 0; h < Hq; h++) {
                double al = 0.0, all = 0.0;
                for (int64_t b = 0; b < B; b++) {
                    const int64_t off = br ? (kv_len ? kv_len[b] : skv) - (q_len ? q_len[b] : sq) : 0;
                    for (int64_t i = 0; i < sq; i++)
                        for (int64_t j = 0; j < skv; j++) {
                            double s = rds[((b * Hq + h) * sq + i) * skv + j];
                            int64_t a = i + off - j;
                            al += s * (double)(a < 0 ? -a : a), all += s;
                        }
                }
                m_al = fmax(m_al, al), m_rel = fmax(m_rel, all);
            }
            for (int64_t h = 0; grads.d_alibi && h < Hq; h++)
                if (!(fabs(((float *)d_alibi.p)[h] - ral[h]) <= tol * (1.0 + m_al)))
                    fail("the ALiBi gradient differs from the reference");
            for (int64_t e = 0; grads.d_rel_table && e < Hq * nb; e++)
                if (!(fabs(((float *)d_rel.p)[e] - rrel[e]) <= tol * (1.0 + m_rel)))
                    fail("the relative-position gradient differs from the reference");
        }
        if (p.biases.callback.fill)
            for (int64_t e = 0; e < n_scores; e++)
                if (!(fabs(cb_grad[e] - rdb[e]) <= tol * (1.0 + ds_max)))
                    fail("the bias callback's gradient differs from the reference");
        for (int t = 0; t < 3; t++) free(rg[t]);
        free(rdb), free(rds), free(ral), free(rrel);
    }

    for (int t = 0; t < 4; t++) buf_free(&in_t[t]), free(f32[t]);
    for (int t = 0; t < 3; t++) buf_free(&g_out[t]);
    buf_free(&o), buf_free(&lse), buf_free(&d_dense), buf_free(&d_alibi), buf_free(&d_rel);
    free(cb_grad);
done:
    buf_free(&mask), buf_free(&bias);
    free(kv_len), free(q_len), free(qseg), free(kvseg), free(slopes), free(rel), free(sinks);
    return 0;
}
