/* child.c: the measurements fmha-bench runs in child processes so a crash,
 * a timeout or the OOM killer cannot take the whole run down: --peaks (one
 * fork + exec of this executable per row; peak RSS from wait4) and --max-fit
 * (a forked child allocates and touches the planned bytes). */
#include "bench.h"

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MB (1024.0 * 1024.0)
#define CHILD_OUTPUT_MAX (1 << 20)
/* Exit status of a child that could not allocate its memory. */
#define CHILD_EXIT_OOM 3
#define CHILD_EXIT_EXEC 127

typedef struct child_result {
    int timed_out;
    int wait_status;
    struct rusage usage;
    double wall_s;
    char *output;          /* what the child wrote on stdout (NUL-terminated) */
    size_t output_length;
} child_result;

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Reads the child's stdout until EOF, then reaps it; SIGKILL once the
 * deadline passes. out_fd < 0 when the child has no pipe. */
static void wait_child(pid_t pid, int out_fd, double start, double timeout_s, child_result *res)
{
    double deadline = start + timeout_s;
    size_t cap = 0;
    res->output = NULL;
    res->output_length = 0;
    while (out_fd >= 0) {
        double left = deadline - bench_now_s();
        if (left <= 0) {
            res->timed_out = 1;
            break;
        }
        struct pollfd pfd = {out_fd, POLLIN, 0};
        int ready = poll(&pfd, 1, (int)(left * 1000) + 1);
        if (ready < 0 && errno == EINTR)
            continue;
        if (ready <= 0)
            continue;
        if (res->output_length + 4096 + 1 > cap) {
            cap = cap ? 2 * cap : 8192;
            char *grown = realloc(res->output, cap);
            if (!grown)
                break;
            res->output = grown;
        }
        ssize_t got = read(out_fd, res->output + res->output_length, cap - res->output_length - 1);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        res->output_length += (size_t)got;
        if (res->output_length > CHILD_OUTPUT_MAX)
            break;
    }
    if (res->output)
        res->output[res->output_length] = '\0';
    for (;;) {
        if (!res->timed_out) {
            pid_t done = wait4(pid, &res->wait_status, WNOHANG, &res->usage);
            if (done == pid)
                break;
            if (done < 0 && errno != EINTR)
                break;
            if (bench_now_s() < deadline) {
                sleep_ms(2);
                continue;
            }
            res->timed_out = 1;
        }
        kill(pid, SIGKILL);
        while (wait4(pid, &res->wait_status, 0, &res->usage) < 0 && errno == EINTR) {
        }
        break;
    }
    res->wall_s = bench_now_s() - start;
}

/* Names a child's end for a row: ok, timeout, oom or error. */
static const char *child_outcome(const child_result *res, char *detail, size_t detail_size)
{
    detail[0] = '\0';
    if (res->timed_out) {
        snprintf(detail, detail_size, "killed after the %.3g s timeout", res->wall_s);
        return "timeout";
    }
    if (WIFSIGNALED(res->wait_status)) {
        int sig = WTERMSIG(res->wait_status);
        snprintf(detail, detail_size, "killed by signal %d (%s)", sig, strsignal(sig));
        /* SIGKILL we did not send: the kernel's OOM killer. */
        return sig == SIGKILL ? "oom" : "error";
    }
    if (WIFEXITED(res->wait_status) && WEXITSTATUS(res->wait_status) == CHILD_EXIT_OOM) {
        snprintf(detail, detail_size, "the child could not allocate its memory");
        return "oom";
    }
    if (WIFEXITED(res->wait_status) && WEXITSTATUS(res->wait_status) != 0) {
        snprintf(detail, detail_size, "the child exited with status %d", WEXITSTATUS(res->wait_status));
        return "error";
    }
    return "ok";
}

/* ---- --peaks ---------------------------------------------------------------- */

int bench_child_main(const bench_options *o, const bench_case *c)
{
    bench_inputs in;
    json_value *row;
    if (bench_inputs_init(&in, c, strcmp(c->mode, "fwdbwd") == 0) != 0) {
        row = bench_measure(o, c, NULL, 0);
    } else {
        row = bench_measure(o, c, &in, 0);
        bench_inputs_free(&in);
    }
    char *text = json_serialize(row, 0);
    printf("%s\n", text);
    fflush(stdout);
    free(text);
    json_free(row);
    return 0;
}

