/* bench.h: what the parts of fmha-bench share: the parsed command line, one
 * benchmark case, the inputs (and their float64 reference) reused across
 * impls, and the entry points of measure.c, child.c and sysinfo.c. */
#ifndef FMHA_BENCH_H
#define FMHA_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "fmha.h"
#include "json.h"

#define BENCH_MAX_LIST 64

typedef struct bench_int_list {
    int64_t values[BENCH_MAX_LIST];
    int count;
} bench_int_list;

typedef struct bench_name_list {
    const char *names[BENCH_MAX_LIST];   /* point at static strings */
    int count;
} bench_name_list;

typedef struct bench_options {
    bench_int_list seqs, dims, peak_seqs, fit_seqs;
    bench_name_list dtypes, variants, modes, impls, peak_impls, fit_impls;
    int64_t batch, heads, portable_max_seq;
    int64_t seq_q, heads_kv;   /* --seq-q, --heads-kv; 0: the seq, the heads */
    int64_t dim_v;             /* --dim-v: V's head dim (MLA: 512 beside 576); 0: each row's head dim */
    int64_t page_size;         /* --page-size: K and V in a paged cache; 0: contiguous */
    const char *kv_dtype;      /* --kv-dtype: K and V in their own dtype; NULL: the row's */
    const char *kv_format;     /* --kv-format: K and V quantized (int8, fp8_*, q8_0, q4_0); NULL: none */
    double kv_min_fraction;    /* --kv-lengths uniform:F (decode rows); 0: every sequence holds seq keys */
    int threads;               /* 0: the library's default */
    const char *precision;     /* --precision: "accurate", "fast", "bf16x3" or "bf16" */
    int no_ref, peaks, max_fit, append, explain;
    double peak_timeout_s;
    double mem_budget_mb;      /* 0: MemAvailable */
    const char *out;
    const char *note;          /* NULL: keep the file's, or a generated one */
    int min_samples;           /* samples per row (>= 7 unless a test lowers it) */
    const char *tune;          /* --tune FILE: run fmha_tune into FILE and nothing else */
    double tune_budget_s;      /* --tune-budget: fmha_tune's budget (0: the library's, 90 s) */
    double min_sample_ms;      /* a sample lasts at least this long */
} bench_options;

/* One row to measure. */
typedef struct bench_case {
    const char *impl, *mode, *variant, *dtype;
    int64_t batch, seq, heads, head_dim;
    const char *precision;     /* "accurate" (NULL), "fast", "bf16x3" or "bf16" */
    int64_t seq_q, heads_kv;   /* queries and kv heads; 0: seq and heads */
    int64_t page_size;         /* keys per page of a paged cache; 0: contiguous */
    const char *kv_dtype;      /* dtype of K and V; NULL: dtype */
    const char *kv_format;     /* K and V quantized into this cache format; NULL: none */
    int64_t head_dim_v;        /* V's and O's head dim; 0: head_dim */
    /* decode rows: sequence 0 holds seq keys, each other one a length drawn
     * uniformly from [ceil(F seq), seq] (seeded: the same every run); 0:
     * every sequence holds seq keys */
    double kv_min_fraction;
} bench_case;

/* A case's query length and kv heads (seq and heads unless set). */
/* 1 for a decode row (one step against the cache) */
static inline int bench_is_decode(const bench_case *c) { return strcmp(c->variant, "decode") == 0; }
static inline int64_t bench_seq_q(const bench_case *c) {
    return c->seq_q ? c->seq_q : bench_is_decode(c) ? 1 : c->seq;
}
static inline int64_t bench_heads_kv(const bench_case *c) { return c->heads_kv ? c->heads_kv : c->heads; }
static inline int64_t bench_head_dim_v(const bench_case *c) { return c->head_dim_v ? c->head_dim_v : c->head_dim; }

/* Random inputs of one (variant, dtype, seq, head dim) and their reference,
 * computed on first use and shared by every mode and impl. */
