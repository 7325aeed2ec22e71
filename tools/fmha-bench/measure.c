/* measure.c: one benchmark row of fmha-bench: problem setup, memory plan,
 * calibrated timing (median and quartiles), GFLOP/s and the relative error
 * against the float64 reference. */
#include "bench.h"
#include "kv_lengths.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fmha_ref.h"
/* The reference with masks and biases (masked_bias rows), where the build
 * links it into fmha_ref and says so with FMHA_REF_HAVE_MASKS. Without it
 * those rows get rel_err null, never an error against the wrong problem. */
#ifdef FMHA_REF_HAVE_MASKS
#include "fmha_ref_masks.h"
#endif

#define MB (1024.0 * 1024.0)
#define INPUT_SEED BENCH_INPUT_SEED
#define MAX_INNER (1LL << 24)

/* The test-only impl's scale is this factor off the right one. */
#define WRONG_SCALE_FACTOR 1.5f

double bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- names ---------------------------------------------------------------- */

int bench_impl_strategy(const char *impl, int *wrong_scale)
{
    *wrong_scale = 0;
    if (strcmp(impl, "fmha_auto") == 0) return FMHA_STRATEGY_AUTO;
    if (strcmp(impl, "fmha_plan") == 0) return FMHA_STRATEGY_AUTO; /* auto, through a reused plan */
    if (strcmp(impl, "fmha_dense") == 0) return FMHA_STRATEGY_DENSE;
    if (strcmp(impl, "fmha_tiled") == 0) return FMHA_STRATEGY_TILED;
    if (strcmp(impl, "fmha_portable") == 0) return FMHA_STRATEGY_PORTABLE;
    if (strcmp(impl, "fmha_wrong_for_test") == 0) {
        *wrong_scale = 1;
        return FMHA_STRATEGY_TILED;
    }
    return -1;
}

int bench_impl_known(const char *impl, int testing_allowed)
{
    int wrong;
    if (bench_impl_strategy(impl, &wrong) < 0)
        return 0;
    return !wrong || testing_allowed;
}

static fmha_dtype dtype_of(const char *name)
{
    if (strcmp(name, "bfloat16") == 0) return FMHA_DTYPE_BF16;
    if (strcmp(name, "float16") == 0) return FMHA_DTYPE_F16;
    return FMHA_DTYPE_F32;
}

static size_t dtype_size(fmha_dtype dtype) { return dtype == FMHA_DTYPE_F32 ? 4 : 2; }

/* The fmha_kv_format of a --kv-format name (0: none). */
static int kv_format_of(const char *name)
{
    static const char *const names[] = {"int8", "fp8_e4m3", "fp8_e5m2", "q8_0", "q4_0"};
    for (int i = 0; name && i < 5; i++)
        if (strcmp(name, names[i]) == 0)
            return FMHA_KV_FORMAT_INT8 + i;
    return 0;
}

/* The dtype of a problem's K and V. */
static fmha_dtype kv_dtype_of(const fmha_problem *p)
{
    return p->kv_dtype == FMHA_KV_DTYPE_SAME ? p->dtype : (fmha_dtype)(p->kv_dtype - 1);
}

static int is_fwdbwd(const bench_case *c) { return strcmp(c->mode, "fwdbwd") == 0; }
static int is_masked_bias(const bench_case *c) { return strcmp(c->variant, "masked_bias") == 0; }

/* The masked_bias variant (as the seed's): keys past S - S/8 hidden, plus a
 * learnable T5 relative-position bias table [heads, 32]. */
#define T5_BUCKETS 32
#define T5_MAX_DISTANCE 128

static void set_variant(const bench_case *c, const bench_inputs *in, fmha_problem *p)
{
    /* bottom-right: the same mask as top-left when Sq = Skv, decoding's when Sq < Skv */
    p->causal = strcmp(c->variant, "causal") == 0 || bench_is_decode(c) ? FMHA_CAUSAL_BOTTOM_RIGHT
                                                                        : FMHA_CAUSAL_NONE;
    if (bench_is_decode(c) && in) /* the cache's lengths: full */
        p->masks.kv_lengths = in->kv_lengths;
    if (is_masked_bias(c) && in) {
        p->masks.kv_lengths = in->kv_lengths;
        p->biases.rel_table = in->rel_table;
        p->biases.rel_num_buckets = T5_BUCKETS;
        p->biases.rel_max_distance = T5_MAX_DISTANCE;
        p->biases.rel_bidirectional = 1;
    }
}

