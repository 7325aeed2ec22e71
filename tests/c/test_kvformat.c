/* test_kvformat.c: K and V stored in quantized cache formats
 * (fmha_problem.k_format / v_format: int8, fp8 e4m3 / e5m2, GGUF q8_0 /
 * q4_0) and the quantizer that writes them (fmha_kv_quantize).
 *
 * Each cache is written by fmha_kv_quantize, then decoded here by this
 * file's own reading of each format (the OCP float8 definitions, ggml's
 * block layouts); the float64 reference runs on those values. Cases: the
 * decode driver (contiguous, and paged in shuffled page order with the
 * scales in a pool beside the values, pages of 1, 5, 16 and 32 keys, which
 * must give the contiguous cache's bits), ragged lengths, GQA, sinks,
 * windows, Sq 1..16, bf16 queries, MLA shapes (D 576, Dv 512, V a view of
 * K's first columns), K and V in different formats, and the tiled, dense
 * and portable forwards, on every ISA of the registry. The quantizers are
 * held to ggml's reference bytes (pinned vectors) and to the nearest-value
 * rule of each format; bad scales and shapes are clear errors with nothing
 * written. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/convert.h"
#include "core/attn.h"
#include "config/cpu.h"
#include "format/format.h"
#include "uk/scalar/decode.h"
#include "fmha_ref_masks.h"
#include "test_util.h"

/* ---- the formats, read independently of the library ---- */

static double half_value(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 31 ? (m ? NAN : INFINITY) : e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
    return h & 0x8000 ? -v : v;
}

static double fp8_value(fmha_kv_format f, uint8_t c) {
    double v;
    if (f == FMHA_KV_FORMAT_FP8_E4M3) {
        int e = (c >> 3) & 15, m = c & 7;
        v = e == 15 && m == 7 ? NAN : e ? ldexp(8 + m, e - 10) : ldexp(m, -9);
    } else {
        int e = (c >> 2) & 31, m = c & 3;
        v = e == 31 ? (m ? NAN : INFINITY) : e ? ldexp(4 + m, e - 17) : ldexp(m, -16);
    }
    return c & 0x80 ? -v : v;
}

static int is_fp8(fmha_kv_format f) { return f == FMHA_KV_FORMAT_FP8_E4M3 || f == FMHA_KV_FORMAT_FP8_E5M2; }

static const char *fmt_name(fmha_kv_format f) {
    static const char *names[] = {"dtype", "f32", "bf16", "f16", "int8", "fp8_e4m3", "fp8_e5m2", "q8_0", "q4_0"};
    return names[f];
}

/* Value e of a stored row (scale: the row's int8 scale or the head's fp8 one). */
static float row_value(fmha_kv_format f, const uint8_t *row, int64_t e, float scale) {
    if (f == FMHA_KV_FORMAT_BF16) {
        uint32_t u = (uint32_t)(row[2 * e] | row[2 * e + 1] << 8) << 16;
        float x;
        memcpy(&x, &u, 4);
        return x;
    }
    if (f == FMHA_KV_FORMAT_INT8) return (float)(int8_t)row[e] * scale;
    if (is_fp8(f)) return (float)fp8_value(f, row[e]) * scale;
    const uint8_t *blk = row + e / 32 * (f == FMHA_KV_FORMAT_Q8_0 ? 34 : 18);
    float d = (float)half_value((uint16_t)(blk[0] | blk[1] << 8));
    int j = (int)(e % 32);
    if (f == FMHA_KV_FORMAT_Q8_0) return (float)(int8_t)blk[2 + j] * d;
    return (float)((j < 16 ? blk[2 + j] & 15 : blk[2 + j - 16] >> 4) - 8) * d;
}

/* A cache [B, S, H, D] in format f: bytes [B, S, H, row] (row in storage
 * units of unit bytes), scales (int8: [B, S, H]; fp8: [H]), and the values
 * it holds, value [B, S, H, D]. */
typedef struct cache {
    fmha_kv_format f;
    int64_t B, S, H, D, row, unit;
    uint8_t *bytes;
    float *scales, *value;
} cache;

static cache cache_new(fmha_kv_format f, int64_t B, int64_t S, int64_t H, int64_t D, const float *x) {
    const int64_t unit = f == FMHA_KV_FORMAT_BF16 ? 2 : 1;
    cache c = {f, B, S, H, D, (int64_t)fmha_kv_format_row_bytes(f, D) / unit, unit, NULL, NULL, NULL};
    const int64_t rows = B * S * H;
    c.bytes = malloc((size_t)(rows * c.row * unit) + 1);
    c.value = malloc((size_t)(rows * D) * sizeof(float));
    const int64_t xs[3] = {H * D, D, 1}, vs[3] = {H * c.row, c.row, 1};
    fmha_status st;
    if (f == FMHA_KV_FORMAT_INT8) {
        c.scales = malloc((size_t)rows * sizeof(float));
        const int64_t ss[2] = {H, 1};
        st = fmha_kv_quantize(f, B * S, H, D, x, xs, c.bytes, vs, c.scales, ss);
    } else if (is_fp8(f)) { /* one scale per head: its largest |x| at the format's top */
        c.scales = malloc((size_t)H * sizeof(float));
        for (int64_t h = 0; h < H; h++) {
            float amax = 0;
            for (int64_t t = 0; t < B * S; t++)
                for (int64_t e = 0; e < D; e++) amax = fmaxf(amax, fabsf(x[(t * H + h) * D + e]));
            c.scales[h] = amax / (f == FMHA_KV_FORMAT_FP8_E4M3 ? 448.0f : 57344.0f);
        }
        const int64_t ss[2] = {0, 1};
        st = fmha_kv_quantize(f, B * S, H, D, x, xs, c.bytes, vs, c.scales, ss);
    } else {
        st = fmha_kv_quantize(f, B * S, H, D, x, xs, c.bytes, vs, NULL, NULL);
    }
    tu_check(st == FMHA_OK, "quantize %s: status %d", fmt_name(f), (int)st);
    for (int64_t r = 0; r < rows; r++) {
        float sc = f == FMHA_KV_FORMAT_INT8 ? c.scales[r] : is_fp8(f) ? c.scales[r % H] : 1.0f;
        for (int64_t e = 0; e < D; e++) c.value[r * D + e] = row_value(f, c.bytes + r * c.row * unit, e, sc);
    }
    return c;
}

static void cache_free(cache *c) { free(c->bytes), free(c->scales), free(c->value); }

/* The problem's view of a contiguous cache (which 0: K, 1: V). */
static void cache_attach(fmha_problem *p, int which, const cache *c) {
    int64_t *st = which ? p->v_strides : p->k_strides;
    st[0] = c->S * c->H * c->row, st[1] = c->H * c->row, st[2] = c->row, st[3] = 1;
    *(which ? &p->v_format : &p->k_format) = c->f;
    *(which ? &p->v_scales : &p->k_scales) = c->scales;
    int64_t *ss = which ? p->v_scale_strides : p->k_scale_strides;
    if (c->f == FMHA_KV_FORMAT_INT8) ss[0] = c->S * c->H, ss[1] = c->H, ss[2] = 1;
    else ss[0] = ss[1] = 0, ss[2] = 1;
}

/* A page pool of c ([pages, page, H, row] bytes, int8 scales [pages, page, H])
 * through table; unused rows hold 0xff bytes and NaN scales. */
typedef struct pool {
    uint8_t *bytes;
    float *scales;
} pool;

static pool pool_new(const cache *c, int64_t page, const int32_t *table, int64_t stride, int64_t pages) {
    const size_t key = (size_t)(c->H * c->row * c->unit);
    pool pl = {malloc((size_t)(pages * page) * key), NULL};
    memset(pl.bytes, 0xff, (size_t)(pages * page) * key);
    if (c->f == FMHA_KV_FORMAT_INT8) {
        pl.scales = malloc((size_t)(pages * page * c->H) * sizeof(float));
        for (int64_t i = 0; i < pages * page * c->H; i++) pl.scales[i] = NAN;
    }
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t j = 0; j < c->S; j++) {
            int32_t pg = table[b * stride + j / page];
            if (pg < 0) continue;
            int64_t slot = pg * page + j % page;
            memcpy(pl.bytes + (size_t)slot * key, c->bytes + (size_t)(b * c->S + j) * key, key);
            if (pl.scales)
                memcpy(pl.scales + slot * c->H, c->scales + (b * c->S + j) * c->H, (size_t)c->H * sizeof(float));
        }
    return pl;
}

static void pool_attach(fmha_problem *p, int which, const cache *c, const pool *pl, int64_t page) {
    (which ? p->v_strides : p->k_strides)[0] = page * c->H * c->row;
    if (pl->scales) {
        *(which ? &p->v_scales : &p->k_scales) = pl->scales;
        int64_t *ss = which ? p->v_scale_strides : p->k_scale_strides;
        ss[0] = page * c->H, ss[1] = c->H, ss[2] = 1;
    }
}

typedef struct fmt_case {
    fmha_kv_format fk, fv;
    int64_t B, hq, hkv, sq, skv, D, Dv;
    fmha_strategy strategy;
    int causal, sinks, window, bf16_q, mla; /* mla: V is K's first Dv columns */
    int64_t page;                           /* > 0: also paged, whose bits must match */
    int bf16_precision; /* a float32 query at BF16 (Q and P rounded to bf16) in place of FAST */
} fmt_case;

/* x [rows][d] as llama.cpp's arithmetic sees a query: each block of 32
 * quantized as ggml's q8_0 (its scale rounded to a half), then dequantized. */
static void llama_q8_0_query(const float *x, size_t rows, int64_t d, float *out) {
    for (size_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < d / 32; b++) {
            int8_t q[32];
            const float dh = fmha_f16_to_f32(fmha_f32_to_f16(fmha_q8_0_block(x + r * d + 32 * b, q)));
            for (int j = 0; j < 32; j++) out[r * d + 32 * b + j] = (float)q[j] * dh;
        }
}

