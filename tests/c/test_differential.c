/* test_differential.c: one random problem through every way fmha can run
 * it, all held to the float64 reference and to each other. Each case runs
 * on every strategy (auto, dense, tiled, portable), on every ISA of the
 * registry this CPU supports, one-shot and through a plan (tu_forward), and
 * a decode-shaped one also from a paged copy of its cache. Problems are
 * drawn with their extremes: windows of 0, 1, INT64_MAX - 1 and INT64_MAX
 * on either side, key lengths of 0 and full, bottom-right offsets of either
 * sign (Sq above and below Skv), alignment without causal, query lengths,
 * K and V in bf16 or f16 beside float32 Q (bf16 ones now and then at
 * precision BF16: the query rounded to bf16 on matrix_decode), or quantized (int8, q8_0, q4_0,
 * fp8 e4m3 and e5m2, D 32 or 64) under either precision (float8 now and then
 * at BF16: the query and P rounded to bf16), and decode shapes (Sq 1..16,
 * Skv >= 8 Sq) often enough to reach the decode driver.
 *
 * Half the problems also hold one NaN or +-inf: in Q, in K or V, in a
 * q8_0 / q4_0 block's d or a float8 byte, at whatever key the draw gives
 * (one a row sees, one its mask hides, one past kv_lengths): every path,
 * each split-KV merge included, must then give the reference's NaN and inf
 * pattern (fmha.h's rule) and its finite values. A quarter of the
 * unquantized problems are all bf16 (Q, K, V and O) with D 32 or 64: the
 * matrix engine's forward, and its decode (up to 48 rows a kv head and 1100
 * keys, in chunks of 256 merged as partials).
 *
 * Tolerances: O within 2e-5 + 2e-5 |ref| (float32 products and sums over at
 * most a few hundred keys); lse within 1e-5 + 1e-5 |ref|, and -inf exactly
 * where the reference has no key. A bf16 query gives a bf16 O: within
 * 8e-3 + 8e-3 |ref| (O's rounding, 2^-8 |O| at most, and P's to bf16 under
 * FAST, 2^-8 of each weight, over values of at most 1), lse within 1e-4 +
 * 1e-4 |ref| (float32 sums of P from a polynomial exp). A run whose scores take a quantized
 * query (precision FAST: q8_0 for int8, q8_0 or q4_0 keys, bf16 for float8
 * ones; precision BF16 on matrix_decode or on float8 caches: bf16, P as
 * bf16, so a bf16 O's tolerances) is held instead to twice the largest error that rounding makes on
 * the same output (the reference on the query rounded as the run rounds it:
 * ggml's q8_0 blocks, as llama.cpp does, or bf16) on top of those. The reference reads
 * the values the caches hold. Paged and contiguous caches give the same
 * bits (the decode driver reads them in the same order); a matrix_decode
 * problem's paged copy (pages of 128-160 keys, merged page by page) is held
 * to the reference. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/attn.h"
#include "runtime/convert.h"
#include "config/cpu.h"
#include "fmha_ref_masks.h"
#include "format/format.h"
#include "test_util.h"

static const int64_t windows[] = {-1, 0, 1, 2, 7, INT64_MAX - 1, INT64_MAX};

/* A window side drawn with its extremes. */
static int64_t draw_window(void) { return windows[tu_int(0, (int64_t)(sizeof windows / sizeof windows[0]) - 1)]; }

typedef struct diff_case {
    fmha_problem p;
    fmha_dtype kv_t;           /* K and V storage */
    fmha_kv_format kv_f;       /* or a quantized format (0: kv_t) */
    int32_t kv_len[3], q_len[3];
    float *q, *k, *v;          /* float32 inputs; k, v already rounded to kv_t (the values a format holds) */
    void *q_t, *k_t, *v_t;     /* Q, K and V as stored (Q: p.dtype; K, V: kv_t, or kv_f's bytes) */
    char poisoned;             /* 'q', 'k', 'v' or 0: the tensor holding a NaN or inf */
    float *k_sc, *v_sc;        /* int8's scales [B, Skv, Hkv] */
    double *ref_o, *ref_lse;   /* [B, Sq, Hq, Dv], [B, Hq, Sq] */
    double qround_o, qround_lse; /* the largest errors of O and lse on the query as FAST rounds it (kv_f) */
    size_t no, nl;
} diff_case;