json_value *bench_peak_row(const bench_options *o, const bench_case *c, const char *exe)
{
    char spec[512], batch[32], heads[32], samples[32], sample_ms[64], threads[32], seq_q[32], heads_kv[32],
         page_size[32], dim_v[32], kv_lengths[64];
    snprintf(spec, sizeof spec, "%s,%s,%s,%s,%lld,%lld", c->impl, c->mode, c->variant, c->dtype,
             (long long)c->seq, (long long)c->head_dim);
    snprintf(batch, sizeof batch, "%lld", (long long)c->batch);
    snprintf(heads, sizeof heads, "%lld", (long long)c->heads);
    snprintf(samples, sizeof samples, "%d", o->min_samples);
    snprintf(sample_ms, sizeof sample_ms, "%.17g", o->min_sample_ms);
    snprintf(threads, sizeof threads, "%d", o->threads);
    snprintf(seq_q, sizeof seq_q, "%lld", (long long)bench_seq_q(c));
    snprintf(heads_kv, sizeof heads_kv, "%lld", (long long)bench_heads_kv(c));
    snprintf(page_size, sizeof page_size, "%lld", (long long)c->page_size);
    snprintf(dim_v, sizeof dim_v, "%lld", (long long)c->head_dim_v);
    char *argv[] = {(char *)exe, "--child-row", spec, "--batch", batch, "--heads", heads,
                    "--min-samples", samples, "--min-sample-ms", sample_ms, NULL, NULL, NULL, NULL,
                    NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    int argc = 11;
    if (c->seq_q) {
        argv[argc++] = "--seq-q";
        argv[argc++] = seq_q;
    }
    if (c->heads_kv) {
        argv[argc++] = "--heads-kv";
        argv[argc++] = heads_kv;
    }
    if (c->head_dim_v) {
        argv[argc++] = "--dim-v";
        argv[argc++] = dim_v;
    }
    if (c->page_size) {
        argv[argc++] = "--page-size";
        argv[argc++] = page_size;
    }
    if (c->kv_min_fraction > 0) {
        snprintf(kv_lengths, sizeof kv_lengths, "uniform:%.17g", c->kv_min_fraction);
        argv[argc++] = "--kv-lengths";
        argv[argc++] = kv_lengths;
    }
    if (c->kv_dtype) {
        argv[argc++] = "--kv-dtype";
        argv[argc++] = (char *)c->kv_dtype;
    }
    if (c->kv_format) {
        argv[argc++] = "--kv-format";
        argv[argc++] = (char *)c->kv_format;
    }
    if (o->threads > 0) {
        argv[argc++] = "--threads";
        argv[argc++] = threads;
    }

    json_value *row = NULL;
    int fds[2];
    if (!exe || pipe2(fds, O_CLOEXEC) != 0) {
        row = bench_row_header(c);
        json_set_string(row, "kind", "peak");
        json_set_string(row, "status", "error");
        json_set_string(row, "error", exe ? "pipe failed" : "cannot find this executable");
        return row;
    }
    fflush(stdout);
    fflush(stderr);
    /* Give freed memory back first: a forked child starts with our resident pages. */
    malloc_trim(0);
    double start = bench_now_s();
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        execv(exe, argv);
        _exit(CHILD_EXIT_EXEC);
    }
    close(fds[1]);
    child_result res;
    memset(&res, 0, sizeof res);
    if (pid < 0) {
        close(fds[0]);
        row = bench_row_header(c);
        json_set_string(row, "kind", "peak");
        json_set_string(row, "status", "error");
        json_set_string(row, "error", "fork failed");
        return row;
    }
    wait_child(pid, fds[0], start, o->peak_timeout_s, &res);
    close(fds[0]);

    char detail[160];
    const char *outcome = child_outcome(&res, detail, sizeof detail);
    if (strcmp(outcome, "ok") == 0 && res.output)
        row = json_parse(res.output, res.output_length, NULL, 0);
    if (row && row->type != JSON_OBJECT) {
        json_free(row);
        row = NULL;
    }
    if (!row) {
        row = bench_row_header(c);
        if (strcmp(outcome, "ok") == 0) {
            outcome = "error";
            snprintf(detail, sizeof detail, "the child printed no row");
        }
        json_set_string(row, "status", outcome);
        json_set_string(row, "error", detail);
    }
    json_set_string(row, "kind", "peak");
    /* ru_maxrss is in KiB on Linux. */
    json_set_number(row, "peak_rss_mb", (double)res.usage.ru_maxrss / 1024.0);
    json_set_number(row, "wall_s", res.wall_s);
    if (res.timed_out)
        json_set_number(row, "timeout_s", o->peak_timeout_s);
    free(res.output);
    return row;
}

/* ---- --max-fit -------------------------------------------------------------- */