/* 1 when the plan's scores take the query rounded to bf16. */
static int bf16_scores(const fmha_problem *p) {
    char line[1024];
    tu_plan_line(p, line, sizeof line);
    return strstr(line, " scores=bf16") != NULL;
}

static void run_case(const fmt_case *fc, const char *isa) {
    const int64_t B = fc->B, skv = fc->skv, D = fc->D, Dv = fc->Dv, hkv = fc->hkv;
    fmha_problem p;
    fmha_problem_init(&p, B, fc->hq, hkv, fc->sq, skv, D, Dv, FMHA_LAYOUT_BSHD);
    p.strategy = fc->strategy;
    if (fc->causal) p.causal = FMHA_CAUSAL_BOTTOM_RIGHT;
    if (fc->window) p.masks.window_left = 37;
    int32_t kv_len[4];
    tu_ragged_kv_lengths(B, skv, kv_len);
    p.masks.kv_lengths = kv_len;
    float sinks[64];
    tu_fill(sinks, 64, -1, 1);
    if (fc->sinks) p.sinks = sinks;

    const size_t nq = (size_t)(B * fc->sq * fc->hq * D), no = (size_t)(B * fc->sq * fc->hq * Dv);
    const size_t nl = (size_t)(B * fc->hq * fc->sq);
    float *q = malloc(nq * sizeof(float)), *xk = malloc((size_t)(B * skv * hkv * D) * sizeof(float));
    float *xv = malloc((size_t)(B * skv * hkv * Dv) * sizeof(float));
    tu_fill(q, nq, -1, 1);
    tu_fill(xk, (size_t)(B * skv * hkv * D), -1, 1);
    tu_fill(xv, (size_t)(B * skv * hkv * Dv), -1, 1);
    xk[3] = 6.0f; /* an outlier: the scales must carry it */
    uint16_t *qb = malloc(nq * sizeof(uint16_t));
    if (fc->bf16_q)
        for (size_t i = 0; i < nq; i++) {
            qb[i] = fmha_f32_to_bf16(q[i]);
            q[i] = fmha_bf16_to_f32(qb[i]);
        }
    cache ck = cache_new(fc->fk, B, skv, hkv, D, xk);
    cache cv = fc->mla ? ck : cache_new(fc->fv, B, skv, hkv, Dv, xv);

    /* the reference on the values the caches hold (V: K's first Dv columns for MLA) */
    float *vval = cv.value;
    if (fc->mla) {
        vval = malloc((size_t)(B * skv * hkv * Dv) * sizeof(float));
        for (int64_t r = 0; r < B * skv * hkv; r++) memcpy(vval + r * Dv, ck.value + r * D, (size_t)Dv * sizeof(float));
    }
    double *ro = malloc(no * sizeof(double)), *rl = malloc(nl * sizeof(double));
    fmha_ref_forward_full(&p, q, ck.value, vval, ro, rl);

    fmha_problem pq = p;
    if (fc->bf16_q) pq.dtype = FMHA_DTYPE_BF16;
    cache_attach(&pq, 0, &ck);
    cache_attach(&pq, 1, &cv);
    if (fc->mla) memcpy(pq.v_strides, pq.k_strides, sizeof pq.k_strides);
    const void *qin = fc->bf16_q ? (const void *)qb : q;
    float *o = malloc(no * sizeof(float)), *lse = malloc(nl * sizeof(float));
    uint16_t *ob = (uint16_t *)o;
    float *of = fc->bf16_q ? malloc(no * sizeof(float)) : o;
    /* ACCURATE: the float32 query against the cache's values; FAST: the
     * same where it takes no quantized query, else the query quantized as
     * q8_0 (or rounded to bf16 for float8 keys), whose error is held to
     * llama.cpp's arithmetic on this cache (the query as ggml's q8_0
     * blocks, products exact: a float64 reference on that query) */
    for (int fast = 0; fast < 2; fast++) {
        pq.precision = !fast ? FMHA_PRECISION_ACCURATE : fc->bf16_precision ? FMHA_PRECISION_BF16 : FMHA_PRECISION_FAST;
        const int integer = fast && tu_quantized_query(&pq);
        if (fast && !integer) continue; /* ACCURATE's arithmetic: checked */
        fmha_status st = tu_forward(&pq, qin, ck.bytes, cv.bytes, o, lse, NULL, 0);
        if (fc->bf16_q) /* widen the bf16 output */
            for (size_t i = 0; i < no; i++) {
                uint32_t u = (uint32_t)ob[i] << 16;
                memcpy(&of[i], &u, 4);
            }
        int lse_ok = 1;
        double ratio;
        if (!integer) {
            for (size_t i = 0; i < nl; i++)
                lse_ok &= rl[i] == -INFINITY ? lse[i] == -INFINITY
                                             : fabs((double)lse[i] - rl[i]) <= 1e-5 * (1 + fabs(rl[i]));
            /* float32 accumulation (and for bf16 Q, O's rounding to bf16) alone */
            ratio = fc->bf16_q ? tu_worst_ratio(of, ro, no, 4e-3, 8e-3) : tu_worst_ratio(of, ro, no, 2e-5, 2e-5);
        } else {
            float *ql = malloc(nq * sizeof(float));
            double *lo = malloc(no * sizeof(double)), *ll = malloc(nl * sizeof(double));
            llama_q8_0_query(q, (size_t)(B * fc->sq * fc->hq), D, ql);
            fmha_ref_forward_full(&p, ql, ck.value, vval, lo, ll);
            /* no more than 1.25x llama.cpp's error (O's rounding to bf16 aside) */
            const double norm = tu_norm_l2(ro, no), bf16_o = fc->bf16_q ? 4e-3 * norm : 0.0;
            double err_l = 0.0;
            for (size_t i = 0; i < no; i++) err_l += (lo[i] - ro[i]) * (lo[i] - ro[i]);
            ratio = tu_err_l2(of, ro, no) / (1.25 * sqrt(err_l) + bf16_o + 1e-7 * norm);
            /* A query rounded to bf16 (the bf16 scores: float8 keys at FAST,
             * BF16): the reference on that query (qr), the rounding the
             * path defines. BF16 also rounds P to bf16, not to llama.cpp's
             * bound: each element of O within 2^-8 max|V| of that reference
             * (each weight's rounding to bf16, 2^-8 of it at most, over
             * values of at most max|V|: reached where a row sees two or
             * three keys) plus 2e-3 relative. */
            double *lq = NULL;
            if (bf16_scores(&pq)) {
                float *qr = malloc(nq * sizeof(float));
                for (size_t i = 0; i < nq; i++) qr[i] = fmha_bf16_to_f32(fmha_f32_to_bf16(q[i]));
                double *rq = malloc(no * sizeof(double));
                lq = malloc(nl * sizeof(double));
                fmha_ref_forward_full(&p, qr, ck.value, vval, rq, lq);
                double vmax = 0.0;
                for (int64_t i = 0; i < B * skv * hkv * Dv; i++) vmax = fmax(vmax, fabs((double)vval[i]));
                if (fc->bf16_precision) ratio = tu_worst_ratio(of, rq, no, 0x1p-8 * vmax + 1e-6, 2e-3);
                free(qr), free(rq);
            }
            /* lse likewise, as the L2 error over the rows; on a bf16 query
             * each row's within 1e-5 (1 + |lse|) of the reference on it (P's
             * rounding, if any, leaves the sums in float32): a bf16 query
             * errs less than llama.cpp's q8_0 one on average (2^-8 of each
             * element at most, against 1/254 of its block's largest), but
             * not on every draw of a few rows (an outlier key element of 6
             * met by a large query element) */
            double el2 = 0.0, ll2 = 0.0;
            for (size_t i = 0; i < nl; i++) {
                if (rl[i] == -INFINITY) {
                    lse_ok &= lse[i] == -INFINITY;
                    continue;
                }
                if (lq) lse_ok &= fabs((double)lse[i] - lq[i]) <= 1e-5 * (1 + fabs(lq[i]));
                el2 += ((double)lse[i] - rl[i]) * ((double)lse[i] - rl[i]);
                ll2 += (ll[i] - rl[i]) * (ll[i] - rl[i]);
            }
            if (!lq) lse_ok &= sqrt(el2) <= 1.25 * sqrt(ll2) + 1e-5 * sqrt((double)nl);
            free(lq);
            free(ql), free(lo), free(ll);
        }

        int paged_same = 1;
        if (fc->page > 0 && st == FMHA_OK) {
            int64_t stride, pages;
            int32_t *table = tu_page_table(B, skv, fc->page, kv_len, &stride, &pages);
            pool pk = pool_new(&ck, fc->page, table, stride, pages), pv = pool_new(&cv, fc->page, table, stride, pages);
            fmha_problem pp = pq;
            pp.block_table = table, pp.block_table_stride = stride, pp.page_size = fc->page, pp.num_pages = pages;
            pool_attach(&pp, 0, &ck, &pk, fc->page);
            pool_attach(&pp, 1, &cv, &pv, fc->page);
            const void *vin = pv.bytes;
            if (fc->mla)
                memcpy(pp.v_strides, pp.k_strides, sizeof pp.k_strides), vin = pk.bytes, pp.v_scales = pp.k_scales,
                    memcpy(pp.v_scale_strides, pp.k_scale_strides, sizeof pp.k_scale_strides);
            float *o2 = malloc(no * sizeof(float)), *lse2 = malloc(nl * sizeof(float));
            fmha_status st2 = tu_forward(&pp, qin, pk.bytes, vin, o2, lse2, NULL, 0);
            /* the decode driver reads both; the tiled forward's rounding differs */
            const int decode = fc->strategy == FMHA_STRATEGY_AUTO && fc->sq <= 16 && skv >= 8 * fc->sq;
            size_t obytes = no * (fc->bf16_q ? 2 : 4);
            paged_same =
                st2 == FMHA_OK && (!decode || (!memcmp(o, o2, obytes) && !memcmp(lse, lse2, nl * sizeof(float))));
            if (pk.scales && kv_len[0] > 0) { /* a bad scale in a page: refused, its key named */
                const int64_t j = kv_len[0] - 1, at = ((int64_t)table[j / fc->page] * fc->page + j % fc->page) * hkv;
                const float keep = pk.scales[at];
                pk.scales[at] = -INFINITY;
                const fmha_status bad = fmha_forward(&pp, qin, pk.bytes, vin, o2, lse2, NULL, 0);
                char key[32];
                snprintf(key, sizeof key, "key %lld,", (long long)j);
                tu_check(bad == FMHA_ERR_BAD_SCALE && strstr(fmha_last_error_message(), key) != NULL,
                         "paged int8: a bad scale of the last key read is named (%s)", fmha_last_error_message());
                pk.scales[at] = keep;
            }
            free(o2), free(lse2), free(table), free(pk.bytes), free(pk.scales), free(pv.bytes), free(pv.scales);
        }
        tu_check(st == FMHA_OK && ratio <= 1.0 && lse_ok && paged_same,
                 "format K %s V %s %s %s %s B %lld Hq %lld Hkv %lld Sq %lld Skv %lld D %lld Dv %lld%s%s%s%s%s page "
                 "%lld: status %d, O ratio %g, lse %s, paged %s",
                 fmt_name(fc->fk), fmt_name(fc->fv), isa, tu_strategy_name(fc->strategy),
                 !integer ? "accurate" : fc->bf16_precision ? "bf16 (rounded query)" : "fast (quantized query)", (long long)B, (long long)fc->hq, (long long)hkv,
                 (long long)fc->sq, (long long)skv, (long long)D, (long long)Dv, fc->causal ? " causal" : "",
                 fc->sinks ? " sinks" : "", fc->window ? " window" : "", fc->bf16_q ? " bf16-q" : "",
                 fc->mla ? " mla" : "", (long long)fc->page, (int)st, ratio, lse_ok ? "ok" : "off",
                 paged_same ? "same" : "differs");
    }
    if (of != o) free(of);
    if (fc->mla) free(vval);
    else cache_free(&cv);
    cache_free(&ck);
    free(q), free(qb), free(xk), free(xv), free(o), free(lse), free(ro), free(rl);
}