void bench_case_problem(const bench_case *c, const bench_inputs *in, fmha_problem *p)
{
    int wrong;
    fmha_problem_init(p, c->batch, c->heads, bench_heads_kv(c), bench_seq_q(c), c->seq, c->head_dim,
                      bench_head_dim_v(c), FMHA_LAYOUT_BSHD);
    p->dtype = dtype_of(c->dtype);
    if (c->kv_dtype)
        p->kv_dtype = (fmha_kv_dtype)(dtype_of(c->kv_dtype) + 1);
    if (c->kv_format) { /* rows of the format, scales as fmha_problem_init's [B, S, Hkv] or per head */
        const int f = kv_format_of(c->kv_format);
        const int64_t row = (int64_t)fmha_kv_format_row_bytes(f, c->head_dim), hkv = bench_heads_kv(c);
        p->k_format = p->v_format = f;
        for (int t = 0; t < 2; t++) {
            int64_t *st = t ? p->v_strides : p->k_strides, *ss = t ? p->v_scale_strides : p->k_scale_strides;
            st[0] = c->seq * hkv * row, st[1] = hkv * row, st[2] = row, st[3] = 1;
            if (f == FMHA_KV_FORMAT_FP8_E4M3 || f == FMHA_KV_FORMAT_FP8_E5M2)
                ss[0] = ss[1] = 0;
        }
        if (in)
            p->k_scales = in->k_scales, p->v_scales = in->v_scales;
    }
    p->precision = !c->precision                       ? FMHA_PRECISION_ACCURATE
                   : strcmp(c->precision, "fast") == 0   ? FMHA_PRECISION_FAST
                   : strcmp(c->precision, "bf16x3") == 0 ? FMHA_PRECISION_BF16X3
                   : strcmp(c->precision, "bf16") == 0   ? FMHA_PRECISION_BF16
                                                         : FMHA_PRECISION_ACCURATE;
    int strategy = bench_impl_strategy(c->impl, &wrong);
    p->strategy = strategy < 0 ? FMHA_STRATEGY_AUTO : (fmha_strategy)strategy;
    set_variant(c, in, p);
    if (in && in->table) { /* the pools' [page, row, head, dim] strides */
        p->block_table = in->table;
        p->block_table_stride = in->table_stride;
        p->page_size = c->page_size;
        p->num_pages = in->num_pages;
        p->k_strides[0] = p->v_strides[0] = c->page_size * p->k_strides[1]; /* a page of rows */
        if (c->kv_format && p->k_scale_strides[0]) /* int8's scales a key: pooled as the rows */
            p->k_scale_strides[0] = p->v_scale_strides[0] = c->page_size * p->k_scale_strides[1];
    }
    if (wrong)
        p->scale = WRONG_SCALE_FACTOR / sqrtf((float)c->head_dim);
}

fmha_status bench_case_plan(const bench_case *c, const bench_inputs *in, size_t *workspace, size_t *args,
                            size_t *outs)
{
    fmha_problem p;
    bench_case_problem(c, in, &p);
    size_t fwd_ws = 0, bwd_ws = 0;
    fmha_status st = fmha_forward_workspace_size(&p, &fwd_ws);
    if (st != FMHA_OK)
        return st;
    /* q, dq: tensor bytes; o, dO: o_tensor; k, dk: kv_tensor; v, dv: v_tensor (Dv for D) */
    const double dv_per_d = (double)bench_head_dim_v(c) / (double)c->head_dim;
    size_t tensor = (size_t)(c->batch * bench_seq_q(c) * c->heads * c->head_dim) * dtype_size(p.dtype);
    size_t kv_tensor = (size_t)(c->batch * c->seq * bench_heads_kv(c) * c->head_dim) * dtype_size(kv_dtype_of(&p));
    if (c->kv_format) /* the rows as stored (the scales are small beside them) */
        kv_tensor = (size_t)(c->batch * c->seq * bench_heads_kv(c)) *
                    fmha_kv_format_row_bytes(kv_format_of(c->kv_format), c->head_dim);
    size_t lse = (size_t)(c->batch * c->heads * bench_seq_q(c)) * sizeof(float);
    size_t extras = 0; /* masked_bias: key lengths and bias table */
    if (is_masked_bias(c))
        extras = (size_t)c->batch * sizeof(int32_t) + (size_t)(c->heads * T5_BUCKETS) * sizeof(float);
    if (!is_fwdbwd(c)) {
        *workspace = fwd_ws;
        *args = tensor + (size_t)((double)kv_tensor * (1.0 + dv_per_d)) + extras; /* q, k, v */
        *outs = (size_t)((double)tensor * dv_per_d);                              /* o */
        return FMHA_OK;
    }
    st = fmha_backward_workspace_size(&p, &bwd_ws);
    if (st != FMHA_OK)
        return st;
    /* fmha_forward_backward allocates the two workspaces one after the other. */
    *workspace = fwd_ws > bwd_ws ? fwd_ws : bwd_ws;
    *args = (size_t)((double)tensor * (1.0 + dv_per_d) + (double)kv_tensor * (1.0 + dv_per_d)) + extras; /* q, k, v, dO */
    *outs = (size_t)((double)tensor * (1.0 + dv_per_d) + (double)kv_tensor * (1.0 + dv_per_d)) + lse; /* o, dq, dk, dv, lse */
    if (is_masked_bias(c))
        *outs += (size_t)(c->heads * T5_BUCKETS) * sizeof(float); /* the table's gradient */
    return FMHA_OK;
}

/* ---- 16-bit storage ---------------------------------------------------------- */

