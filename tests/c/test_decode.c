/* test_decode.c: the decode driver (few queries against many keys) and its
 * microkernels.
 *   kernels   every ISA's decode kernels against the scalar specification
 *   shapes    Sq = 1..16, GQA 8/1 and 32/8 and MHA, ragged key and query
 *             lengths, causal in both alignments, a window, float32, bf16
 *             and f16 caches, [B,S,H,D] and [B,H,S,D] layouts, every ISA,
 *             against the float64 reference; the decode driver is checked
 *             to be the one planned, and 1, 2 and 3 threads must agree bit
 *             for bit (split-KV merges in a fixed order)
 *   MLA       DeepSeek's decode shape: D 576, Dv 512, 16 and 128 query heads
 *             on one kv head, V the first 512 columns of K (the same pointer
 *             and strides), float32 and bf16, Sq 1 and 2, every ISA, against
 *             the reference and the tiled strategy, 1 and 2 threads bit for bit
 *   prefill   a causal forward over S tokens equals, row by row, S decode
 *             calls on the same cache with growing key lengths
 *   fallback  a table without decode kernels, and masks the decode driver
 *             does not serve, plan the tiled forward
 *   aligned   bottom-right causal with key and query lengths follows each
 *             sequence's own lengths (j <= i + kv_len[b] - q_len[b]) in the
 *             tiled, dense, portable and decode forwards and the backward,
 *             with a window and ALiBi, against the float64 reference
 *   sinks     attention sinks in every forward (decode, tiled, dense,
 *             portable; float32 and bf16) and in the backward's dQ, dK, dV,
 *             with masked rows and sinks far above and below the scores;
 *             the sinks' gradient (fmha_sinks_backward) against central
 *             differences of the reference, and its errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/attn.h"
#include "runtime/convert.h"
#include "config/cpu.h"
#include "fmha_ref_masks.h"
#include "test_util.h"
#include "uk/scalar/decode.h"


/* ---- kernels ---- */

static void check_close(const float *got, const float *want, size_t n, double tol, const char *what) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)want[i]) / (tol + tol * fabs((double)want[i]));
        if (!(d <= worst)) worst = d;
    }
    tu_check(worst <= 1.0, "%s: worst ratio %g", what, worst);
}

static void test_kernels(const fmha_ukernels *uk) {
    if (!uk->cache[FMHA_FORMAT_F32].scores) return;
    static const size_t dims[] = {1, 7, 16, 33, 64, 100, 128, 256};
    for (int c = 0; c < 24; c++) {
        size_t rows = (size_t)tu_int(1, 32), nk = (size_t)tu_int(1, 40);
        size_t d = dims[tu_int(0, 7)], dv = dims[tu_int(0, 7)];
        size_t ldq = d + (size_t)tu_int(0, 3), ldk = d + (size_t)tu_int(0, 5), lds = nk + 3;
        size_t ldv = dv + (size_t)tu_int(0, 5), ldo = dv + 1;
        /* q [rows][ldq], k [nk + 16][ldk] (16 spare rows: the kernels may
         * prefetch ahead), s [rows][lds], v [nk + 16][ldv], o [rows][ldo] */
        float *q = malloc(rows * ldq * sizeof(float)), *k = malloc((nk + 16) * ldk * sizeof(float));
        float *v = malloc((nk + 16) * ldv * sizeof(float));
        float *s1 = malloc(rows * lds * sizeof(float)), *s2 = malloc(rows * lds * sizeof(float));
        float *o1 = malloc(rows * ldo * sizeof(float)), *o2 = malloc(rows * ldo * sizeof(float));
        float m1[32], m2[32], l1[32], l2[32], a1[32], a2[32];
        tu_fill(q, rows * ldq, -1, 1);
        tu_fill(k, (nk + 16) * ldk, -1, 1);
        tu_fill(v, (nk + 16) * ldv, -1, 1);
        tu_fill(o1, rows * ldo, -1, 1);
        memcpy(o2, o1, rows * ldo * sizeof(float));
        float scale = (float)tu_uniform(0.05, 2.0);
        fmha_f32_decode_scores__scalar(rows, nk, d, q, ldq, k, ldk, s1, lds, scale);
        uk->cache[FMHA_FORMAT_F32].scores(rows, nk, d, q, ldq, k, ldk, s2, lds, scale);
        float *w1 = malloc(rows * nk * sizeof(float)), *w2 = malloc(rows * nk * sizeof(float));
        for (size_t r = 0; r < rows; r++) {
            memcpy(w1 + r * nk, s1 + r * lds, nk * sizeof(float));
            memcpy(w2 + r * nk, s2 + r * lds, nk * sizeof(float));
        }
        check_close(w2, w1, rows * nk, 1e-5 * sqrt((double)d), "decode scores");
        /* masked scores: some -inf, a fully masked row, running stats */
        for (size_t r = 0; r < rows; r++) {
            for (size_t j = 0; j < nk; j++)
                if (tu_int(0, 3) == 0 || r == 1) s1[r * lds + j] = -INFINITY;
            m1[r] = r % 3 == 0 ? -INFINITY : (float)tu_uniform(-2, 2);
            l1[r] = m1[r] == -INFINITY ? 0.0f : (float)tu_uniform(0.5, 3);
            memcpy(s2 + r * lds, s1 + r * lds, nk * sizeof(float));
        }
        memcpy(m2, m1, sizeof m1);
        memcpy(l2, l1, sizeof l1);
        fmha_f32_decode_softmax__scalar(rows, nk, s1, lds, m1, l1, a1);
        uk->decode.softmax(rows, nk, s2, lds, m2, l2, a2);
        for (size_t r = 0; r < rows; r++) {
            memcpy(w1 + r * nk, s1 + r * lds, nk * sizeof(float));
            memcpy(w2 + r * nk, s2 + r * lds, nk * sizeof(float));
        }
        check_close(w2, w1, rows * nk, 4e-7, "decode softmax P");
        check_close(a2, a1, rows, 4e-7, "decode softmax alpha");
        check_close(l2, l1, rows, 1e-6 * (double)nk, "decode softmax l");
        tu_check(!memcmp(m1, m2, rows * sizeof(float)), "decode softmax m");
        fmha_f32_decode_values__scalar(rows, nk, dv, s1, lds, v, ldv, o1, ldo, a1);
        uk->cache[FMHA_FORMAT_F32].values(rows, nk, dv, s1, lds, v, ldv, o2, ldo, a1);
        check_close(o2, o1, rows * ldo, 1e-5 * sqrt((double)nk), "decode values");
        free(q), free(k), free(v), free(s1), free(s2), free(o1), free(o2), free(w1), free(w2);
    }
    /* widening is exact: every 16-bit pattern */
    uint16_t *bits = malloc(65536 * sizeof(uint16_t));
    float *w1 = malloc(65536 * sizeof(float)), *w2 = malloc(65536 * sizeof(float));
    for (size_t i = 0; i < 65536; i++) bits[i] = (uint16_t)i;
    for (int t = 0; t < 2; t++) {
        fmha_cache_load_ukernel_fn fn = t ? uk->cache[FMHA_FORMAT_F16].load : uk->cache[FMHA_FORMAT_BF16].load;
        fmha_cache_load_ukernel_fn spec = t ? fmha_widen_f16__scalar : fmha_widen_bf16__scalar;
        size_t n = 65536 - (size_t)tu_int(0, 15);
        spec(n, bits, w1);
        fn(n, bits, w2);
        /* bit for bit; a NaN may come back quieted */
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            if (memcmp(&w1[i], &w2[i], sizeof(float)) && !(isnan(w1[i]) && isnan(w2[i]))) bad++;
        tu_check(bad == 0, "%s widen %s: %zu values differ", uk->isa, t ? "f16" : "bf16", bad);
    }
    free(bits), free(w1), free(w2);
}

/* The kernels over 2-byte K and V rows read in place: the bits of the same
 * ISA's float32 kernels on the widened rows (random finite values, every
 * row count and tail). */
static void test_h16_kernels(const fmha_ukernels *uk) {
    for (int t = 0; t < 2; t++) {
        fmha_cache_scores_ukernel_fn scores = t ? uk->cache[FMHA_FORMAT_F16].scores : uk->cache[FMHA_FORMAT_BF16].scores;
        fmha_cache_values_ukernel_fn values = t ? uk->cache[FMHA_FORMAT_F16].values : uk->cache[FMHA_FORMAT_BF16].values;
        fmha_cache_load_ukernel_fn widen = t ? fmha_widen_f16__scalar : fmha_widen_bf16__scalar;
        if (!scores || !values) continue;
        for (int c = 0; c < 24; c++) {
            size_t rows = (size_t)tu_int(1, 32), nk = (size_t)tu_int(1, 40), d = (size_t)tu_int(1, 200);
            size_t ld = d + (size_t)tu_int(0, 5), lds = nk + 1;
            /* q, o [rows][d]; k16 [nk][ld] 2-byte rows and kw their float32 widening; s, p [rows][lds] */
            float *q = malloc(rows * d * sizeof(float)), *kw = malloc(nk * ld * sizeof(float));
            float *s1 = malloc(rows * lds * sizeof(float)), *s2 = malloc(rows * lds * sizeof(float));
            float *o1 = malloc(rows * d * sizeof(float)), *o2 = malloc(rows * d * sizeof(float));
            float alpha[32];
            uint16_t *k16 = malloc(nk * ld * sizeof(uint16_t));
            tu_fill(q, rows * d, -1, 1);
            tu_fill(kw, nk * ld, -1, 1);
            for (size_t i = 0; i < nk * ld; i++) k16[i] = t ? fmha_f32_to_f16(kw[i]) : fmha_f32_to_bf16(kw[i]);
            widen(nk * ld, k16, kw);
            tu_fill(s1, rows * lds, 0, 1);
            memcpy(s2, s1, rows * lds * sizeof(float));
            tu_fill(o1, rows * d, -1, 1);
            memcpy(o2, o1, rows * d * sizeof(float));
            tu_fill(alpha, rows, 0, 1);
            uk->cache[FMHA_FORMAT_F32].scores(rows, nk, d, q, d, kw, ld, s1, lds, 0.3f);
            scores(rows, nk, d, q, d, k16, ld, s2, lds, 0.3f);
            tu_check(!memcmp(s1, s2, rows * lds * sizeof(float)), "%s %s decode scores: not the float32 bits",
                     uk->isa, t ? "f16" : "bf16");
            uk->cache[FMHA_FORMAT_F32].values(rows, nk, d, s1, lds, kw, ld, o1, d, alpha);
            values(rows, nk, d, s1, lds, k16, ld, o2, d, alpha);
            tu_check(!memcmp(o1, o2, rows * d * sizeof(float)), "%s %s decode values: not the float32 bits",
                     uk->isa, t ? "f16" : "bf16");
            free(q), free(kw), free(s1), free(s2), free(o1), free(o2), free(k16);
        }
    }
}

