/* test_pool.c: the thread pool (src/runtime/pool.c) hands every task to exactly one
 * thread, with thread < max_threads, across many back-to-back jobs of mixed
 * thread counts (the pool grows mid-run and workers sit out jobs that need
 * fewer threads), with jobs separated by pauses longer than the spin window
 * (workers asleep) and by none (workers spinning), and with two user threads
 * calling at once, and in children forked right after a job (a child's new
 * workers must join its own jobs, never the parent's last one); half the
 * jobs carry per-thread hooks, checked around every task. ctest also
 * runs it with FMHA_SPIN_US=0 (never spin). */
#include <pthread.h>
#include <signal.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "runtime/pool.h"
#include "test_util.h"

enum { MAX_TASKS = 257 };

typedef struct {
    atomic_int runs[MAX_TASKS]; /* times each task ran */
    int max_threads;
    atomic_int bad_thread;      /* a thread index >= max_threads was seen */
    int hooked;                 /* the job runs with hook_begin and hook_end */
} job_record;

/* Per-thread hooks: begin and end calls of the current job, and whether
 * this thread is between its begin and end. */
static atomic_int hook_begins, hook_ends, hook_misplaced;
static _Thread_local int inside_hooks;

static void hook_begin(void) {
    if (inside_hooks) atomic_fetch_add(&hook_misplaced, 1); /* a second begin */
    inside_hooks = 1;
    atomic_fetch_add(&hook_begins, 1);
}

static void hook_end(void) {
    if (!inside_hooks) atomic_fetch_add(&hook_misplaced, 1); /* an end without begin */
    inside_hooks = 0;
    atomic_fetch_add(&hook_ends, 1);
}

static void count_task(void *ctx, size_t task, int thread) {
    job_record *r = ctx;
    atomic_fetch_add(&r->runs[task], 1);
    if (thread < 0 || thread >= r->max_threads) atomic_store(&r->bad_thread, 1);
    if (r->hooked != inside_hooks) atomic_fetch_add(&hook_misplaced, 1); /* a task outside its hooks */
}

/* Runs `jobs` jobs of 1..top threads; returns the number whose record was wrong. */
/* Jobs of one user thread at a time may carry hooks (their counters are global). */
static int run_jobs(unsigned seed, int jobs, int top, int pause_every, int hooks) {
    int wrong = 0;
    for (int j = 0; j < jobs; j++) {
        seed = seed * 1103515245u + 12345u;
        size_t n_tasks = 1 + (seed >> 8) % MAX_TASKS;
        int max_threads = 1 + (int)((seed >> 20) % (unsigned)top);
        job_record rec = {.max_threads = max_threads, .hooked = hooks && (seed >> 28) & 1};
        for (size_t t = 0; t < MAX_TASKS; t++) atomic_init(&rec.runs[t], 0);
        atomic_init(&rec.bad_thread, 0);
        if (rec.hooked) {
            atomic_store(&hook_begins, 0);
            atomic_store(&hook_ends, 0);
        }
        int rc = rec.hooked ? fmha_parallel_for_hooked(n_tasks, max_threads, count_task, &rec, hook_begin, hook_end)
                            : fmha_parallel_for(n_tasks, max_threads, count_task, &rec);
        /* hooks: one begin and one end on each thread that ran a task (1..max_threads) */
        int begins = atomic_load(&hook_begins), ends = atomic_load(&hook_ends);
        int ok = rc == 0 && !atomic_load(&rec.bad_thread) &&
                 (!rec.hooked || (begins == ends && begins >= 1 && begins <= max_threads));
        for (size_t t = 0; t < MAX_TASKS; t++)
            ok &= atomic_load(&rec.runs[t]) == (t < n_tasks ? 1 : 0);
        wrong += !ok;
        if (pause_every && j % pause_every == 0) {
            struct timespec ts = {0, 2 * 1000 * 1000}; /* 2 ms: past the spin window */
            nanosleep(&ts, NULL);
        }
    }
    return wrong;
}

static void *second_caller(void *arg) {
    *(int *)arg = run_jobs(99, 2000, 6, 0, 0);
    return NULL;
}

int main(void) {
    /* first with no more threads than CPUs (workers spin between jobs), then
     * with up to 6 (the pool grows; past the CPU count it stops spinning) */
    cpu_set_t set;
    int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    int top = cpus < 6 ? cpus : 6;
    for (int pass = 0; pass < 2; pass++) {
        tu_check(run_jobs(1, 3000, top, 0, 1) == 0, "back-to-back jobs (1..%d threads): a task ran 0 or 2+ times", top);
        tu_check(run_jobs(2, 300, top, 1, 1) == 0, "jobs with workers asleep between them (1..%d threads)", top);
        tu_check(run_jobs(3, 2000, top, 7, 1) == 0, "mixed pauses (1..%d threads)", top);
        top = 6;
    }
    int other = -1;
    pthread_t th;
    tu_check(pthread_create(&th, NULL, second_caller, &other) == 0, "pthread_create");
    int mine = run_jobs(4, 2000, 6, 0, 1);
    pthread_join(th, NULL);
    tu_check(mine == 0 && other == 0, "two user threads calling at once: %d and %d wrong jobs",
             mine, other);
    /* fork right after a multithreaded job: the child's first job grows a
     * fresh pool; its jobs must run every task once (status 0) */
    int bad_children = 0;
    for (int i = 0; i < 20; i++) {
        run_jobs(5 + (unsigned)i, 3, 6, 0, 1);
        pid_t pid = fork();
        if (pid == 0) _exit(run_jobs(7, 200, 6, 0, 1) == 0 && atomic_load(&hook_misplaced) == 0 ? 0 : 1);
        int status = -1, waited = 0;
        for (; waited < 6000; waited++) { /* 60 s */
            pid_t r = waitpid(pid, &status, WNOHANG);
            if (r == pid || r < 0) break;
            nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
        }
        if (waited == 6000) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            status = -1;
        }
        bad_children += !(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    tu_check(bad_children == 0, "jobs in forked children: %d of 20 children hung or ran a task 0 or 2+ times",
             bad_children);
    size_t zero_tasks_ran = 0;
    tu_check(fmha_parallel_for(0, 4, count_task, &zero_tasks_ran) == 0, "zero tasks");
    tu_check(atomic_load(&hook_misplaced) == 0, "per-thread hooks: %d tasks outside their thread's begin/end",
             atomic_load(&hook_misplaced));
    return tu_finish();
}
