/* pool.h: the persistent thread pool. parallel_for hands task indices
 * 0..n_tasks-1 to the threads (the caller is thread 0) in increasing order
 * through a shared counter; results must not depend on which thread ran a
 * task, only the thread index selects per-thread scratch memory. */
#ifndef FMHA_POOL_H
#define FMHA_POOL_H

#include <stddef.h>

typedef void (*fmha_task_fn)(void *ctx, size_t task, int thread);

/* Threads the next parallel_for will use (>= 1). */
int fmha_pool_threads(void);

/* Runs fn(ctx, task, thread) for every task with up to max_threads threads
 * (thread < max_threads always holds, so callers size scratch by it).
 * Returns 0, or -1 if fewer threads than asked could be created (every task
 * still ran, on the threads there were). Calls from different user threads
 * are serialised. */
int fmha_parallel_for(size_t n_tasks, int max_threads, fmha_task_fn fn, void *ctx);

/* fmha_parallel_for with per-thread set-up and tear-down: each thread that
 * runs a task of the job calls begin() before its first task and end()
 * after its last, on that thread (kernels with thread state: a tile
 * configuration loaded, then released). Either may be NULL. A thread that
 * runs no task calls neither. */
int fmha_parallel_for_hooked(size_t n_tasks, int max_threads, fmha_task_fn fn, void *ctx, void (*begin)(void),
                             void (*end)(void));

/* n > 0 fixes the count, 0 restores the default; -1 for an invalid n. */
int fmha_pool_set_threads(int n);

#endif /* FMHA_POOL_H */
