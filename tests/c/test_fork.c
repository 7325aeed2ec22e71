/* test_fork.c: fmha in a child of fork(). The pool's workers do not survive
 * a fork, so a child that calls fmha after its parent ran a multithreaded
 * call must get a fresh pool rather than wait for workers it lacks (servers
 * that pre-fork, Python multiprocessing and data-loader workers do this).
 *
 * Cases (4 threads unless said):
 *   - fork after a forward and a backward: the child and the parent both
 *     compute them again; every result is bitwise equal to the one before
 *     the fork (results do not depend on the thread count or the pool) and
 *     O matches the float64 reference (|x - r| <= 1e-5 + 1e-4 |r|);
 *   - a grandchild (fork in the child after its own call);
 *   - forks while another thread only reads the thread count, before the
 *     process made any call (the pool's lock must be reset in the child);
 *   - fork while another thread of the parent is inside calls: the child's
 *     own calls still complete and match; run first with one thread in a
 *     process that has never made a multithreaded call (the pool's locks
 *     must be reset in the child even then), then with 4 threads.
 * A child that has not exited after 120 s (a grandchild: 30 s) counts as
 * hung: it is killed and the case fails (instead of the test waiting
 * forever). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fmha_ref.h"
#include "test_util.h"

static fmha_problem prob;
static float *q, *k, *v, *d_o;
static size_t n_o, n_l, n_q, n_k, n_v; /* V and dV: Dv columns, not D */
/* results before the fork */
static float *o0, *l0, *dq0, *dk0, *dv0;

static float *xmalloc_f(size_t n) {
    float *x = malloc(n * sizeof(float));
    if (!x) abort();
    return x;
}

/* One caller's buffers: results and a workspace for both calls. */
typedef struct call_buffers {
    float *o, *l, *dq, *dk, *dv;
    void *ws;
    size_t ws_bytes;
} call_buffers;

static void buffers_make(call_buffers *b) {
    size_t f = 0, w = 0;
    if (fmha_forward_workspace_size(&prob, &f) != FMHA_OK || fmha_backward_workspace_size(&prob, &w) != FMHA_OK) abort();
    b->o = xmalloc_f(n_o), b->l = xmalloc_f(n_l), b->dq = xmalloc_f(n_q);
    b->dk = xmalloc_f(n_k), b->dv = xmalloc_f(n_v);
    b->ws_bytes = f > w ? f : w;
    b->ws = malloc(b->ws_bytes);
    if (!b->ws) abort();
}

static void buffers_free(call_buffers *b) { free(b->o), free(b->l), free(b->dq), free(b->dk), free(b->dv), free(b->ws); }

/* Forward + backward of prob into b; 1 if every result equals the saved
 * one bitwise. No allocation of its own or the library's. */
static int compute_and_compare_in(call_buffers *b) {
    const fmha_status fs = fmha_forward(&prob, q, k, v, b->o, b->l, b->ws, b->ws_bytes);
    const fmha_status bs = fs == FMHA_OK ? fmha_backward(&prob, q, k, v, b->o, d_o, b->l, b->dq, b->dk, b->dv, NULL,
                                                         b->ws, b->ws_bytes)
                                         : fs;
    /* which part differs (0 none): O, lse, dQ, dK, dV */
    const int differs = memcmp(b->o, o0, n_o * sizeof(float))     ? 1
                        : memcmp(b->l, l0, n_l * sizeof(float))   ? 2
                        : memcmp(b->dq, dq0, n_q * sizeof(float)) ? 3
                        : memcmp(b->dk, dk0, n_k * sizeof(float)) ? 4
                        : memcmp(b->dv, dv0, n_v * sizeof(float)) ? 5
                                                                  : 0;
    const int ok = fs == FMHA_OK && bs == FMHA_OK && !differs;
    if (!ok) /* the cause, beside the failure's message */
        fprintf(stderr, "pid %d, %d threads: forward %d, backward %d (%s), differs in %s\n", (int)getpid(),
                fmha_get_num_threads(), (int)fs, (int)bs, fmha_last_error_message(),
                (const char *[]){"nothing", "O", "lse", "dQ", "dK", "dV"}[differs]);
    return ok;
}