/* A score does not depend on where its row and key fall in a call: the
 * kernels run whole blocks (4 rows x 4 keys, 1 row x 16 keys) apart from
 * the partial ones at a call's edges, and both must give the same bits, or
 * a step's result would move with its sub-blocks and pages. Each call here
 * starts a few rows and keys into the first one's, so that every (row,
 * key) falls at another place in its block; float32, bf16 and f16 rows,
 * head dims with and without a tail of 16. */
static void test_scores_place(const fmha_ukernels *uk) {
    static const size_t dims[] = {16, 33, 64, 100, 128, 256};
    for (int c = 0; c < 36; c++) {
        const fmha_cache_format_id id = (fmha_cache_format_id)(c % 3); /* F32, BF16, F16 */
        const fmha_cache_scores_ukernel_fn scores = uk->cache[id].scores;
        if (!scores) continue;
        size_t rows = (size_t)tu_int(1, 13), nk = (size_t)tu_int(1, 40), d = dims[tu_int(0, 5)];
        size_t r0 = (size_t)tu_int(0, (int)rows - 1), j0 = (size_t)tu_int(0, (int)nk - 1);
        size_t unit = id == FMHA_FORMAT_F32 ? 4 : 2, ldk = d + (size_t)tu_int(0, 3), lds = nk;
        /* q [rows][d]; k [nk][ldk] in the format; s1, s2 [rows][lds] */
        float *q = malloc(rows * d * sizeof(float)), *kw = malloc(nk * ldk * sizeof(float));
        float *s1 = malloc(rows * lds * sizeof(float)), *s2 = malloc(rows * lds * sizeof(float));
        unsigned char *k = malloc(nk * ldk * unit);
        tu_fill(q, rows * d, -1, 1);
        tu_fill(kw, nk * ldk, -1, 1);
        for (size_t i = 0; i < nk * ldk; i++) {
            uint16_t h = id == FMHA_FORMAT_BF16 ? fmha_f32_to_bf16(kw[i]) : fmha_f32_to_f16(kw[i]);
            if (id == FMHA_FORMAT_F32) memcpy(k + 4 * i, &kw[i], 4);
            else memcpy(k + 2 * i, &h, 2);
        }
        scores(rows, nk, d, q, d, k, ldk, s1, lds, 0.7f);
        scores(rows - r0, nk - j0, d, q + r0 * d, d, k + j0 * ldk * unit, ldk, s2, lds, 0.7f);
        int same = 1;
        for (size_t r = r0; r < rows; r++)
            same &= !memcmp(s1 + r * lds + j0, s2 + (r - r0) * lds, (nk - j0) * sizeof(float));
        tu_check(same, "%s %s decode scores: rows %zu keys %zu d %zu from row %zu key %zu: other bits", uk->isa,
                 fmha_cache_format_at(id)->name, rows, nk, d, r0, j0);
        free(q), free(kw), free(s1), free(s2), free(k);
    }
}

/* The rows-in-lanes scores (decode.scores_qt) give the scalar float32
 * scores' bits (one fmaf chain from zero a row and key, then the scale),
 * whatever the lanes past the rows hold: every row count to 16, tails of
 * keys and of the head dim, row strides past d. */
static void test_scores_qt(const fmha_ukernels *uk) {
    if (!uk->decode.scores_qt) return;
    static const size_t dims[] = {1, 3, 4, 7, 16, 33, 64, 100, 128, 256};
    for (int c = 0; c < 40; c++) {
        size_t rows = c < 16 ? (size_t)c + 1 : (size_t)tu_int(1, 16), nk = (size_t)tu_int(1, 40);
        size_t d = dims[tu_int(0, 9)], ldk = d + (size_t)tu_int(0, 5), lds = nk + 3;
        /* q [rows][d], qt [d][16] (lanes past rows: noise), k [nk][ldk], s [rows][lds] */
        float *q = malloc(rows * d * sizeof(float)), *qt = malloc(d * 16 * sizeof(float));
        float *k = malloc(nk * ldk * sizeof(float));
        float *s1 = malloc(rows * lds * sizeof(float)), *s2 = malloc(rows * lds * sizeof(float));
        tu_fill(q, rows * d, -1, 1);
        tu_fill(qt, d * 16, -4, 4);
        tu_fill(k, nk * ldk, -1, 1);
        for (size_t r = 0; r < rows; r++)
            for (size_t e = 0; e < d; e++) qt[e * 16 + r] = q[r * d + e];
        tu_fill(s1, rows * lds, 0, 1);
        memcpy(s2, s1, rows * lds * sizeof(float));
        const float scale = (float)tu_uniform(0.05, 2.0);
        fmha_f32_decode_scores__scalar(rows, nk, d, q, d, k, ldk, s1, lds, scale);
        uk->decode.scores_qt(rows, nk, d, qt, k, ldk, s2, lds, scale);
        tu_check(!memcmp(s1, s2, rows * lds * sizeof(float)),
                 "%s decode scores_qt (%zu rows, %zu keys, d %zu): not the scalar scores' bits", uk->isa, rows, nk,
                 d);
        free(q), free(qt), free(k), free(s1), free(s2);
    }
}

/* The bf16 pair kernels of a bf16 cache (scores_bf16, values_bf16: a bf16
 * problem at FAST, a float32 one at BF16) give their specifications' bits
 * (normal operands, as the contract asks): rows 1-9, keys 1-128 (odd
 * counts too), head dims of whole blocks of 32, value dims with tails, V's
 * rows in order or shuffled. */
static void test_bf16_pairs(const fmha_ukernels *uk) {
    const fmha_uk_cache *c = &uk->cache[FMHA_FORMAT_BF16];
    if (!c->scores_bf16 || !c->values_bf16) return;
    for (int t = 0; t < 24; t++) {
        const size_t rows = (size_t)tu_int(1, 9), nk = t < 4 ? (size_t)(125 + t) : (size_t)tu_int(1, 40);
        const size_t d = 32 * (size_t)tu_int(1, 8), dv = (size_t)tu_int(1, 200);
        const size_t ldk = d + (size_t)tu_int(0, 5), ldv = dv + (size_t)tu_int(0, 5), lds = nk + 3;
        /* q [rows][d / 2] pairs, k [nk][ldk], v [nk][ldv] bf16; s, p [rows][lds]; o [rows][dv] */
        uint32_t *q = malloc(rows * d / 2 * sizeof(uint32_t));
        uint16_t *k = malloc(nk * ldk * sizeof(uint16_t)), *v = malloc(nk * ldv * sizeof(uint16_t));
        float *s1 = malloc(rows * lds * sizeof(float)), *s2 = malloc(rows * lds * sizeof(float));
        float *o1 = malloc(rows * dv * sizeof(float)), *o2 = malloc(rows * dv * sizeof(float)), alpha[9];
        for (size_t i = 0; i < rows * d / 2; i++)
            q[i] = (uint32_t)fmha_f32_to_bf16((float)tu_uniform(-1, 1)) |
                   (uint32_t)fmha_f32_to_bf16((float)tu_uniform(-1, 1)) << 16;
        for (size_t i = 0; i < nk * ldk; i++) k[i] = fmha_f32_to_bf16((float)tu_uniform(-2, 2));
        for (size_t i = 0; i < nk * ldv; i++) v[i] = fmha_f32_to_bf16((float)tu_uniform(-2, 2));
        fmha_bf16kv_scores_bf16__scalar(rows, nk, d, q, d / 2, k, ldk, s1, lds, 0.3f);
        c->scores_bf16(rows, nk, d, q, d / 2, k, ldk, s2, lds, 0.3f);
        size_t bad = 0;
        for (size_t r = 0; r < rows; r++) bad += memcmp(s1 + r * lds, s2 + r * lds, nk * sizeof(float)) != 0;
        tu_check(bad == 0, "%s bf16 keys scores_bf16 (%zu rows, %zu keys, d %zu): not the specification's bits",
                 uk->isa, rows, nk, d);
        /* P in (0.01, 1): normal, as a softmax leaves it */
        for (size_t i = 0; i < rows * lds; i++) s1[i] = (float)tu_uniform(0.01, 1);
        tu_fill(o1, rows * dv, -1, 1);
        memcpy(o2, o1, rows * dv * sizeof(float));
        tu_fill(alpha, rows, 0, 1);
        /* V's rows by address: in order, or shuffled (a paged cache's pages) */
        const void **v_rows = malloc(nk * sizeof *v_rows);
        for (size_t j = 0; j < nk; j++) v_rows[j] = v + j * ldv;
        for (size_t j = nk - 1; t % 2 && j > 0; j--) {
            const size_t x = (size_t)tu_int(0, (int)j);
            const void *y = v_rows[j];
            v_rows[j] = v_rows[x], v_rows[x] = y;
        }
        fmha_bf16kv_values_bf16__scalar(rows, nk, dv, s1, lds, v_rows, o1, dv, alpha);
        c->values_bf16(rows, nk, dv, s1, lds, v_rows, o2, dv, alpha);
        free(v_rows);
        tu_check(!memcmp(o1, o2, rows * dv * sizeof(float)),
                 "%s values_bf16 (%zu rows, %zu keys, dv %zu): not the specification's bits", uk->isa, rows, nk, dv);
        free(q), free(k), free(v), free(s1), free(s2), free(o1), free(o2);
    }
}