/* K or V of p (which 'k' or 'v': float32 values x at p's strides) quantized
 * into format f, each batch element's rows in p's layout with rows of
 * whole blocks; x becomes the values the cache holds (with int8's scales,
 * *scales [B, Skv, Hkv]; float8's scale 1), and p's strides count the
 * format's bytes. */
static void *quantize_as(fmha_problem *p, char which, float *x, fmha_kv_format f, float **scales) {
    int64_t *st = which == 'k' ? p->k_strides : p->v_strides;
    const int64_t B = p->batch, S = p->seq_kv, H = p->heads_kv, D = which == 'k' ? p->head_dim : p->head_dim_v;
    const int64_t row = (int64_t)fmha_kv_format_row_bytes(f, D), bshd = st[1] > st[2];
    const int64_t bs[4] = {S * H * row, bshd ? H * row : row, bshd ? row : S * row, 1};
    uint8_t *bytes = malloc((size_t)(B * S * H * row));
    *scales = f == FMHA_KV_FORMAT_INT8 ? malloc((size_t)(B * S * H) * sizeof(float)) : NULL;
    for (int64_t b = 0; b < B; b++) {
        const int64_t xs[3] = {st[1], st[2], st[3]}, vs[3] = {bs[1], bs[2], 1}, ss[2] = {H, 1};
        fmha_kv_quantize(f, S, H, D, x + b * st[0], xs, bytes + b * bs[0], vs, *scales ? *scales + b * S * H : NULL,
                         *scales ? ss : NULL);
    }
    const fmha_cache_format *cf = fmha_cache_format_at((fmha_cache_format_id)(f - FMHA_KV_FORMAT_F32));
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = 0; j < S; j++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t e = 0; e < D; e++)
                    x[b * st[0] + j * st[1] + h * st[2] + e * st[3]] =
                        cf->dequant(bytes + b * bs[0] + j * bs[1] + h * bs[2], e) *
                        (*scales ? (*scales)[(b * S + j) * H + h] : 1.0f);
    memcpy(st, bs, sizeof bs);
    if (which == 'k') p->k_format = f, p->k_scales = *scales;
    else p->v_format = f, p->v_scales = *scales;
    int64_t *ss = which == 'k' ? p->k_scale_strides : p->v_scale_strides;
    ss[0] = S * H, ss[1] = H, ss[2] = 1;
    return bytes;
}

/* Stores K or V (float32 values x of n elements) as kv_t, and rounds x to
 * what that storage holds. */
static void *store_as(float *x, size_t n, fmha_dtype t) {
    if (t == FMHA_DTYPE_F32) return x;
    uint16_t *h = malloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) {
        h[i] = t == FMHA_DTYPE_BF16 ? fmha_f32_to_bf16(x[i]) : fmha_f32_to_f16(x[i]);
        x[i] = t == FMHA_DTYPE_BF16 ? fmha_bf16_to_f32(h[i]) : fmha_f16_to_f32(h[i]);
    }
    return h;
}

/* Element (b, s, h, e) of a tensor at strides st; a random one of extents n. */
static int64_t at4(const int64_t st[4], int64_t b, int64_t s, int64_t h, int64_t e) {
    return b * st[0] + s * st[1] + h * st[2] + e * st[3];
}

/* One NaN, +inf or -inf into Q, K or V as stored, at a random element (any
 * key: seen, masked or past kv_lengths); for a q8_0 / q4_0 cache into the
 * element's block d, for float8 its byte (int8 holds no such value: Q then).
 * The float copies the reference reads (at rp's strides) take the values
 * now stored. */