static const fmha_kv_format quantized[] = {FMHA_KV_FORMAT_INT8, FMHA_KV_FORMAT_FP8_E4M3, FMHA_KV_FORMAT_FP8_E5M2,
                                           FMHA_KV_FORMAT_Q8_0, FMHA_KV_FORMAT_Q4_0};

/* 1 when problem p's plan takes P V in `values` ("bf16", "integer",
 * "float32") on the decode driver; -1 on another driver. */
static int plan_values(const fmha_problem *p, const char *values) {
    char line[1024], want[32];
    tu_plan_line(p, line, sizeof line);
    if (!strstr(line, "driver=decode ")) return -1;
    snprintf(want, sizeof want, " values=%s ", values);
    return strstr(line, want) != NULL;
}

/* Per ISA: float8 values take bf16 P where the precision rounds P (a bf16
 * problem at FAST, a float32 one at BF16) and the table has values_bf16,
 * never at a float32 problem's FAST (whose bound is llama.cpp's error:
 * fmha.h). */
static void test_fp8_values_choice(const char *isa) {
    const fmha_ukernels *uk = fmha_cpu_kernels();
    static const fmha_kv_format fmts[] = {FMHA_KV_FORMAT_FP8_E4M3, FMHA_KV_FORMAT_FP8_E5M2};
    for (int fi = 0; fi < 2; fi++) {
        const fmha_cache_format_id id = (fmha_cache_format_id)(fmts[fi] - FMHA_KV_FORMAT_F32);
        const int has = uk->cache[id].values_bf16 != NULL;
        fmha_problem p;
        fmha_problem_init(&p, 1, 32, 8, 1, 4096, 128, 128, FMHA_LAYOUT_BSHD);
        p.k_format = p.v_format = fmts[fi];
        const int64_t row = (int64_t)fmha_kv_format_row_bytes(fmts[fi], 128);
        for (int t = 0; t < 2; t++) {
            int64_t *st = t ? p.v_strides : p.k_strides;
            st[0] = 4096 * 8 * row, st[1] = 8 * row, st[2] = row, st[3] = 1;
        }
        p.k_scale_strides[0] = p.k_scale_strides[1] = p.v_scale_strides[0] = p.v_scale_strides[1] = 0;
        static const struct { fmha_dtype dtype; fmha_precision precision; int bf16_p; } cases[] = {
            {FMHA_DTYPE_F32, FMHA_PRECISION_FAST, 0},
            {FMHA_DTYPE_F32, FMHA_PRECISION_ACCURATE, 0},
            {FMHA_DTYPE_F32, FMHA_PRECISION_BF16, 1},
            {FMHA_DTYPE_BF16, FMHA_PRECISION_FAST, 1},
        };
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            p.dtype = cases[c].dtype, p.precision = cases[c].precision;
            const int got = plan_values(&p, "bf16");
            if (got < 0) continue; /* another driver (a matrix engine's) */
            tu_check(got == (has && cases[c].bf16_p), "%s %s dtype %d precision %d: values on bf16 P %d, wanted %d", isa,
                     fmt_name(fmts[fi]), (int)cases[c].dtype, (int)cases[c].precision, got, has && cases[c].bf16_p);
        }
    }
}

static void test_cases(const char *isa) {
    static const int64_t pages[] = {1, 5, 16, 32};
    for (int fi = 0; fi < 5; fi++) {
        const fmha_kv_format f = quantized[fi];
        for (int pi = 0; pi < 4; pi++) { /* decode: GQA 8/1, then 32/8 with sinks */
            fmt_case fc = {f, f, 3, 8, 1, 1, 300, 64, 64, FMHA_STRATEGY_AUTO, 1, 0, 0, 0, 0, pages[pi], 0};
            run_case(&fc, isa);
        }
        fmt_case fc = {f, f, 2, 32, 8, 2, 200, 32, 64, FMHA_STRATEGY_AUTO, 1, 1, 1, 0, 0, 16, 0};
        run_case(&fc, isa);
        fc = (fmt_case){f, f, 2, 4, 2, 16, 150, 32, 32, FMHA_STRATEGY_AUTO, 1, 0, 0, 1, 0, 5, 0}; /* bf16 Q, Sq 16 */
        run_case(&fc, isa);
        fc = (fmt_case){f, f, 2, 32, 8, 3, 180, 64, 64, FMHA_STRATEGY_AUTO, 1, 0, 0, 0, 0, 16, 0}; /* 12 rows a kv head */
        run_case(&fc, isa);
        fc = (fmt_case){f, f, 2, 32, 8, 1, 300, 64, 64, FMHA_STRATEGY_AUTO, 1, 0, 0, 1, 0, 16, 0}; /* bf16 Q, Sq 1 */
        run_case(&fc, isa);
        /* a float32 query at BF16: 4 and 16 rows a kv head */
        fc = (fmt_case){f, f, 2, 32, 8, 1, 300, 64, 64, FMHA_STRATEGY_AUTO, 1, 0, 0, 0, 0, 16, 1};
        run_case(&fc, isa);
        fc = (fmt_case){f, f, 1, 32, 8, 4, 200, 128, 128, FMHA_STRATEGY_AUTO, 1, 0, 0, 0, 0, 5, 1};
        run_case(&fc, isa);
        /* prefill against the cache: the tiled, dense and portable forwards */
        static const fmha_strategy strategies[] = {FMHA_STRATEGY_TILED, FMHA_STRATEGY_DENSE, FMHA_STRATEGY_PORTABLE};
        for (int si = 0; si < 3; si++) {
            fc = (fmt_case){f, f, 2, 4, 2, 70, 150, 64, 32, strategies[si], si != 1, si == 0, si == 2, 0, 0, 0, 0};
            run_case(&fc, isa);
        }
        /* K and V in different formats */
        fmha_kv_format other = quantized[(fi + 3) % 5];
        fc = (fmt_case){f, other, 2, 8, 2, 1, 260, 64, 96, FMHA_STRATEGY_AUTO, 0, 0, 0, 0, 0, 3, 0};
        run_case(&fc, isa);
        fc.fv = FMHA_KV_FORMAT_BF16;
        fc.page = 0;
        run_case(&fc, isa);
    }
}

/* The errors behind precision FAST's choice (the table in fmha.h,
 * design.md and the README), on the table in use: one decode step, B 1,
 * Hq 32 / Hkv 8, D 128, Skv 4096 (512 emulated), Sq 1, Q, K, V uniform in [-1, 1), the
 * relative L2 error of O against float64 on the values each cache holds,
 * for ACCURATE, FAST and llama.cpp's arithmetic (the query as ggml's q8_0
 * blocks, exact products), and FAST against ACCURATE. FAST's may be no
 * worse than llama.cpp's (within 5%: for the integer formats the two
 * quantize the same integers, with scales in float32 and in a half; the
 * float8 formats' bf16 query errs less). */