static uint32_t float_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float bits_float(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static uint16_t float_to_bf16(float x)
{
    uint32_t u = float_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);        /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static uint16_t float_to_f16(float x)
{
    uint32_t u = float_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    u &= 0x7fffffffu;
    if (u >= 0x7f800000u)
        return sign | (u > 0x7f800000u ? 0x7e00 : 0x7c00);
    if (u >= 0x477ff000u) /* rounds to infinity */
        return sign | 0x7c00;
    if (u < 0x38800000u)  /* subnormal half: multiples of 2^-24 */
        return sign | (uint16_t)rintf(bits_float(u) * 16777216.0f);
    u -= 0x38000000u;     /* rebias the exponent 127 -> 15 */
    u += 0xfffu + ((u >> 13) & 1u);
    return sign | (uint16_t)(u >> 13);
}

static float f16_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    if (exponent == 0) {
        float magnitude = (float)mantissa * (1.0f / 16777216.0f);
        return sign ? -magnitude : magnitude;
    }
    if (exponent == 31)
        return bits_float(sign | 0x7f800000u | (mantissa << 13));
    return bits_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

/* Element i of a dtype array as float. */
static float load_element(fmha_dtype dtype, const void *x, size_t i)
{
    if (dtype == FMHA_DTYPE_F32)
        return ((const float *)x)[i];
    uint16_t h = ((const uint16_t *)x)[i];
    return dtype == FMHA_DTYPE_BF16 ? bits_float((uint32_t)h << 16) : f16_to_float(h);
}

/* Rounds x[0..n) to the dtype in place and stores the dtype copy in out. */
static void round_to_dtype(fmha_dtype dtype, float *x, uint16_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        out[i] = dtype == FMHA_DTYPE_BF16 ? float_to_bf16(x[i]) : float_to_f16(x[i]);
        x[i] = load_element(dtype, out, i);
    }
}

/* ---- inputs and reference -------------------------------------------------- */

/* Uniform in [-1, 1), exactly representable in float. */
static void fill_uniform(float *x, size_t n, uint64_t *state)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((double)(splitmix64(state) >> 40) * (2.0 / 16777216.0) - 1.0);
}

/* The paged copy of the cache as it runs (k_run, v_run: elements, or a
 * format's rows) and of int8's scales a key: each sequence's ceil(S / page)
 * pages placed at a shuffled position of the pools (splitmix64
 * Fisher-Yates); pool rows are [page, row, head, ...] as the keys' rows. */
static int make_pools(bench_inputs *in, const bench_case *c)
{
    const int64_t ps = c->page_size, per_seq = (c->seq + ps - 1) / ps, hkv = bench_heads_kv(c);
    const size_t row = (size_t)hkv * (in->kv_format ? (size_t)in->kv_row_bytes : (size_t)c->head_dim * in->kv_elem_size);
    const int key_scales = in->kv_format == FMHA_KV_FORMAT_INT8; /* [key][head] floats, paged with the rows */
    in->table_stride = per_seq;
    in->num_pages = c->batch * per_seq;
    in->table = malloc((size_t)in->num_pages * sizeof(int32_t));
    in->k_pool = malloc((size_t)(in->num_pages * ps) * row);
    in->v_pool = malloc((size_t)(in->num_pages * ps) * row);
    float *scale_pool[2] = {NULL, NULL};
    for (int t = 0; t < 2 && key_scales; t++)
        scale_pool[t] = malloc((size_t)(in->num_pages * ps * hkv) * sizeof(float));
    if (!in->table || !in->k_pool || !in->v_pool || (key_scales && (!scale_pool[0] || !scale_pool[1]))) {
        free(scale_pool[0]);
        free(scale_pool[1]);
        return -1;
    }
    uint64_t state = INPUT_SEED ^ 0x70a6e5ULL;
    for (int64_t i = 0; i < in->num_pages; i++)
        in->table[i] = (int32_t)i;
    for (int64_t i = in->num_pages - 1; i > 0; i--) {
        int64_t j = (int64_t)(splitmix64(&state) % (uint64_t)(i + 1));
        int32_t t = in->table[i];
        in->table[i] = in->table[j];
        in->table[j] = t;
    }
    for (int64_t b = 0; b < c->batch; b++)
        for (int64_t j = 0; j < c->seq; j++) {
            size_t to = (size_t)(in->table[b * per_seq + j / ps] * ps + j % ps) * row;
            size_t from = (size_t)(b * c->seq + j) * row;
            memcpy((char *)in->k_pool + to, (const char *)in->k_run + from, row);
            memcpy((char *)in->v_pool + to, (const char *)in->v_run + from, row);
            for (int t = 0; t < 2 && key_scales; t++) {
                const float *sc = t ? in->v_scales : in->k_scales;
                memcpy(scale_pool[t] + (to / row) * (size_t)hkv, sc + (size_t)(b * c->seq + j) * (size_t)hkv,
                       (size_t)hkv * sizeof(float));
            }
        }
    if (key_scales) {
        free(in->k_scales);
        free(in->v_scales);
        in->k_scales = scale_pool[0], in->v_scales = scale_pool[1];
    }
    in->k_run = in->k_pool;
    in->v_run = in->v_pool;
    return 0;
}