static void poison(diff_case *c, const fmha_problem *rp) {
    static const float values[] = {NAN, INFINITY, -INFINITY};
    const fmha_problem *p = &c->p;
    const float x = values[tu_int(0, 2)];
    char which = "qkv"[tu_int(0, 2)];
    if (c->kv_f == FMHA_KV_FORMAT_INT8) which = 'q';
    int64_t n[4];
    const int64_t *st = tu_shape(rp, which, n);
    const int64_t b = tu_int(0, n[0] - 1), s = tu_int(0, n[1] - 1), h = tu_int(0, n[2] - 1), e = tu_int(0, n[3] - 1);
    float *f = which == 'q' ? c->q : which == 'k' ? c->k : c->v;
    void *t = which == 'q' ? c->q_t : which == 'k' ? c->k_t : c->v_t;
    const fmha_dtype ft = which == 'q' ? p->dtype : c->kv_t;
    c->poisoned = which;
    if (which == 'q' || !c->kv_f) { /* a float element */
        const int64_t i = at4(st, b, s, h, e);
        f[i] = x;
        if (t != (void *)f) ((uint16_t *)t)[i] = ft == FMHA_DTYPE_BF16 ? fmha_f32_to_bf16(x) : fmha_f32_to_f16(x);
        f[i] = ft == FMHA_DTYPE_F32 ? x : ft == FMHA_DTYPE_BF16 ? fmha_bf16_to_f32(((uint16_t *)t)[i])
                                                                 : fmha_f16_to_f32(((uint16_t *)t)[i]);
        return;
    }
    /* a format's bytes: st counts bytes of rows; the element's block d or byte */
    const fmha_kv_format fmt = c->kv_f;
    const int64_t *bs = which == 'k' ? p->k_strides : p->v_strides, D = n[3];
    uint8_t *row = (uint8_t *)t + b * bs[0] + s * bs[1] + h * bs[2];
    const fmha_cache_format *cf = fmha_cache_format_at((fmha_cache_format_id)(fmt - FMHA_KV_FORMAT_F32));
    if (fmt == FMHA_KV_FORMAT_Q8_0 || fmt == FMHA_KV_FORMAT_Q4_0) {
        const uint16_t d = fmha_f32_to_f16(x);
        memcpy(row + (size_t)(e / 32) * fmha_kv_format_row_bytes(fmt, 32), &d, 2);
    } else { /* float8: E4M3 has NaN only (S.1111.111), E5M2 inf and NaN */
        row[e] = fmt == FMHA_KV_FORMAT_FP8_E4M3 ? (x < 0 ? 0xff : 0x7f) : x != x ? 0x7e : x > 0 ? 0x7c : 0xfc;
    }
    for (int64_t j = 0; j < D; j++) f[at4(st, b, s, h, j)] = cf->dequant(row, j);
}