/* The same scores with 16 rows in the lanes (scores_bf16_qt on the
 * query's pair tiles, qt[16 p + r], rows past `rows` 0), where the table
 * has it: 1-16 rows, 1-40 keys (blocks of 16 and a last partial one), head
 * dims of whole blocks of 32, any row stride, against the specification. */
static void test_bf16_pairs_qt(const fmha_ukernels *uk) {
    const fmha_uk_cache *c = &uk->cache[FMHA_FORMAT_BF16];
    if (!c->scores_bf16_qt) return;
    for (int t = 0; t < 24; t++) {
        const size_t rows = t < 4 ? 16 : (size_t)tu_int(1, 16), nk = (size_t)tu_int(1, 40);
        const size_t d = 32 * (size_t)tu_int(1, 8), ldk = d + (size_t)tu_int(0, 5), lds = nk + 3;
        /* qt [d / 2][16] pairs, k [nk][ldk] bf16, s [16][lds] */
        uint32_t *qt = calloc(d / 2 * 16, sizeof(uint32_t));
        uint16_t *k = malloc(nk * ldk * sizeof(uint16_t));
        float *s1 = malloc(16 * lds * sizeof(float)), *s2 = malloc(16 * lds * sizeof(float));
        for (size_t p = 0; p < d / 2; p++)
            for (size_t r = 0; r < rows; r++)
                qt[16 * p + r] = (uint32_t)fmha_f32_to_bf16((float)tu_uniform(-1, 1)) |
                                 (uint32_t)fmha_f32_to_bf16((float)tu_uniform(-1, 1)) << 16;
        for (size_t i = 0; i < nk * ldk; i++) k[i] = fmha_f32_to_bf16((float)tu_uniform(-2, 2));
        tu_fill(s1, 16 * lds, 0, 1);
        memcpy(s2, s1, 16 * lds * sizeof(float));
        fmha_bf16kv_scores_bf16_qt__scalar(rows, nk, d, qt, k, ldk, s1, lds, 0.3f);
        c->scores_bf16_qt(rows, nk, d, qt, k, ldk, s2, lds, 0.3f);
        tu_check(!memcmp(s1, s2, 16 * lds * sizeof(float)),
                 "%s bf16 keys scores_bf16_qt (%zu rows, %zu keys, d %zu): not the specification's bits", uk->isa,
                 rows, nk, d);
        free(qt), free(k), free(s1), free(s2);
    }
}

/* ---- shapes against the reference ---- */

typedef struct dec_case {
    int64_t batch, hq, hkv, sq, skv, d, dv;
    fmha_causal causal;
    int ragged_kv, ragged_q, window, bhsd;
    fmha_dtype dtype;
} dec_case;

/* Inputs in the dtype (bits, or float32) and their exact float values. */
typedef struct dec_tensor {
    size_t n;
    void *data;
    float *value;
} dec_tensor;

static dec_tensor dec_tensor_new(fmha_dtype t, size_t n) {
    dec_tensor x = {n, NULL, malloc(n * sizeof(float))};
    x.data = t == FMHA_DTYPE_F32 ? (void *)x.value : malloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) {
        float f = (float)tu_uniform(-1, 1);
        if (t != FMHA_DTYPE_F32) {
            fmha_store(x.data, t, (int64_t)i, f);
            f = fmha_load(x.data, t, (int64_t)i);
        }
        x.value[i] = f;
    }
    return x;
}

static void dec_tensor_free(dec_tensor *x) {
    if (x->data != x->value) free(x->data);
    free(x->value);
}

static int planned_decode(const fmha_problem *p) { return tu_planned_driver(p, &fmha_fwd_driver_decode); }

/* The documented rule for decoding on the tiles (fmha.h, fmha_plan_describe's
 * drivers): bf16 at FAST, auto, a table with a matrix decode, Sq <= 16,
 * Skv >= 8 Sq, 8+ rows a kv head (group x Sq), D a multiple of 32, K and V
 * of unit stride, no bias, dropout, segments or callback (as these cases). */
static int matrix_decode_expected(const fmha_problem *p) {
    const int64_t rows = p->heads_q / p->heads_kv * p->seq_q;
    return fmha_cpu_kernels()->matrix.decode && p->dtype == FMHA_DTYPE_BF16 && p->seq_q <= 16 &&
           p->seq_kv >= 8 * p->seq_q && rows >= 8 && p->head_dim % 32 == 0 && p->strategy == FMHA_STRATEGY_AUTO;
}

static void run_case(const dec_case *dc) {
    fmha_problem p;
    fmha_problem_init(&p, dc->batch, dc->hq, dc->hkv, dc->sq, dc->skv, dc->d, dc->dv,
                      dc->bhsd ? FMHA_LAYOUT_BHSD : FMHA_LAYOUT_BSHD);
    p.causal = dc->causal;
    p.dtype = dc->dtype;
    int32_t kv_len[8], q_len[8];
    for (int64_t b = 0; b < dc->batch; b++) {
        kv_len[b] = (int32_t)tu_int(b == 0 ? dc->skv / 2 : 0, dc->skv);
        q_len[b] = (int32_t)tu_int(b == 0 ? 1 : 0, dc->sq);
    }
    if (dc->ragged_kv) p.masks.kv_lengths = kv_len;
    if (dc->ragged_q) p.masks.q_lengths = q_len;
    if (dc->window) p.masks.window_left = tu_int(0, dc->skv / 2);
    size_t nq = (size_t)(dc->batch * dc->sq * dc->hq * dc->d);
    size_t nk = (size_t)(dc->batch * dc->skv * dc->hkv * dc->d);
    size_t nv = (size_t)(dc->batch * dc->skv * dc->hkv * dc->dv);
    size_t no = (size_t)(dc->batch * dc->sq * dc->hq * dc->dv), nl = (size_t)(dc->batch * dc->hq * dc->sq);
    dec_tensor q = dec_tensor_new(p.dtype, nq), k = dec_tensor_new(p.dtype, nk), v = dec_tensor_new(p.dtype, nv);
    fmha_problem pf = p;
    pf.dtype = FMHA_DTYPE_F32;
    /* ref_o [B, Sq, Hq, Dv] contiguous, ref_lse [B, Hq, Sq] */
    double *ref_o = malloc(no * sizeof(double)), *ref_lse = malloc(nl * sizeof(double));
    fmha_ref_forward_full(&pf, q.value, k.value, v.value, ref_o, ref_lse);
    char what[200];
    snprintf(what, sizeof what,
             "B %lld Hq %lld Hkv %lld Sq %lld Skv %lld D %lld Dv %lld %s%s%s%s %s %s",
             (long long)dc->batch, (long long)dc->hq, (long long)dc->hkv, (long long)dc->sq,
             (long long)dc->skv, (long long)dc->d, (long long)dc->dv, tu_causal_name(dc->causal),
             dc->ragged_kv ? " kv_lengths" : "", dc->ragged_q ? " q_lengths" : "",
             dc->window ? " window" : "", dc->bhsd ? "BHSD" : "BSHD",
             dc->dtype == FMHA_DTYPE_F32 ? "f32" : dc->dtype == FMHA_DTYPE_BF16 ? "bf16" : "f16");
    size_t esize = fmha_dtype_size(p.dtype);
    /* o [B, Sq, Hq, Dv] in the dtype, lse [B, Hq, Sq]; first: the 1-thread run */
    char *o = malloc(no * esize), *o_first = malloc(no * esize);
    float *lse = malloc(nl * sizeof(float)), *lse_first = malloc(nl * sizeof(float));
    float *of = malloc(no * sizeof(float));
    double *lse_d = malloc(nl * sizeof(double));
    const char *isa_default = fmha_isa_name();
    for (size_t ii = 0; ii < fmha_isa_count(); ii++) {
        if (!tu_isa_runs(fmha_isa_at(ii)) || fmha_cpu_force_isa(fmha_isa_at(ii)->name) != 0) continue;
        const fmha_ukernels *uk = fmha_cpu_kernels();
        int want = uk->cache[FMHA_FORMAT_F32].scores != NULL && dc->sq <= 16 && dc->skv >= 8 * dc->sq;
        if (matrix_decode_expected(&p))
            tu_check(tu_planned_driver(&p, &fmha_fwd_driver_matrix_decode) == 1, "%s %s: matrix_decode planned",
                     fmha_isa_at(ii)->name, what);
        else
            tu_check(planned_decode(&p) == want, "%s %s: decode planned %d, wanted %d", fmha_isa_at(ii)->name,
                     what, planned_decode(&p), want);
        for (int threads = 1; threads <= (tu_emulated() ? 2 : 3); threads++) {
            fmha_set_num_threads(threads);
            memset(o, 0x7f, no * esize);
            fmha_status st = tu_forward(&p, q.data, k.data, v.data, o, lse, NULL, 0);
            if (!tu_check(st == FMHA_OK, "%s %s: status %d", fmha_isa_at(ii)->name, what, (int)st)) continue;
            if (threads == 1) {
                memcpy(o_first, o, no * esize);
                memcpy(lse_first, lse, nl * sizeof(float));
                /* of [B, Sq, Hq, Dv] contiguous, as the reference */
                const int64_t *os = p.o_strides;
                size_t at = 0;
                for (int64_t b = 0; b < dc->batch; b++)
                    for (int64_t i = 0; i < dc->sq; i++)
                        for (int64_t h = 0; h < dc->hq; h++)
                            for (int64_t c = 0; c < dc->dv; c++)
                                of[at++] = fmha_load(o, p.dtype, b * os[0] + i * os[1] + h * os[2] + c * os[3]);
                /* bf16 and f16 outputs: the rounding of O itself plus accumulation */
                double otol = p.dtype == FMHA_DTYPE_F32 ? 2e-5 : p.dtype == FMHA_DTYPE_BF16 ? 8e-3 : 1e-3;
                tu_check(tu_worst_ratio(of, ref_o, no, otol, otol) <= 1.0, "%s %s: O ratio %g",
                         fmha_isa_at(ii)->name, what, tu_worst_ratio(of, ref_o, no, otol, otol));
                int lse_ok = 1;
                size_t bad = 0;
                for (size_t i = 0; i < nl; i++) {
                    const int ok = isinf(ref_lse[i]) ? isinf(lse[i]) && lse[i] < 0
                                                     : fabs((double)lse[i] - ref_lse[i]) <= 1e-5 * (1 + fabs(ref_lse[i]));
                    if (!ok && lse_ok) bad = i;
                    lse_ok &= ok;
                }
                tu_check(lse_ok, "%s %s: lse[%zu] %.9g, reference %.9g", fmha_isa_at(ii)->name, what, bad,
                         (double)lse[bad], ref_lse[bad]);
            } else {
                tu_check(!memcmp(o, o_first, no * esize) && !memcmp(lse, lse_first, nl * sizeof(float)),
                         "%s %s: %d threads differ from 1", fmha_isa_at(ii)->name, what, threads);
            }
        }
    }
    fmha_set_num_threads(0);
    fmha_cpu_force_isa(isa_default);
    free(ref_o), free(ref_lse), free(o), free(o_first), free(lse), free(lse_first), free(of), free(lse_d);
    dec_tensor_free(&q), dec_tensor_free(&k), dec_tensor_free(&v);
}