/* K and V quantized into c's format (k_run, v_run then read them); the
 * float inputs stay as they are, so the reference is the unquantized one. */
static int quantize_inputs(bench_inputs *in, const bench_case *c)
{
    const int f = kv_format_of(c->kv_format);
    const int64_t hkv = bench_heads_kv(c), tokens = c->batch * c->seq, D = c->head_dim;
    in->kv_format = f;
    in->kv_row_bytes = (int64_t)fmha_kv_format_row_bytes(f, D);
    if (!in->kv_row_bytes)
        return -1;
    const int per_key = f == FMHA_KV_FORMAT_INT8, per_head = f == FMHA_KV_FORMAT_FP8_E4M3 || f == FMHA_KV_FORMAT_FP8_E5M2;
    void *stored[2] = {malloc((size_t)(tokens * hkv * in->kv_row_bytes)), malloc((size_t)(tokens * hkv * in->kv_row_bytes))};
    float *scales[2] = {NULL, NULL};
    for (int t = 0; t < 2 && (per_key || per_head); t++) {
        scales[t] = malloc((size_t)(per_key ? tokens * hkv : hkv) * sizeof(float));
        for (int64_t h = 0; per_head && h < hkv; h++) /* inputs lie in [-1, 1): the top code at 1 */
            scales[t][h] = 1.0f / (f == FMHA_KV_FORMAT_FP8_E4M3 ? 448.0f : 57344.0f);
    }
    in->k_scales = scales[0], in->v_scales = scales[1];
    in->kv_stored[0] = stored[0], in->kv_stored[1] = stored[1];
    if (!stored[0] || !stored[1] || ((per_key || per_head) && (!scales[0] || !scales[1])))
        return -1;
    const int64_t xs[3] = {hkv * D, D, 1}, vs[3] = {hkv * in->kv_row_bytes, in->kv_row_bytes, 1},
                  ss[2] = {per_key ? hkv : 0, 1};
    for (int t = 0; t < 2; t++)
        if (fmha_kv_quantize(f, tokens, hkv, D, t ? in->v : in->k, xs, stored[t], vs, scales[t],
                             scales[t] ? ss : NULL) != FMHA_OK)
            return -1;
    in->k_run = stored[0];
    in->v_run = stored[1];
    return 0;
}

int bench_inputs_init(bench_inputs *in, const bench_case *c, int with_d_o)
{
    memset(in, 0, sizeof *in);
    in->dtype = dtype_of(c->dtype);
    in->elem_size = dtype_size(in->dtype);
    in->kv_dtype = c->kv_dtype ? dtype_of(c->kv_dtype) : in->dtype;
    in->kv_elem_size = dtype_size(in->kv_dtype);
    in->q_elems = (size_t)(c->batch * bench_seq_q(c) * c->heads * c->head_dim);
    in->o_elems = (size_t)(c->batch * bench_seq_q(c) * c->heads * bench_head_dim_v(c));
    in->kv_elems = (size_t)(c->batch * c->seq * bench_heads_kv(c) * c->head_dim);
    in->v_elems = (size_t)(c->batch * c->seq * bench_heads_kv(c) * bench_head_dim_v(c));
    in->q = malloc(in->q_elems * sizeof(float));
    in->k = malloc(in->kv_elems * sizeof(float));
    in->v = malloc(in->v_elems * sizeof(float));
    in->d_o = with_d_o ? malloc(in->o_elems * sizeof(float)) : NULL;
    int failed = !in->q || !in->k || !in->v || (with_d_o && !in->d_o);
    if (bench_is_decode(c)) {
        in->kv_lengths = malloc((size_t)c->batch * sizeof(int32_t));
        failed |= !in->kv_lengths;
    }
    if (is_masked_bias(c)) {
        in->kv_lengths = malloc((size_t)c->batch * sizeof(int32_t));
        in->rel_table = malloc((size_t)(c->heads * T5_BUCKETS) * sizeof(float));
        failed |= !in->kv_lengths || !in->rel_table;
    }
    if (in->dtype != FMHA_DTYPE_F32 && !failed) {
        in->q_in = malloc(in->q_elems * in->elem_size);
        in->d_o_in = with_d_o ? malloc(in->o_elems * in->elem_size) : NULL;
        failed |= !in->q_in || (with_d_o && !in->d_o_in);
    }
    if (in->kv_dtype != FMHA_DTYPE_F32 && !failed) {
        in->k_in = malloc(in->kv_elems * in->kv_elem_size);
        in->v_in = malloc(in->v_elems * in->kv_elem_size);
        failed |= !in->k_in || !in->v_in;
    }
    if (failed) {
        bench_inputs_free(in);
        return -1;
    }
    uint64_t state = INPUT_SEED;
    fill_uniform(in->q, in->q_elems, &state);
    fill_uniform(in->k, in->kv_elems, &state);
    fill_uniform(in->v, in->v_elems, &state);
    if (in->d_o)
        fill_uniform(in->d_o, in->o_elems, &state);
    else
        state += in->o_elems * 0x9e3779b97f4a7c15ULL; /* the table gets the same values either way */
    if (in->dtype == FMHA_DTYPE_F32) {
        in->q_in = in->q;
        in->d_o_in = in->d_o;
    } else {
        round_to_dtype(in->dtype, in->q, in->q_in, in->q_elems);
        if (in->d_o)
            round_to_dtype(in->dtype, in->d_o, in->d_o_in, in->o_elems);
    }
    if (in->kv_dtype == FMHA_DTYPE_F32) {
        in->k_in = in->k;
        in->v_in = in->v;
    } else {
        round_to_dtype(in->kv_dtype, in->k, in->k_in, in->kv_elems);
        round_to_dtype(in->kv_dtype, in->v, in->v_in, in->v_elems);
    }
    if (bench_is_decode(c)) {
        /* --kv-lengths: lengths from their own seed, the values unchanged */
        uint64_t len_state = BENCH_LENGTHS_SEED;
        for (int64_t b = 0; b < c->batch; b++)
            in->kv_lengths[b] = (int32_t)bench_kv_length(&len_state, b, c->seq, c->kv_min_fraction);
    }
    if (is_masked_bias(c)) {
        for (int64_t b = 0; b < c->batch; b++)
            in->kv_lengths[b] = (int32_t)(c->seq - c->seq / 8);
        fill_uniform(in->rel_table, (size_t)(c->heads * T5_BUCKETS), &state);
    }
    in->k_run = in->k_in;
    in->v_run = in->v_in;
    if (c->kv_format && quantize_inputs(in, c) != 0) {
        bench_inputs_free(in);
        return -1;
    }
    if (c->page_size && make_pools(in, c) != 0) {
        bench_inputs_free(in);
        return -1;
    }
    /* The reference sees the same (rounded) values, masks and bias in float32. */
    fmha_problem_init(&in->ref_problem, c->batch, c->heads, bench_heads_kv(c), bench_seq_q(c), c->seq,
                      c->head_dim, bench_head_dim_v(c), FMHA_LAYOUT_BSHD);
    set_variant(c, in, &in->ref_problem);
    return 0;
}