/* The same with buffers of its own and the library's one-shot workspace. */
static int compute_and_compare(void) {
    call_buffers b;
    buffers_make(&b);
    free(b.ws), b.ws = NULL, b.ws_bytes = 0;
    const int ok = compute_and_compare_in(&b);
    buffers_free(&b);
    return ok;
}

/* Waits for pid up to `seconds`; its exit status, or -1 if it hung (killed) or died. */
static int wait_child_for(pid_t pid, int seconds) {
    for (int i = 0; i < 100 * seconds; i++) {
        int status;
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        if (r < 0) return -1;
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

static int wait_child(pid_t pid) { return wait_child_for(pid, 120); }

/* Child body: compute, optionally fork a grandchild that computes too. */
static int child_main(int grandchild) {
    if (!compute_and_compare()) return 1;
    if (grandchild) {
        pid_t pid = fork();
        if (pid < 0) return 3;
        if (pid == 0) _exit(compute_and_compare() ? 0 : 1);
        if (wait_child(pid) != 0) return 2;
    }
    return compute_and_compare() ? 0 : 1;
}

static void fork_case(const char *what, int grandchild) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        tu_check(0, "%s: fork failed", what);
        return;
    }
    if (pid == 0) _exit(child_main(grandchild));
    /* the parent computes while the child does */
    int parent_ok = compute_and_compare();
    int rc = wait_child(pid);
    tu_check(rc == 0, "%s: child %s", what,
             rc < 0 ? "hung or crashed" : rc == 2 ? "saw its grandchild fail" : "got other results");
    tu_check(parent_ok, "%s: the parent's results changed after the fork", what);
}

static volatile int busy_stop;

static volatile int busy_calls; /* the busy caller's calls so far */

/* Calls while the main thread forks, on buffers made before its first
 * call, so that after it no call of this thread allocates: a fork while
 * another thread is inside malloc hands the child a held allocator lock
 * under GCC 12's AddressSanitizer (its fork does not take them), and the
 * child's first allocation then waits for ever (glibc's own malloc is
 * safe: the Release run). The calls are the ones a server makes beside
 * its forks; what the case checks is the library's own state. */
static void *busy_caller(void *arg) {
    (void)arg;
    call_buffers b;
    buffers_make(&b);
    while (!busy_stop) {
        compute_and_compare_in(&b);
        busy_calls = busy_calls + 1;
    }
    buffers_free(&b);
    return NULL;
}

static volatile int reader_running;

static void *count_reader(void *arg) {
    (void)arg;
    (void)fmha_get_num_threads();
    reader_running = 1;
    while (!busy_stop) (void)fmha_get_num_threads();
    return NULL;
}

/* Child body of the first case: 20 forks while a second thread reads the
 * thread count (the pool's lock), before this process made any call;
 * every grandchild must complete a forward. */
static int fork_while_reading_count(void) {
    pthread_t th;
    busy_stop = 0;
    reader_running = 0;
    if (pthread_create(&th, NULL, count_reader, NULL) != 0) return 3;
    int failed = 0;
    float *o = xmalloc_f(n_o);
    /* the first fork once the reader runs its loop: a fork during its
     * start-up, while it allocates its thread's own blocks, hands the
     * grandchild a held allocator lock under GCC 12's AddressSanitizer
     * (whose fork does not take its allocator's locks), and the
     * grandchild's first worker thread then waits on it for ever */
    while (!reader_running) nanosleep(&(struct timespec){0, 100 * 1000}, NULL);
    for (int i = 0; i < 20 && !failed; i++) {
        pid_t pid = fork();
        if (pid < 0) failed = 3;
        else if (pid == 0) _exit(fmha_forward(&prob, q, k, v, o, NULL, NULL, 0) == FMHA_OK ? 0 : 1);
        else if (wait_child_for(pid, 30) != 0) failed = 1; /* killed well before the parent gives up */
    }
    busy_stop = 1;
    pthread_join(th, NULL);
    free(o);
    return failed;
}