static void test_precision_table(void) {
    const int64_t B = 1, hq = 32, hkv = 8, S = tu_quick_pick(4096, 512), D = 128;
    const size_t nq = (size_t)(B * hq * D), nkv = (size_t)(B * S * hkv * D);
    float *q = malloc(nq * sizeof(float)), *ql = malloc(nq * sizeof(float)), *xk = malloc(nkv * sizeof(float));
    float *xv = malloc(nkv * sizeof(float)), *oa = malloc(nq * sizeof(float)), *of = malloc(nq * sizeof(float));
    double *ro = malloc(nq * sizeof(double)), *lo = malloc(nq * sizeof(double));
    float lse[32];
    tu_fill(q, nq, -1, 1), tu_fill(xk, nkv, -1, 1), tu_fill(xv, nkv, -1, 1);
    llama_q8_0_query(q, (size_t)(B * hq), D, ql);
    printf("precision table (%s): rel. L2 error of O vs float64, Hq 32 / Hkv 8, D 128, Skv %lld\n", fmha_isa_name(),
           (long long)S);
    printf("  format    accurate   fast       llama.cpp  fast / llama.cpp  fast vs accurate\n");
    for (int fi = 0; fi < 5; fi++) {
        const fmha_kv_format fmts[] = {FMHA_KV_FORMAT_INT8, FMHA_KV_FORMAT_Q8_0, FMHA_KV_FORMAT_Q4_0,
                                       FMHA_KV_FORMAT_FP8_E4M3, FMHA_KV_FORMAT_FP8_E5M2};
        cache ck = cache_new(fmts[fi], B, S, hkv, D, xk), cv = cache_new(fmts[fi], B, S, hkv, D, xv);
        fmha_problem p;
        fmha_problem_init(&p, B, hq, hkv, 1, S, D, D, FMHA_LAYOUT_BSHD);
        fmha_ref_forward_full(&p, q, ck.value, cv.value, ro, NULL);
        fmha_ref_forward_full(&p, ql, ck.value, cv.value, lo, NULL);
        cache_attach(&p, 0, &ck);
        cache_attach(&p, 1, &cv);
        p.precision = FMHA_PRECISION_ACCURATE;
        fmha_status st = tu_forward(&p, q, ck.bytes, cv.bytes, oa, lse, NULL, 0);
        p.precision = FMHA_PRECISION_FAST;
        st |= tu_forward(&p, q, ck.bytes, cv.bytes, of, lse, NULL, 0);
        const int integer = tu_quantized_query(&p);
        double norm = tu_norm_l2(ro, nq), el = 0.0, fa = 0.0, na = 0.0;
        for (size_t i = 0; i < nq; i++) {
            el += (lo[i] - ro[i]) * (lo[i] - ro[i]);
            fa += ((double)of[i] - oa[i]) * ((double)of[i] - oa[i]), na += (double)oa[i] * oa[i];
        }
        const double ea = tu_err_l2(oa, ro, nq) / norm, ef = tu_err_l2(of, ro, nq) / norm;
        el = sqrt(el) / norm;
        printf("  %-9s %.2e   %.2e   %.2e   %.3f             %.2e%s\n", fmt_name(fmts[fi]), ea, ef, el, ef / el,
               sqrt(fa / na),
               integer ? "" : " (fast: the float32 query here)");
        tu_check(st == FMHA_OK && ea < 1e-5 && (!integer || ef <= 1.05 * el),
                 "precision table %s: accurate %.2e, fast %.2e, llama.cpp %.2e", fmt_name(fmts[fi]), ea, ef, el);
        if (fi >= 3) { /* float8 at BF16: the query and P rounded to bf16 (fmha.h, FMHA_PRECISION_BF16) */
            p.precision = FMHA_PRECISION_BF16;
            const fmha_status sb = tu_forward(&p, q, ck.bytes, cv.bytes, of, lse, NULL, 0);
            const double eb = tu_err_l2(of, ro, nq) / norm;
            printf("  %-9s at bf16 %.2e\n", fmt_name(fmts[fi]), eb);
            tu_check(sb == FMHA_OK && eb < 3e-3, "precision table %s at BF16: %.2e", fmt_name(fmts[fi]), eb);
        }
        cache_free(&ck), cache_free(&cv);
    }
    free(q), free(ql), free(xk), free(xv), free(oa), free(of), free(ro), free(lo);
}

/* MLA decode: one latent head of 576, V its first 512 columns (the same
 * memory), 16 query heads, Sq 1 and 4, contiguous and paged. */
static void test_mla(const char *isa) {
    static const fmha_kv_format fmts[] = {FMHA_KV_FORMAT_Q8_0, FMHA_KV_FORMAT_FP8_E4M3, FMHA_KV_FORMAT_INT8};
    for (int fi = 0; fi < 3; fi++)
        for (int64_t sq = 1; sq <= 4; sq += 3) {
            fmt_case fc = {fmts[fi], fmts[fi], 1, 16, 1, sq, 200, 576, 512, FMHA_STRATEGY_AUTO, 1, 0, 0, 0, 1, 64, 0};
            run_case(&fc, isa);
        }
}

/* MLA's decode step with 128 heads on the latent head: the fold driver
 * (the heads as the queries of one tiled forward) at 1 and 2 threads,
 * V a view of K, against the reference; the plan names the driver
 * (64 heads of B 2, 128 of B 1: 2 blocks of the avx512 tables' NR 64). */
static void test_fold(const char *isa) {
    static const fmha_kv_format fmts[] = {FMHA_KV_FORMAT_Q8_0, FMHA_KV_FORMAT_INT8, FMHA_KV_FORMAT_FP8_E5M2};
    for (int t = 1; t <= 2; t++) {
        fmha_set_num_threads(t);
        for (int fi = 0; fi < 3; fi++) {
            fmt_case fc = {fmts[fi], fmts[fi], 2, 128, 1, 1, 150, 576, 512, FMHA_STRATEGY_AUTO, 1, 0, 0, fi == 1, 1, 0, 0};
            run_case(&fc, isa);
        }
        fmt_case fc = {FMHA_KV_FORMAT_Q4_0, FMHA_KV_FORMAT_INT8, 2, 64, 1, 1, 90, 64, 96, FMHA_STRATEGY_AUTO, 0, 0, 0,
                       0, 0, 0, 0};
        run_case(&fc, isa);
    }
    /* the driver the plan names: fold, and decode where a window rules it out */
    fmha_set_num_threads(1);
    fmha_problem p;
    fmha_problem_init(&p, 1, 128, 1, 1, 300, 576, 512, FMHA_LAYOUT_BSHD);
    char line[512];
    tu_plan_line(&p, line, sizeof line);
    tu_check(strstr(line, "driver=fold") != NULL, "%s: 128 heads on one kv head fold (%s)", isa, line);
    p.masks.window_left = 100;
    tu_plan_line(&p, line, sizeof line);
    tu_check(strstr(line, "driver=decode") != NULL, "%s: a window keeps decode (%s)", isa, line);
    fmha_set_num_threads(0); /* the default again */
}

/* ---- the kernels of each format ---- */

/* Per ISA: the format's load kernel gives the scalar specification's bits
 * (every byte pattern of the 8-bit formats, random blocks with every f16
 * scale class), and its in-place scores and values kernels (where the
 * table has them) give the float32 kernels' bits on the loaded rows. */
static void test_format_kernels(const char *isa) {
    const fmha_ukernels *uk = fmha_cpu_kernels();
    const fmha_ukernels *spec = fmha_cpu_kernels_for("scalar");
    for (int fi = 0; fi < 5; fi++) {
        const fmha_kv_format f = quantized[fi];
        const fmha_cache_format_id id = (fmha_cache_format_id)(f - FMHA_KV_FORMAT_F32);
        const int64_t per = f >= FMHA_KV_FORMAT_Q8_0 ? 32 : 1, nbytes = f == FMHA_KV_FORMAT_Q8_0 ? 34
                                                                         : f == FMHA_KV_FORMAT_Q4_0 ? 18 : 1;
        /* 64 rows of D = 256 (int8/fp8: every byte value) */
        enum { ROWS = 64, D = 256 };
        const int64_t row = D / per * nbytes;
        uint8_t *bytes = malloc((size_t)(ROWS * row));
        for (int64_t i = 0; i < ROWS * row; i++) bytes[i] = (uint8_t)(per == 1 ? i : tu_int(0, 255));
        if (per > 1) /* block scales: normal, subnormal, zero, negative halves */
            for (int64_t blk = 0; blk < ROWS * D / 32; blk++) {
                static const uint16_t halves[] = {0x3c00, 0x2e66, 0x0003, 0x0000, 0xb555, 0x1400};
                uint16_t h = halves[tu_int(0, 5)];
                bytes[blk * nbytes] = (uint8_t)(h & 0xff), bytes[blk * nbytes + 1] = (uint8_t)(h >> 8);
            }
        float *w1 = malloc(ROWS * D * sizeof(float)), *w2 = malloc(ROWS * D * sizeof(float));
        size_t n = per == 1 ? (size_t)(ROWS * D) - (size_t)tu_int(0, 15) : (size_t)(ROWS * D);
        spec->cache[id].load(n, bytes, w1);
        uk->cache[id].load(n, bytes, w2);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            if (memcmp(&w1[i], &w2[i], sizeof(float)) && !(isnan(w1[i]) && isnan(w2[i]))) bad++;
        tu_check(bad == 0, "%s load %s: %zu values differ from the specification", isa, fmt_name(f), bad);
        if (uk->cache[id].scores) {
            /* finite rows only (fp8 NaN codes replaced: every byte's value, the
             * load above may have stopped short of the last), then the float32
             * kernels on the loaded rows */
            spec->cache[id].load((size_t)(ROWS * D), bytes, w1);
            for (int64_t i = 0; per == 1 && i < ROWS * row; i++)
                if (isnan(w1[i]) || isinf(w1[i])) bytes[i] = 0x11;
            spec->cache[id].load((size_t)(ROWS * D), bytes, w1);
            for (int c = 0; c < 12; c++) {
                size_t rows = (size_t)tu_int(1, 9), nk = (size_t)tu_int(1, ROWS), lds = nk + 1;
                size_t d = per > 1 ? (size_t)(32 * tu_int(1, D / 32)) : (size_t)tu_int(1, D);
                float q[9 * D], s1[9 * (ROWS + 1)], s2[9 * (ROWS + 1)], o1[9 * D], o2[9 * D], alpha[9];
                tu_fill(q, rows * d, -1, 1);
                tu_fill(s1, rows * lds, 0, 1);
                memcpy(s2, s1, rows * lds * sizeof(float));
                tu_fill(o1, rows * d, -1, 1);
                memcpy(o2, o1, rows * d * sizeof(float));
                tu_fill(alpha, rows, 0, 1);
                uk->cache[FMHA_FORMAT_F32].scores(rows, nk, d, q, d, w1, D, s1, lds, 0.3f);
                uk->cache[id].scores(rows, nk, d, q, d, bytes, (size_t)row, s2, lds, 0.3f);
                tu_check(!memcmp(s1, s2, rows * lds * sizeof(float)), "%s %s scores: not the float32 bits", isa,
                         fmt_name(f));
                uk->cache[FMHA_FORMAT_F32].values(rows, nk, d, s1, lds, w1, D, o1, d, alpha);
                uk->cache[id].values(rows, nk, d, s1, lds, bytes, (size_t)row, o2, d, alpha);
                tu_check(!memcmp(o1, o2, rows * d * sizeof(float)), "%s %s values: not the float32 bits", isa,
                         fmt_name(f));
            }
        }
        free(bytes), free(w1), free(w2);
    }
}

