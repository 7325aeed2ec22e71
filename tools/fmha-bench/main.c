/* main.c: fmha-bench, the benchmark of fmha's strategies against the float64
 * reference. Reproduces the seed record's schema (device, config, results,
 * configs, note) and config names; adds --peaks (peak RSS per row in a child)
 * and --max-fit (largest sequence whose memory plan fits a budget).
 *
 * Options for tests (in --help under "testing"): --min-samples N and
 * --min-sample-ms MS shorten a row; the impl fmha_wrong_for_test (tiled with
 * a wrong scale, to prove rel_err is not blind) is accepted only when the
 * environment has FMHA_BENCH_TESTING=1. --child-row is internal (the child
 * side of --peaks).
 *
 * Exit status: 0 done, 1 a run-time failure (unreadable --append file,
 * output not writable), 2 a bad command line (nothing is written). */
#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXIT_USAGE 2

static const char *const IMPL_NAMES[] = {"fmha_auto", "fmha_dense", "fmha_tiled", "fmha_portable",
                                         "fmha_plan", "fmha_wrong_for_test"};
static const char *const DTYPE_NAMES[] = {"float32", "bfloat16", "float16"};
static const char *const KV_FORMAT_NAMES[] = {"int8", "fp8_e4m3", "fp8_e5m2", "q8_0", "q4_0"};
static const char *const VARIANT_NAMES[] = {"plain", "causal", "masked_bias", "decode"};
static const char *const MODE_NAMES[] = {"fwd", "fwdbwd"};

#define FMHA_STR_(x) #x
#define FMHA_STR(x) FMHA_STR_(x)

static void usage(FILE *f)
{
    fprintf(f,
            "usage: fmha-bench [options]\n"
            "Times fmha's strategies on random BSHD inputs (float32, bfloat16 or float16:\n"
            "--dtypes; D = Dv = head dim unless --dim-v) and writes one JSON record: device, config,\n"
            "results, configs, note. The table gives each row's median, q1..q3 and spread\n"
            "((q3 - q1) / median, marked '!' past 25%%); skipped rows say why.\n"
            "\n"
            "  --seqs LIST             sequence lengths (default 128,256,512,1024,2048)\n"
            "  --dims LIST             head dims, 1.." FMHA_STR(FMHA_MAX_HEAD_DIM) " (default 64)\n"
            "  --dtypes LIST           float32,bfloat16,float16 (default float32)\n"
            "  --variants LIST         plain,causal,masked_bias,decode (default plain); causal is\n"
            "                          bottom-right (top-left's mask when the query length is\n"
            "                          the seq, decoding's when shorter); masked_bias hides keys past S - S/8 and adds\n"
            "                          a learnable T5 relative-position bias [heads, 32]; decode is\n"
            "                          one step against a KV cache of seq keys: --seq-q queries\n"
            "                          (default 1), causal bottom-right, key_value_seq_lengths = seq\n"
            "                          Rows the library cannot serve get \"status\": \"unsupported\".\n"
            "  --modes LIST            fwd,fwdbwd (default fwd,fwdbwd)\n"
            "  --batch N               batch (default 1)\n"
            "  --heads N               heads (default 8)\n"
            "  --seq-q N               query length (default: the seq, 1 for decode rows)\n"
            "  --heads-kv N            key/value heads (default: the heads; fewer for GQA)\n"
            "  --dim-v N               V's (and O's) head dim, 1.." FMHA_STR(FMHA_MAX_HEAD_DIM) " (default: each\n"
            "                          row's head dim; MLA: --dims 576 --dim-v 512 --heads-kv 1)\n"
            "  --page-size N           K and V in a paged cache of N keys a page, pages in\n"
            "                          shuffled order (forward only; default: contiguous)\n"
            "  --kv-lengths uniform:F  decode rows of uneven sequences: sequence 0 caches seq\n"
            "                          keys, each other one a length drawn uniformly from\n"
            "                          [F seq, seq] (0 < F <= 1; seeded, the same every run);\n"
            "                          GFLOP/s and KV_GB/s count the keys cached (default: seq)\n"
            "  --kv-dtype T            K and V in bfloat16 or float16 beside float32 rows\n"
            "                          (fmha_problem.kv_dtype; forward only; default: the row's)\n"
            "  --kv-format F           K and V quantized by fmha_kv_quantize into int8, fp8_e4m3,\n"
            "                          fp8_e5m2, q8_0 or q4_0 (forward only; paged with --page-size;\n"
            "                          the error column is against the unquantized float64 attention)\n"
            "  --impls LIST            fmha_auto,fmha_dense,fmha_tiled,fmha_portable (default),\n"
            "                          fmha_plan (auto through one reused plan: per-call cost)\n"
            "  --portable-max-seq N    fmha_portable only up to this seq (default 1024)\n"
            "  --threads N             fmha_set_num_threads(N) (default: the library's)\n"
            "  --no-ref                skip rel_err (the float64 reference)\n"
            "  --explain               print what serves each row (driver, ISA, operand path,\n"
            "                          cache formats, tiles, threads, CPU: fmha_plan_describe)\n"
            "                          to stderr; every row records it as \"plan\"\n"
            "  --precision P           fast (default), accurate, bf16x3 or bf16: fmha_precision\n"
            "                          (bfloat16 rows; float32 rows: bf16x3 on AMX tiles, bf16 on AMX,\n"
            "                          AVX512-BF16 or Arm's BF16)\n"
            "  --peaks                 also run each (impl, seq) of --peak-seqs x --peak-impls\n"
            "                          (and record the memory read bandwidth, mem_read_gbs)\n"
            "                          in a child process: peak_rss_mb and wall_s (no rel_err)\n"
            "  --peak-seqs LIST        default 4096,8192,16384\n"
            "  --peak-impls LIST       default fmha_auto,fmha_tiled,fmha_dense\n"
            "  --peak-timeout SECONDS  kill a child after this long (default 300); also\n"
            "                          bounds each --max-fit allocation check\n"
            "  --max-fit               per impl of --fit-impls, the largest seq of --fit-seqs\n"
            "                          whose memory plan fits the budget\n"
            "  --fit-seqs LIST         default 4096,8192,16384,32768,65536,131072\n"
            "  --fit-impls LIST        default fmha_tiled,fmha_dense,fmha_auto\n"
            "  --mem-budget-mb M       budget for --max-fit (default: MemAvailable)\n"
            "  --out PATH              output file (default results.json)\n"
            "  --append                add rows and this config to an existing --out file\n"
            "  --note TEXT             the record's note\n"
            "  --tune FILE             measure this CPU instead (fmha_tune): time the kernel table's\n"
            "                          tunings (float32 tile variants, keys per tile, K's copy, the\n"
            "                          dense crossover, decode's split and prefetch, the AMX\n"
            "                          schedule and backward), print a progress line per step and\n"
            "                          the tuned against generic times, and write FILE, a wisdom file that\n"
            "                          FMHA_WISDOM=FILE (or the per-user file, ~/.cache/fmha/\n"
            "                          wisdom.json) makes later runs use; other entries of FILE are\n"
            "                          kept. Uses --threads; about 90 s (--tune-budget SECONDS)\n"
            "  --help                  this text\n"
            "\n"
            "testing:\n"
            "  --min-samples N         timed samples per row (default 7)\n"
            "  --min-sample-ms MS      shortest sample (default 20)\n"
            "  FMHA_BENCH_TESTING=1    enables the impl fmha_wrong_for_test (wrong scale)\n");
}