static int draw_case(diff_case *c) {
    memset(c, 0, sizeof *c);
    const int64_t B = tu_int(1, 3), hkv = tu_int(1, 2), hq = hkv * tu_int(1, 3);
    const int decode = tu_int(0, 1);
    const int64_t sq = decode ? tu_int(1, 16) : tu_int(1, 70);
    /* now and then past a matrix_decode chunk (256 keys): split-KV merges */
    const int64_t skv = decode ? tu_int(8 * sq, tu_int(0, 3) ? 8 * sq + 200 : 1100) : tu_int(1, 90);
    static const int64_t dims[] = {8, 16, 24, 64};
    /* a quantized cache now and then (head dims of whole blocks) */
    static const fmha_kv_format formats[] = {FMHA_KV_FORMAT_INT8, FMHA_KV_FORMAT_Q8_0, FMHA_KV_FORMAT_Q4_0,
                                             FMHA_KV_FORMAT_FP8_E4M3, FMHA_KV_FORMAT_FP8_E5M2};
    c->kv_f = tu_int(0, 3) == 0 ? formats[tu_int(0, 4)] : FMHA_KV_FORMAT_DTYPE;
    /* a quarter of the rest all bf16, head dims of whole k-steps: the matrix engine's paths */
    const int all_bf16 = !c->kv_f && tu_int(0, 3) == 0;
    const int64_t D = c->kv_f || all_bf16 ? 32 * tu_int(1, 2) : dims[tu_int(0, 3)];
    fmha_problem *p = &c->p;
    fmha_problem_init(p, B, hq, hkv, sq, skv, D, D, tu_int(0, 1) ? FMHA_LAYOUT_BSHD : FMHA_LAYOUT_BHSD);
    p->causal = (fmha_causal)tu_int(0, 2);
    /* alignment: causal's, or bottom-right / top-left where causal agrees */
    int64_t al = tu_int(0, 2);
    if ((p->causal == FMHA_CAUSAL_TOP_LEFT && al == FMHA_ALIGN_BOTTOM_RIGHT) ||
        (p->causal == FMHA_CAUSAL_BOTTOM_RIGHT && al == FMHA_ALIGN_TOP_LEFT))
        al = FMHA_ALIGN_CAUSAL;
    p->alignment = al;
    if (tu_int(0, 2)) p->masks.window_left = draw_window();
    if (tu_int(0, 2)) p->masks.window_right = draw_window();
    if (tu_int(0, 1)) {
        for (int64_t b = 0; b < B; b++) {
            int64_t pick = tu_int(0, 3);
            c->kv_len[b] = (int32_t)(pick == 0 ? 0 : pick == 1 ? skv : tu_int(0, skv));
        }
        p->masks.kv_lengths = c->kv_len;
    }
    if (tu_int(0, 3) == 0) {
        for (int64_t b = 0; b < B; b++) c->q_len[b] = (int32_t)tu_int(0, sq);
        p->masks.q_lengths = c->q_len;
    }
    c->kv_t = FMHA_DTYPE_F32;
    if (c->kv_f) {
        p->precision = tu_int(0, 1) ? FMHA_PRECISION_FAST : FMHA_PRECISION_ACCURATE;
        /* now and then a float8 cache at BF16: the query and P rounded to bf16 */
        if ((c->kv_f == FMHA_KV_FORMAT_FP8_E4M3 || c->kv_f == FMHA_KV_FORMAT_FP8_E5M2) && tu_int(0, 2) == 0)
            p->precision = FMHA_PRECISION_BF16;
    } else if (all_bf16) {
        c->kv_t = p->dtype = FMHA_DTYPE_BF16;
    } else if (tu_int(0, 2) == 0) {
        c->kv_t = tu_int(0, 1) ? FMHA_DTYPE_BF16 : FMHA_DTYPE_F16;
        p->kv_dtype = c->kv_t == FMHA_DTYPE_BF16 ? FMHA_KV_DTYPE_BF16 : FMHA_KV_DTYPE_F16;
        /* now and then precision BF16: a float32 query rounded to bf16 (matrix_decode) */
        if (c->kv_t == FMHA_DTYPE_BF16 && tu_int(0, 1)) p->precision = FMHA_PRECISION_BF16;
    }
    if (fmha_problem_check(p) != FMHA_OK) return 0;
    c->q = tu_new_input(p, 'q', -1, 1);
    c->k = tu_new_input(p, 'k', -1, 1);
    c->v = tu_new_input(p, 'v', -1, 1);
    int64_t n[4];
    tu_shape(p, 'k', n);
    size_t nk = tu_span(p->k_strides, n);
    tu_shape(p, 'v', n);
    size_t nv = tu_span(p->v_strides, n);
    fmha_problem rp = *p; /* the reference reads the rounded float32 copies at p's strides */
    rp.kv_dtype = FMHA_KV_DTYPE_SAME;
    c->k_t = c->kv_f ? quantize_as(p, 'k', c->k, c->kv_f, &c->k_sc) : store_as(c->k, nk, c->kv_t);
    c->v_t = c->kv_f ? quantize_as(p, 'v', c->v, c->kv_f, &c->v_sc) : store_as(c->v, nv, c->kv_t);
    tu_shape(p, 'q', n);
    c->q_t = store_as(c->q, tu_span(p->q_strides, n), p->dtype);
    if (tu_int(0, 1)) poison(c, &rp);
    c->no = (size_t)(B * sq * hq * D);
    c->nl = (size_t)(B * hq * sq);
    c->ref_o = malloc(c->no * sizeof(double));
    c->ref_lse = malloc(c->nl * sizeof(double));
    if (fmha_ref_forward_full(&rp, c->q, c->k, c->v, c->ref_o, c->ref_lse) != 0) return 0;
    if (c->kv_f || p->precision == FMHA_PRECISION_BF16) {
        /* the query as FAST rounds it: bf16 for float8 keys, else q8_0 blocks
         * with the scale kept in float32 (fmha_q8_quantize_row's rounding,
         * not ggml's half: at D 32 the half's rounding scales a whole row's
         * scores by up to 2^-11, more than 2x the query's own rounding
         * moves O); as BF16 rounds it: bf16 */
        const int fp8 = c->kv_f == FMHA_KV_FORMAT_FP8_E4M3 || c->kv_f == FMHA_KV_FORMAT_FP8_E5M2;
        tu_shape(p, 'q', n);
        float *ql = malloc(tu_span(p->q_strides, n) * sizeof(float));
        double *lo = malloc(c->no * sizeof(double)), *ll = malloc(c->nl * sizeof(double));
        memcpy(ql, c->q, tu_span(p->q_strides, n) * sizeof(float));
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < sq; i++)
                for (int64_t h = 0; h < hq; h++)
                    for (int64_t e0 = 0; e0 < D; e0 += c->kv_f ? 32 : D) { /* D: any, unquantized */
                        float x[32];
                        int8_t qi[32];
                        float *at = ql + b * p->q_strides[0] + i * p->q_strides[1] + h * p->q_strides[2];
                        if (fp8 || !c->kv_f) {
                            for (int e = 0; e < (c->kv_f ? 32 : D); e++)
                                at[(e0 + e) * p->q_strides[3]] = fmha_bf16_to_f32(fmha_f32_to_bf16(at[(e0 + e) * p->q_strides[3]]));
                            continue;
                        }
                        for (int e = 0; e < 32; e++) x[e] = at[(e0 + e) * p->q_strides[3]];
                        const float dq = fmha_q8_0_block(x, qi);
                        for (int e = 0; e < 32; e++) at[(e0 + e) * p->q_strides[3]] = (float)qi[e] * dq;
                    }
        int ok = fmha_ref_forward_full(&rp, ql, c->k, c->v, lo, ll) == 0;
        c->qround_o = c->qround_lse = 0.0;
        for (size_t i = 0; i < c->no; i++)
            if (isfinite(c->ref_o[i])) c->qround_o = fmax(c->qround_o, fabs(lo[i] - c->ref_o[i]));
        for (size_t i = 0; i < c->nl; i++)
            if (isfinite(c->ref_lse[i])) c->qround_lse = fmax(c->qround_lse, fabs(ll[i] - c->ref_lse[i]));
        free(ql), free(lo), free(ll);
        return ok;
    }
    return 1;
}