/* Per ISA: the integer scores on the q8_0 query (scores_q8, where the
 * table has them) give the scalar specification's bits: random key bytes
 * (int8's -128 included; block scales of every half class, NaN and inf
 * too), query rows quantized by the driver's rule and rows at the
 * extremes (every q = +-127: the largest sums), 1..19 rows (every row
 * group; tiles from 8 rows, their groups of 16 and a partial one), 1..40
 * keys (a partial group of 16), D 32..320 (an odd count of blocks: a
 * chunk's half left zero), any row stride. */
static void test_scores_q8(const char *isa) {
    const fmha_ukernels *uk = fmha_cpu_kernels();
    const fmha_ukernels *spec = fmha_cpu_kernels_for("scalar");
    static const fmha_kv_format fmts[] = {FMHA_KV_FORMAT_INT8, FMHA_KV_FORMAT_Q8_0, FMHA_KV_FORMAT_Q4_0};
    enum { ROWS = 19, KEYS = 40, D = 320, LD = D + 64 };
    for (int fi = 0; fi < 3; fi++) {
        const fmha_kv_format f = fmts[fi];
        const fmha_cache_format_id id = (fmha_cache_format_id)(f - FMHA_KV_FORMAT_F32);
        if (!uk->cache[id].scores_q8) continue;
        tu_check(spec->cache[id].scores_q8 != NULL, "%s: the specification of %s's integer scores", isa, fmt_name(f));
        const size_t nbytes = f == FMHA_KV_FORMAT_Q8_0 ? 34 : f == FMHA_KV_FORMAT_Q4_0 ? 18 : 32;
        const size_t ldk_max = D / 32 * nbytes + 50;
        uint8_t *k = malloc(KEYS * ldk_max);
        int8_t *qi = malloc(ROWS * LD);
        uint8_t *tiles = malloc(2 * fmha_q8_tiles_group_bytes(D)); /* 19 rows: 2 groups of 16 */
        float x[LD], qd[ROWS * LD / 32], s1[ROWS * KEYS], s2[ROWS * KEYS];
        int32_t qsum[ROWS * LD / 32];
        size_t bad = 0;
        for (int c = 0; c < 40; c++) {
            const size_t rows = (size_t)tu_int(1, ROWS), nk = (size_t)tu_int(1, KEYS), d = 32 * (size_t)tu_int(1, D / 32);
            const size_t ldk = d / 32 * nbytes + (size_t)tu_int(0, 50), lds = KEYS;
            for (size_t i = 0; i < KEYS * ldk_max; i++) k[i] = (uint8_t)tu_int(0, 255);
            if (nbytes != 32) /* block scales: normal, subnormal, zero, negative, NaN and inf halves */
                for (size_t j = 0; j < nk; j++)
                    for (size_t b = 0; b < d / 32; b++) {
                        static const uint16_t halves[] = {0x3c00, 0x2e66, 0x0003, 0x0000, 0xb555, 0x1400, 0x7e00, 0xfc00};
                        const uint16_t h = halves[tu_int(0, c % 4 ? 5 : 7)];
                        k[j * ldk + b * nbytes] = (uint8_t)(h & 0xff), k[j * ldk + b * nbytes + 1] = (uint8_t)(h >> 8);
                    }
            for (size_t r = 0; r < rows; r++) {
                tu_fill(x, d, -2, 2);
                if (c % 5 == 0) x[tu_int(0, (int64_t)d - 1)] = 40.0f; /* an outlier block */
                fmha_q8_quantize_row(x, (int64_t)d, qi + r * LD, qd + r * (LD / 32), qsum + r * (LD / 32));
                if (c % 7 == 3) /* the extremes */
                    for (size_t e = 0; e < d; e++) qi[r * LD + e] = (int8_t)(e % 3 ? -127 : 127);
                if (c % 7 == 3)
                    for (size_t b = 0; b < d / 32; b++) {
                        int32_t t = 0;
                        for (size_t e = 0; e < 32; e++) t += qi[r * LD + 32 * b + e];
                        qsum[r * (LD / 32) + b] = t;
                    }
            }
            fmha_q8_rows q = {qi, qd, qsum, LD, NULL};
            if (uk->cache[id].q8_tiles) { /* the table's kernel reads the query's tiles */
                fmha_q8_tiles_pack(rows, d, &q, tiles);
                q.tiles = tiles;
            }
            tu_fill(s1, ROWS * KEYS, 0, 1);
            memcpy(s2, s1, sizeof s1);
            const float scale = (float)tu_uniform(0.05, 2);
            spec->cache[id].scores_q8(rows, nk, d, &q, k, ldk, s1, lds, scale);
            uk->cache[id].scores_q8(rows, nk, d, &q, k, ldk, s2, lds, scale);
            for (size_t i = 0; i < ROWS * KEYS; i++)
                bad += memcmp(&s1[i], &s2[i], sizeof(float)) && !(isnan(s1[i]) && isnan(s2[i]));
        }
        tu_check(bad == 0, "%s %s integer scores: %zu differ from the specification's bits", isa, fmt_name(f), bad);
        free(k), free(qi), free(tiles);
    }
}

/* Per ISA: P V in integers (values_int, where the table has it) gives the
 * scalar specification's bits: random value bytes (block scales of every
 * half class, NaN and inf too), P in [0, 1) with zeros, rows of zeros and
 * rows of tiny or huge weights, 1..40 rows (groups of 16 on the tiles
 * and the rows past them, 16 and 32 exactly), 1..64 keys (odd counts: a
 * pair's pad), any Dv for int8 (partial blocks and vectors), any row
 * stride. */
static void test_values_int(const char *isa) {
    const fmha_ukernels *uk = fmha_cpu_kernels();
    const fmha_ukernels *spec = fmha_cpu_kernels_for("scalar");
    static const fmha_kv_format fmts[] = {FMHA_KV_FORMAT_INT8, FMHA_KV_FORMAT_Q8_0, FMHA_KV_FORMAT_Q4_0};
    enum { ROWS = 40, KEYS = 64, DV = 320 };
    for (int fi = 0; fi < 3; fi++) {
        const fmha_kv_format f = fmts[fi];
        const fmha_cache_format_id id = (fmha_cache_format_id)(f - FMHA_KV_FORMAT_F32);
        if (!uk->cache[id].values_int) continue;
        tu_check(spec->cache[id].values_int != NULL, "%s: the specification of %s's integer values", isa, fmt_name(f));
        const size_t nbytes = f == FMHA_KV_FORMAT_Q8_0 ? 34 : f == FMHA_KV_FORMAT_Q4_0 ? 18 : 32;
        const size_t ldv_max = DV / 32 * nbytes + 50;
        uint8_t *v = malloc(KEYS * ldv_max);
        float *p = malloc(ROWS * KEYS * sizeof(float)), *o1 = malloc(ROWS * DV * sizeof(float));
        float *o2 = malloc(ROWS * DV * sizeof(float)), alpha[ROWS];
        size_t bad = 0;
        for (int c = 0; c < 40; c++) {
            /* odd cases: more than 4 rows (several blocks of rows) of at most 17
             * keys, a decode sub-block's size */
            const size_t rows = (size_t)(c % 8 == 6 ? 16 * tu_int(1, 2) : c % 2 ? tu_int(5, ROWS) : tu_int(1, ROWS));
            const size_t nk = (size_t)(c % 2 ? tu_int(1, 17) : tu_int(1, KEYS));
            const size_t dv = nbytes == 32 ? (size_t)tu_int(1, DV) : 32 * (size_t)tu_int(1, DV / 32);
            const size_t ldv = (dv + 31) / 32 * nbytes + (size_t)tu_int(0, 50);
            for (size_t i = 0; i < KEYS * ldv_max; i++) v[i] = (uint8_t)tu_int(0, 255);
            if (nbytes != 32)
                for (size_t j = 0; j < nk; j++)
                    for (size_t b = 0; b < dv / 32; b++) {
                        static const uint16_t halves[] = {0x3c00, 0x2e66, 0x0003, 0x0000, 0xb555, 0x1400, 0x7e00, 0xfc00};
                        const uint16_t h = halves[tu_int(0, c % 4 ? 5 : 7)];
                        v[j * ldv + b * nbytes] = (uint8_t)(h & 0xff), v[j * ldv + b * nbytes + 1] = (uint8_t)(h >> 8);
                    }
            tu_fill(p, ROWS * KEYS, 0, 1);
            for (size_t i = 0; i < ROWS * KEYS; i++)
                if (tu_int(0, 3) == 0) p[i] = 0.0f;
            for (size_t j = 0; j < nk; j++) p[j] = 0.0f;                            /* row 0: no weight */
            for (size_t j = 0; j < nk && rows > 1; j++) p[KEYS + j] *= c % 2 ? 1e-30f : 1e30f; /* tiny, huge */
            tu_fill(o1, ROWS * DV, -1, 1);
            memcpy(o2, o1, ROWS * DV * sizeof(float));
            tu_fill(alpha, ROWS, 0, 1);
            /* the rows in order, or anywhere (a paged cache: every other case
             * takes them in a shuffled order, the stride's pad between) */
            const void *v_rows[KEYS];
            size_t order[KEYS];
            for (size_t j = 0; j < KEYS; j++) order[j] = j;
            for (size_t j = KEYS - 1; c % 2 && j > 0; j--) {
                const size_t t = (size_t)tu_int(0, (int)j), x = order[j];
                order[j] = order[t], order[t] = x;
            }
            for (size_t j = 0; j < nk; j++) v_rows[j] = v + order[j] * ldv;
            spec->cache[id].values_int(rows, nk, dv, p, KEYS, v_rows, o1, DV, alpha);
            uk->cache[id].values_int(rows, nk, dv, p, KEYS, v_rows, o2, DV, alpha);
            for (size_t i = 0; i < ROWS * DV; i++)
                bad += memcmp(&o1[i], &o2[i], sizeof(float)) && !(isnan(o1[i]) && isnan(o2[i]));
        }
        tu_check(bad == 0, "%s %s integer values: %zu differ from the specification's bits", isa, fmt_name(f), bad);
        free(v), free(p), free(o1), free(o2);
    }
}

