/* ring_bench.c (fmha-ring-bench): measures ring attention under mpirun:
 * the time of fmha_ring_forward (and backward) on a global sequence split
 * over the ranks, each rank's peak RSS, the time of one block alone
 * (fmha_forward of a slice against a slice), and MPI point-to-point
 * latency and bandwidth between ranks 0 and 1 for the block's size. The
 * numbers feed docs/ring.md.
 *   mpirun -np P fmha-ring-bench S [B H D causal(0/1) bwd(0/1) zigzag(0/1)] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "fmha_mpi.h"

static float *random_buffer(size_t n, unsigned seed) {
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)(seed >> 8) / 16777216.f - 0.5f;
    }
    return x;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, P;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &P);
    const int64_t S = argc > 1 ? atoll(argv[1]) : 16384, B = argc > 2 ? atoll(argv[2]) : 1;
    const int64_t H = argc > 3 ? atoll(argv[3]) : 8, D = argc > 4 ? atoll(argv[4]) : 64;
    const int causal = argc > 5 && atoi(argv[5]), bwd = argc > 6 && atoi(argv[6]), zig = argc > 7 && atoi(argv[7]);
    const int64_t L = S / P;   /* S a multiple of P (of 2P for zigzag) */
    const fmha_ring_layout layout = zig ? FMHA_RING_ZIGZAG : FMHA_RING_CONTIGUOUS;
    fmha_problem p;
    fmha_problem_init(&p, B, H, H, L, L, D, D, FMHA_LAYOUT_BSHD);
    p.causal = causal ? FMHA_CAUSAL_TOP_LEFT : FMHA_CAUSAL_NONE;
    const size_t n = (size_t)(B * L * H * D);
    float *q = random_buffer(n, 1u + (unsigned)rank), *k = random_buffer(n, 99u + (unsigned)rank);
    float *v = random_buffer(n, 7u + (unsigned)rank), *o = malloc(n * sizeof(float));
    float *lse = malloc((size_t)(B * H * L) * sizeof(float));
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    fmha_status st = fmha_ring_forward(&p, MPI_COMM_WORLD, layout, q, k, v, o, lse);
    double t_fwd = MPI_Wtime() - t0, t_bwd = 0;
    if (bwd && st == FMHA_OK) {
        float *d_o = random_buffer(n, 5u + (unsigned)rank), *dq = malloc(n * sizeof(float));
        float *dk = malloc(n * sizeof(float)), *dv = malloc(n * sizeof(float));
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        st = fmha_ring_backward(&p, MPI_COMM_WORLD, layout, q, k, v, o, d_o, lse, dq, dk, dv);
        t_bwd = MPI_Wtime() - t0;
        free(d_o), free(dq), free(dk), free(dv);
    }
    double t[2] = {t_fwd, t_bwd}, tmax[2];
    MPI_Reduce(t, tmax, 2, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    long rss = ru.ru_maxrss, *all_rss = malloc((size_t)P * sizeof(long));
    MPI_Gather(&rss, 1, MPI_LONG, all_rss, 1, MPI_LONG, 0, MPI_COMM_WORLD);

    /* one block alone: this rank's queries against its own keys, unmasked */
    fmha_problem pb = p;
    pb.causal = FMHA_CAUSAL_NONE;
    t0 = MPI_Wtime();
    fmha_forward(&pb, q, k, v, o, lse, NULL, 0);
    const double t_block = MPI_Wtime() - t0;

    /* point to point between ranks 0 and 1: 8-byte latency, block bandwidth */
    double lat = 0, bw = 0;
    const size_t kv_bytes = 2 * n * sizeof(float);
    if (P > 1 && rank < 2) {
        char *msg = malloc(kv_bytes);
        memset(msg, 1, kv_bytes);
        const int other = 1 - rank, reps = 200;
        t0 = MPI_Wtime();
        for (int i = 0; i < reps; i++) {
            if (rank == 0) {
                MPI_Send(msg, 8, MPI_CHAR, other, 1, MPI_COMM_WORLD);
                MPI_Recv(msg, 8, MPI_CHAR, other, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else {
                MPI_Recv(msg, 8, MPI_CHAR, other, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(msg, 8, MPI_CHAR, other, 1, MPI_COMM_WORLD);
            }
        }
        lat = (MPI_Wtime() - t0) / (2 * reps);
        t0 = MPI_Wtime();
        for (int i = 0; i < 5; i++) {
            if (rank == 0) {
                MPI_Send(msg, (int)kv_bytes, MPI_CHAR, other, 2, MPI_COMM_WORLD);
                MPI_Recv(msg, 1, MPI_CHAR, other, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            } else {
                MPI_Recv(msg, (int)kv_bytes, MPI_CHAR, other, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(msg, 1, MPI_CHAR, other, 2, MPI_COMM_WORLD);
            }
        }
        bw = 5.0 * (double)kv_bytes / (MPI_Wtime() - t0);
        free(msg);
    }
    if (rank == 0) {
        printf("P=%d S=%lld B=%lld H=%lld D=%lld causal=%d layout=%s threads=%d status=%d\n", P, (long long)S,
               (long long)B, (long long)H, (long long)D, causal, zig ? "zigzag" : "contiguous",
               fmha_get_num_threads(), st);
        printf("ring forward %.3f s%s", tmax[0], bwd ? "" : "\n");
        if (bwd) printf(", backward %.3f s\n", tmax[1]);
        printf("peak RSS per rank (MiB):");
        for (int i = 0; i < P; i++) printf(" %.1f", all_rss[i] / 1024.0);
        printf("\none block (%lld x %lld keys) forward alone: %.4f s\n", (long long)L, (long long)L, t_block);
        if (P > 1)
            printf("MPI 0<->1: latency %.2f us, bandwidth %.2f GB/s (%.1f MiB K|V block)\n", lat * 1e6, bw / 1e9,
                   kv_bytes / 1048576.0);
    }
    free(q), free(k), free(v), free(o), free(lse), free(all_rss);
    MPI_Finalize();
    return st == FMHA_OK ? 0 : 1;
}