static void free_case(diff_case *c) {
    if (c->q_t != c->q) free(c->q_t);
    if (c->k_t != c->k) free(c->k_t);
    if (c->v_t != c->v) free(c->v_t);
    free(c->q), free(c->k), free(c->v), free(c->ref_o), free(c->ref_lse), free(c->k_sc), free(c->v_sc);
}

/* O (contiguous [B, Sq, Hq, Dv] after gathering) and lse against the
 * reference (p: the problem as run). */
static int agrees(const diff_case *c, const fmha_problem *run, const float *o, const float *lse, const char *what) {
    const fmha_problem *p = &c->p;
    int64_t n[4];
    const int64_t *st = tu_shape(p, 'o', n);
    float *og = malloc(c->no * sizeof(float));
    const int bf16 = p->dtype == FMHA_DTYPE_BF16;
    if (bf16) { /* O as bf16 at O's strides */
        size_t at = 0;
        for (int64_t b = 0; b < n[0]; b++)
            for (int64_t s = 0; s < n[1]; s++)
                for (int64_t h = 0; h < n[2]; h++)
                    for (int64_t e = 0; e < n[3]; e++) og[at++] = fmha_bf16_to_f32(((const uint16_t *)o)[at4(st, b, s, h, e)]);
    } else {
        tu_gather(o, st, n, og);
    }
    const int integer = (c->kv_f || p->precision == FMHA_PRECISION_BF16) && tu_quantized_query(run);
    /* P as bf16: a bf16 O's tolerance (precision BF16 on the tiles) */
    const int p_bf16 = bf16 || (p->precision == FMHA_PRECISION_BF16 && integer);
    const double o_tol = p_bf16 ? 8e-3 : 2e-5, lse_tol = p_bf16 ? 1e-4 : 1e-5;
    double ratio = tu_worst_ratio(og, c->ref_o, c->no, o_tol + (integer ? 2.0 * c->qround_o : 0.0), o_tol);
    size_t bad_lse = 0;
    for (size_t i = 0; i < c->nl; i++) {
        double r = c->ref_lse[i], x = lse[i];
        if (isnan(r) || isnan(x)) bad_lse += !(isnan(r) && isnan(x));
        else if (isinf(r) || isinf(x)) bad_lse += !(r == x);
        else bad_lse += !(fabs(x - r) <= lse_tol + lse_tol * fabs(r) + (integer ? 2.0 * c->qround_lse : 0.0));
    }
    if (getenv("FMHA_TEST_VERBOSE") && (ratio > 1.0 || bad_lse))
        for (size_t i = 0; i < c->nl; i++) printf("  lse[%zu] %g ref %g\n", i, (double)lse[i], c->ref_lse[i]);
    free(og);
    return tu_check(ratio <= 1.0 && bad_lse == 0,
                    "%s: B %lld Hq %lld Hkv %lld Sq %lld Skv %lld D %lld causal %d align %lld window (%lld, %lld) "
                    "kv_len %s q_len %s dtype %d kv %d format %d poisoned %c: O worst/tol %.3g, %zu lse off",
                    what, (long long)p->batch, (long long)p->heads_q, (long long)p->heads_kv, (long long)p->seq_q,
                    (long long)p->seq_kv, (long long)p->head_dim, (int)p->causal, (long long)p->alignment,
                    (long long)p->masks.window_left, (long long)p->masks.window_right,
                    p->masks.kv_lengths ? "on" : "off", p->masks.q_lengths ? "on" : "off", (int)p->dtype, (int)c->kv_t,
                    (int)c->kv_f, c->poisoned ? c->poisoned : '-', ratio, bad_lse);
}