/* n random bytes of float8 format id, its NaN and inf codes only where
 * `special` (else their bit 6 cleared: finite codes). */
static void fp8_key_bytes(fmha_cache_format_id id, uint8_t *k, size_t n, int special) {
    const fmha_cache_format *f = fmha_cache_format_at(id);
    for (size_t i = 0; i < n; i++) {
        k[i] = (uint8_t)tu_int(0, 255);
        const float x = f->dequant(k + i, 0);
        if (!special && (x != x || isinf(x))) k[i] &= 0xbf;
    }
}

/* Per ISA: float8 keys' scores on the bf16 query (scores_bf16, where the
 * table has it) give the scalar specification's bits: every byte of both
 * formats (NaN and inf codes now and then), query pairs rounded from
 * uniform rows, 1..9 rows (blocks of 4 and single rows), 1..40 keys, D
 * 32..320, any row stride. */
static void test_scores_bf16(const char *isa) {
    const fmha_ukernels *uk = fmha_cpu_kernels();
    const fmha_ukernels *spec = fmha_cpu_kernels_for("scalar");
    static const fmha_kv_format fmts[] = {FMHA_KV_FORMAT_FP8_E4M3, FMHA_KV_FORMAT_FP8_E5M2};
    enum { ROWS = 9, KEYS = 40, D = 320 };
    for (int fi = 0; fi < 2; fi++) {
        const fmha_kv_format f = fmts[fi];
        const fmha_cache_format_id id = (fmha_cache_format_id)(f - FMHA_KV_FORMAT_F32);
        if (!uk->cache[id].scores_bf16) continue;
        tu_check(spec->cache[id].scores_bf16 != NULL, "%s: the specification of %s's bf16 scores", isa, fmt_name(f));
        uint8_t *k = malloc(KEYS * (D + 50));
        uint32_t q[ROWS * D / 2];
        float x[ROWS * D], s1[ROWS * KEYS], s2[ROWS * KEYS];
        size_t bad = 0;
        for (int c = 0; c < 40; c++) {
            const size_t rows = (size_t)tu_int(1, ROWS), nk = (size_t)tu_int(1, KEYS), d = 32 * (size_t)tu_int(1, D / 32);
            const size_t ldk = d + (size_t)tu_int(0, 50), ldq = D / 2;
            fp8_key_bytes(id, k, KEYS * (D + 50), c % 4 == 0);
            tu_fill(x, ROWS * D, -2, 2);
            for (size_t i = 0; i < ROWS * D / 2; i++)
                q[i] = (uint32_t)fmha_f32_to_bf16(x[2 * i]) | (uint32_t)fmha_f32_to_bf16(x[2 * i + 1]) << 16;
            tu_fill(s1, ROWS * KEYS, 0, 1);
            memcpy(s2, s1, sizeof s1);
            const float scale = (float)tu_uniform(0.05, 2);
            spec->cache[id].scores_bf16(rows, nk, d, q, ldq, k, ldk, s1, KEYS, scale);
            uk->cache[id].scores_bf16(rows, nk, d, q, ldq, k, ldk, s2, KEYS, scale);
            for (size_t i = 0; i < ROWS * KEYS; i++)
                bad += memcmp(&s1[i], &s2[i], sizeof(float)) && !(isnan(s1[i]) && isnan(s2[i]));
        }
        tu_check(bad == 0, "%s %s bf16 scores: %zu differ from the specification's bits", isa, fmt_name(f), bad);
        free(k);
    }
}

/* Per ISA: the same with 16 rows in the lanes (scores_bf16_qt, where the
 * table has it): the specification's bits on the query's pair tiles, 1..16
 * rows (the tile's rows past them 0), 1..40 keys (blocks of 16 and a
 * last partial one), D 32..320, any row stride, NaN codes one case in four. */
static void test_scores_bf16_qt(const char *isa) {
    const fmha_ukernels *uk = fmha_cpu_kernels();
    const fmha_ukernels *spec = fmha_cpu_kernels_for("scalar");
    static const fmha_kv_format fmts[] = {FMHA_KV_FORMAT_FP8_E4M3, FMHA_KV_FORMAT_FP8_E5M2};
    enum { KEYS = 40, D = 320 };
    for (int fi = 0; fi < 2; fi++) {
        const fmha_kv_format f = fmts[fi];
        const fmha_cache_format_id id = (fmha_cache_format_id)(f - FMHA_KV_FORMAT_F32);
        if (!uk->cache[id].scores_bf16_qt) continue;
        tu_check(spec->cache[id].scores_bf16_qt != NULL, "%s: the specification of %s's bf16 tile scores", isa,
                 fmt_name(f));
        uint8_t *k = malloc(KEYS * (D + 50));
        uint32_t qt[D / 2 * 16];
        float x[16 * D], s1[16 * KEYS], s2[16 * KEYS];
        size_t bad = 0;
        for (int c = 0; c < 40; c++) {
            const size_t rows = (size_t)tu_int(1, 16), nk = (size_t)tu_int(1, KEYS), d = 32 * (size_t)tu_int(1, D / 32);
            const size_t ldk = d + (size_t)tu_int(0, 50);
            fp8_key_bytes(id, k, KEYS * (D + 50), c % 4 == 0);
            tu_fill(x, 16 * D, -2, 2);
            for (size_t p = 0; p < D / 2; p++) /* qt[16 p + r]: row r's pair p */
                for (size_t r = 0; r < 16; r++)
                    qt[16 * p + r] = r >= rows ? 0
                                               : (uint32_t)fmha_f32_to_bf16(x[r * D + 2 * p]) |
                                                     (uint32_t)fmha_f32_to_bf16(x[r * D + 2 * p + 1]) << 16;
            tu_fill(s1, 16 * KEYS, 0, 1);
            memcpy(s2, s1, sizeof s1);
            const float scale = (float)tu_uniform(0.05, 2);
            spec->cache[id].scores_bf16_qt(rows, nk, d, qt, k, ldk, s1, KEYS, scale);
            uk->cache[id].scores_bf16_qt(rows, nk, d, qt, k, ldk, s2, KEYS, scale);
            for (size_t i = 0; i < 16 * KEYS; i++)
                bad += memcmp(&s1[i], &s2[i], sizeof(float)) && !(isnan(s1[i]) && isnan(s2[i]));
        }
        tu_check(bad == 0, "%s %s bf16 tile scores: %zu differ from the specification's bits", isa, fmt_name(f), bad);
        free(k);
    }
}

/* Per ISA: float8 values on bf16 P (values_bf16, where the table has it)
 * give the scalar specification's bits (normal operands, as the contract
 * asks: finite codes, P in (0.01, 1)): 1..9 rows (blocks of 4 and single
 * rows), 1..128 keys (odd counts: a pair with no second row), any Dv
 * (whole and partial blocks of 64), V's rows in order or shuffled. */
static void test_values_bf16(const char *isa) {
    const fmha_ukernels *uk = fmha_cpu_kernels();
    static const fmha_kv_format fmts[] = {FMHA_KV_FORMAT_FP8_E4M3, FMHA_KV_FORMAT_FP8_E5M2};
    static const fmha_cache_values_bf16_ukernel_fn specs[] = {fmha_e4m3kv_values_bf16__scalar,
                                                               fmha_e5m2kv_values_bf16__scalar};
    enum { ROWS = 9, KEYS = 128, DV = 320 };
    for (int fi = 0; fi < 2; fi++) {
        const fmha_kv_format f = fmts[fi];
        const fmha_cache_format_id id = (fmha_cache_format_id)(f - FMHA_KV_FORMAT_F32);
        if (!uk->cache[id].values_bf16) continue;
        uint8_t *v = malloc(KEYS * (DV + 50));
        float *p = malloc(ROWS * KEYS * sizeof(float)), *o1 = malloc(ROWS * DV * sizeof(float));
        float *o2 = malloc(ROWS * DV * sizeof(float)), alpha[ROWS];
        size_t bad = 0;
        for (int c = 0; c < 40; c++) {
            const size_t rows = (size_t)tu_int(1, ROWS), nk = (size_t)(c < 4 ? 125 + c : tu_int(1, 70));
            const size_t dv = (size_t)tu_int(1, DV), ldv = dv + (size_t)tu_int(0, 50);
            fp8_key_bytes(id, v, KEYS * (DV + 50), 0);
            tu_fill(p, ROWS * KEYS, 0.01, 1);
            tu_fill(o1, ROWS * DV, -1, 1);
            memcpy(o2, o1, ROWS * DV * sizeof(float));
            tu_fill(alpha, ROWS, 0, 1);
            const void *v_rows[KEYS];
            for (size_t j = 0; j < nk; j++) v_rows[j] = v + j * ldv;
            for (size_t j = nk - 1; c % 2 && j > 0; j--) { /* a paged cache's order */
                const size_t t = (size_t)tu_int(0, (int)j);
                const void *x = v_rows[j];
                v_rows[j] = v_rows[t], v_rows[t] = x;
            }
            specs[fi](rows, nk, dv, p, KEYS, v_rows, o1, DV, alpha);
            uk->cache[id].values_bf16(rows, nk, dv, p, KEYS, v_rows, o2, DV, alpha);
            bad += memcmp(o1, o2, ROWS * DV * sizeof(float)) != 0;
        }
        tu_check(bad == 0, "%s %s values on bf16 P: %zu cases differ from the specification's bits", isa, fmt_name(f),
                 bad);
        free(v), free(p), free(o1), free(o2);
    }
}