typedef struct bench_inputs {
    fmha_problem ref_problem;  /* float32, correct scale, the variant's masks */
    fmha_dtype dtype, kv_dtype; /* of Q, O (and dO); of K and V */
    /* --kv-format: K and V as stored (k_in, v_in: [B, S, Hkv, row bytes]) and
     * their scales (int8 [B, S, Hkv], fp8 [Hkv]); the reference keeps the
     * unquantized values, so a row's error includes the quantization's */
    int kv_format;             /* fmha_kv_format, 0: none */
    int64_t kv_row_bytes;
    float *k_scales, *v_scales;
    void *kv_stored[2];
    size_t elem_size, kv_elem_size; /* bytes of one element in each */
    size_t q_elems, kv_elems, o_elems, v_elems; /* kv_elems: K's (and V's unless --dim-v) */
    /* The inputs as float32, already rounded to the dtype (the reference's). */
    float *q, *k, *v, *d_o;
    /* The inputs in the dtype (the same arrays as above for float32). */
    void *q_in, *k_in, *v_in, *d_o_in;
    /* Paged cache (--page-size): pools [pages, page_size, Hkv, D] in the
     * dtype holding k_in and v_in's rows, pages in shuffled order, and the
     * block table [B, table_stride]; k_run, v_run: what the calls read. */
    void *k_pool, *v_pool;
    int32_t *table;
    int64_t table_stride, num_pages;
    const void *k_run, *v_run;
    /* masked_bias: key lengths [B] and the relative-position table [H, buckets]. */
    int32_t *kv_lengths;
    float *rel_table;
    double *o_ref, *dq_ref, *dk_ref, *dv_ref, *d_rel_table_ref;
    /* 0 not yet, 1 done, -1 failed, -2 this build's reference lacks the variant */
    int o_ref_state, grad_ref_state;
} bench_inputs;

/* ---- measure.c ---- */

/* The strategy an impl name runs; -1 for an unknown name. *wrong_scale is
 * set for the test-only impl that must give a large rel_err. */
int bench_impl_strategy(const char *impl, int *wrong_scale);
int bench_impl_known(const char *impl, int testing_allowed);

/* Fills the problem a case runs (dtype, strategy, mask, bias, scale). in
 * provides the masked_bias arrays; NULL leaves them off. */
void bench_case_problem(const bench_case *c, const bench_inputs *in, fmha_problem *p);
/* Memory plan of a case from the library's size queries: workspace, input
 * and output bytes. */
fmha_status bench_case_plan(const bench_case *c, const bench_inputs *in, size_t *workspace, size_t *args,
                            size_t *outs);

/* Random inputs for c (dO only when with_d_o, for fwdbwd). Returns 0, or
 * -1 when memory ran out (nothing left allocated). */
int bench_inputs_init(bench_inputs *in, const bench_case *c, int with_d_o);
void bench_inputs_free(bench_inputs *in);

/* The leading keys every row has (impl .. head_dim). */
json_value *bench_row_header(const bench_case *c);
/* Times one case and returns its row; in NULL means the inputs could not be
 * allocated. with_ref adds rel_err against in's reference. */
json_value *bench_measure(const bench_options *o, const bench_case *c, bench_inputs *in, int with_ref);
/* The "status" and "error" of a row from a library status. */
void bench_row_set_status(json_value *row, fmha_status status);

double bench_now_s(void);

/* ---- child.c ---- */

/* Runs c in a child process of this executable (exe) and returns its row with
 * peak_rss_mb and wall_s, or a timeout / oom / error row. */
json_value *bench_peak_row(const bench_options *o, const bench_case *c, const char *exe);
/* The largest seq of o->fit_seqs whose memory plan fits the budget and
 * could be allocated and touched in a child. c gives impl, mode, dtype, dim. */
json_value *bench_fit_row(const bench_options *o, const bench_case *c, double budget_bytes);
/* The child's side of bench_peak_row: prints the row on stdout. */
int bench_child_main(const bench_options *o, const bench_case *c);

/* ---- sysinfo.c ---- */

json_value *bench_device_info(void);
/* Memory read bandwidth (GB/s) on `threads` threads, best of 3 passes over
 * 512 MiB; 0 when the buffer cannot be allocated (peak.c). */
double bench_peak_mem_read_gbs(int threads);
/* MemAvailable from /proc/meminfo in bytes, or 0 when unknown. */
double bench_mem_available_bytes(void);
/* This executable's path (for exec of a child), or NULL. */
const char *bench_self_exe(void);

/* This machine's float32 FMA and bf16 dot-product ceilings in GFLOP/s on
 * `threads` threads (0 where the CPU lacks the instructions); peak.c. */
void bench_peak_gflops(int threads, double *f32, double *bf16);

#endif /* FMHA_BENCH_H */