/* The case from a paged pool (pages of 3..20 keys, shuffled): the bits of
 * the contiguous run. BSHD caches only (the pool's rows are [page, Hkv, D]). */
static void paged_case(const diff_case *c, const float *o_contig, const float *lse_contig, int tiles) {
    const fmha_problem *p = &c->p;
    if (p->k_strides[2] != p->head_dim || c->kv_f) return; /* BHSD, formats (test_kvformat): no pool here */
    /* on the tiles: pages of 128 keys or more, several to a chunk */
    int64_t ps = tiles ? tu_int(128, 160) : tu_int(3, 20), stride, pages;
    int32_t full[3];
    for (int64_t b = 0; b < p->batch; b++) full[b] = (int32_t)p->seq_kv;
    const int32_t *lens = p->masks.kv_lengths ? p->masks.kv_lengths : full;
    int32_t *table = tu_page_table(p->batch, p->seq_kv, ps, lens, &stride, &pages);
    size_t es = fmha_dtype_size(c->kv_t), row = (size_t)(p->heads_kv * p->head_dim) * es;
    char *kpool = malloc((size_t)(pages * ps) * row), *vpool = malloc((size_t)(pages * ps) * row);
    memset(kpool, 0xff, (size_t)(pages * ps) * row);
    memset(vpool, 0xff, (size_t)(pages * ps) * row);
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t j = 0; j < p->seq_kv; j++) {
            int32_t pg = table[b * stride + j / ps];
            if (pg < 0) continue;
            size_t at = (size_t)(pg * ps + j % ps) * row, from = (size_t)(b * p->seq_kv + j) * row;
            memcpy(kpool + at, (const char *)c->k_t + from, row);
            memcpy(vpool + at, (const char *)c->v_t + from, row);
        }
    fmha_problem pp = *p;
    pp.block_table = table;
    pp.block_table_stride = stride;
    pp.page_size = ps;
    pp.num_pages = pages;
    pp.k_strides[0] = pp.v_strides[0] = ps * p->heads_kv * p->head_dim;
    float *o = tu_new_output(p, 'o', 0.0f), *lse = malloc(c->nl * sizeof(float));
    fmha_status st = tu_forward(&pp, c->q_t, kpool, vpool, o, lse, NULL, 0);
    if (st == FMHA_OK && tiles) { /* page by page on the tiles: merged in another order, held to the reference */
        tu_check(tu_planned_driver(&pp, &fmha_fwd_driver_matrix_decode) == 1,
                 "paged (pages of %lld): not planned on matrix_decode", (long long)ps);
        agrees(c, &pp, o, lse, "paged on the tiles");
    } else if (st == FMHA_OK) {
        int64_t n[4];
        tu_shape(p, 'o', n);
        size_t span = tu_span(p->o_strides, n);
        tu_check(!memcmp(o, o_contig, span * sizeof(float)) && !memcmp(lse, lse_contig, c->nl * sizeof(float)),
                 "paged (pages of %lld) differs from the contiguous cache's bits", (long long)ps);
    } else {
        tu_check(st == FMHA_ERR_UNSUPPORTED, "paged: status %d (%s)", (int)st, fmha_last_error_message());
    }
    free(o), free(lse), free(kpool), free(vpool), free(table);
}