static int usage_error(const char *format, ...)
{
    va_list ap;
    va_start(ap, format);
    fprintf(stderr, "fmha-bench: ");
    vfprintf(stderr, format, ap);
    fprintf(stderr, "\n(fmha-bench --help lists the options)\n");
    va_end(ap);
    return -1;
}

static int testing_enabled(void)
{
    const char *v = getenv("FMHA_BENCH_TESTING");
    return v && strcmp(v, "1") == 0;
}

static int parse_int(const char *text, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end != '\0')
        return -1;
    *out = v;
    return 0;
}

static int parse_double(const char *text, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end != '\0' || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

static int parse_int_option(const char *flag, const char *text, int64_t min, int64_t max, int64_t *out)
{
    if (parse_int(text, out) != 0 || *out < min || *out > max)
        return usage_error("%s wants an integer in %lld..%lld, got '%s'", flag, (long long)min,
                           (long long)max, text);
    return 0;
}

static int parse_int_list(const char *flag, const char *text, int64_t min, int64_t max, bench_int_list *out)
{
    char buf[4096];
    if (strlen(text) >= sizeof buf)
        return usage_error("%s: list too long", flag);
    snprintf(buf, sizeof buf, "%s", text);
    out->count = 0;
    char *rest = buf;
    for (;;) {
        char *comma = strchr(rest, ',');
        if (comma)
            *comma = '\0';
        int64_t v;
        if (parse_int(rest, &v) != 0 || v < min || v > max)
            return usage_error("%s wants a comma-separated list of integers in %lld..%lld, got '%s'", flag,
                               (long long)min, (long long)max, text);
        for (int i = 0; i < out->count; i++)
            if (out->values[i] == v)
                return usage_error("%s: %lld appears twice", flag, (long long)v);
        if (out->count == BENCH_MAX_LIST)
            return usage_error("%s: more than %d values", flag, BENCH_MAX_LIST);
        out->values[out->count++] = v;
        if (!comma)
            return 0;
        rest = comma + 1;
    }
}

static int parse_name_list(const char *flag, const char *text, const char *const *allowed, int n_allowed,
                           bench_name_list *out)
{
    char buf[4096];
    if (strlen(text) >= sizeof buf)
        return usage_error("%s: list too long", flag);
    snprintf(buf, sizeof buf, "%s", text);
    out->count = 0;
    char *rest = buf;
    for (;;) {
        char *comma = strchr(rest, ',');
        if (comma)
            *comma = '\0';
        const char *match = NULL;
        for (int i = 0; i < n_allowed && !match; i++)
            if (strcmp(rest, allowed[i]) == 0)
                match = allowed[i];
        if (match && allowed == IMPL_NAMES && !bench_impl_known(match, testing_enabled()))
            match = NULL;
        if (!match) {
            char known[512] = "";
            for (int i = 0; i < n_allowed; i++) {
                if (allowed == IMPL_NAMES && !bench_impl_known(allowed[i], testing_enabled()))
                    continue;
                if (known[0])
                    strncat(known, ",", sizeof known - strlen(known) - 1);
                strncat(known, allowed[i], sizeof known - strlen(known) - 1);
            }
            return usage_error("%s: unknown value '%s' (known: %s)", flag, rest, known);
        }
        for (int i = 0; i < out->count; i++)
            if (out->names[i] == match)
                return usage_error("%s: '%s' appears twice", flag, match);
        if (out->count == BENCH_MAX_LIST)
            return usage_error("%s: more than %d values", flag, BENCH_MAX_LIST);
        out->names[out->count++] = match;
        if (!comma)
            return 0;
        rest = comma + 1;
    }
}

#define COUNT_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

static void set_default_options(bench_options *o)
{
    memset(o, 0, sizeof *o);
    parse_int_list("--seqs", "128,256,512,1024,2048", 1, 1 << 30, &o->seqs);
    parse_int_list("--dims", "64", 1, FMHA_MAX_HEAD_DIM, &o->dims);
    parse_int_list("--peak-seqs", "4096,8192,16384", 1, 1 << 30, &o->peak_seqs);
    parse_int_list("--fit-seqs", "4096,8192,16384,32768,65536,131072", 1, 1 << 30, &o->fit_seqs);
    parse_name_list("--dtypes", "float32", DTYPE_NAMES, COUNT_OF(DTYPE_NAMES), &o->dtypes);
    parse_name_list("--variants", "plain", VARIANT_NAMES, COUNT_OF(VARIANT_NAMES), &o->variants);
    parse_name_list("--modes", "fwd,fwdbwd", MODE_NAMES, COUNT_OF(MODE_NAMES), &o->modes);
    parse_name_list("--impls", "fmha_auto,fmha_dense,fmha_tiled,fmha_portable", IMPL_NAMES,
                    COUNT_OF(IMPL_NAMES), &o->impls);
    parse_name_list("--peak-impls", "fmha_auto,fmha_tiled,fmha_dense", IMPL_NAMES, COUNT_OF(IMPL_NAMES),
                    &o->peak_impls);
    parse_name_list("--fit-impls", "fmha_tiled,fmha_dense,fmha_auto", IMPL_NAMES, COUNT_OF(IMPL_NAMES),
                    &o->fit_impls);
    o->batch = 1;
    o->heads = 8;
    o->portable_max_seq = 1024;
    o->peak_timeout_s = 300;
    o->out = "results.json";
    o->min_samples = 7;
    o->precision = "fast";
    o->min_sample_ms = 20;
}

typedef enum { RUN_BENCH, RUN_HELP, RUN_CHILD } run_kind;

/* The internal --child-row spec: impl,mode,variant,dtype,seq,dim. */
static int parse_child_spec(const char *text, bench_case *c)
{
    char buf[512];
    char *fields[6];
    int n = 0;
    snprintf(buf, sizeof buf, "%s", text);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok && n < 6; tok = strtok_r(NULL, ",", &save))
        fields[n++] = tok;
    bench_name_list names;
    if (n != 6 || parse_name_list("--child-row", fields[0], IMPL_NAMES, COUNT_OF(IMPL_NAMES), &names))
        return usage_error("--child-row: bad spec '%s'", text);
    c->impl = names.names[0];
    if (parse_name_list("--child-row", fields[1], MODE_NAMES, COUNT_OF(MODE_NAMES), &names))
        return -1;
    c->mode = names.names[0];
    if (parse_name_list("--child-row", fields[2], VARIANT_NAMES, COUNT_OF(VARIANT_NAMES), &names))
        return -1;
    c->variant = names.names[0];
    if (parse_name_list("--child-row", fields[3], DTYPE_NAMES, COUNT_OF(DTYPE_NAMES), &names))
        return -1;
    c->dtype = names.names[0];
    if (parse_int_option("--child-row", fields[4], 1, 1 << 30, &c->seq) ||
        parse_int_option("--child-row", fields[5], 1, FMHA_MAX_HEAD_DIM, &c->head_dim))
        return -1;
    return 0;
}

