/* pool.c: a persistent pthread pool, created on first use and grown when
 * more threads are requested. One job at a time: workers sleep on a
 * condition variable, claim task indices from an atomic counter, and the
 * caller joins in as thread 0 and waits until every task has finished.
 * A child of fork() gets a fresh, empty pool (pthread_atfork). */
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#define POOL_MAX_THREADS 1024

static pthread_mutex_t pool_call_lock = PTHREAD_MUTEX_INITIALIZER; /* one job at a time */
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_wake = PTHREAD_COND_INITIALIZER;
static pthread_cond_t pool_done = PTHREAD_COND_INITIALIZER;

static int pool_requested;           /* fmha_set_num_threads value, 0 = default */
static int pool_started;             /* worker threads alive (thread ids 1..pool_started) */
static unsigned long pool_generation;/* bumped per job */
static int pool_job_threads;         /* threads taking part in the current job */
static int pool_busy_workers;        /* workers still inside the current job */

static fmha_task_fn job_fn;
static void *job_ctx;
static size_t job_tasks;
static atomic_size_t job_next;

static int pool_default_threads(void) {
    const char *env = getenv("FMHA_NUM_THREADS");
    if (env && *env) {
        long n = strtol(env, NULL, 10);
        if (n >= 1 && n <= POOL_MAX_THREADS) return (int)n;
    }
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n >= 1) return n > POOL_MAX_THREADS ? POOL_MAX_THREADS : n;
    }
#endif
    return 1;
}

int fmha_pool_threads(void) {
    pthread_mutex_lock(&pool_lock);
    int n = pool_requested > 0 ? pool_requested : pool_default_threads();
    pthread_mutex_unlock(&pool_lock);
    return n;
}

int fmha_pool_set_threads(int n) {
    if (n < 0 || n > POOL_MAX_THREADS) return -1;
    pthread_mutex_lock(&pool_lock);
    pool_requested = n;
    pthread_mutex_unlock(&pool_lock);
    return 0;
}

static void pool_run_tasks(int thread) {
    for (;;) {
        size_t t = atomic_fetch_add_explicit(&job_next, 1, memory_order_relaxed);
        if (t >= job_tasks) break;
        job_fn(job_ctx, t, thread);
    }
}

static void *pool_worker(void *arg) {
    int id = (int)(size_t)arg;
    unsigned long seen = 0;
    pthread_mutex_lock(&pool_lock);
    for (;;) {
        while (pool_generation == seen) pthread_cond_wait(&pool_wake, &pool_lock);
        seen = pool_generation;
        if (id >= pool_job_threads) continue; /* not needed for this job */
        pthread_mutex_unlock(&pool_lock);
        pool_run_tasks(id);
        pthread_mutex_lock(&pool_lock);
        if (--pool_busy_workers == 0) pthread_cond_signal(&pool_done);
    }
    return NULL;
}

/* The child of fork() has only the thread that forked: the workers are gone
 * and a lock held by another thread stays held. The child starts over with
 * an empty pool (its next call creates workers again); the requested count
 * is kept. A job in progress at the fork is not finished in the child. */
static void pool_after_fork_child(void) {
    static const pthread_mutex_t mutex_init = PTHREAD_MUTEX_INITIALIZER;
    static const pthread_cond_t cond_init = PTHREAD_COND_INITIALIZER;
    pool_call_lock = mutex_init;
    pool_lock = mutex_init;
    pool_wake = cond_init;
    pool_done = cond_init;
    pool_started = 0;
    pool_job_threads = 0;
    pool_busy_workers = 0;
}

static int pool_fork_handler; /* pthread_atfork done (under pool_lock) */

/* Starts workers up to want - 1 of them; returns how many threads can run. */
static int pool_grow(int want) {
    /* no workers unless a forked child can forget them */
    if (!pool_fork_handler && want > 1) {
        if (pthread_atfork(NULL, NULL, pool_after_fork_child) != 0) return 1;
        pool_fork_handler = 1;
    }
    while (pool_started < want - 1) {
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&th, &attr, pool_worker, (void *)(size_t)(pool_started + 1));
        pthread_attr_destroy(&attr);
        if (rc != 0) break;
        pool_started++;
    }
    return pool_started + 1;
}

int fmha_parallel_for(size_t n_tasks, int max_threads, fmha_task_fn fn, void *ctx) {
    if (n_tasks == 0) return 0;
    int want = max_threads < 1 ? 1 : max_threads;
    if ((size_t)want > n_tasks) want = (int)n_tasks;
    pthread_mutex_lock(&pool_call_lock);
    pthread_mutex_lock(&pool_lock);
    int have = want > 1 ? pool_grow(want) : 1;
    int threads = have < want ? have : want;
    job_fn = fn;
    job_ctx = ctx;
    job_tasks = n_tasks;
    atomic_store(&job_next, 0);
    pool_job_threads = threads;
    pool_busy_workers = threads - 1;
    if (threads > 1) {
        pool_generation++;
        pthread_cond_broadcast(&pool_wake);
    }
    pthread_mutex_unlock(&pool_lock);

    pool_run_tasks(0);

    pthread_mutex_lock(&pool_lock);
    while (pool_busy_workers > 0) pthread_cond_wait(&pool_done, &pool_lock);
    pthread_mutex_unlock(&pool_lock);
    pthread_mutex_unlock(&pool_call_lock);
    return have < want ? -1 : 0;
}
