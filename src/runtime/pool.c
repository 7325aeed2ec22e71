/* pool.c: a persistent pthread pool, created on first use and grown when
 * more threads are requested. One job at a time: the caller publishes a job
 * word (generation and thread count), workers claim task indices from an
 * atomic counter, and the caller joins in as thread 0 and waits until every
 * task has finished.
 *
 * Waiting spins before it sleeps: a worker that finished a job watches the
 * job word for FMHA_SPIN_US microseconds (default 200) before it sleeps on
 * a condition variable, and the caller watches the busy count as long before
 * it sleeps; the spin yields the CPU every microsecond, so other runtimes'
 * threads (an OpenMP team between regions) are not starved; no spinning
 * while the pool has more threads than CPUs. A call's phases (pre-pass, tasks, reduction) and calls made
 * back to back then start without a futex wake-up (10-30 us each in a VM).
 * A child of fork() gets a fresh, empty pool (pthread_atfork). A job may
 * carry per-thread hooks (fmha_parallel_for_hooked), called by each thread
 * around its share of the tasks; nothing of them outlives the job. */
#include "runtime/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#define POOL_MAX_THREADS 1024
#define POOL_THREAD_BITS 11 /* the job word's low bits: threads in the job (<= 1024) */
#define POOL_DEFAULT_SPIN_US 200

static pthread_mutex_t pool_call_lock = PTHREAD_MUTEX_INITIALIZER; /* one job at a time */
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t pool_wake = PTHREAD_COND_INITIALIZER;
static pthread_cond_t pool_done = PTHREAD_COND_INITIALIZER;

static int pool_requested;        /* fmha_set_num_threads value, 0 = default */
static int pool_started;          /* worker threads alive (thread ids 1..pool_started) */
static int pool_sleepers;         /* workers in cond_wait on pool_wake (under pool_lock) */
static long pool_spin_setting = -1; /* FMHA_SPIN_US in ns; -1 until read (under pool_lock) */
/* the spin in use: the setting, or 0 while the pool has more threads than CPUs
 * (a spinning worker would then hold a core that a working thread needs) */
static atomic_long pool_spin_ns;

/* generation << POOL_THREAD_BITS | threads of the job; a worker reads both at once */
static atomic_uint_least64_t job_word;
/* job_word when pool_grow last started workers, before the job that grew the
 * pool was published: a new worker's "seen", so it joins that job and never
 * one published earlier (say, in a parent before fork) */
static uint64_t pool_grow_word;
static atomic_uint_least64_t pool_busy_workers; /* workers still inside the current job */

static fmha_task_fn job_fn;
static void (*job_begin)(void), (*job_end)(void); /* per-thread hooks of the job, or NULL */
static void *job_ctx;
static size_t job_tasks;
static atomic_size_t job_next;

/* CPUs this process may run on (1 if unknown). */
static int pool_cpu_count(void) {
#ifdef CPU_COUNT
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n >= 1) return n > POOL_MAX_THREADS ? POOL_MAX_THREADS : n;
    }
#endif
    return 1;
}

static int pool_default_threads(void) {
    const char *env = getenv("FMHA_NUM_THREADS");
    if (env && *env) {
        long n = strtol(env, NULL, 10);
        if (n >= 1 && n <= POOL_MAX_THREADS) return (int)n;
    }
    return pool_cpu_count();
}

static long pool_read_spin_ns(void) {
    const char *env = getenv("FMHA_SPIN_US");
    long us = POOL_DEFAULT_SPIN_US;
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end == '\0' && v >= 0 && v <= 1000000) us = v;
    }
    return us * 1000;
}

static void pool_register_fork_handler(void);
static pthread_once_t pool_fork_once = PTHREAD_ONCE_INIT;

int fmha_pool_threads(void) {
    /* every entry point registers the fork handler before its first lock */
    pthread_once(&pool_fork_once, pool_register_fork_handler);
    pthread_mutex_lock(&pool_lock);
    int n = pool_requested > 0 ? pool_requested : pool_default_threads();
    pthread_mutex_unlock(&pool_lock);
    return n;
}

int fmha_pool_set_threads(int n) {
    if (n < 0 || n > POOL_MAX_THREADS) return -1;
    pthread_once(&pool_fork_once, pool_register_fork_handler);
    pthread_mutex_lock(&pool_lock);
    pool_requested = n;
    pthread_mutex_unlock(&pool_lock);
    return 0;
}

static int64_t pool_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline void pool_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Spins up to spin_ns until *word equals value (equal = 1) or differs from
 * it (equal = 0): returns 1, or 0 when time is up. Every 64 pauses (about a
 * microsecond) it yields the CPU, so a thread of another runtime (an OpenMP
 * team between its regions, say) that wants this core gets it, and checks
 * the clock. */
static int pool_spin_until(atomic_uint_least64_t *word, uint64_t value, int equal, long spin_ns) {
    if (spin_ns <= 0) return 0;
    int64_t deadline = pool_now_ns() + spin_ns;
    for (;;) {
        for (int i = 0; i < 64; i++) {
            if ((atomic_load_explicit(word, memory_order_acquire) == value) == equal) return 1;
            pool_cpu_relax();
        }
        if (pool_now_ns() >= deadline) return 0;
        sched_yield();
    }
}

/* Claims and runs tasks until none is left; the job's hooks around them,
 * when this thread gets one. */