void bench_inputs_free(bench_inputs *in)
{
    if (in->q_in != in->q) {
        free(in->q_in);
        free(in->d_o_in);
    }
    if (in->k_in != in->k) {
        free(in->k_in);
        free(in->v_in);
    }
    free(in->q);
    free(in->k);
    free(in->v);
    free(in->d_o);
    free(in->kv_lengths);
    free(in->rel_table);
    free(in->kv_stored[0]);
    free(in->kv_stored[1]);
    free(in->k_scales);
    free(in->v_scales);
    free(in->k_pool);
    free(in->v_pool);
    free(in->table);
    free(in->o_ref);
    free(in->dq_ref);
    free(in->dk_ref);
    free(in->dv_ref);
    free(in->d_rel_table_ref);
    memset(in, 0, sizeof *in);
}

static int has_masks_or_biases(const fmha_problem *p)
{
    return p->masks.kv_lengths || p->biases.rel_table;
}

static int ensure_forward_ref(bench_inputs *in)
{
    if (in->o_ref_state != 0)
        return in->o_ref_state;
    const fmha_problem *p = &in->ref_problem;
    in->o_ref = malloc(in->o_elems * sizeof(double));
    int rc = -1;
    if (!in->o_ref)
        rc = -1;
    else if (!has_masks_or_biases(p))
        rc = fmha_ref_forward(p, in->q, in->k, in->v, in->o_ref, NULL);
    else
#ifdef FMHA_REF_HAVE_MASKS
        rc = fmha_ref_forward_full(p, in->q, in->k, in->v, in->o_ref, NULL);
#else
        rc = -2;
#endif
    return in->o_ref_state = rc == 0 ? 1 : rc;
}

static int ensure_gradient_ref(bench_inputs *in)
{
    if (in->grad_ref_state != 0)
        return in->grad_ref_state;
    const fmha_problem *p = &in->ref_problem;
    in->dq_ref = malloc(in->q_elems * sizeof(double));
    in->dk_ref = malloc(in->kv_elems * sizeof(double));
    in->dv_ref = malloc(in->v_elems * sizeof(double));
    int rc = -1;
    if (!in->dq_ref || !in->dk_ref || !in->dv_ref || !in->d_o) {
        rc = -1;
    } else if (!has_masks_or_biases(p)) {
        rc = fmha_ref_backward(p, in->q, in->k, in->v, in->d_o, in->dq_ref, in->dk_ref, in->dv_ref);
    } else {
#ifdef FMHA_REF_HAVE_MASKS
        if (p->biases.rel_table)
            in->d_rel_table_ref = malloc((size_t)(p->heads_q * p->biases.rel_num_buckets) * sizeof(double));
        rc = p->biases.rel_table && !in->d_rel_table_ref
                 ? -1
                 : fmha_ref_backward_full(p, in->q, in->k, in->v, in->d_o, in->dq_ref, in->dk_ref, in->dv_ref,
                                          NULL, NULL, in->d_rel_table_ref);
#else
        rc = -2;
#endif
    }
    return in->grad_ref_state = rc == 0 ? 1 : rc;
}