static int parse_args(int argc, char **argv, bench_options *o, run_kind *kind, bench_case *child)
{
    *kind = RUN_BENCH;
    const char *child_spec = NULL;
    for (int i = 1; i < argc; i++) {
        char flag[64];
        const char *arg = argv[i];
        const char *value = NULL;
        if (strncmp(arg, "--", 2) != 0) {
            if (strcmp(arg, "-h") == 0) {
                *kind = RUN_HELP;
                return 0;
            }
            return usage_error("unexpected argument '%s'", arg);
        }
        const char *eq = strchr(arg, '=');
        size_t flag_length = eq ? (size_t)(eq - arg) : strlen(arg);
        if (flag_length >= sizeof flag)
            return usage_error("unknown option '%s'", arg);
        memcpy(flag, arg, flag_length);
        flag[flag_length] = '\0';
        if (eq)
            value = eq + 1;

        /* Switches. */
        int *switch_target = strcmp(flag, "--no-ref") == 0    ? &o->no_ref
                             : strcmp(flag, "--peaks") == 0   ? &o->peaks
                             : strcmp(flag, "--max-fit") == 0 ? &o->max_fit
                             : strcmp(flag, "--append") == 0  ? &o->append
                             : strcmp(flag, "--explain") == 0 ? &o->explain
                                                              : NULL;
        if (switch_target || strcmp(flag, "--help") == 0) {
            if (value)
                return usage_error("%s takes no value", flag);
            if (switch_target)
                *switch_target = 1;
            else
                *kind = RUN_HELP;
            continue;
        }
        static const char *const valued[] = {
            "--seqs", "--dims", "--dtypes", "--variants", "--modes", "--batch", "--heads", "--impls",
            "--seq-q", "--heads-kv", "--dim-v", "--page-size", "--kv-lengths", "--kv-dtype", "--kv-format",
            "--portable-max-seq", "--threads", "--peak-seqs", "--peak-impls", "--peak-timeout", "--fit-seqs",
            "--fit-impls", "--mem-budget-mb", "--out", "--note", "--min-samples", "--min-sample-ms",
            "--child-row", "--precision", "--tune", "--tune-budget"};
        int known = 0;
        for (int k = 0; k < COUNT_OF(valued); k++)
            known |= strcmp(flag, valued[k]) == 0;
        if (!known)
            return usage_error("unknown option '%s'", flag);
        if (!value) {
            if (i + 1 >= argc)
                return usage_error("%s needs a value", flag);
            value = argv[++i];
        }

        int64_t n;
        double x;
        int rc = 0;
        if (strcmp(flag, "--seqs") == 0)
            rc = parse_int_list(flag, value, 1, 1 << 30, &o->seqs);
        else if (strcmp(flag, "--dims") == 0)
            rc = parse_int_list(flag, value, 1, FMHA_MAX_HEAD_DIM, &o->dims);
        else if (strcmp(flag, "--peak-seqs") == 0)
            rc = parse_int_list(flag, value, 1, 1 << 30, &o->peak_seqs);
        else if (strcmp(flag, "--fit-seqs") == 0)
            rc = parse_int_list(flag, value, 1, 1 << 30, &o->fit_seqs);
        else if (strcmp(flag, "--dtypes") == 0)
            rc = parse_name_list(flag, value, DTYPE_NAMES, COUNT_OF(DTYPE_NAMES), &o->dtypes);
        else if (strcmp(flag, "--variants") == 0)
            rc = parse_name_list(flag, value, VARIANT_NAMES, COUNT_OF(VARIANT_NAMES), &o->variants);
        else if (strcmp(flag, "--modes") == 0)
            rc = parse_name_list(flag, value, MODE_NAMES, COUNT_OF(MODE_NAMES), &o->modes);
        else if (strcmp(flag, "--impls") == 0)
            rc = parse_name_list(flag, value, IMPL_NAMES, COUNT_OF(IMPL_NAMES), &o->impls);
        else if (strcmp(flag, "--peak-impls") == 0)
            rc = parse_name_list(flag, value, IMPL_NAMES, COUNT_OF(IMPL_NAMES), &o->peak_impls);
        else if (strcmp(flag, "--fit-impls") == 0)
            rc = parse_name_list(flag, value, IMPL_NAMES, COUNT_OF(IMPL_NAMES), &o->fit_impls);
        else if (strcmp(flag, "--batch") == 0)
            rc = parse_int_option(flag, value, 1, 1 << 20, &o->batch);
        else if (strcmp(flag, "--heads") == 0)
            rc = parse_int_option(flag, value, 1, 1 << 20, &o->heads);
        else if (strcmp(flag, "--seq-q") == 0)
            rc = parse_int_option(flag, value, 1, 1 << 30, &o->seq_q);
        else if (strcmp(flag, "--heads-kv") == 0)
            rc = parse_int_option(flag, value, 1, 1 << 20, &o->heads_kv);
        else if (strcmp(flag, "--dim-v") == 0)
            rc = parse_int_option(flag, value, 1, FMHA_MAX_HEAD_DIM, &o->dim_v);
        else if (strcmp(flag, "--page-size") == 0)
            rc = parse_int_option(flag, value, 1, 1 << 30, &o->page_size);
        else if (strcmp(flag, "--kv-lengths") == 0) {
            if (strncmp(value, "uniform:", 8) != 0 || parse_double(value + 8, &x) != 0 || !(x > 0) || x > 1)
                return usage_error("--kv-lengths wants uniform:F with 0 < F <= 1, got '%s'", value);
            o->kv_min_fraction = x;
        }
        else if (strcmp(flag, "--kv-dtype") == 0) {
            bench_name_list one;
            rc = parse_name_list(flag, value, DTYPE_NAMES, COUNT_OF(DTYPE_NAMES), &one);
            if (rc == 0 && one.count != 1)
                return usage_error("--kv-dtype takes one dtype");
            o->kv_dtype = rc == 0 ? one.names[0] : NULL;
        }
        else if (strcmp(flag, "--kv-format") == 0) {
            bench_name_list one;
            rc = parse_name_list(flag, value, KV_FORMAT_NAMES, COUNT_OF(KV_FORMAT_NAMES), &one);
            if (rc == 0 && one.count != 1)
                return usage_error("--kv-format takes one format");
            o->kv_format = rc == 0 ? one.names[0] : NULL;
        }
        else if (strcmp(flag, "--portable-max-seq") == 0)
            rc = parse_int_option(flag, value, 0, 1 << 30, &o->portable_max_seq);
        else if (strcmp(flag, "--precision") == 0) {
            static const char *const precisions[] = {"accurate", "fast", "bf16x3", "bf16"};
            o->precision = NULL;
            for (size_t i = 0; i < COUNT_OF(precisions); i++)
                if (strcmp(value, precisions[i]) == 0) o->precision = precisions[i];
            if (!o->precision)
                return usage_error("--precision wants accurate, fast, bf16x3 or bf16, got '%s'", value);
        } else if (strcmp(flag, "--threads") == 0) {
            rc = parse_int_option(flag, value, 1, 1024, &n);
            o->threads = (int)n;
        } else if (strcmp(flag, "--min-samples") == 0) {
            rc = parse_int_option(flag, value, 1, 10000, &n);
            o->min_samples = (int)n;
        } else if (strcmp(flag, "--peak-timeout") == 0) {
            if (parse_double(value, &x) != 0 || x <= 0)
                return usage_error("--peak-timeout wants seconds > 0, got '%s'", value);
            o->peak_timeout_s = x;
        } else if (strcmp(flag, "--mem-budget-mb") == 0) {
            if (parse_double(value, &x) != 0 || x <= 0)
                return usage_error("--mem-budget-mb wants a size > 0, got '%s'", value);
            o->mem_budget_mb = x;
        } else if (strcmp(flag, "--min-sample-ms") == 0) {
            if (parse_double(value, &x) != 0 || x < 0)
                return usage_error("--min-sample-ms wants milliseconds >= 0, got '%s'", value);
            o->min_sample_ms = x;
        } else if (strcmp(flag, "--out") == 0) {
            if (!value[0])
                return usage_error("--out needs a path");
            o->out = value;
        } else if (strcmp(flag, "--note") == 0) {
            o->note = value;
        } else if (strcmp(flag, "--tune") == 0) {
            if (!value[0])
                return usage_error("--tune needs a path");
            o->tune = value;
        } else if (strcmp(flag, "--tune-budget") == 0) {
            if (parse_double(value, &x) != 0 || x <= 0 || x > 86400)
                return usage_error("--tune-budget wants seconds in (0, 86400], got '%s'", value);
            o->tune_budget_s = x;
        } else if (strcmp(flag, "--child-row") == 0) {
            child_spec = value;
        }
        if (rc)
            return -1;
    }
    if (o->kv_format && o->kv_dtype)
        return usage_error("--kv-format stores the cache in its own format: not with --kv-dtype");
    if (o->dim_v && (o->kv_format || o->page_size))
        return usage_error("--dim-v needs K and V as plain tensors: not with --kv-format or --page-size");
    if (o->kv_min_fraction > 0)
        for (int v = 0; v < o->variants.count; v++)
            if (strcmp(o->variants.names[v], "decode") != 0)
                return usage_error("--kv-lengths sets the decode rows' cache lengths: --variants decode only");
    if (*kind == RUN_BENCH && child_spec) {
        *kind = RUN_CHILD;
        child->batch = o->batch;
        child->heads = o->heads;
        child->seq_q = o->seq_q;
        child->heads_kv = o->heads_kv;
        child->head_dim_v = o->dim_v;
        child->page_size = o->page_size;
        child->kv_dtype = o->kv_dtype;
        child->kv_format = o->kv_format;
        child->kv_min_fraction = o->kv_min_fraction;
        return parse_child_spec(child_spec, child);
    }
    return 0;
}