static void test_shapes(void) {
    static const fmha_dtype dtypes[] = {FMHA_DTYPE_F32, FMHA_DTYPE_BF16, FMHA_DTYPE_F16};
    static const int64_t heads[][2] = {{8, 1}, {32, 8}, {3, 3}};
    for (int64_t sq = 1; sq <= 16; sq++) {
        dec_case dc = {0};
        dc.batch = tu_int(1, 3);
        dc.hq = heads[sq % 3][0];
        dc.hkv = heads[sq % 3][1];
        dc.sq = sq;
        dc.skv = tu_int(4 * sq, tu_quick_pick(700, 300)); /* below 8 Sq: the tiled forward */
        dc.d = sq % 4 == 0 ? 128 : tu_int(1, 96);
        dc.dv = sq % 5 == 0 ? tu_int(1, 80) : dc.d;
        dc.causal = (fmha_causal)(sq % 3);
        dc.ragged_kv = sq % 2;
        dc.ragged_q = sq % 4 == 3;
        dc.window = sq % 7 == 5;
        dc.bhsd = sq % 3 == 1;
        dc.dtype = dtypes[sq % 3];
        run_case(&dc);
        /* the same with the other dtypes, causal bottom-right and ragged keys */
        dc.causal = FMHA_CAUSAL_BOTTOM_RIGHT;
        dc.ragged_kv = 1;
        dc.dtype = dtypes[(sq + 1) % 3];
        run_case(&dc);
    }
    /* long caches, several chunks per kv head */
    dec_case big = {1, 32, 8, 1, tu_emulated() ? 2500 : 5000, 128, 128, FMHA_CAUSAL_BOTTOM_RIGHT, 0, 0, 0, 0,
                    FMHA_DTYPE_F32};
    run_case(&big);
    big.dtype = FMHA_DTYPE_BF16;
    big.ragged_kv = 1;
    big.sq = 4;
    run_case(&big);
    /* bf16 on the tiles: 192 rows a kv head (two calls of up to four row
     * blocks), a window crossing the key chunks, Dv short of a tile */
    dec_case rows = {2, 16, 1, 12, 1500, 96, 40, FMHA_CAUSAL_BOTTOM_RIGHT, 1, 1, 1, 0, FMHA_DTYPE_BF16};
    run_case(&rows);
    /* bf16 on the tiles, kv heads side by side: a task runs its batch
     * element's 4 kv heads 256 keys a turn over chunks of 512 (64 rows a
     * kv head), ragged keys and a window */
    dec_case turns = {2, 16, 4, 16, tu_emulated() ? 1500 : 3000, 64, 64, FMHA_CAUSAL_BOTTOM_RIGHT, 1, 0, 1, 0,
                      FMHA_DTYPE_BF16};
    run_case(&turns);
}

/* The matrix decode kernel's calls resumed on the 128-key grid (contract
 * in ukernel.h) give the one call's bits: 1000 keys in turns of 256, each
 * told the next turn's keys, against one call; 40 rows in two blocks, each
 * row its own key range. */
static void test_matrix_decode_resume(const fmha_ukernels *uk) {
    if (!uk->matrix.decode) return;
    enum { D = 64, DV = 64, NK = 1000, NB = 2, ROWS = 40, TURN = 256 };
    const size_t dvp = fmha_matrix_dvp(DV), qt_words = D / 32 * 512;
    /* k, v [NK][D] bf16 rows; q [ROWS][D] bf16 */
    uint16_t *k = malloc(NK * D * 2), *v = malloc(NK * DV * 2), *q = malloc(ROWS * D * 2);
    for (size_t i = 0; i < NK * D; i++) k[i] = fmha_f32_to_bf16((float)tu_uniform(-1, 1));
    for (size_t i = 0; i < NK * DV; i++) v[i] = fmha_f32_to_bf16((float)tu_uniform(-1, 1));
    for (size_t i = 0; i < ROWS * D; i++) q[i] = fmha_f32_to_bf16((float)tu_uniform(-2, 2));
    /* qt [NB][D / 32 * 512] words; lo, hi [NB][32]; the outputs twice */
    /* vb: the kernel's V interleave of a 128-key block, [128 / 32][dvp / 16][16][16] words */
    uint32_t *qt = calloc(NB * qt_words, 4), *vb = calloc(128 / 32 * dvp / 16 * 256, 4);
    int64_t lo[NB * 32] = {0}, hi[NB * 32] = {0};
    float *s = calloc(NB * 128 * 32, 4), *o[2], m[2][NB * 32], l[2][NB * 32];
    uint16_t *pbuf = calloc(NB * 32 * 128, 2), *k_tail = calloc(32 * D, 2);
    for (int t = 0; t < 2; t++) o[t] = calloc(NB * 32 * dvp, 4);
    for (size_t blk = 0; blk < NB; blk++) {
        const void *rows[32];
        const size_t nq = blk + 1 < NB ? 32 : ROWS - 32 * (NB - 1);
        for (size_t r = 0; r < nq; r++) {
            rows[r] = q + (32 * blk + r) * D;
            lo[32 * blk + r] = (int64_t)((32 * blk + r) * 37 % 300);
            hi[32 * blk + r] = NK - (int64_t)((32 * blk + r) * 11 % 200);
        }
        uk->matrix.pack_qt(nq, D, rows, FMHA_MATRIX_SRC_BF16, 1, 0, qt + blk * qt_words);
    }
    fmha_matrix_dec_args one = {.nb = NB, .nq = ROWS - 32 * (NB - 1), .d = D, .dv = DV, .dvp = dvp, .qt = qt,
                                .k = (const char *)k, .v = (const char *)v, .k_rs = D * 2, .v_rs = DV * 2,
                                .kb = 0, .ke = NK, .lo = lo, .hi = hi, .scale_log2 = 0.125f * 1.4426950f,
                                .rescale_log2 = 8, .o = o[0], .m = m[0], .l = l[0], .s = s, .p = pbuf, .vb = vb,
                                .k_tail = k_tail};
    uk->matrix.decode(&one);
    for (int64_t j0 = 0; j0 < NK; j0 += TURN) {
        fmha_matrix_dec_args a = one;
        a.o = o[1], a.m = m[1], a.l = l[1];
        a.k += j0 * a.k_rs, a.v += j0 * a.v_rs, a.kb = j0, a.ke = j0 + TURN < NK ? j0 + TURN : NK;
        a.resume = j0 > 0, a.unfinished = a.ke < NK;
        if (a.unfinished) {
            const int64_t left = NK - a.ke;
            a.next_k = a.k + TURN * a.k_rs, a.next_v = a.v + TURN * a.v_rs, a.next_n = left < TURN ? left : TURN;
        }
        uk->matrix.decode(&a);
    }
    int same = memcmp(m[0], m[1], sizeof m[0]) == 0 && memcmp(l[0], l[1], sizeof l[0]) == 0;
    for (size_t r = 0; r < ROWS; r++) same &= memcmp(o[0] + r * dvp, o[1] + r * dvp, DV * 4) == 0;
    tu_check(same, "%s: matrix decode in turns of %d keys gives the one call's bits", uk->isa, TURN);
    tu_check(isfinite(l[0][0]) && l[0][0] > 0, "%s: matrix decode resume: row 0 summed (l %g)", uk->isa,
             (double)l[0][0]);
    free(k), free(v), free(q), free(qt), free(vb), free(s), free(pbuf), free(k_tail), free(o[0]), free(o[1]);
}

/* ---- MLA: V inside K ---- */

/* K [B, Skv, 1, 576] (the latent cache and its rope part), V its first 512
 * columns: v = k with K's strides and Dv 512. */