static void pool_run_tasks(int thread) {
    int began = 0;
    for (;;) {
        size_t t = atomic_fetch_add_explicit(&job_next, 1, memory_order_relaxed);
        if (t >= job_tasks) break;
        if (!began && job_begin) job_begin();
        began = 1;
        job_fn(job_ctx, t, thread);
    }
    if (began && job_end) job_end();
}

static void *pool_worker(void *arg) {
    int id = (int)(size_t)arg;
    /* written before pthread_create; the next grow waits for this worker's
     * part in the job that created it */
    uint64_t seen = pool_grow_word;
    int left_out = 0; /* the last job did not need this worker: sleep at once */
    for (;;) {
        long spin_ns = left_out ? 0 : atomic_load_explicit(&pool_spin_ns, memory_order_relaxed);
        if (!pool_spin_until(&job_word, seen, 0, spin_ns)) {
            pthread_mutex_lock(&pool_lock);
            pool_sleepers++;
            while (atomic_load_explicit(&job_word, memory_order_acquire) == seen)
                pthread_cond_wait(&pool_wake, &pool_lock);
            pool_sleepers--;
            pthread_mutex_unlock(&pool_lock);
        }
        seen = atomic_load_explicit(&job_word, memory_order_acquire);
        int threads = (int)(seen & ((1u << POOL_THREAD_BITS) - 1));
        left_out = id >= threads;
        if (left_out) continue; /* not needed for this job */
        /* job_fn, job_ctx, job_tasks stay fixed until this worker reports */
        pool_run_tasks(id);
        if (atomic_fetch_sub_explicit(&pool_busy_workers, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&pool_lock); /* the caller checks the count under this lock */
            pthread_cond_signal(&pool_done);
            pthread_mutex_unlock(&pool_lock);
        }
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
    pool_sleepers = 0;
    atomic_store(&pool_busy_workers, 0);
}

static int pool_fork_handler; /* pthread_atfork succeeded (set once) */

static void pool_register_fork_handler(void) {
    pool_fork_handler = pthread_atfork(NULL, NULL, pool_after_fork_child) == 0;
}

/* Starts workers up to want - 1 of them; returns how many threads can run. */
static int pool_grow(int want) {
    /* no workers unless a forked child can forget them */
    if (!pool_fork_handler) return 1;
    static int cpus;
    if (pool_spin_setting < 0) {
        pool_spin_setting = pool_read_spin_ns();
        cpus = pool_cpu_count();
        atomic_store_explicit(&pool_spin_ns, pool_spin_setting, memory_order_relaxed);
    }
    if (pool_started >= want - 1) return pool_started + 1;
    pool_grow_word = atomic_load_explicit(&job_word, memory_order_relaxed);
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
    atomic_store_explicit(&pool_spin_ns, pool_started + 1 <= cpus ? pool_spin_setting : 0,
                          memory_order_relaxed);
    return pool_started + 1;
}

int fmha_parallel_for(size_t n_tasks, int max_threads, fmha_task_fn fn, void *ctx) {
    return fmha_parallel_for_hooked(n_tasks, max_threads, fn, ctx, NULL, NULL);
}

int fmha_parallel_for_hooked(size_t n_tasks, int max_threads, fmha_task_fn fn, void *ctx, void (*begin)(void),
                             void (*end)(void)) {
    if (n_tasks == 0) return 0;
    int want = max_threads < 1 ? 1 : max_threads;
    if ((size_t)want > n_tasks) want = (int)n_tasks;
    /* before the first lock: a child forked while another thread holds the
     * locks, even in a single-thread call, must find them reset (so also
     * in fmha_pool_threads and fmha_pool_set_threads) */
    pthread_once(&pool_fork_once, pool_register_fork_handler);
    pthread_mutex_lock(&pool_call_lock);
    pthread_mutex_lock(&pool_lock);
    int have = want > 1 ? pool_grow(want) : 1;
    int threads = have < want ? have : want;
    long spin_ns = atomic_load_explicit(&pool_spin_ns, memory_order_relaxed);
    job_fn = fn;
    job_begin = begin;
    job_end = end;
    job_ctx = ctx;
    job_tasks = n_tasks;
    atomic_store_explicit(&job_next, 0, memory_order_relaxed);
    if (threads > 1) {
        atomic_store_explicit(&pool_busy_workers, (uint64_t)(threads - 1), memory_order_relaxed);
        uint64_t gen = (atomic_load_explicit(&job_word, memory_order_relaxed) >> POOL_THREAD_BITS) + 1;
        /* release: a worker that sees the new word sees the job above */
        atomic_store_explicit(&job_word, gen << POOL_THREAD_BITS | (uint64_t)threads,
                              memory_order_release);
        if (pool_sleepers > 0) pthread_cond_broadcast(&pool_wake);
    }
    pthread_mutex_unlock(&pool_lock);

    pool_run_tasks(0);

    if (threads > 1 && !pool_spin_until(&pool_busy_workers, 0, 1, spin_ns)) {
        pthread_mutex_lock(&pool_lock);
        while (atomic_load_explicit(&pool_busy_workers, memory_order_acquire) > 0)
            pthread_cond_wait(&pool_done, &pool_lock);
        pthread_mutex_unlock(&pool_lock);
    }
    pthread_mutex_unlock(&pool_call_lock);
    return have < want ? -1 : 0;
}