/* ---- the record -------------------------------------------------------------- */

static json_value *int_list_json(const bench_int_list *l)
{
    char buf[4096] = "";
    for (int i = 0; i < l->count; i++) {
        size_t used = strlen(buf);
        snprintf(buf + used, sizeof buf - used, "%s%lld", i ? "," : "", (long long)l->values[i]);
    }
    return json_new_string(buf);
}

static json_value *name_list_json(const bench_name_list *l)
{
    char buf[4096] = "";
    for (int i = 0; i < l->count; i++) {
        size_t used = strlen(buf);
        snprintf(buf + used, sizeof buf - used, "%s%s", i ? "," : "", l->names[i]);
    }
    return json_new_string(buf);
}

/* This run's flags, with the seed's key names where it had one. */
static json_value *config_json(const bench_options *o)
{
    json_value *c = json_new_object();
    json_set_string(c, "device", "cpu");
    json_set_bool(c, "append", o->append);
    json_object_set(c, "seqs", int_list_json(&o->seqs));
    json_object_set(c, "dims", int_list_json(&o->dims));
    json_object_set(c, "dtypes", name_list_json(&o->dtypes));
    json_object_set(c, "variants", name_list_json(&o->variants));
    json_object_set(c, "modes", name_list_json(&o->modes));
    json_set_number(c, "batch", (double)o->batch);
    json_set_number(c, "heads", (double)o->heads);
    if (o->seq_q)
        json_set_number(c, "seq_q", (double)o->seq_q);
    if (o->heads_kv)
        json_set_number(c, "heads_kv", (double)o->heads_kv);
    if (o->dim_v)
        json_set_number(c, "dim_v", (double)o->dim_v);
    if (o->page_size)
        json_set_number(c, "page_size", (double)o->page_size);
    if (o->kv_dtype)
        json_set_string(c, "kv_dtype", o->kv_dtype);
    if (o->kv_format)
        json_set_string(c, "kv_format", o->kv_format);
    if (o->kv_min_fraction > 0)
        json_set_number(c, "kv_min_fraction", o->kv_min_fraction);
    json_object_set(c, "impls", name_list_json(&o->impls));
    json_set_number(c, "portable_max_seq", (double)o->portable_max_seq);
    json_set_bool(c, "no_ref", o->no_ref);
    json_set_bool(c, "peaks", o->peaks);
    json_object_set(c, "peak_seqs", int_list_json(&o->peak_seqs));
    json_object_set(c, "peak_impls", name_list_json(&o->peak_impls));
    json_set_number(c, "peak_timeout", o->peak_timeout_s);
    json_set_bool(c, "max_fit", o->max_fit);
    json_object_set(c, "fit_seqs", int_list_json(&o->fit_seqs));
    json_object_set(c, "fit_impls", name_list_json(&o->fit_impls));
    if (o->mem_budget_mb > 0)
        json_set_number(c, "mem_budget_mb", o->mem_budget_mb);
    else
        json_object_set(c, "mem_budget_mb", json_new_null());
    if (o->threads > 0)
        json_set_number(c, "threads", o->threads);
    else
        json_object_set(c, "threads", json_new_null());
    json_set_string(c, "precision", o->precision);
    json_set_number(c, "min_samples", o->min_samples);
    json_set_number(c, "min_sample_ms", o->min_sample_ms);
    json_set_string(c, "out", o->out);
    return c;
}