static void mla_case(int64_t B, int64_t hq, int64_t sq, int64_t skv, fmha_dtype dtype, int causal) {
    const int64_t D = 576, Dv = 512;
    fmha_problem p;
    fmha_problem_init(&p, B, hq, 1, sq, skv, D, Dv, FMHA_LAYOUT_BSHD);
    p.dtype = dtype;
    if (causal) p.causal = FMHA_CAUSAL_BOTTOM_RIGHT;
    memcpy(p.v_strides, p.k_strides, sizeof p.v_strides);
    int32_t kv_len[4];
    tu_ragged_kv_lengths(B, skv, kv_len);
    p.masks.kv_lengths = kv_len;
    size_t nq = (size_t)(B * sq * hq * D), nk = (size_t)(B * skv * D), no = (size_t)(B * sq * hq * Dv);
    size_t nl = (size_t)(B * hq * sq), es = fmha_dtype_size(dtype);
    dec_tensor q = dec_tensor_new(dtype, nq), k = dec_tensor_new(dtype, nk);
    fmha_problem pf = p;
    pf.dtype = FMHA_DTYPE_F32;
    /* ref_o [B, Sq, Hq, Dv], ref_lse [B, Hq, Sq]; V read from K's values */
    double *ref_o = malloc(no * sizeof(double)), *ref_lse = malloc(nl * sizeof(double));
    fmha_ref_forward_full(&pf, q.value, k.value, k.value, ref_o, ref_lse);
    /* o [B, Sq, Hq, Dv] in the dtype: auto (2 threads, 1 thread) and tiled */
    char *o = malloc(no * es), *o1 = malloc(no * es), *ot = malloc(no * es);
    float *lse = malloc(nl * sizeof(float)), *lse1 = malloc(nl * sizeof(float)), *lset = malloc(nl * sizeof(float));
    float *of = malloc(no * sizeof(float));
    double *tiled = malloc(no * sizeof(double));
    char what[160];
    snprintf(what, sizeof what, "MLA B %lld Hq %lld Sq %lld Skv %lld D 576 Dv 512 (V in K) %s%s", (long long)B,
             (long long)hq, (long long)sq, (long long)skv, dtype == FMHA_DTYPE_F32 ? "f32" : "bf16",
             causal ? " causal" : "");
    /* float32: accumulation error; bf16: O rounded to bf16 */
    const double tol = dtype == FMHA_DTYPE_F32 ? 2e-5 : 8e-3;
    const char *isa_default = fmha_isa_name();
    for (size_t ii = 0; ii < fmha_isa_count(); ii++) {
        if (!tu_isa_runs(fmha_isa_at(ii)) || fmha_cpu_force_isa(fmha_isa_at(ii)->name) != 0) continue;
        /* bf16 with a matrix decode: decoding on the tiles; otherwise one
         * query of 64+ heads in 2+ query blocks of the folded problem (32
         * rows on the matrix driver, bf16 on a table with a matrix part, else
         * NR): the fold driver (fold.c), else decode */
        const int64_t nr = dtype == FMHA_DTYPE_BF16 && fmha_cpu_kernels()->matrix.forward
                               ? FMHA_MATRIX_BLOCK_Q
                               : (int64_t)fmha_cpu_kernels()->tile.nr;
        const int fold = sq == 1 && hq >= 64 && B * ((hq + nr - 1) / nr) >= 2;
        const int on_tiles = matrix_decode_expected(&p);
        tu_check(on_tiles ? tu_planned_driver(&p, &fmha_fwd_driver_matrix_decode)
                 : fold   ? tu_planned_driver(&p, &fmha_fwd_driver_fold)
                          : planned_decode(&p) == (fmha_cpu_kernels()->decode.softmax != NULL),
                 "%s %s: %s planned", fmha_isa_at(ii)->name, what,
                 on_tiles ? "matrix_decode" : fold ? "fold" : "decode");
        fmha_problem ptl = p;
        ptl.strategy = FMHA_STRATEGY_TILED;
        fmha_set_num_threads(2);
        fmha_status st = tu_forward(&p, q.data, k.data, k.data, o, lse, NULL, 0);
        fmha_status stt = tu_forward(&ptl, q.data, k.data, k.data, ot, lset, NULL, 0);
        fmha_set_num_threads(1);
        fmha_status st1 = tu_forward(&p, q.data, k.data, k.data, o1, lse1, NULL, 0);
        if (!tu_check(st == FMHA_OK && stt == FMHA_OK && st1 == FMHA_OK, "%s %s: status %d, tiled %d, 1 thread %d",
                      fmha_isa_at(ii)->name, what, (int)st, (int)stt, (int)st1))
            continue;
        tu_check(!memcmp(o, o1, no * es) && !memcmp(lse, lse1, nl * sizeof(float)), "%s %s: 2 threads differ from 1",
                 fmha_isa_at(ii)->name, what);
        for (size_t i = 0; i < no; i++) tiled[i] = fmha_load(ot, dtype, (int64_t)i);
        for (size_t i = 0; i < no; i++) of[i] = fmha_load(o, dtype, (int64_t)i);
        double r_ref = tu_worst_ratio(of, ref_o, no, tol, tol), r_tiled = tu_worst_ratio(of, tiled, no, tol, tol);
        tu_check(r_ref <= 1.0 && r_tiled <= 1.0, "%s %s: O ratio %g to the reference, %g to tiled", fmha_isa_at(ii)->name,
                 what, r_ref, r_tiled);
        int lse_ok = 1;
        for (size_t i = 0; i < nl; i++) {
            if (isinf(ref_lse[i])) lse_ok &= isinf(lse[i]) && lse[i] < 0 && isinf(lset[i]) && lset[i] < 0;
            else lse_ok &= fabs((double)lse[i] - ref_lse[i]) <= 1e-5 * (1 + fabs(ref_lse[i])) &&
                           fabs((double)lset[i] - ref_lse[i]) <= 1e-5 * (1 + fabs(ref_lse[i]));
        }
        tu_check(lse_ok, "%s %s: lse (auto and tiled)", fmha_isa_at(ii)->name, what);
    }
    fmha_set_num_threads(0);
    fmha_cpu_force_isa(isa_default);
    free(ref_o), free(ref_lse), free(o), free(o1), free(ot), free(lse), free(lse1), free(lset), free(of), free(tiled);
    dec_tensor_free(&q), dec_tensor_free(&k);
}

/* The prefetch's thresholds: float32 K and V take decode_prefetch_f32_bytes,
 * bf16 and f16 decode_prefetch_h16_bytes, a quantized cache (q8_0)
 * decode_prefetch_bytes (planned on trial contexts of the default table,
 * one threshold 0 and the others 2^50, each in turn). */
static void test_prefetch_thresholds(void) {
    const fmha_ukernels *uk = fmha_cpu_kernels();
    if (!uk->decode.softmax) {
        printf("skip: prefetch thresholds (the default table has no decode kernels)\n");
        return;
    }
    /* caches: float32, bf16, f16 (kv_dtype), q8_0 (k_format, v_format); class: 0 f32, 1 2-byte, 2 quantized */
    static const char *const name[] = {"float32", "bf16", "f16", "q8_0"};
    static const int cls[] = {0, 1, 1, 2};
    for (int on = 0; on < 3; on++) {
        fmha_tuning t = *uk->tuning;
        t.decode_prefetch_f32_bytes = on == 0 ? 0 : (int64_t)1 << 50;
        t.decode_prefetch_h16_bytes = on == 1 ? 0 : (int64_t)1 << 50;
        t.decode_prefetch_bytes = on == 2 ? 0 : (int64_t)1 << 50;
        fmha_trial trial;
        if (!tu_check(fmha_cpu_trial(uk->isa, &t, &trial) == 0, "prefetch thresholds: a trial of %s", uk->isa))
            return;
        for (int d = 0; d < 4; d++) {
            fmha_problem p;
            fmha_problem_init(&p, 1, 8, 2, 1, 4096, 128, 128, FMHA_LAYOUT_BSHD);
            p.causal = FMHA_CAUSAL_BOTTOM_RIGHT;
            if (d < 3) {
                static const fmha_kv_dtype kv[] = {FMHA_KV_DTYPE_F32, FMHA_KV_DTYPE_BF16, FMHA_KV_DTYPE_F16};
                p.kv_dtype = kv[d];
            } else { /* rows of 4 blocks of 34 bytes, strides in bytes */
                const int64_t row = 128 / 32 * 34, st[4] = {4096 * 2 * row, 2 * row, row, 1};
                p.k_format = p.v_format = FMHA_KV_FORMAT_Q8_0;
                memcpy(p.k_strides, st, sizeof st), memcpy(p.v_strides, st, sizeof st);
            }
            fmha_plan plan;
            const fmha_status st = fmha_plan_init_in(&trial.ctx, &p, &plan);
            if (!tu_check(st == FMHA_OK && plan.driver == &fmha_fwd_driver_decode,
                          "prefetch thresholds: K and V %s planned on decode (status %d)", name[d], (int)st))
                continue;
            tu_check(plan.drv.dec.prefetch == (cls[d] == on), "prefetch thresholds: K and V %s, class %d's at 0: "
                     "prefetch %d, wanted %d", name[d], on, plan.drv.dec.prefetch, cls[d] == on);
        }
    }
}

static void test_mla(void) {
    /* emulated runs (a table's kernels): the two shapes of 16 heads, on
     * fewer keys; the head counts below choose drivers, which the native
     * runs cover */
    const int64_t skv = tu_emulated() ? 100 : 300;
    mla_case(2, 16, 1, skv, FMHA_DTYPE_F32, 0);
    mla_case(2, 16, 2, skv, FMHA_DTYPE_BF16, 1);
    if (tu_emulated()) return;
    mla_case(1, 128, 1, 200, FMHA_DTYPE_BF16, 1);
    mla_case(1, 64, 1, 200, FMHA_DTYPE_BF16, 1); /* two blocks of 32 on the matrix driver, one of NR = 64 */
    mla_case(1, 128, 1, 200, FMHA_DTYPE_F32, 1);
}

/* ---- prefill then decode ---- */