/* In a forked child: map and touch `bytes`, exit 0, or CHILD_EXIT_OOM when
 * the mapping fails. The child offers itself to the OOM killer first. */
static void touch_memory_child(size_t bytes)
{
    int fd = open("/proc/self/oom_score_adj", O_WRONLY);
    if (fd >= 0) {
        ssize_t ignored = write(fd, "1000", 4);
        (void)ignored;
        close(fd);
    }
    if (bytes == 0)
        _exit(0);
    unsigned char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        _exit(CHILD_EXIT_OOM);
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0)
        page = 4096;
    for (size_t off = 0; off < bytes; off += (size_t)page)
        p[off] = 1;
    p[bytes - 1] = 1;
    _exit(0);
}

/* "ok" when a child could allocate and touch bytes, else its outcome. */
static const char *try_allocate(size_t bytes, double timeout_s, char *detail, size_t detail_size)
{
    fflush(stdout);
    fflush(stderr);
    double start = bench_now_s();
    pid_t pid = fork();
    if (pid == 0)
        touch_memory_child(bytes);
    if (pid < 0) {
        snprintf(detail, detail_size, "fork failed");
        return "error";
    }
    child_result res;
    memset(&res, 0, sizeof res);
    wait_child(pid, -1, start, timeout_s, &res);
    return child_outcome(&res, detail, detail_size);
}

json_value *bench_fit_row(const bench_options *o, const bench_case *c, double budget_bytes)
{
    json_value *row = json_new_object();
    json_set_string(row, "kind", "max_fit");
    json_set_string(row, "impl", c->impl);
    json_set_string(row, "mode", c->mode);
    json_set_string(row, "dtype", c->dtype);
    json_set_number(row, "batch", (double)c->batch);
    json_set_number(row, "heads", (double)c->heads);
    json_set_number(row, "head_dim", (double)c->head_dim);
    json_set_number(row, "budget_mb", budget_bytes / MB);

    /* Largest seq first; the first whose plan fits and whose memory a child
     * could touch is the answer. */
    int order[BENCH_MAX_LIST];
    int n = o->fit_seqs.count;
    for (int i = 0; i < n; i++)
        order[i] = i;
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && o->fit_seqs.values[order[j]] > o->fit_seqs.values[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }

    json_value *checked = json_new_array();
    json_value *best_seq = NULL;
    double best_bytes = 0;
    fmha_status failure = FMHA_OK;
    for (int i = 0; i < n && !best_seq; i++) {
        bench_case at = *c;
        at.seq = o->fit_seqs.values[order[i]];
        size_t ws = 0, args = 0, outs = 0;
        json_value *entry = json_new_object();
        json_set_number(entry, "seq", (double)at.seq);
        fmha_status st = bench_case_plan(&at, NULL, &ws, &args, &outs);
        if (st != FMHA_OK) {
            json_set_string(entry, "result", "plan failed");
            json_set_string(entry, "error", fmha_status_string(st));
            json_array_push(checked, entry);
            if (failure == FMHA_OK)
                failure = st;
            continue;
        }
        double bytes = (double)ws + (double)args + (double)outs;
        json_set_number(entry, "plan_mb", bytes / MB);
        if (bytes > budget_bytes) {
            json_set_string(entry, "result", "over budget");
        } else {
            char detail[160];
            const char *outcome = try_allocate(ws + args + outs, o->peak_timeout_s, detail, sizeof detail);
            json_set_string(entry, "result", strcmp(outcome, "ok") == 0 ? "fits" : outcome);
            if (detail[0])
                json_set_string(entry, "error", detail);
            if (strcmp(outcome, "ok") == 0) {
                best_seq = json_new_number((double)at.seq);
                best_bytes = bytes;
            }
        }
        json_array_push(checked, entry);
    }
    /* Every plan failed the same way (e.g. a mode not in the library yet). */
    int all_failed = !best_seq && failure != FMHA_OK;
    for (size_t i = 0; all_failed && i < checked->count; i++)
        if (!json_object_get(checked->items[i], "error") ||
            json_object_get(checked->items[i], "plan_mb"))
            all_failed = 0;
    if (all_failed) {
        bench_row_set_status(row, failure);
    } else {
        json_set_string(row, "status", "ok");
    }
    json_object_set(row, "max_fit_seq", best_seq ? best_seq : json_new_null());
    if (best_seq)
        json_set_number(row, "bytes", best_bytes);
    else
        json_object_set(row, "bytes", json_new_null());
    json_object_set(row, "checked", checked);
    return row;
}