/* Reads and parses path. Returns NULL and sets *missing when it does not exist. */
static json_value *read_record(const char *path, int *missing, char *error, size_t error_size)
{
    *missing = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT)
            *missing = 1;
        else
            snprintf(error, error_size, "cannot read %s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, length = 0;
    char *text = malloc(cap);
    size_t got;
    while (text && (got = fread(text + length, 1, cap - length, f)) > 0) {
        length += got;
        if (length == cap) {
            char *grown = realloc(text, cap *= 2);
            if (!grown)
                free(text);
            text = grown;
        }
    }
    int read_failed = ferror(f);
    fclose(f);
    if (!text || read_failed) {
        free(text);
        snprintf(error, error_size, "cannot read %s", path);
        return NULL;
    }
    char parse_error[128];
    json_value *doc = json_parse(text, length, parse_error, sizeof parse_error);
    free(text);
    if (!doc) {
        snprintf(error, error_size, "%s is not valid JSON (%s)", path, parse_error);
        return NULL;
    }
    if (doc->type != JSON_OBJECT) {
        json_free(doc);
        snprintf(error, error_size, "%s is not a JSON object", path);
        return NULL;
    }
    json_value *results = json_object_get(doc, "results");
    if (results && results->type != JSON_ARRAY) {
        json_free(doc);
        snprintf(error, error_size, "%s: \"results\" is not an array", path);
        return NULL;
    }
    return doc;
}

/* path's temporary sibling: same directory, so rename() is atomic. */
static void temp_path_for(const char *path, char *out, size_t out_size)
{
    snprintf(out, out_size, "%s.tmp.%ld", path, (long)getpid());
}

/* Writes text to path through a temporary file and rename(). */
static int write_atomically(const char *path, const char *text, char *error, size_t error_size)
{
    char temp[4096];
    temp_path_for(path, temp, sizeof temp);
    FILE *f = fopen(temp, "wb");
    if (!f) {
        snprintf(error, error_size, "cannot create %s: %s", temp, strerror(errno));
        return -1;
    }
    size_t length = strlen(text);
    int failed = fwrite(text, 1, length, f) != length || fputc('\n', f) == EOF || fflush(f) != 0 ||
                 fsync(fileno(f)) != 0;
    failed |= fclose(f) != 0;
    if (failed || rename(temp, path) != 0) {
        snprintf(error, error_size, "cannot write %s: %s", path, strerror(errno));
        unlink(temp);
        return -1;
    }
    /* Make the rename itself durable. */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash)
        slash[slash == dir ? 1 : 0] = '\0';
    int dir_fd = open(slash ? dir : ".", O_RDONLY | O_DIRECTORY);
    if (dir_fd >= 0) {
        fsync(dir_fd);
        close(dir_fd);
    }
    return 0;
}

/* Fails early (before a long run) when --out's directory is not writable. */
static int check_writable(const char *path, char *error, size_t error_size)
{
    char temp[4096];
    temp_path_for(path, temp, sizeof temp);
    FILE *f = fopen(temp, "wb");
    if (!f) {
        snprintf(error, error_size, "cannot write next to %s: %s", path, strerror(errno));
        return -1;
    }
    fclose(f);
    unlink(temp);
    return 0;
}

/* The configs of the earlier runs of an existing record, oldest first. Each
 * keeps the machine it ran on: configs without a "machine" get the old
 * record's device, since the new record's device is this machine. */
static json_value *earlier_configs(const json_value *old)
{
    json_value *configs = json_new_array();
    const json_value *list = json_object_get(old, "configs");
    const json_value *config = json_object_get(old, "config");
    int config_listed = 0;
    if (list && list->type == JSON_ARRAY)
        for (size_t i = 0; i < list->count; i++) {
            json_array_push(configs, json_clone(list->items[i]));
            if (config && json_equal(config, list->items[i]))
                config_listed = 1;
        }
    /* A record whose "configs" omits its own "config" (as the seed's): keep it, first. */
    if (config && !config_listed) {
        json_array_push(configs, NULL);
        memmove(configs->items + 1, configs->items, (configs->count - 1) * sizeof *configs->items);
        configs->items[0] = json_clone(config);
    }
    const json_value *old_device = json_object_get(old, "device");
    for (size_t i = 0; old_device && i < configs->count; i++)
        if (configs->items[i]->type == JSON_OBJECT && !json_object_get(configs->items[i], "machine"))
            json_object_set(configs->items[i], "machine", json_clone(old_device));
    return configs;
}