static void test_prefill_identity(void) {
    const int64_t B = 2, hq = 8, hkv = 2, S = 70, D = 64;
    fmha_problem full;
    fmha_problem_init(&full, B, hq, hkv, S, S, D, D, FMHA_LAYOUT_BSHD);
    full.causal = FMHA_CAUSAL_BOTTOM_RIGHT;
    full.strategy = FMHA_STRATEGY_TILED;
    size_t nq = (size_t)(B * S * hq * D), nk = (size_t)(B * S * hkv * D);
    /* q, o [B, S, Hq, D], k, v [B, S, Hkv, D] */
    float *q = malloc(nq * sizeof(float)), *k = malloc(nk * sizeof(float)), *v = malloc(nk * sizeof(float));
    float *o_full = malloc(nq * sizeof(float)), *o_dec = malloc(nq * sizeof(float));
    tu_fill(q, nq, -2, 2);
    tu_fill(k, nk, -2, 2);
    tu_fill(v, nk, -1, 1);
    tu_check(fmha_forward(&full, q, k, v, o_full, NULL, NULL, 0) == FMHA_OK, "prefill forward");
    /* step t: query t of every batch element against the cache's first t + 1 keys */
    fmha_problem step = full;
    step.seq_q = 1;
    step.strategy = FMHA_STRATEGY_AUTO;
    int32_t kv_len[2] = {1, 1};
    step.masks.kv_lengths = kv_len;
    tu_check(planned_decode(&step) == (fmha_cpu_kernels()->decode.softmax != NULL), "prefill: decode planned");
    int ok = 1;
    for (int64_t t = 0; t < S; t++) {
        kv_len[0] = kv_len[1] = (int32_t)(t + 1);
        ok &= fmha_forward(&step, q + t * full.q_strides[1], k, v, o_dec + t * full.o_strides[1], NULL,
                           NULL, 0) == FMHA_OK;
    }
    double worst = 0.0;
    for (size_t i = 0; i < nq; i++) {
        double d = fabs((double)o_dec[i] - (double)o_full[i]);
        if (!(d <= worst)) worst = d;
    }
    tu_check(ok && worst <= 1e-5, "prefill then decode: max |diff| %g", worst);
    free(q), free(k), free(v), free(o_full), free(o_dec);
}

/* ---- fallbacks ---- */

static int dummy_classify(void *ctx, const fmha_tile *t) { return FMHA_TILE_CLASS_FULL; }
static void dummy_fill(void *ctx, const fmha_tile *t, uint8_t *vis) {}

static void test_fallbacks(void) {
    if (!fmha_cpu_kernels()->decode.softmax) return;
    fmha_problem p;
    fmha_problem_init(&p, 1, 8, 2, 1, 512, 64, 64, FMHA_LAYOUT_BSHD);
    tu_check(planned_decode(&p) == 1, "decode planned for Sq = 1");
    fmha_problem x = p;
    x.strategy = FMHA_STRATEGY_TILED;
    tu_check(planned_decode(&x) == 0, "explicit tiled stays tiled");
    x = p;
    x.seq_q = 17;
    tu_check(planned_decode(&x) == 0, "Sq = 17 is not decode");
    x = p;
    x.seq_kv = 7;
    tu_check(planned_decode(&x) == 0, "Skv < 8 Sq is not decode");
    x = p;
    float slopes[8] = {0.5f, 0.25f, 0.125f, 0.0625f, 0.5f, 0.25f, 0.125f, 0.0625f}, table[8 * 4] = {0};
    x.biases.softcap = 30.0f;
    x.biases.alibi_slopes = slopes;
    tu_check(planned_decode(&x) == 1, "softcap and ALiBi decode");
    x = p;
    x.biases.rel_table = table, x.biases.rel_num_buckets = 4, x.biases.rel_max_distance = 8;
    tu_check(planned_decode(&x) == 0, "a relative-position table falls back");
    x = p;
    x.masks.callback.classify = dummy_classify;
    x.masks.callback.fill = dummy_fill;
    tu_check(planned_decode(&x) == 0, "a mask callback falls back");
    x = p;
    x.k_strides[3] = 2;
    x.k_strides[2] *= 2;
    x.k_strides[1] *= 2;
    tu_check(planned_decode(&x) == 0, "strided head dim falls back");
    /* a table without decode kernels plans the tiled forward */
    fmha_plan plan;
    tu_check(fmha_plan_init(&p, &plan) == FMHA_OK && plan.driver == &fmha_fwd_driver_decode, "plan_init decodes");
    fmha_ukernels bare = *plan.uk;
    bare.decode.softmax = NULL;
    plan.uk = &bare;
    tu_check(fmha_decode_plan(&plan) == 0 && fmha_fwd_driver_choose(&plan) == FMHA_OK && plan.driver != &fmha_fwd_driver_decode, "a table without decode kernels: tiled or dense");
    bare = *fmha_cpu_kernels();
    bare.cache[FMHA_FORMAT_BF16].scores = NULL;
    bare.cache[FMHA_FORMAT_BF16].values = NULL;
    x = p;
    x.dtype = FMHA_DTYPE_BF16;
    tu_check(fmha_plan_init(&x, &plan) == FMHA_OK, "bf16 plan");
    plan.uk = &bare;
    tu_check(fmha_decode_plan(&plan) == 1, "a format without in-place kernels decodes (rows loaded first)");
    fmha_cpu_force_isa("scalar");
    tu_check(planned_decode(&p) == 1, "scalar table decodes");
    for (size_t ii = 0; ii < fmha_isa_count(); ii++)
        if (fmha_cpu_force_isa(fmha_isa_at(ii)->name) == 0)
            tu_check(planned_decode(&p) == (fmha_cpu_kernels()->decode.softmax != NULL), "%s: decode planned with "
                     "decode kernels", fmha_isa_at(ii)->name);
    fmha_cpu_force_isa(tu_isa_best());
}

/* ---- per-sequence causal alignment ---- */

static void aligned_case(int64_t sq, int64_t skv, const int32_t *kv_len, const int32_t *q_len,
                         int window, int alibi) {
    const int64_t B = 3, hq = 4, hkv = 2, D = 24;
    fmha_problem p;
    fmha_problem_init(&p, B, hq, hkv, sq, skv, D, D, FMHA_LAYOUT_BSHD);
    p.causal = FMHA_CAUSAL_BOTTOM_RIGHT;
    p.masks.kv_lengths = kv_len;
    p.masks.q_lengths = q_len;
    if (window) p.masks.window_left = 5;
    float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f};
    if (alibi) p.biases.alibi_slopes = slopes;
    size_t nq = (size_t)(B * sq * hq * D), nk = (size_t)(B * skv * hkv * D), nl = (size_t)(B * hq * sq);
    /* q, o, d_o [B, Sq, Hq, D]; k, v [B, Skv, Hkv, D] */
    float *q = malloc(nq * sizeof(float)), *k = malloc(nk * sizeof(float)), *v = malloc(nk * sizeof(float));
    float *d_o = malloc(nq * sizeof(float)), *o = malloc(nq * sizeof(float)), *lse = malloc(nl * sizeof(float));
    float *dq = malloc(nq * sizeof(float)), *dk = malloc(nk * sizeof(float)), *dv = malloc(nk * sizeof(float));
    tu_fill(q, nq, -1, 1), tu_fill(k, nk, -1, 1), tu_fill(v, nk, -1, 1), tu_fill(d_o, nq, -1, 1);
    double *ro = malloc(nq * sizeof(double)), *rl = malloc(nl * sizeof(double));
    double *rdq = malloc(nq * sizeof(double)), *rdk = malloc(nk * sizeof(double)), *rdv = malloc(nk * sizeof(double));
    fmha_ref_forward_full(&p, q, k, v, ro, rl);
    fmha_ref_backward_full(&p, q, k, v, d_o, rdq, rdk, rdv, NULL, NULL, NULL);
    char what[120];
    snprintf(what, sizeof what, "aligned Sq %lld Skv %lld%s%s", (long long)sq, (long long)skv,
             window ? " window" : "", alibi ? " alibi" : "");
    /* the reference itself: query i of b sees key j iff j <= i + kv_len - q_len (and lengths) */
    int ref_ok = 1;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < sq; i++)
            for (int64_t j = 0; j < skv; j++) {
                int want = j < kv_len[b] && i < q_len[b] && j <= i + kv_len[b] - q_len[b] &&
                           (!window || i + kv_len[b] - q_len[b] - j <= 5);
                ref_ok &= fmha_ref_full_visible(&p, b, 0, i, j) == want;
            }
    tu_check(ref_ok, "%s: reference visibility", what);
    static const fmha_strategy strategies[] = {FMHA_STRATEGY_AUTO, FMHA_STRATEGY_TILED,
                                               FMHA_STRATEGY_DENSE, FMHA_STRATEGY_PORTABLE};
    for (int si = 0; si < 4; si++) {
        if (tu_strategy_skipped(strategies[si])) continue;
        p.strategy = strategies[si];
        fmha_status st = tu_forward(&p, q, k, v, o, lse, NULL, 0);
        int lse_ok = 1;
        for (size_t i = 0; i < nl; i++)
            lse_ok &= isinf(rl[i]) ? isinf(lse[i]) && lse[i] < 0
                                   : fabs((double)lse[i] - rl[i]) <= 1e-5 * (1 + fabs(rl[i]));
        tu_check(st == FMHA_OK && tu_worst_ratio(o, ro, nq, 2e-5, 2e-5) <= 1.0 && lse_ok,
                 "%s %s: forward (status %d, O ratio %g, lse %d)", what, tu_strategy_name(si), (int)st,
                 tu_worst_ratio(o, ro, nq, 2e-5, 2e-5), lse_ok);
        if (si == 0) continue;
        st = tu_backward(&p, q, k, v, o, d_o, lse, dq, dk, dv, NULL, NULL, 0);
        tu_check(st == FMHA_OK && tu_worst_ratio(dq, rdq, nq, 1e-4, 1e-4) <= 1.0 &&
                     tu_worst_ratio(dk, rdk, nk, 1e-4, 1e-4) <= 1.0 &&
                     tu_worst_ratio(dv, rdv, nk, 1e-4, 1e-4) <= 1.0,
                 "%s %s: backward (status %d)", what, tu_strategy_name(si), (int)st);
    }
    free(q), free(k), free(v), free(d_o), free(o), free(lse), free(dq), free(dk), free(dv);
    free(ro), free(rl), free(rdq), free(rdk), free(rdv);
}