/* Adds the squared error and squared reference norm of x against ref. */
static void accumulate_error_f32(const float *x, const double *ref, size_t n, double *err2, double *ref2)
{
    for (size_t i = 0; i < n; i++) {
        double d = (double)x[i] - ref[i];
        *err2 += d * d;
        *ref2 += ref[i] * ref[i];
    }
}

/* The same for x in the dtype. */
static void accumulate_error(fmha_dtype dtype, const void *x, const double *ref, size_t n, double *err2,
                             double *ref2)
{
    for (size_t i = 0; i < n; i++) {
        double d = (double)load_element(dtype, x, i) - ref[i];
        *err2 += d * d;
        *ref2 += ref[i] * ref[i];
    }
}

static double relative_error(double err2, double ref2)
{
    return ref2 > 0.0 ? sqrt(err2 / ref2) : sqrt(err2);
}

/* ---- rows ------------------------------------------------------------------ */

json_value *bench_row_header(const bench_case *c)
{
    json_value *row = json_new_object();
    json_set_string(row, "impl", c->impl);
    json_set_string(row, "mode", c->mode);
    json_set_string(row, "variant", c->variant);
    json_set_string(row, "dtype", c->dtype);
    if (c->kv_dtype)
        json_set_string(row, "kv_dtype", c->kv_dtype);
    if (c->kv_format)
        json_set_string(row, "kv_format", c->kv_format);
    if (strcmp(c->dtype, "bfloat16") == 0)
        json_set_string(row, "precision", c->precision ? c->precision : "accurate");
    json_set_number(row, "batch", (double)c->batch);
    json_set_number(row, "seq", (double)c->seq);
    json_set_number(row, "heads", (double)c->heads);
    json_set_number(row, "head_dim", (double)c->head_dim);
    if (c->head_dim_v)
        json_set_number(row, "head_dim_v", (double)c->head_dim_v);
    if (c->seq_q || bench_is_decode(c))
        json_set_number(row, "seq_q", (double)bench_seq_q(c));
    if (c->heads_kv)
        json_set_number(row, "heads_kv", (double)c->heads_kv);
    if (c->page_size)
        json_set_number(row, "page_size", (double)c->page_size);
    if (c->kv_min_fraction > 0)
        json_set_number(row, "kv_min_fraction", c->kv_min_fraction);
    return row;
}

void bench_row_set_status(json_value *row, fmha_status status)
{
    const char *name = status == FMHA_OK ? "ok"
                       : status == FMHA_ERR_UNSUPPORTED ? "unsupported"
                       : status == FMHA_ERR_OUT_OF_MEMORY ? "oom"
                       : "error";
    json_set_string(row, "status", name);
    if (status != FMHA_OK)
        json_set_string(row, "error", fmha_status_string(status));
}

typedef struct run_buffers {
    fmha_problem p;
    const bench_inputs *in;
    int fwdbwd;
    void *workspace;
    size_t workspace_bytes;
    void *o, *dq, *dk, *dv;   /* in the dtype */
    float *lse;
    fmha_param_grads grads;   /* masked_bias: the table's gradient */
    fmha_plan *plan;          /* impl fmha_plan: made once in the setup, reused by every call */
} run_buffers;

static fmha_status run_once(const run_buffers *r)
{
    const bench_inputs *in = r->in;
    if (r->plan && !r->fwdbwd)
        return fmha_plan_forward(r->plan, in->q_in, in->k_run, in->v_run, r->o, NULL);
    if (r->plan)
        return fmha_plan_forward_backward(r->plan, in->q_in, in->k_run, in->v_run, in->d_o_in, r->o, r->lse,
                                          r->dq, r->dk, r->dv, r->grads.d_rel_table ? &r->grads : NULL);
    if (!r->fwdbwd)
        return fmha_forward(&r->p, in->q_in, in->k_run, in->v_run, r->o, NULL, r->workspace, r->workspace_bytes);
    return fmha_forward_backward(&r->p, in->q_in, in->k_run, in->v_run, in->d_o_in, r->o, r->lse, r->dq, r->dk,
                                 r->dv, r->grads.d_rel_table ? &r->grads : NULL);
}

/* Seconds for `calls` calls, or a negative value when a call failed. */
static double time_calls(const run_buffers *r, long long calls, fmha_status *status)
{
    double start = bench_now_s();
    for (long long i = 0; i < calls; i++) {
        *status = run_once(r);
        if (*status != FMHA_OK)
            return -1.0;
    }
    return bench_now_s() - start;
}

static int compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile of sorted x[0..n) with linear interpolation. */
static double quantile(const double *x, int n, double q)
{
    double pos = q * (n - 1);
    int lo = (int)floor(pos);
    int hi = lo + 1 < n ? lo + 1 : lo;
    return x[lo] + (pos - lo) * (x[hi] - x[lo]);
}