/* ---- the terminal table ---------------------------------------------------------- */

/* The table python -m fmha.tools.bench_peers prints too (same columns, same
 * widths). spread is (q3 - q1) / median; a row whose spread passes
 * SPREAD_FLAG is marked '!' and counted for the note under the table. */
#define SPREAD_FLAG 0.25
#define TABLE_FORMAT "%-20s %-7s %-12s %-9s %4s %7s %10s %19s %7s %9s %8s %9s  %s"

static int flagged_rows; /* rows marked '!' so far */

static void print_time_header(void)
{
    printf(TABLE_FORMAT "\n", "impl", "mode", "variant", "dtype", "D", "seq", "median_ms", "q1..q3_ms", "spread",
           "GFLOP/s", "KV_GB/s", "rel_err", "status");
}

static void format_number(char *buf, size_t size, const json_value *row, const char *key, const char *format)
{
    const json_value *v = json_object_get(row, key);
    if (v && v->type == JSON_NUMBER && strcmp(format, "%.4g") == 0 && fabs(v->number) >= 1e4)
        snprintf(buf, size, "%.0f", v->number); /* no exponent for large values */
    else if (v && v->type == JSON_NUMBER)
        snprintf(buf, size, format, v->number);
    else
        snprintf(buf, size, "-");
}

/* "q1..q3" and the spread in percent ('!' past SPREAD_FLAG), or "-". */
static void format_spread(char *range, size_t range_size, char *spread, size_t spread_size, const json_value *row)
{
    const json_value *q1 = json_object_get(row, "q1_ms"), *q3 = json_object_get(row, "q3_ms");
    double median = json_get_number(row, "median_ms", 0);
    if (!q1 || !q3 || q1->type != JSON_NUMBER || q3->type != JSON_NUMBER || !(median > 0)) {
        snprintf(range, range_size, "-");
        snprintf(spread, spread_size, "-");
        return;
    }
    char lo[32], hi[32];
    format_number(lo, sizeof lo, row, "q1_ms", "%.4g");
    format_number(hi, sizeof hi, row, "q3_ms", "%.4g");
    snprintf(range, range_size, "%s..%s", lo, hi);
    double relative = (q3->number - q1->number) / median;
    int flag = relative > SPREAD_FLAG;
    flagged_rows += flag;
    snprintf(spread, spread_size, "%.0f%%%s", 100.0 * relative, flag ? "!" : "");
}

static void print_time_row(const json_value *row)
{
    char d[32], seq[32], median[32], range[80], spread[32], gflops[32], gbs[32], rel[32], peak[32], wall[32];
    format_number(d, sizeof d, row, "head_dim", "%.0f");
    if (json_object_get(row, "head_dim_v")) { /* D/Dv */
        char dv[16];
        format_number(dv, sizeof dv, row, "head_dim_v", "%.0f");
        snprintf(d + strlen(d), sizeof d - strlen(d), "/%s", dv);
    }
    format_number(seq, sizeof seq, row, "seq", "%.0f");
    format_number(median, sizeof median, row, "median_ms", "%.4g");
    format_spread(range, sizeof range, spread, sizeof spread, row);
    format_number(gflops, sizeof gflops, row, "gflops", "%.4g");
    format_number(gbs, sizeof gbs, row, "kv_gbs", "%.3g");
    format_number(rel, sizeof rel, row, "rel_err", "%.2e");
    printf(TABLE_FORMAT, json_get_string(row, "impl", "?"), json_get_string(row, "mode", "?"),
           json_get_string(row, "variant", "?"), json_get_string(row, "dtype", "?"), d, seq, median, range, spread,
           gflops, gbs, rel, json_get_string(row, "status", "?"));
    const char *error = json_get_string(row, "error", NULL);
    if (error)
        printf(" (%s)", error);
    if (json_object_get(row, "wall_s")) {
        format_number(peak, sizeof peak, row, "peak_rss_mb", "%.1f");
        format_number(wall, sizeof wall, row, "wall_s", "%.2f");
        printf("  peak_rss_mb=%s wall_s=%s", peak, wall);
    }
    printf("\n");
}

/* A row not measured, in the table with its reason (it is not in the results). */
static void print_skipped_row(const bench_case *c, const char *reason)
{
    char d[32], seq[32];
    if (c->head_dim_v)
        snprintf(d, sizeof d, "%lld/%lld", (long long)c->head_dim, (long long)c->head_dim_v);
    else
        snprintf(d, sizeof d, "%lld", (long long)c->head_dim);
    snprintf(seq, sizeof seq, "%lld", (long long)c->seq);
    printf(TABLE_FORMAT " (%s)\n", c->impl, c->mode, c->variant, c->dtype, d, seq, "-", "-", "-", "-", "-", "-",
           "skipped", reason);
}

/* The notes under a table: what '!' means, how many rows were skipped. */
static void print_table_notes(int skipped)
{
    if (flagged_rows)
        printf("! %d row%s with q1..q3 wider than %.0f%% of the median: the machine was busy or the "
               "clock changed; rerun them\n",
               flagged_rows, flagged_rows == 1 ? "" : "s", 100.0 * SPREAD_FLAG);
    if (skipped)
        printf("%d row%s skipped (reason in the row)\n", skipped, skipped == 1 ? "" : "s");
    flagged_rows = 0;
}

static void print_fit_row(const json_value *row)
{
    char seq[32], mb[32];
    format_number(seq, sizeof seq, row, "max_fit_seq", "%.0f");
    const json_value *bytes = json_object_get(row, "bytes");
    if (bytes && bytes->type == JSON_NUMBER)
        snprintf(mb, sizeof mb, "%.1f", bytes->number / (1024.0 * 1024.0));
    else
        snprintf(mb, sizeof mb, "-");
    printf("%-20s %-7s %-10s max_fit_seq=%-8s plan_mb=%-10s budget_mb=%.0f  %s\n",
           json_get_string(row, "impl", "?"), json_get_string(row, "mode", "?"),
           json_get_string(row, "dtype", "?"), seq, mb, json_get_number(row, "budget_mb", 0),
           json_get_string(row, "status", "?"));
}