static void test_aligned(void) {
    /* lengths with kv_len - q_len positive, zero and negative (the first
     * q_len - kv_len queries then see no key) */
    const int32_t kv_a[3] = {90, 50, 20}, q_a[3] = {37, 10, 30};
    for (int w = 0; w < 2; w++)
        for (int a = 0; a < 2; a++) aligned_case(37, 90, kv_a, q_a, w, a);
    /* decode-sized: Sq 4 (the decode driver under auto) */
    const int32_t kv_b[3] = {300, 7, 0}, q_b[3] = {4, 2, 3};
    aligned_case(4, 300, kv_b, q_b, 0, 0);
    aligned_case(4, 300, kv_b, q_b, 1, 1);
}

/* ---- attention sinks ---- */

/* L = sum over rows of O . dO with the float64 reference (o: scratch). */
static double sinks_loss(const fmha_problem *pf, const dec_tensor *q, const dec_tensor *k,
                         const dec_tensor *v, const dec_tensor *d_o, double *o) {
    fmha_ref_forward_full(pf, q->value, k->value, v->value, o, NULL);
    double l = 0.0;
    for (size_t i = 0; i < d_o->n; i++) l += o[i] * (double)d_o->value[i];
    return l;
}

/* dL/dsinks by central differences of the reference, Richardson-extrapolated
 * ((4 D(h/2) - D(h)) / 3, h = 2^-7: sinks on the 2^-10 grid move exactly). */
static void sinks_grad_fd(const fmha_problem *pf_in, const dec_tensor *q, const dec_tensor *k,
                          const dec_tensor *v, const dec_tensor *d_o, double *g) {
    fmha_problem pf = *pf_in;
    float sinks[8];
    memcpy(sinks, pf_in->sinks, sizeof sinks);
    pf.sinks = sinks;
    double *o = malloc(d_o->n * sizeof(double));
    for (int64_t h = 0; h < pf.heads_q; h++) {
        double d[2];
        for (int r = 0; r < 2; r++) {
            float step = r ? 0x1p-8f : 0x1p-7f, z = pf_in->sinks[h];
            sinks[h] = z + step;
            double up = sinks_loss(&pf, q, k, v, d_o, o);
            sinks[h] = z - step;
            double down = sinks_loss(&pf, q, k, v, d_o, o);
            sinks[h] = z;
            d[r] = (up - down) / (2.0 * (double)step);
        }
        g[h] = (4.0 * d[1] - d[0]) / 3.0;
    }
    free(o);
}

/* fmha_sinks_backward against the differences, the same bits for 1 and 3
 * threads; rows past q_lengths (lse -inf) and rows that see no key add 0. */
static void sinks_grad_check(const fmha_problem *p, const fmha_problem *pf, const dec_tensor *q,
                             const dec_tensor *k, const dec_tensor *v, const void *o,
                             const float *lse, const char *what) {
    int64_t hq = p->heads_q;
    size_t no = (size_t)(p->batch * p->seq_q * hq * p->head_dim_v);
    dec_tensor d_o = dec_tensor_new(p->dtype, no);
    double fd[8], scale = 0.0;
    sinks_grad_fd(pf, q, k, v, &d_o, fd);
    for (int64_t h = 0; h < hq; h++) scale = fmax(scale, fabs(fd[h]));
    float g1[8], g3[8];
    int nthreads = fmha_get_num_threads();
    fmha_set_num_threads(1);
    fmha_status st1 = fmha_sinks_backward(p, o, d_o.data, lse, g1);
    fmha_set_num_threads(3);
    fmha_status st3 = fmha_sinks_backward(p, o, d_o.data, lse, g3);
    fmha_set_num_threads(nthreads);
    /* float32: O and lse carry ~1e-6 relative error; bf16: O is rounded to 2^-8 */
    double tol = (p->dtype == FMHA_DTYPE_F32 ? 1e-5 : 2e-2) * fmax(1.0, scale), worst = 0.0;
    for (int64_t h = 0; h < hq; h++) worst = fmax(worst, fabs((double)g1[h] - fd[h]));
    tu_check(st1 == FMHA_OK && st3 == FMHA_OK && worst <= tol && memcmp(g1, g3, sizeof(float) * (size_t)hq) == 0,
             "d_sinks %s: status %d/%d, worst |d - fd| %.3g (tol %.3g), threads 1 vs 3 %s", what, (int)st1,
             (int)st3, worst, tol, memcmp(g1, g3, sizeof(float) * (size_t)hq) ? "differ" : "equal");
    dec_tensor_free(&d_o);
}

static void sinks_case(int64_t sq, int64_t skv, fmha_dtype dtype, float sink_lo, float sink_hi) {
    const int64_t B = 2, hq = 8, hkv = 2, D = 32;
    fmha_problem p;
    fmha_problem_init(&p, B, hq, hkv, sq, skv, D, D, FMHA_LAYOUT_BSHD);
    p.causal = FMHA_CAUSAL_BOTTOM_RIGHT;
    p.dtype = dtype;
    /* batch 1: the first query sees no key (q_len > kv_len) */
    int32_t kv_len[2] = {(int32_t)skv, (int32_t)(sq > 1 ? sq - 1 : 0)}, q_len[2] = {(int32_t)sq, (int32_t)sq};
    p.masks.kv_lengths = kv_len;
    p.masks.q_lengths = q_len;
    float sinks[8];
    for (int h = 0; h < 8; h++) sinks[h] = (float)(nearbyint(tu_uniform(sink_lo, sink_hi) * 1024.0) / 1024.0);
    p.sinks = sinks;
    size_t nq = (size_t)(B * sq * hq * D), nk = (size_t)(B * skv * hkv * D), nl = (size_t)(B * hq * sq);
    dec_tensor q = dec_tensor_new(dtype, nq), k = dec_tensor_new(dtype, nk), v = dec_tensor_new(dtype, nk);
    fmha_problem pf = p;
    pf.dtype = FMHA_DTYPE_F32;
    double *ro = malloc(nq * sizeof(double)), *rl = malloc(nl * sizeof(double));
    fmha_ref_forward_full(&pf, q.value, k.value, v.value, ro, rl);
    size_t esize = fmha_dtype_size(dtype);
    /* o [B, Sq, Hq, D] in the dtype and widened, lse [B, Hq, Sq] */
    void *o = malloc(nq * esize);
    float *of = malloc(nq * sizeof(float)), *lse = malloc(nl * sizeof(float));
    static const fmha_strategy strategies[] = {FMHA_STRATEGY_AUTO, FMHA_STRATEGY_TILED,
                                               FMHA_STRATEGY_DENSE, FMHA_STRATEGY_PORTABLE};
    double otol = dtype == FMHA_DTYPE_F32 ? 2e-5 : 8e-3;
    for (int si = 0; si < 4; si++) {
        if (tu_strategy_skipped(strategies[si])) continue;
        p.strategy = strategies[si];
        fmha_status st = tu_forward(&p, q.data, k.data, v.data, o, lse, NULL, 0);
        for (size_t i = 0; i < nq; i++) of[i] = fmha_load(o, dtype, (int64_t)i);
        int lse_ok = 1;
        for (size_t i = 0; i < nl; i++)
            lse_ok &= fabs((double)lse[i] - rl[i]) <= 1e-5 * (1 + fabs(rl[i]));
        tu_check(st == FMHA_OK && tu_worst_ratio(of, ro, nq, otol, otol) <= 1.0 && lse_ok,
                 "sinks Sq %lld Skv %lld %s sinks [%g, %g] %s: status %d, O ratio %g, lse %d",
                 (long long)sq, (long long)skv, dtype == FMHA_DTYPE_F32 ? "f32" : "bf16",
                 (double)sink_lo, (double)sink_hi, tu_strategy_name(strategies[si]), (int)st,
                 tu_worst_ratio(of, ro, nq, otol, otol), lse_ok);
        char what[96];
        snprintf(what, sizeof what, "Sq %lld Skv %lld %s sinks [%g, %g] %s", (long long)sq, (long long)skv,
                 dtype == FMHA_DTYPE_F32 ? "f32" : "bf16", (double)sink_lo, (double)sink_hi,
                 tu_strategy_name(si));
        if (st == FMHA_OK && (si == 0 || si == 1)) sinks_grad_check(&p, &pf, &q, &k, &v, o, lse, what);
    }
    if (dtype == FMHA_DTYPE_F32) { /* dQ, dK, dV through lse */
        float *d_o = malloc(nq * sizeof(float)), *dq = malloc(nq * sizeof(float));
        float *dk = malloc(nk * sizeof(float)), *dv = malloc(nk * sizeof(float));
        double *rdq = malloc(nq * sizeof(double)), *rdk = malloc(nk * sizeof(double)),
               *rdv = malloc(nk * sizeof(double));
        tu_fill(d_o, nq, -1, 1);
        fmha_ref_backward_full(&pf, q.value, k.value, v.value, d_o, rdq, rdk, rdv, NULL, NULL, NULL);
        p.strategy = FMHA_STRATEGY_TILED;
        fmha_status st = tu_forward_backward(&p, q.data, k.data, v.data, d_o, o, lse, dq, dk, dv, NULL);
        tu_check(st == FMHA_OK && tu_worst_ratio(dq, rdq, nq, 1e-4, 1e-4) <= 1.0 &&
                     tu_worst_ratio(dk, rdk, nk, 1e-4, 1e-4) <= 1.0 &&
                     tu_worst_ratio(dv, rdv, nk, 1e-4, 1e-4) <= 1.0,
                 "sinks Sq %lld Skv %lld: backward (status %d)", (long long)sq, (long long)skv, (int)st);
        free(d_o), free(dq), free(dk), free(dv), free(rdq), free(rdk), free(rdv);
    }
    free(ro), free(rl), free(o), free(of), free(lse);
    dec_tensor_free(&q), dec_tensor_free(&k), dec_tensor_free(&v);
}