static void free_buffers(run_buffers *r)
{
    fmha_plan_destroy(r->plan);
    free(r->workspace);
    free(r->o);
    free(r->lse);
    free(r->dq);
    free(r->dk);
    free(r->dv);
    free(r->grads.d_rel_table);
}

/* Scores a bottom-right causal mask lets through: query i of sq sees
 * min(skv, i + skv - sq + 1) keys, none below 0. */
static double bottom_right_pairs(int64_t sq, int64_t skv)
{
    double pairs = 0.0;
    for (int64_t i = 0; i < sq; i++) {
        int64_t seen = i + skv - sq + 1;
        pairs += (double)(seen < 0 ? 0 : seen > skv ? skv : seen);
    }
    return pairs;
}

json_value *bench_measure(const bench_options *o, const bench_case *c, bench_inputs *in, int with_ref)
{
    json_value *row = bench_row_header(c);
    if (!in) {
        json_set_string(row, "status", "oom");
        json_set_string(row, "error", "could not allocate the inputs");
        return row;
    }

    run_buffers r;
    memset(&r, 0, sizeof r);
    r.in = in;
    r.fwdbwd = is_fwdbwd(c);
    if (r.fwdbwd && !in->d_o) {
        json_set_string(row, "status", "error");
        json_set_string(row, "error", "inputs made without dO");
        return row;
    }

    /* compile_s: problem setup, size queries, allocation and a first call. */
    double setup_start = bench_now_s();
    bench_case_problem(c, in, &r.p);
    size_t workspace = 0, args = 0, outs = 0;
    fmha_status st = bench_case_plan(c, in, &workspace, &args, &outs);
    if (st != FMHA_OK) {
        bench_row_set_status(row, st);
        return row;
    }
    /* what serves the row (fmha_plan_describe), recorded and with --explain printed */
    fmha_plan *described = NULL;
    if (fmha_plan_create(&r.p, &described) == FMHA_OK) {
        char line[512];
        fmha_plan_describe(described, line, sizeof line);
        json_set_string(row, "plan", line);
        if (o->explain)
            fprintf(stderr, "explain: %s %s %s %s S=%lld D=%lld: %s\n", c->impl, c->mode, c->variant, c->dtype,
                    (long long)c->seq, (long long)c->head_dim, line);
        fmha_plan_destroy(described);
    }
    if (!r.fwdbwd) {
        r.workspace_bytes = workspace;
        r.workspace = workspace ? malloc(workspace) : NULL;
    }
    r.o = malloc(in->o_elems * in->elem_size);
    int alloc_failed = (!r.fwdbwd && workspace && !r.workspace) || !r.o;
    if (r.fwdbwd) {
        r.lse = malloc((size_t)(c->batch * c->heads * bench_seq_q(c)) * sizeof(float));
        r.dq = malloc(in->q_elems * in->elem_size);
        r.dk = malloc(in->kv_elems * in->kv_elem_size);
        r.dv = malloc(in->v_elems * in->kv_elem_size);
        alloc_failed |= !r.lse || !r.dq || !r.dk || !r.dv;
        if (r.p.biases.rel_table) {
            r.grads.d_rel_table = malloc((size_t)(c->heads * T5_BUCKETS) * sizeof(float));
            alloc_failed |= !r.grads.d_rel_table;
        }
    }
    if (alloc_failed) {
        free_buffers(&r);
        json_set_string(row, "status", "oom");
        json_set_string(row, "error", "could not allocate the outputs or the workspace");
        return row;
    }
    if (strcmp(c->impl, "fmha_plan") == 0) {
        st = fmha_plan_create(&r.p, &r.plan);
        if (st != FMHA_OK) {
            free_buffers(&r);
            bench_row_set_status(row, st);
            return row;
        }
    }
    st = run_once(&r);
    double compile_s = bench_now_s() - setup_start;
    if (st != FMHA_OK) {
        free_buffers(&r);
        bench_row_set_status(row, st);
        return row;
    }

    /* Calibrate: grow the calls per sample until a sample lasts min_sample_ms. */
    long long inner = 1;
    double min_s = o->min_sample_ms * 1e-3;
    for (;;) {
        double t = time_calls(&r, inner, &st);
        if (t < 0 || t >= min_s || inner >= MAX_INNER)
            break;
        long long next = (long long)ceil((double)inner * 1.1 * min_s / (t > 1e-9 ? t : 1e-9));
        inner = next > 2 * inner ? (next < MAX_INNER ? next : MAX_INNER) : 2 * inner;
    }
    int n = o->min_samples;
    double *per_call_ms = malloc((size_t)n * sizeof(double));
    for (int i = 0; st == FMHA_OK && per_call_ms && i < n; i++) {
        double t = time_calls(&r, inner, &st);
        if (t >= 0)
            per_call_ms[i] = t * 1e3 / (double)inner;
    }
    if (st != FMHA_OK || !per_call_ms) {
        free(per_call_ms);
        free_buffers(&r);
        if (st == FMHA_OK) {
            json_set_string(row, "status", "oom");
            json_set_string(row, "error", "could not allocate the sample table");
        } else {
            bench_row_set_status(row, st);
        }
        return row;
    }
    qsort(per_call_ms, (size_t)n, sizeof(double), compare_doubles);
    double median_ms = quantile(per_call_ms, n, 0.5);

    /* scores seen: Sq x Skv, half when causal and square, else counted
     * per query (bottom-right: query i sees min(Skv, i + Skv - Sq + 1) keys);
     * uneven decode rows (--kv-lengths) count each sequence's own keys, and
     * pairs is then the mean over the batch */
    const int uneven = bench_is_decode(c) && c->kv_min_fraction > 0 && in->kv_lengths;
    double pairs = (double)bench_seq_q(c) * (double)c->seq, cached = (double)c->seq;
    if (uneven) {
        pairs = cached = 0.0;
        for (int64_t b = 0; b < c->batch; b++) {
            cached += (double)in->kv_lengths[b] / (double)c->batch;
            pairs += bottom_right_pairs(bench_seq_q(c), in->kv_lengths[b]) / (double)c->batch;
        }
        json_set_number(row, "kv_len_mean", cached);
    } else if (r.p.causal != FMHA_CAUSAL_NONE && bench_seq_q(c) == c->seq) {
        pairs *= 0.5;
    } else if (r.p.causal != FMHA_CAUSAL_NONE) {
        pairs = bottom_right_pairs(bench_seq_q(c), c->seq);
    }
    /* 2 flops a multiply-add: Q K^T over D, P V over Dv */
    double flops = 2.0 * (double)c->batch * (double)c->heads * pairs * (double)(c->head_dim + bench_head_dim_v(c));
    /* K and V of every (batch, kv head), read once: the floor of any forward
     * (of the keys cached, for uneven decode rows) */
    double kv_bytes = (double)(in->kv_elems + in->v_elems) * (double)in->kv_elem_size;
    if (in->kv_format) /* as stored: the rows, and int8's scale per row */
        kv_bytes = 2.0 * (double)(in->kv_elems / (size_t)c->head_dim) *
                   ((double)in->kv_row_bytes + (in->kv_format == FMHA_KV_FORMAT_INT8 ? 4.0 : 0.0));
    kv_bytes *= cached / (double)c->seq;
    if (r.fwdbwd)
        flops *= 3.5;

    json_set_string(row, "status", "ok");
    json_set_number(row, "compile_s", compile_s);
    json_set_number(row, "inner", (double)inner);
    json_set_number(row, "samples", (double)n);
    json_set_number(row, "median_ms", median_ms);
    json_set_number(row, "q1_ms", quantile(per_call_ms, n, 0.25));
    json_set_number(row, "q3_ms", quantile(per_call_ms, n, 0.75));
    free(per_call_ms);

    if (with_ref) {
        double err2 = 0.0, ref2 = 0.0;
        int ref_state = r.fwdbwd ? ensure_gradient_ref(in) : ensure_forward_ref(in);
        if (ref_state == 1 && !r.fwdbwd) {
            accumulate_error(in->dtype, r.o, in->o_ref, in->o_elems, &err2, &ref2);
        } else if (ref_state == 1) {
            accumulate_error(in->dtype, r.dq, in->dq_ref, in->q_elems, &err2, &ref2);
            accumulate_error(in->kv_dtype, r.dk, in->dk_ref, in->kv_elems, &err2, &ref2);
            accumulate_error(in->kv_dtype, r.dv, in->dv_ref, in->v_elems, &err2, &ref2);
        }
        if (ref_state == 1) {
            json_set_number(row, "rel_err", relative_error(err2, ref2));
        } else {
            json_object_set(row, "rel_err", json_new_null());
            json_set_string(row, "rel_err_note", ref_state == -2
                                                     ? "this build's float64 reference has no masks or biases"
                                                     : "the float64 reference could not be computed");
        }
        /* The learnable bias table's gradient, apart: its scale differs from dQ, dK, dV's. */
        if (ref_state == 1 && r.fwdbwd && r.grads.d_rel_table && in->d_rel_table_ref) {
            double table_err2 = 0.0, table_ref2 = 0.0;
            accumulate_error_f32(r.grads.d_rel_table, in->d_rel_table_ref, (size_t)(c->heads * T5_BUCKETS),
                                 &table_err2, &table_ref2);
            json_set_number(row, "rel_err_bias_grad", relative_error(table_err2, table_ref2));
        }
    }
    json_set_number(row, "temp_mb", (double)workspace / MB);
    json_set_number(row, "arg_mb", (double)args / MB);
    json_set_number(row, "out_mb", (double)outs / MB);
    json_set_number(row, "gflops", flops / 1e9 / (median_ms * 1e-3));
    json_set_number(row, "kv_gbs", kv_bytes / 1e9 / (median_ms * 1e-3));
    free_buffers(&r);
    return row;
}