/* ---- the run ---------------------------------------------------------------------- */

static int portable_skipped(const bench_options *o, const char *impl, int64_t seq)
{
    return strcmp(impl, "fmha_portable") == 0 && seq > o->portable_max_seq;
}

static void portable_skip_reason(const bench_options *o, char *buf, size_t size)
{
    snprintf(buf, size, "fmha_portable runs up to --portable-max-seq %lld", (long long)o->portable_max_seq);
}

static int count_time_rows(const bench_options *o, const bench_int_list *seqs, const bench_name_list *impls)
{
    int per_seq_rows = 0;
    for (int s = 0; s < seqs->count; s++)
        for (int i = 0; i < impls->count; i++)
            per_seq_rows += !portable_skipped(o, impls->names[i], seqs->values[s]);
    return per_seq_rows * o->dtypes.count * o->dims.count * o->variants.count * o->modes.count;
}

typedef struct progress {
    int done, total;
    double start_s; /* bench_now_s() when the run began */
} progress;

/* m:ss, or h:mm:ss past an hour */
static void format_duration(char *buf, size_t size, double seconds)
{
    long long s = (long long)(seconds + 0.5);
    if (s >= 3600)
        snprintf(buf, size, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
    else
        snprintf(buf, size, "%lld:%02lld", s / 60, s % 60);
}

/* "[row i/n] what ... elapsed m:ss, ~m:ss left": the time left assumes the
 * rows to come take as long as those done (once one is done). */
static void print_progress(progress *pr, const char *what)
{
    pr->done++;
    double elapsed = bench_now_s() - pr->start_s;
    char spent[32], left[32] = "";
    format_duration(spent, sizeof spent, elapsed);
    if (pr->done > 1) {
        format_duration(left + 3, sizeof left - 3, elapsed / (pr->done - 1) * (pr->total - pr->done + 1));
        memcpy(left, ", ~", 3);
        strncat(left, " left", sizeof left - strlen(left) - 1);
    }
    fprintf(stderr, "[row %d/%d] %s  elapsed %s%s\n", pr->done, pr->total, what, spent, left);
}

static void report_progress(progress *pr, const bench_case *c, const char *what)
{
    char text[256];
    snprintf(text, sizeof text, "%s %s %s seq=%lld%s%s%s", c->impl, c->mode, c->variant, (long long)c->seq,
             strcmp(c->dtype, "float32") ? " " : "", strcmp(c->dtype, "float32") ? c->dtype : "", what);
    print_progress(pr, text);
}

static void run_time_rows(const bench_options *o, json_value *results, progress *pr)
{
    int with_d_o = 0; /* dO only when some mode needs it */
    for (int m = 0; m < o->modes.count; m++)
        with_d_o |= strcmp(o->modes.names[m], "fwdbwd") == 0;
    char portable_reason[96];
    portable_skip_reason(o, portable_reason, sizeof portable_reason);
    int skipped = 0;
    print_time_header();
    for (int t = 0; t < o->dtypes.count; t++)
        for (int d = 0; d < o->dims.count; d++)
            for (int v = 0; v < o->variants.count; v++)
                for (int s = 0; s < o->seqs.count; s++) {
                    bench_case c = {NULL, NULL, o->variants.names[v], o->dtypes.names[t], o->batch,
                                    o->seqs.values[s], o->heads, o->dims.values[d], o->precision,
                                    o->seq_q, o->heads_kv, o->page_size, o->kv_dtype, o->kv_format, o->dim_v,
                                    o->kv_min_fraction};
                    c.impl = o->impls.names[0];
                    c.mode = o->modes.names[0];
                    /* One set of inputs (and reference) per (variant, seq, dim), every mode and impl. */
                    bench_inputs in;
                    int have_inputs = bench_inputs_init(&in, &c, with_d_o) == 0;
                    for (int m = 0; m < o->modes.count; m++)
                        for (int i = 0; i < o->impls.count; i++) {
                            c.mode = o->modes.names[m];
                            c.impl = o->impls.names[i];
                            if (portable_skipped(o, c.impl, c.seq)) {
                                print_skipped_row(&c, portable_reason);
                                skipped++;
                                continue;
                            }
                            report_progress(pr, &c, "");
                            json_value *row = bench_measure(o, &c, have_inputs ? &in : NULL, !o->no_ref);
                            json_set_string(row, "kind", "time");
                            print_time_row(row);
                            json_array_push(results, row);
                        }
                    if (have_inputs)
                        bench_inputs_free(&in);
                }
    print_table_notes(skipped);
}

static void run_peak_rows(const bench_options *o, json_value *results, progress *pr)
{
    const char *exe = bench_self_exe();
    printf("-- peaks (one child per row, timeout %.3g s) --\n", o->peak_timeout_s);
    char portable_reason[96];
    portable_skip_reason(o, portable_reason, sizeof portable_reason);
    int skipped = 0;
    print_time_header();
    for (int t = 0; t < o->dtypes.count; t++)
        for (int d = 0; d < o->dims.count; d++)
            for (int v = 0; v < o->variants.count; v++)
                for (int s = 0; s < o->peak_seqs.count; s++)
                    for (int m = 0; m < o->modes.count; m++)
                        for (int i = 0; i < o->peak_impls.count; i++) {
                            bench_case c = {o->peak_impls.names[i], o->modes.names[m], o->variants.names[v],
                                            o->dtypes.names[t], o->batch, o->peak_seqs.values[s], o->heads,
                                            o->dims.values[d], o->precision, o->seq_q, o->heads_kv,
                                            o->page_size, o->kv_dtype, o->kv_format, o->dim_v,
                                            o->kv_min_fraction};
                            if (portable_skipped(o, c.impl, c.seq)) {
                                print_skipped_row(&c, portable_reason);
                                skipped++;
                                continue;
                            }
                            report_progress(pr, &c, " (peak)");
                            json_value *row = bench_peak_row(o, &c, exe);
                            print_time_row(row);
                            json_array_push(results, row);
                        }
    print_table_notes(skipped);
}

static void run_fit_rows(const bench_options *o, json_value *results, progress *pr)
{
    double budget = o->mem_budget_mb > 0 ? o->mem_budget_mb * 1024.0 * 1024.0 : bench_mem_available_bytes();
    printf("-- max fit (budget %.0f MiB) --\n", budget / (1024.0 * 1024.0));
    for (int t = 0; t < o->dtypes.count; t++)
        for (int d = 0; d < o->dims.count; d++)
            for (int m = 0; m < o->modes.count; m++)
                for (int i = 0; i < o->fit_impls.count; i++) {
                    bench_case c = {o->fit_impls.names[i], o->modes.names[m], "plain", o->dtypes.names[t],
                                    o->batch, 0, o->heads, o->dims.values[d], o->precision, o->seq_q,
                                    o->heads_kv, o->page_size, o->kv_dtype, o->kv_format, o->dim_v, 0.0};
                    char what[128];
                    snprintf(what, sizeof what, "%s %s max-fit", c.impl, c.mode);
                    print_progress(pr, what);
                    json_value *row = bench_fit_row(o, &c, budget);
                    print_fit_row(row);
                    json_array_push(results, row);
                }
}

static char *default_note(const bench_options *o, const json_value *device)
{
    char *note = malloc(1024);
    if (note)
        snprintf(note, 1024,
                 "fmha-bench %s on %s (%s kernels, %.0f threads). Median and quartiles of the per-call "
                 "time over %d timed samples of >= %g ms each; rel_err against the float64 reference.",
                 fmha_version_string(), json_get_string(device, "cpu", "unknown CPU"),
                 json_get_string(device, "isa", "?"), json_get_number(device, "threads", 0), o->min_samples,
                 o->min_sample_ms);
    return note;
}

/* fmha_tune's progress lines, on stderr as the rows' are. */
static void tune_progress(void *user, const char *line)
{
    (void)user;
    fprintf(stderr, "%s\n", line);
}

/* --tune FILE: fmha_tune and nothing else. */
static int run_tune(const bench_options *o)
{
    const double start = bench_now_s();
    fmha_status st = fmha_tune(o->tune, o->tune_budget_s, tune_progress, NULL);
    if (st != FMHA_OK) {
        fprintf(stderr, "fmha-bench: --tune failed: %s\n", fmha_last_error_message());
        return 1;
    }
    fprintf(stderr, "fmha-bench: tuned in %.0f s; %s\n", bench_now_s() - start, fmha_tuning_status());
    return 0;
}

int main(int argc, char **argv)
{
    bench_options o;
    bench_case child;
    run_kind kind;
    set_default_options(&o);
    memset(&child, 0, sizeof child);
    if (parse_args(argc, argv, &o, &kind, &child) != 0)
        return EXIT_USAGE;
    if (kind == RUN_HELP) {
        usage(stdout);
        return 0;
    }
    if (o.threads > 0 && fmha_set_num_threads(o.threads) != FMHA_OK) {
        fprintf(stderr, "fmha-bench: fmha_set_num_threads(%d) failed\n", o.threads);
        return EXIT_USAGE;
    }
    if (kind == RUN_CHILD)
        return bench_child_main(&o, &child);
    if (o.tune)
        return run_tune(&o);

    setvbuf(stdout, NULL, _IOLBF, 0);
    char error[4200];
    json_value *old = NULL;
    if (o.append) {
        int missing;
        old = read_record(o.out, &missing, error, sizeof error);
        if (!old && !missing) {
            fprintf(stderr, "fmha-bench: %s; nothing written\n", error);
            return 1;
        }
    }
    if (check_writable(o.out, error, sizeof error) != 0) {
        fprintf(stderr, "fmha-bench: %s\n", error);
        json_free(old);
        return 1;
    }

    json_value *device = bench_device_info();
    if (o.peaks) { /* decoding's ceiling: bytes of K and V read per second */
        double gbs = bench_peak_mem_read_gbs(fmha_get_num_threads());
        if (gbs > 0) json_set_number(device, "mem_read_gbs", gbs);
    }
    json_value *config = config_json(&o);
    json_object_set(config, "machine", json_clone(device));
    json_value *results = json_new_array();
    progress pr = {0, count_time_rows(&o, &o.seqs, &o.impls), bench_now_s()};
    if (o.peaks)
        pr.total += count_time_rows(&o, &o.peak_seqs, &o.peak_impls);
    if (o.max_fit)
        pr.total += o.fit_impls.count * o.modes.count * o.dtypes.count * o.dims.count;

    run_time_rows(&o, results, &pr);
    if (o.peaks)
        run_peak_rows(&o, results, &pr);
    if (o.max_fit)
        run_fit_rows(&o, results, &pr);

    /* The record: an --append run keeps the earlier rows, configs and note. */
    if (o.append) {
        json_free(old);
        int missing;
        old = read_record(o.out, &missing, error, sizeof error);
        if (!old && !missing) {
            fprintf(stderr, "fmha-bench: %s; nothing written\n", error);
            return 1;
        }
    }
    json_value *doc = json_new_object();
    json_object_set(doc, "device", device);
    json_object_set(doc, "config", json_clone(config));
    json_value *all_results = json_new_array();
    json_value *old_results = json_object_get(old, "results");
    for (size_t i = 0; old_results && i < old_results->count; i++)
        json_array_push(all_results, json_clone(old_results->items[i]));
    size_t new_rows = results->count;
    for (size_t i = 0; i < results->count; i++)
        json_array_push(all_results, json_clone(results->items[i]));
    json_object_set(doc, "results", all_results);
    json_value *configs = old ? earlier_configs(old) : json_new_array();
    json_array_push(configs, config);
    json_object_set(doc, "configs", configs);
    const char *old_note = json_get_string(old, "note", NULL);
    char *generated = NULL;
    if (o.note)
        json_set_string(doc, "note", o.note);
    else if (old_note)
        json_set_string(doc, "note", old_note);
    else {
        generated = default_note(&o, device);
        json_set_string(doc, "note", generated ? generated : "");
    }
    free(generated);

    char *text = json_serialize(doc, 2);
    int rc = write_atomically(o.out, text, error, sizeof error);
    if (rc != 0)
        fprintf(stderr, "fmha-bench: %s\n", error);
    else
        fprintf(stderr, "fmha-bench: wrote %zu new rows (%zu in all) to %s\n", new_rows, all_results->count,
                o.out);
    free(text);
    json_free(doc);
    json_free(results);
    json_free(old);
    return rc == 0 ? 0 : 1;
}