int main(void) {
    tu_seed();
    const int cases = getenv("FMHA_TEST_CASES") ? atoi(getenv("FMHA_TEST_CASES")) : (int)tu_quick_pick(160, 40);
    long long runs = 0, decode_runs = 0, paged = 0, matrix_decode_runs = 0, f32_query_tiles = 0, poisoned = 0;
    for (int ci = 0; ci < cases; ci++) {
        diff_case c;
        if (!draw_case(&c)) {
            ci--; /* drew an invalid problem: draw again */
            continue;
        }
        char isa[64];
        for (size_t r = 0; tu_isa_run(r, 1, isa, sizeof isa); r++) {
            for (int s = FMHA_STRATEGY_AUTO; s <= FMHA_STRATEGY_PORTABLE; s++) {
                if (tu_strategy_skipped(s) || tu_strategy_repeats(s)) continue;
                fmha_problem p = c.p;
                p.strategy = (fmha_strategy)s;
                float *o = tu_new_output(&p, 'o', 0.0f), *lse = malloc(c.nl * sizeof(float));
                fmha_status st = tu_forward(&p, c.q_t, c.k_t, c.v_t, o, lse, NULL, 0);
                char what[96];
                snprintf(what, sizeof what, "case %d %s %s", ci, isa, tu_strategy_name(s));
                if (tu_check(st == FMHA_OK, "%s: status %d (%s)", what, (int)st, fmha_last_error_message()) &&
                    agrees(&c, &p, o, lse, what)) {
                    fmha_plan *plan = NULL;
                    if (fmha_plan_create(&p, &plan) == FMHA_OK) {
                        decode_runs += plan->driver == &fmha_fwd_driver_decode;
                        matrix_decode_runs += plan->driver == &fmha_fwd_driver_matrix_decode;
                        f32_query_tiles += plan->driver == &fmha_fwd_driver_matrix_decode && p.dtype == FMHA_DTYPE_F32;
                        poisoned += c.poisoned != 0;
                        const int tiles = plan->driver == &fmha_fwd_driver_matrix_decode;
                        if ((plan->driver == &fmha_fwd_driver_decode || tiles) && s == FMHA_STRATEGY_AUTO) {
                            paged_case(&c, o, lse, tiles);
                            paged++;
                        }
                    }
                    fmha_plan_destroy(plan);
                }
                runs++;
                free(o), free(lse);
            }
        }
        free_case(&c);
    }
    printf("%d problems, %lld runs (%lld on the decode driver, %lld also paged, %lld on matrix_decode, %lld of them "
           "with a float32 query; %lld holding a NaN or inf)\n",
           cases, runs, decode_runs, paged, matrix_decode_runs, f32_query_tiles, poisoned);
    tu_check(decode_runs > 0 && paged > 0, "the draw reached the decode driver (%lld) and pages (%lld)", decode_runs,
             paged);
    return tu_finish();
}