/* ---- the quantizers ---- */

/* ggml's quantize_row_q8_0_ref and quantize_row_q4_0_ref on x[i] =
 * 3 sin(0.37 i + 0.1) (an outlier 9.5 at i = 40, a zero block at 64..95),
 * 128 values; the bytes below are what ggml writes (commit d99724f). */
static void test_ggml_vectors(void) {
    float x[128];
    for (int i = 0; i < 128; i++) x[i] = 3.0f * sinf(0.37f * (float)i + 0.1f);
    x[40] = 9.5f;
    for (int i = 64; i < 96; i++) x[i] = 0.0f;
#include "kvformat_ggml_vectors.h"
    uint8_t q8[4 * 34], q4[4 * 18];
    const int64_t xs[3] = {128, 128, 1}, q8s[3] = {136, 136, 1}, q4s[3] = {72, 72, 1};
    tu_check(fmha_kv_quantize(FMHA_KV_FORMAT_Q8_0, 1, 1, 128, x, xs, q8, q8s, NULL, NULL) == FMHA_OK &&
                 !memcmp(q8, ggml_q8_0, sizeof q8),
             "q8_0: ggml's quantize_row_q8_0_ref bytes");
    tu_check(fmha_kv_quantize(FMHA_KV_FORMAT_Q4_0, 1, 1, 128, x, xs, q4, q4s, NULL, NULL) == FMHA_OK &&
                 !memcmp(q4, ggml_q4_0, sizeof q4),
             "q4_0: ggml's quantize_row_q4_0_ref bytes");
}

/* fp8: every value quantizes to the nearest code (ties to the even
 * mantissa), saturating at the largest finite; int8: round(x / scale) with
 * scale = max |x| / 127. */
static void test_quantize_rules(void) {
    for (int which = 0; which < 2; which++) {
        const fmha_kv_format f = which ? FMHA_KV_FORMAT_FP8_E5M2 : FMHA_KV_FORMAT_FP8_E4M3;
        const double top = which ? 57344.0 : 448.0;
        enum { N = 4096 };
        float *x = malloc(N * sizeof(float));
        uint8_t *out = malloc(N);
        for (int i = 0; i < N; i++) {
            double mag = ldexp(tu_uniform(1, 2), (int)tu_int(which ? -18 : -11, which ? 17 : 10));
            x[i] = (float)(tu_int(0, 1) ? -mag : mag);
        }
        x[0] = 0.0f, x[1] = -0.0f, x[2] = 1e30f, x[3] = -INFINITY, x[4] = NAN;
        x[5] = (float)(which ? 61440.0 : 464.0); /* halfway past the top: saturates */
        x[6] = (float)ldexp(9, which ? -17 : -10); /* halfway between subnormal codes 4 and 5 (e4m3) / 2 and 3 */
        const int64_t xs[3] = {N, N, 1}, vs[3] = {N, N, 1}, ss[2] = {0, 1};
        float one = 1.0f;
        int bad = 0;
        tu_check(fmha_kv_quantize(f, 1, 1, N, x, xs, out, vs, &one, ss) == FMHA_OK, "%s quantize", fmt_name(f));
        for (int i = 0; i < N; i++) {
            double got = fp8_value(f, out[i]);
            if (isnan(x[i])) {
                bad += !isnan(got);
                continue;
            }
            double want_mag = fmin(fabs((double)x[i]), top), best = INFINITY;
            int best_code = -1;
            for (int c = 0; c < 128; c++) { /* the nearest finite code, ties to an even code */
                double v = fp8_value(f, (uint8_t)c);
                if (isnan(v) || isinf(v)) continue;
                double dist = fabs(v - want_mag);
                if (dist < best || (dist == best && (c & 1) == 0)) best = dist, best_code = c;
            }
            double want = fp8_value(f, (uint8_t)best_code);
            bad += got != (signbit(x[i]) ? -want : want) || !signbit(got) != !signbit(x[i]);
        }
        tu_check(bad == 0, "%s: nearest code, ties to even, saturated (%d wrong)", fmt_name(f), bad);
        free(x), free(out);
    }
    float x[3][40], scales[3];
    int8_t q[3][40];
    tu_fill(&x[0][0], 120, -2, 2);
    for (int e = 0; e < 40; e++) x[2][e] = 0.0f;
    const int64_t xs[3] = {40, 40, 1}, vs[3] = {40, 40, 1}, ss[2] = {1, 1};
    int bad = fmha_kv_quantize(FMHA_KV_FORMAT_INT8, 3, 1, 40, &x[0][0], xs, q, vs, scales, ss) != FMHA_OK;
    for (int t = 0; t < 3; t++) {
        float amax = 0;
        for (int e = 0; e < 40; e++) amax = fmaxf(amax, fabsf(x[t][e]));
        bad += scales[t] != amax / 127;
        for (int e = 0; e < 40; e++) bad += q[t][e] != (int8_t)(scales[t] ? roundf(x[t][e] * (1.0f / scales[t])) : 0);
    }
    tu_check(bad == 0, "int8: scale max|x| / 127, q = round(x / scale), a zero row scale 0");
}