/* Bad calls of fmha_sinks_backward: a clear status, d_sinks untouched. */
static void test_sinks_backward_errors(void) {
    fmha_problem p;
    fmha_problem_init(&p, 1, 2, 1, 3, 16, 8, 8, FMHA_LAYOUT_BSHD);
    float sinks[2] = {0.5f, -0.5f}, o[48] = {0}, d_o[48] = {0}, lse[8] = {0}, d[2] = {7.0f, 7.0f};
    p.sinks = NULL;
    tu_check(fmha_sinks_backward(&p, o, d_o, lse, d) == FMHA_ERR_BAD_MASK && d[0] == 7.0f,
             "d_sinks without sinks is refused");
    p.sinks = sinks;
    tu_check(fmha_sinks_backward(&p, NULL, d_o, lse, d) == FMHA_ERR_NULL_POINTER &&
                 fmha_sinks_backward(&p, o, d_o, lse, NULL) == FMHA_ERR_NULL_POINTER &&
                 fmha_sinks_backward(NULL, o, d_o, lse, d) == FMHA_ERR_NULL_POINTER && d[0] == 7.0f,
             "d_sinks: NULL arguments are refused");
    tu_check(fmha_sinks_backward(&p, o, d_o, lse, lse + 2) == FMHA_ERR_OVERLAP &&
                 fmha_sinks_backward(&p, o, d_o, lse, sinks) == FMHA_ERR_OVERLAP &&
                 fmha_sinks_backward(&p, o, d_o, lse, o + 4) == FMHA_ERR_OVERLAP && lse[2] == 0.0f &&
                 sinks[0] == 0.5f && o[4] == 0.0f,
             "d_sinks overlapping an input is refused, nothing written");
    p.heads_kv = 3;
    tu_check(fmha_sinks_backward(&p, o, d_o, lse, d) == FMHA_ERR_BAD_HEADS && d[0] == 7.0f,
             "d_sinks: an invalid problem is refused");
}

static void test_sinks(void) {
    for (int t = 0; t < 2; t++) {
        fmha_dtype dtype = t ? FMHA_DTYPE_BF16 : FMHA_DTYPE_F32;
        sinks_case(1, 300, dtype, -2, 2);
        sinks_case(3, 200, dtype, -1, 3);
        sinks_case(20, 150, dtype, -2, 2);   /* not decode: the tiled forward under auto */
        sinks_case(2, 100, dtype, 60, 80);   /* the sink dwarfs every score */
        sinks_case(2, 100, dtype, -80, -60); /* the sink vanishes */
    }
    /* a non-finite sink is refused */
    fmha_problem p;
    fmha_problem_init(&p, 1, 2, 1, 1, 16, 8, 8, FMHA_LAYOUT_BSHD);
    float bad[2] = {0.0f, NAN};
    p.sinks = bad;
    tu_check(fmha_problem_check(&p) == FMHA_ERR_BAD_MASK, "a NaN sink is refused");
    test_sinks_backward_errors();
}

/* A float32 query against a bf16 cache at precision BF16 (fmha.h: the
 * query rounded to bf16 as it is packed) decodes on the tiles where a
 * table has a matrix decode, from 8 rows a kv head; at FAST the same
 * problem keeps its float32 query (the decode driver). Held to the float64
 * reference on the exact inputs: the query's rounding (at most 2^-8 of
 * each element) moves a score by up to 2^-8 sum |q_e k_e| scale (here at
 * most 0.008, about 6e-4 typically), and P enters P V as bf16: O within 2e-3
 * absolute + relative (measured: a tenth of that), lse within
 * 5e-3 (1 + |lse|); bits do not depend on the thread count. */
static void test_f32_query_bf16_cache(void) {
    const int64_t B = 2, hq = 8, hkv = 2, sq = 4, skv = 700, d = 64;
    fmha_problem p;
    fmha_problem_init(&p, B, hq, hkv, sq, skv, d, d, FMHA_LAYOUT_BSHD);
    p.causal = FMHA_CAUSAL_BOTTOM_RIGHT;
    p.kv_dtype = FMHA_KV_DTYPE_BF16;
    p.precision = FMHA_PRECISION_BF16;
    int32_t kv_len[2] = {(int32_t)skv, 333};
    p.masks.kv_lengths = kv_len;
    const size_t nq = (size_t)(B * sq * hq * d), nk = (size_t)(B * skv * hkv * d), nl = (size_t)(B * hq * sq);
    dec_tensor q = dec_tensor_new(FMHA_DTYPE_F32, nq), k = dec_tensor_new(FMHA_DTYPE_BF16, nk),
               v = dec_tensor_new(FMHA_DTYPE_BF16, nk);
    fmha_problem pf = p;
    pf.kv_dtype = FMHA_KV_DTYPE_SAME;
    /* ref_o [B, Sq, Hq, D], ref_lse [B, Hq, Sq] */
    double *ref_o = malloc(nq * sizeof(double)), *ref_lse = malloc(nl * sizeof(double));
    fmha_ref_forward_full(&pf, q.value, k.value, v.value, ref_o, ref_lse);
    float *o = malloc(nq * sizeof(float)), *o_first = malloc(nq * sizeof(float));
    float *lse = malloc(nl * sizeof(float)), *lse_first = malloc(nl * sizeof(float));
    const char *isa_default = fmha_isa_name();
    for (size_t ii = 0; ii < fmha_isa_count(); ii++) {
        const char *isa = fmha_isa_at(ii)->name;
        if (!tu_isa_runs(fmha_isa_at(ii)) || fmha_cpu_force_isa(isa) != 0) continue;
        const int tiles = fmha_cpu_kernels()->matrix.decode != NULL;
        tu_check(tu_planned_driver(&p, &fmha_fwd_driver_matrix_decode) == tiles, "%s: f32 query, bf16 cache, BF16: "
                 "matrix_decode planned %d, wanted %d", isa, tu_planned_driver(&p, &fmha_fwd_driver_matrix_decode), tiles);
        fmha_problem fast = p;
        fast.precision = FMHA_PRECISION_FAST;
        tu_check(tu_planned_driver(&fast, &fmha_fwd_driver_matrix_decode) == 0,
                 "%s: f32 query, bf16 cache, FAST: planned on the tiles", isa);
        /* without tiles, a table with bf16 pair kernels takes both products in them */
        const fmha_uk_cache *bc = &fmha_cpu_kernels()->cache[FMHA_FORMAT_BF16];
        if (!tiles) {
            char line[1024];
            tu_plan_line(&p, line, sizeof line);
            const int pairs = strstr(line, " scores=bf16 values=bf16") != NULL;
            tu_check(pairs == (bc->scores_bf16 && bc->values_bf16), "%s: f32 query, bf16 cache, BF16: bf16 pairs %d (%s)",
                     isa, pairs, line);
        }
        for (int threads = 1; threads <= (tu_emulated() ? 2 : 3); threads++) {
            fmha_set_num_threads(threads);
            if (!tu_check(tu_forward(&p, q.data, k.data, v.data, o, lse, NULL, 0) == FMHA_OK,
                          "%s: f32 query, bf16 cache: status", isa))
                continue;
            if (threads > 1) {
                tu_check(!memcmp(o, o_first, nq * sizeof(float)) && !memcmp(lse, lse_first, nl * sizeof(float)),
                         "%s: f32 query, bf16 cache: %d threads differ from 1", isa, threads);
                continue;
            }
            memcpy(o_first, o, nq * sizeof(float));
            memcpy(lse_first, lse, nl * sizeof(float));
            tu_check(tu_worst_ratio(o, ref_o, nq, 2e-3, 2e-3) <= 1.0, "%s: f32 query, bf16 cache: O ratio %g", isa,
                     tu_worst_ratio(o, ref_o, nq, 2e-3, 2e-3));
            double worst = 0;
            for (size_t i = 0; i < nl; i++) {
                const double e = fabs((double)lse[i] - ref_lse[i]) / (5e-3 * (1 + fabs(ref_lse[i])));
                if (!(e <= worst)) worst = e;
            }
            tu_check(worst <= 1.0, "%s: f32 query, bf16 cache: lse ratio %g", isa, worst);
        }
        /* a NaN in query row (b 0, i 0, h 0): its O and lse NaN, every other row's bits unchanged */
        fmha_set_num_threads(0);
        const float q0 = ((float *)q.data)[0];
        ((float *)q.data)[0] = NAN;
        if (tu_check(tu_forward(&p, q.data, k.data, v.data, o, lse, NULL, 0) == FMHA_OK, "%s: NaN query: status",
                     isa)) {
            int nan_row = isnan(lse[0]), others = 1;
            for (int64_t c = 0; c < d; c++) nan_row &= isnan(o[c]);
            for (size_t i = (size_t)d; i < nq; i++) others &= memcmp(&o[i], &o_first[i], sizeof(float)) == 0;
            for (size_t i = 1; i < nl; i++) others &= memcmp(&lse[i], &lse_first[i], sizeof(float)) == 0;
            tu_check(nan_row && others, "%s: NaN query: its row NaN %d, other rows unchanged %d", isa, nan_row, others);
        }
        ((float *)q.data)[0] = q0;
    }
    fmha_set_num_threads(0);
    fmha_cpu_force_isa(isa_default);
    free(ref_o), free(ref_lse), free(o), free(o_first), free(lse), free(lse_first);
    dec_tensor_free(&q), dec_tensor_free(&k), dec_tensor_free(&v);
}

int main(void) {
    tu_seed();
    const char *isa_default = fmha_isa_name();
    for (size_t ii = 0; ii < fmha_isa_count(); ii++) {
        const fmha_ukernels *uk = fmha_cpu_kernels_for(fmha_isa_at(ii)->name);
        if (uk) test_kernels(uk);
        if (uk) test_h16_kernels(uk);
        if (uk) test_scores_place(uk);
        if (uk) test_scores_qt(uk);
        if (uk) test_bf16_pairs(uk), test_bf16_pairs_qt(uk);
        if (uk) test_matrix_decode_resume(uk);
    }
    test_fallbacks();
    fmha_cpu_force_isa(isa_default);
    test_prefill_identity();
    test_aligned();
    test_sinks();
    test_mla();
    test_prefetch_thresholds();
    test_shapes();
    test_f32_query_bf16_cache();
    return tu_finish();
}