/* Forks three times while a second thread of the parent runs calls. */
static void fork_while_busy(const char *what) {
    pthread_t th;
    busy_stop = 0;
    busy_calls = 0;
    if (!tu_check(pthread_create(&th, NULL, busy_caller, NULL) == 0, "%s: no thread", what)) return;
    while (busy_calls < 1) nanosleep(&(struct timespec){0, 100 * 1000}, NULL); /* its first call made */
    for (int i = 0; i < 3; i++) {
        nanosleep(&(struct timespec){0, 3 * 1000 * 1000}, NULL);
        fork_case(what, 0);
    }
    busy_stop = 1;
    pthread_join(th, NULL);
}

int main(void) {
    tu_seed();
    fmha_problem_init(&prob, 2, 4, 2, 130, 150, 32, 24, FMHA_LAYOUT_BSHD);
    prob.causal = FMHA_CAUSAL_BOTTOM_RIGHT;
    prob.strategy = FMHA_STRATEGY_TILED;
    q = tu_new_input(&prob, 'q', -1, 1), k = tu_new_input(&prob, 'k', -1, 1);
    v = tu_new_input(&prob, 'v', -1, 1), d_o = tu_new_input(&prob, 'o', -1, 1);
    int64_t n[4];
    tu_shape(&prob, 'o', n), n_o = tu_numel(n);
    tu_shape(&prob, 'q', n), n_q = tu_numel(n);
    tu_shape(&prob, 'k', n), n_k = tu_numel(n);
    tu_shape(&prob, 'v', n), n_v = tu_numel(n);
    n_l = (size_t)(prob.batch * prob.heads_q * prob.seq_q);
    o0 = xmalloc_f(n_o), l0 = xmalloc_f(n_l), dq0 = xmalloc_f(n_q);
    dk0 = xmalloc_f(n_k), dv0 = xmalloc_f(n_v);

    /* before any call of this process: forks while a thread holds the
     * pool's lock only to read the thread count */
    fflush(stdout);
    pid_t first = fork();
    if (first == 0) _exit(fork_while_reading_count());
    int first_rc = first < 0 ? -1 : wait_child(first);
    tu_check(first_rc == 0, "fork while another thread reads the thread count, before any call: %s",
             first_rc == 1 ? "a grandchild hung or failed" : "the child failed or hung");

    /* one thread until the single-thread case below has run */
    fmha_set_num_threads(1);
    int ok = fmha_forward(&prob, q, k, v, o0, l0, NULL, 0) == FMHA_OK &&
             fmha_backward(&prob, q, k, v, o0, d_o, l0, dq0, dk0, dv0, NULL, NULL, 0) == FMHA_OK;
    if (!tu_check(ok, "the calls before the fork failed")) return tu_finish();
    double *ro = malloc(n_o * sizeof(double));
    if (!ro || fmha_ref_forward(&prob, q, k, v, ro, NULL) != 0) abort();
    tu_check(tu_worst_ratio(o0, ro, n_o, 1e-5, 1e-4) <= 1.0, "O differs from the reference");
    free(ro);

    fork_while_busy("fork while another thread calls fmha, one thread");
    fmha_set_num_threads(4);
    fork_case("fork after a call", 0);
    fork_case("fork after a call, then a grandchild", 1);
    fork_while_busy("fork while another thread calls fmha");
    fmha_set_num_threads(0);
    free(q), free(k), free(v), free(d_o);
    free(o0), free(l0), free(dq0), free(dk0), free(dv0);
    return tu_finish();
}