/* ---- bad input: clear errors, nothing written ---- */
static void test_errors(void) {
    const int64_t B = 1, H = 2, S = 64, D = 32;
    float q[64], xk[4096], xv[4096], o[64], lse[2];
    tu_fill(q, 64, -1, 1), tu_fill(xk, 4096, -1, 1), tu_fill(xv, 4096, -1, 1);
    cache ck = cache_new(FMHA_KV_FORMAT_INT8, B, S, H, D, xk), cv = cache_new(FMHA_KV_FORMAT_Q8_0, B, S, H, D, xv);
    fmha_problem p;
    fmha_problem_init(&p, B, H, H, 1, S, D, D, FMHA_LAYOUT_BSHD);
    cache_attach(&p, 0, &ck);
    cache_attach(&p, 1, &cv);
    tu_check(fmha_forward(&p, q, ck.bytes, cv.bytes, o, lse, NULL, 0) == FMHA_OK, "formats: the good call runs");
#define REFUSED(prob, want, what)                                                                                      \
    do {                                                                                                               \
        for (int i = 0; i < 64; i++) o[i] = 7.0f;                                                                      \
        fmha_status got_ = fmha_forward(&(prob), q, ck.bytes, cv.bytes, o, lse, NULL, 0);                              \
        tu_check(got_ == (want) && tu_count_not(o, 64, 7.0f) == 0, "formats: %s is %d (got %d: %s), nothing written", \
                 what, (int)(want), (int)got_, fmha_last_error_message());                                             \
    } while (0)
    fmha_problem b = p;
    b.k_format = 9;
    REFUSED(b, FMHA_ERR_BAD_OPTION, "an unknown k_format");
    b = p;
    b.k_scales = NULL;
    REFUSED(b, FMHA_ERR_NULL_POINTER, "int8 without k_scales");
    b = p;
    b.v_scales = ck.scales;
    REFUSED(b, FMHA_ERR_BAD_OPTION, "scales beside q8_0");
    b = p;
    b.k_scale_strides[1] = -1;
    REFUSED(b, FMHA_ERR_BAD_STRIDE, "a negative scale stride");
    b = p;
    b.v_strides[3] = 2;
    REFUSED(b, FMHA_ERR_BAD_STRIDE, "a q8_0 dim stride other than 1");
    fmha_problem_init(&b, B, H, H, 1, S, 48, 48, FMHA_LAYOUT_BSHD);
    b.v_format = FMHA_KV_FORMAT_Q4_0;
    tu_check(fmha_problem_check(&b) == FMHA_ERR_BAD_HEAD_DIM && strstr(fmha_last_error_message(), "head_dim_v") &&
                 strstr(fmha_last_error_message(), "32"),
             "formats: Dv 48 with q4_0 is BAD_HEAD_DIM naming head_dim_v and 32 (%s)", fmha_last_error_message());
    /* a bad scale a key the call reads: refused, named; past kv_length: never read */
    /* (every sign and class; in a block of 16 of the check's vector pass
     * and in its tail: key 2 and the last key) */
    const float bad_values[6] = {NAN, -NAN, INFINITY, -INFINITY, -0.5f, -1e-40f};
    const int64_t bad_keys[2] = {2, S - 1};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 6; i++) {
            const int64_t at = bad_keys[k] * H + 1;
            float keep = ck.scales[at];
            ck.scales[at] = bad_values[i];
            REFUSED(p, FMHA_ERR_BAD_SCALE, "a bad k_scales value");
            char key[32];
            snprintf(key, sizeof key, "key %lld,", (long long)bad_keys[k]);
            tu_check(strstr(fmha_last_error_message(), "k_scales") && strstr(fmha_last_error_message(), key),
                     "formats: the bad scale %g is named (%s)", (double)bad_values[i], fmha_last_error_message());
            ck.scales[at] = keep;
        }
    /* The decode step reading every key checks the scales as it reads
     * them (fmha_decode_reads_scales), on each thread: a bad K or V scale
     * is refused and named as by the check before the run, o and lse
     * untouched, on 1 and 2 threads. A query length of 0 (a step that
     * reads no key) leaves the check before the run, which still refuses
     * it. V int8 here: its per-key scales scale P. */
    {
        cache cvi = cache_new(FMHA_KV_FORMAT_INT8, B, S, H, D, xv);
        fmha_problem pv = p;
        cache_attach(&pv, 1, &cvi);
        fmha_plan pl;
        fmha_status planned = fmha_plan_init(&pv, &pl);
        tu_check(planned == FMHA_OK && pl.driver == &fmha_fwd_driver_decode && fmha_decode_reads_scales(&pl) == 1,
                 "formats: the decode step reads every scale of this call (%d: %s)", (int)planned,
                 planned == FMHA_OK ? pl.driver->name : fmha_last_error_message());
        int32_t no_rows[1] = {0};
        fmha_problem w = pv;
        w.masks.q_lengths = no_rows;
        planned = fmha_plan_init(&w, &pl);
        tu_check(planned == FMHA_OK && pl.driver == &fmha_fwd_driver_decode && fmha_decode_reads_scales(&pl) == 0,
                 "formats: a query length of 0: the decode step reads no scale (%d: %s)", (int)planned,
                 planned == FMHA_OK ? pl.driver->name : fmha_last_error_message());
        for (int threads = 1; threads <= 2; threads++) {
            fmha_set_num_threads(threads);
            for (int which = 0; which < 3; which++) { /* K key 2, V key 63, K key 2 of a query length 0 */
                float *at = which == 1 ? &cvi.scales[(S - 1) * H] : &ck.scales[2 * H + 1];
                const float keep = *at;
                *at = NAN;
                const fmha_problem t = which == 2 ? w : pv;
                for (int i = 0; i < 64; i++) o[i] = 7.0f;
                lse[0] = lse[1] = 7.0f;
                const fmha_status got = fmha_forward(&t, q, ck.bytes, cvi.bytes, o, lse, NULL, 0);
                const char *want = which == 1 ? "v_scales" : "k_scales", *key = which == 1 ? "key 63," : "key 2,";
                tu_check(got == FMHA_ERR_BAD_SCALE && strstr(fmha_last_error_message(), want) &&
                             strstr(fmha_last_error_message(), key) && tu_count_not(o, 64, 7.0f) == 0 &&
                             lse[0] == 7.0f && lse[1] == 7.0f,
                         "formats: %s, %d threads: a bad %s of %s is refused and named, nothing written (%d: %s)",
                         which == 2 ? "no key read" : "every key read", threads, want, key, (int)got,
                         fmha_last_error_message());
                *at = keep;
            }
        }
        fmha_set_num_threads(0);
        cache_free(&cvi);
    }
    /* the vector pass's tail: 61 keys x 2 heads read, key 60 bad */
    {
        int32_t len61[1] = {61};
        fmha_problem t = p;
        t.masks.kv_lengths = len61;
        float keep = ck.scales[60 * H + 1];
        ck.scales[60 * H + 1] = -NAN;
        REFUSED(t, FMHA_ERR_BAD_SCALE, "a bad k_scales value in the check's tail");
        tu_check(strstr(fmha_last_error_message(), "key 60,") != NULL, "formats: the tail's bad scale is named (%s)",
                 fmha_last_error_message());
        ck.scales[60 * H + 1] = keep;
    }
    /* -0 is >= 0: a valid scale */
    {
        float keep = ck.scales[2 * H + 1];
        ck.scales[2 * H + 1] = -0.0f;
        tu_check(fmha_forward(&p, q, ck.bytes, cv.bytes, o, lse, NULL, 0) == FMHA_OK, "formats: a scale of -0 is valid");
        ck.scales[2 * H + 1] = keep;
    }
    int32_t len[1] = {10};
    b = p;
    b.masks.kv_lengths = len;
    ck.scales[20 * H] = NAN;
    tu_check(fmha_forward(&b, q, ck.bytes, cv.bytes, o, lse, NULL, 0) == FMHA_OK,
             "formats: a scale past kv_lengths is never read");
    ck.scales[20 * H] = 1.0f;
    /* K's extent counts its bytes: an output inside them overlaps */
    tu_check(fmha_forward(&p, q, ck.bytes, cv.bytes, (float *)(ck.bytes + S * H * D - 8), lse, NULL, 0) ==
                 FMHA_ERR_OVERLAP,
             "formats: K's extent is its bytes");
    /* the backward: unsupported */
    float dq[64], dk[4096], dv[4096];
    for (int i = 0; i < 64; i++) dq[i] = 7.0f;
    tu_check(fmha_backward(&p, q, ck.bytes, cv.bytes, o, o, lse, dq, dk, dv, NULL, NULL, 0) == FMHA_ERR_UNSUPPORTED &&
                 tu_count_not(dq, 64, 7.0f) == 0,
             "formats: the backward is FMHA_ERR_UNSUPPORTED");
    /* the quantizer's refusals */
    const int64_t xs[3] = {H * D, D, 1}, vs[3] = {H * 34, 34, 1}, ss[2] = {H, 1};
    uint8_t out[512];
    float sc[4] = {1, 1, 1, 1};
    memset(out, 0x5a, sizeof out);
    tu_check(fmha_kv_quantize(FMHA_KV_FORMAT_Q8_0, 2, H, 40, xk, xs, out, vs, NULL, NULL) == FMHA_ERR_BAD_HEAD_DIM &&
                 fmha_kv_quantize(FMHA_KV_FORMAT_Q8_0, 2, H, D, xk, xs, out, vs, sc, ss) == FMHA_ERR_BAD_OPTION &&
                 fmha_kv_quantize(FMHA_KV_FORMAT_INT8, 2, H, D, xk, xs, out, xs, NULL, NULL) == FMHA_ERR_NULL_POINTER &&
                 fmha_kv_quantize(FMHA_KV_FORMAT_DTYPE, 2, H, D, xk, xs, out, xs, NULL, NULL) == FMHA_ERR_BAD_OPTION &&
                 fmha_kv_quantize(FMHA_KV_FORMAT_Q8_0, 2, H, D, xk, xs, (uint8_t *)xk + 8, vs, NULL, NULL) ==
                     FMHA_ERR_OVERLAP,
             "quantize: bad dim, scales, format and overlaps refused");
    float nan_row[64];
    tu_fill(nan_row, 64, -1, 1);
    nan_row[37] = NAN;
    sc[0] = -0.5f;
    const int64_t ss0[2] = {0, 1};
    tu_check(fmha_kv_quantize(FMHA_KV_FORMAT_INT8, 1, H, D, nan_row, xs, out, xs, sc + 1, ss) == FMHA_ERR_BAD_SCALE &&
                 fmha_kv_quantize(FMHA_KV_FORMAT_Q8_0, 1, H, D, nan_row, xs, out, vs, NULL, NULL) ==
                     FMHA_ERR_BAD_SCALE &&
                 fmha_kv_quantize(FMHA_KV_FORMAT_Q4_0, 1, H, D, nan_row, xs, out, vs, NULL, NULL) ==
                     FMHA_ERR_BAD_SCALE &&
                 fmha_kv_quantize(FMHA_KV_FORMAT_FP8_E4M3, 1, H, D, nan_row, xs, out, xs, sc, ss0) ==
                     FMHA_ERR_BAD_SCALE,
             "quantize: a NaN under int8, q8_0 and q4_0 (whose scales it would set) and a negative fp8 scale are "
             "BAD_SCALE");
    int untouched = 1;
    for (int i = 0; i < 512; i++) untouched &= out[i] == 0x5a;
    tu_check(untouched && sc[1] == 1.0f, "quantize: nothing written on an error");
    /* a zero fp8 scale, which attention accepts: the head holds only 0 (NaN stays NaN) */
    sc[0] = 0.0f;
    nan_row[38] = INFINITY;
    int zeros = 1;
    for (int f = 0; f < 2; f++) {
        const fmha_kv_format fmt = f ? FMHA_KV_FORMAT_FP8_E5M2 : FMHA_KV_FORMAT_FP8_E4M3;
        const fmha_cache_format *cf = fmha_cache_format_at((fmha_cache_format_id)(fmt - FMHA_KV_FORMAT_F32));
        zeros &= fmha_kv_quantize(fmt, 1, 1, D, nan_row, xs, out, xs, sc, ss0) == FMHA_OK;
        for (int64_t e = 0; e < D; e++) zeros &= e == 37 ? isnan(cf->dequant(out, e)) : cf->dequant(out, e) == 0.0f;
    }
    tu_check(zeros, "quantize: a zero fp8 scale stores 0 for every value but NaN");
    cache_free(&ck), cache_free(&cv);
}

int main(void) {
    tu_seed();
    tu_isa_variants = 1; /* every table: the float32 kernels of avx512 and the integer ones of avx512vnni */
    tu_each_isa(test_format_kernels);
    tu_each_isa(test_scores_q8);
    tu_each_isa(test_values_int);
    tu_each_isa(test_scores_bf16);
    tu_each_isa(test_scores_bf16_qt);
    tu_each_isa(test_values_bf16);
    tu_each_isa(test_fp8_values_choice);
    tu_each_isa(test_cases);
    tu_each_isa(test_mla);
    tu_each_isa(test_fold);
    test_precision_table();
    test_ggml_vectors();
    test_quantize_rules();
    test_errors();
    return tu_finish();
}
