/* test_mpi_ring.c: ring attention (fmha_mpi.h) on every rank of
 * MPI_COMM_WORLD (ctest runs it with mpirun -np 2 and -np 4). Every rank
 * builds the same global Q, K, V, dO from a fixed seed, runs single-process
 * fmha on the whole sequence, and compares its own slice of the ring's
 * results with it:
 *   O rel L2 <= 1e-5, lse |diff| <= 1e-5 (1 + |lse|), dQ dK dV rel L2 <= 2e-5
 * for plain, causal, GQA (Hq 4, Hkv 2), Dv != D, an uneven last slice and
 * the zigzag layout (global tensors reordered by fmha_ring_zigzag_permute),
 * inputs read through the global tensors' strides and outputs written in a
 * [B, H, S, D] layout. Errors: one rank disagreeing (head dim, causal), slices
 * of a wrong length, a NULL on one rank, bf16, MPI_COMM_NULL, zigzag with
 * odd or unequal slices, the layout differing on one rank, an unknown
 * layout: the same status on every rank, outputs untouched. Exit status agreed over ranks. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmha_mpi.h"

/* Open MPI unloads its components (dlclose) at MPI_Finalize; under ASan the
 * allocations they keep until exit would then be reported from an unknown
 * module that no suppression can name. Keeping them loaded lets
 * tests/mpi/lsan.supp name them (leak:mca_). Test only. */
int dlclose(void *handle);
int dlclose(void *handle) {
    (void)handle;
    return 0;
}

static int rank, nranks, failures, checks;

static void check(int cond, const char *what) {
    checks++;
    if (!cond) {
        failures++;
        fprintf(stderr, "rank %d FAIL: %s\n", rank, what);
    }
}

static uint64_t rng_state;
static float next_uniform(void) {   /* xorshift64*, in [-1, 1) */
    rng_state ^= rng_state >> 12, rng_state ^= rng_state << 25, rng_state ^= rng_state >> 27;
    return (float)((double)((rng_state * 2685821657736338717ull) >> 11) / 9007199254740992.0 * 2 - 1);
}
static float *new_random(size_t n) {
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = next_uniform();
    return x;
}
static float *new_filled(size_t n, float value) {
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = value;
    return x;
}

/* rel L2 of a local slice (strides st, [B, L, H, D]) against rows
 * [s0, s0 + L) of a global contiguous [B, N, H, D] tensor */
static double slice_rel_l2(const float *x, const int64_t st[4], const float *g, int64_t B, int64_t N,
                           int64_t s0, int64_t L, int64_t H, int64_t D) {
    double num = 0, den = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < L; s++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < D; d++) {
                    const double r = g[((b * N + s0 + s) * H + h) * D + d];
                    const double e = x[b * st[0] + s * st[1] + h * st[2] + d * st[3]] - r;
                    num += e * e, den += r * r;
                }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void bhsd(int64_t st[4], int64_t L, int64_t H, int64_t D) {
    st[0] = H * L * D, st[1] = D, st[2] = L * D, st[3] = 1;
}

typedef struct {
    const char *name;
    int64_t B, Hq, Hkv, D, Dv, L, last;
    fmha_causal causal;
    fmha_ring_layout layout;
} ring_case;

/* Zigzag: a global tensor [B, N, H, D] (contiguous) replaced by its zigzag
 * order; checks that the inverse gives the original back. */
static void to_zigzag(float **x, int64_t B, int64_t N, int64_t H, int64_t D) {
    const int64_t st[4] = {N * H * D, H * D, D, 1};
    const size_t n = (size_t)(B * N * H * D);
    float *z = malloc(n * sizeof(float)), *back = malloc(n * sizeof(float));
    fmha_status s1 = fmha_ring_zigzag_permute(B, N, H, D, st, nranks, 1, *x, z);
    fmha_status s2 = fmha_ring_zigzag_permute(B, N, H, D, st, nranks, 0, z, back);
    check(s1 == FMHA_OK && s2 == FMHA_OK && !memcmp(back, *x, n * sizeof(float)), "zigzag permute round trip");
    free(back), free(*x);
    *x = z;
}

static void run_case(const ring_case *c) {
    const int64_t P = nranks, N = c->L * (P - 1) + c->last;
    const int64_t my_len = rank == P - 1 ? c->last : c->L, s0 = rank * c->L;
    rng_state = 0x9e3779b97f4a7c15ull ^ (uint64_t)(c->B * 131 + c->Hq * 17 + c->D + c->last * 7 + c->causal);
    const size_t nq = (size_t)(c->B * N * c->Hq * c->D), nk = (size_t)(c->B * N * c->Hkv * c->D);
    const size_t nv = (size_t)(c->B * N * c->Hkv * c->Dv), no = (size_t)(c->B * N * c->Hq * c->Dv);
    float *q = new_random(nq), *k = new_random(nk), *v = new_random(nv), *d_o = new_random(no);
    /* single process on the whole sequence */
    fmha_problem g;
    fmha_problem_init(&g, c->B, c->Hq, c->Hkv, N, N, c->D, c->Dv, FMHA_LAYOUT_BSHD);
    g.causal = c->causal;
    float *go = malloc(no * sizeof(float)), *glse = malloc((size_t)(c->B * c->Hq * N) * sizeof(float));
    float *gdq = malloc(nq * sizeof(float)), *gdk = malloc(nk * sizeof(float)), *gdv = malloc(nv * sizeof(float));
    check(fmha_forward_backward(&g, q, k, v, d_o, go, glse, gdq, gdk, gdv, NULL) == FMHA_OK, "single-process run");
    if (c->layout == FMHA_RING_ZIGZAG) {
        to_zigzag(&q, c->B, N, c->Hq, c->D), to_zigzag(&k, c->B, N, c->Hkv, c->D);
        to_zigzag(&v, c->B, N, c->Hkv, c->Dv), to_zigzag(&d_o, c->B, N, c->Hq, c->Dv);
        to_zigzag(&go, c->B, N, c->Hq, c->Dv), to_zigzag(&glse, c->B * c->Hq, N, 1, 1);
        to_zigzag(&gdq, c->B, N, c->Hq, c->D), to_zigzag(&gdk, c->B, N, c->Hkv, c->D);
        to_zigzag(&gdv, c->B, N, c->Hkv, c->Dv);
    }

    /* the local slice: inputs through the global strides, outputs [B, H, L, D] */
    fmha_problem p = g;
    p.seq_q = p.seq_kv = my_len;
    const int64_t off_q = s0 * c->Hq * c->D, off_k = s0 * c->Hkv * c->D, off_v = s0 * c->Hkv * c->Dv,
                  off_o = s0 * c->Hq * c->Dv;
    int64_t ost[4], qst[4], kst[4], vst[4];
    bhsd(ost, my_len, c->Hq, c->Dv), bhsd(qst, my_len, c->Hq, c->D), bhsd(kst, my_len, c->Hkv, c->D),
        bhsd(vst, my_len, c->Hkv, c->Dv);
    memcpy(p.o_strides, ost, sizeof ost);
    const size_t lq = (size_t)(c->B * my_len * c->Hq), lkv = (size_t)(c->B * my_len * c->Hkv);
    float *o = new_filled(lq * (size_t)c->Dv, NAN), *lse = new_filled(lq, NAN);
    fmha_status s = fmha_ring_forward(&p, MPI_COMM_WORLD, c->layout, q + off_q, k + off_k, v + off_v, o, lse);
    char what[200];
    double e_o = slice_rel_l2(o, ost, go, c->B, N, s0, my_len, c->Hq, c->Dv), e_l = 0;
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->Hq; h++)
            for (int64_t i = 0; i < my_len; i++) {
                const double r = glse[(b * c->Hq + h) * N + s0 + i];
                const double e = fabs(lse[(b * c->Hq + h) * my_len + i] - r) / (1 + fabs(r));
                e_l = e > e_l || isnan(e) ? e : e_l;
            }
    snprintf(what, sizeof what, "%s forward: status %d, O rel L2 %.3g, lse %.3g", c->name, s, e_o, e_l);
    check(s == FMHA_OK && e_o <= 1e-5 && e_l <= 1e-5, what);

    /* backward: o and d_o in the local [B, H, L, Dv] layout */
    float *d_ol = malloc(lq * (size_t)c->Dv * sizeof(float));
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t i = 0; i < my_len; i++)
            for (int64_t h = 0; h < c->Hq; h++)
                for (int64_t d = 0; d < c->Dv; d++)
                    d_ol[b * ost[0] + i * ost[1] + h * ost[2] + d] = d_o[off_o + ((b * N + i) * c->Hq + h) * c->Dv + d];
    fmha_problem pb = p;
    memcpy(pb.q_strides, qst, sizeof qst), memcpy(pb.k_strides, kst, sizeof kst), memcpy(pb.v_strides, vst, sizeof vst);
    /* inputs q, k, v copied to the [B, H, L, D] layout the gradients use */
    float *ql = malloc(lq * (size_t)c->D * sizeof(float)), *kl = malloc(lkv * (size_t)c->D * sizeof(float));
    float *vl = malloc(lkv * (size_t)c->Dv * sizeof(float));
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t i = 0; i < my_len; i++) {
            for (int64_t h = 0; h < c->Hq; h++)
                for (int64_t d = 0; d < c->D; d++)
                    ql[b * qst[0] + i * qst[1] + h * qst[2] + d] = q[off_q + ((b * N + i) * c->Hq + h) * c->D + d];
            for (int64_t h = 0; h < c->Hkv; h++) {
                for (int64_t d = 0; d < c->D; d++)
                    kl[b * kst[0] + i * kst[1] + h * kst[2] + d] = k[off_k + ((b * N + i) * c->Hkv + h) * c->D + d];
                for (int64_t d = 0; d < c->Dv; d++)
                    vl[b * vst[0] + i * vst[1] + h * vst[2] + d] = v[off_v + ((b * N + i) * c->Hkv + h) * c->Dv + d];
            }
        }
    float *dq = new_filled(lq * (size_t)c->D, NAN), *dk = new_filled(lkv * (size_t)c->D, NAN);
    float *dv = new_filled(lkv * (size_t)c->Dv, NAN);
    s = fmha_ring_backward(&pb, MPI_COMM_WORLD, c->layout, ql, kl, vl, o, d_ol, lse, dq, dk, dv);
    const double e_dq = slice_rel_l2(dq, qst, gdq, c->B, N, s0, my_len, c->Hq, c->D);
    const double e_dk = slice_rel_l2(dk, kst, gdk, c->B, N, s0, my_len, c->Hkv, c->D);
    const double e_dv = slice_rel_l2(dv, vst, gdv, c->B, N, s0, my_len, c->Hkv, c->Dv);
    snprintf(what, sizeof what, "%s backward: status %d, rel L2 dQ %.3g dK %.3g dV %.3g", c->name, s, e_dq, e_dk, e_dv);
    check(s == FMHA_OK && e_dq <= 2e-5 && e_dk <= 2e-5 && e_dv <= 2e-5, what);
    if (rank == 0) printf("%s\n", what);

    free(q), free(k), free(v), free(d_o), free(go), free(glse), free(gdq), free(gdk), free(gdv);
    free(o), free(lse), free(d_ol), free(ql), free(kl), free(vl), free(dq), free(dk), free(dv);
}

/* Runs forward and backward with problem p on this rank; both must give
 * `want` and leave the outputs untouched. */
static void expect_error(const char *name, fmha_problem *p, MPI_Comm comm, fmha_ring_layout layout, int null_o,
                         fmha_status want) {
    const size_t n = 2 * 64 * 4 * 64;   /* room for any problem below */
    float *q = new_filled(n, 0.5f), *out = new_filled(n, 7.f), *lse = new_filled(n, 7.f);
    float *g1 = new_filled(n, 7.f), *g2 = new_filled(n, 7.f), *g3 = new_filled(n, 7.f);
    fmha_status f = fmha_ring_forward(p, comm, layout, q, q, q, null_o ? NULL : out, lse);
    fmha_status b = fmha_ring_backward(p, comm, layout, q, q, q, q, q, q, g1, g2, null_o ? NULL : g3);
    const char *msg = fmha_ring_last_error_message();
    char named[240];
    snprintf(named, sizeof named, "error %s: the refusal says why (\"%s\")", name, msg);
    check(msg[0] != '\0', named);
    int untouched = 1;
    for (size_t i = 0; i < n; i++) untouched &= out[i] == 7.f && lse[i] == 7.f && g1[i] == 7.f && g2[i] == 7.f && g3[i] == 7.f;
    char what[200];
    snprintf(what, sizeof what, "error %s: forward %d, backward %d, want %d (%s); outputs %s", name, f, b, want,
             fmha_status_string(want), untouched ? "untouched" : "WRITTEN");
    check(f == want && b == want && untouched, what);
    free(q), free(out), free(lse), free(g1), free(g2), free(g3);
}

static void test_errors(void) {
    fmha_problem p;
    const int last = nranks - 1;
    fmha_problem_init(&p, 2, 4, 2, 16, 16, 32, 32, FMHA_LAYOUT_BSHD);
    if (rank == 1) p.head_dim = 16;
    expect_error("head dim on rank 1", &p, MPI_COMM_WORLD, FMHA_RING_CONTIGUOUS, 0, FMHA_ERR_BAD_SIZE);

    fmha_problem_init(&p, 2, 4, 2, 16, 16, 32, 32, FMHA_LAYOUT_BSHD);
    if (rank == last) p.causal = FMHA_CAUSAL_TOP_LEFT;
    expect_error("causal on the last rank", &p, MPI_COMM_WORLD, FMHA_RING_CONTIGUOUS, 0, FMHA_ERR_BAD_SIZE);

    const int64_t len = rank == last ? 20 : 16;   /* last slice longer */
    fmha_problem_init(&p, 2, 4, 2, len, len, 32, 32, FMHA_LAYOUT_BSHD);
    expect_error("last slice longer", &p, MPI_COMM_WORLD, FMHA_RING_CONTIGUOUS, 0, FMHA_ERR_BAD_SIZE);

    const int64_t len0 = rank == 0 ? 12 : 16;     /* a slice before the last shorter */
    fmha_problem_init(&p, 2, 4, 2, len0, len0, 32, 32, FMHA_LAYOUT_BSHD);
    expect_error("first slice shorter", &p, MPI_COMM_WORLD, FMHA_RING_CONTIGUOUS, 0, FMHA_ERR_BAD_SIZE);

    fmha_problem_init(&p, 2, 4, 2, 16, 16, 32, 32, FMHA_LAYOUT_BSHD);
    expect_error("NULL output on rank 0", &p, MPI_COMM_WORLD, FMHA_RING_CONTIGUOUS, rank == 0, FMHA_ERR_NULL_POINTER);

    fmha_problem_init(&p, 2, 4, 2, 16, 16, 32, 32, FMHA_LAYOUT_BSHD);
    if (rank == last) p.heads_kv = 3;             /* invalid locally: 4 % 3 */
    expect_error("bad heads on the last rank", &p, MPI_COMM_WORLD, FMHA_RING_CONTIGUOUS, 0, FMHA_ERR_BAD_HEADS);

    fmha_problem_init(&p, 2, 4, 2, 16, 16, 32, 32, FMHA_LAYOUT_BSHD);
    p.dtype = FMHA_DTYPE_BF16;
    expect_error("bf16", &p, MPI_COMM_WORLD, FMHA_RING_CONTIGUOUS, 0, FMHA_ERR_UNSUPPORTED);

    fmha_problem_init(&p, 2, 4, 2, 16, 16, 32, 32, FMHA_LAYOUT_BSHD);
    p.kv_dtype = FMHA_KV_DTYPE_BF16; /* the ring copies K and V as float32 */
    expect_error("a bf16 cache beside float32 queries", &p, MPI_COMM_WORLD, FMHA_RING_CONTIGUOUS, 0,
                 FMHA_ERR_UNSUPPORTED);

    fmha_problem_init(&p, 2, 4, 2, 16, 8, 32, 32, FMHA_LAYOUT_BSHD);
    expect_error("seq_q != seq_kv", &p, MPI_COMM_WORLD, FMHA_RING_CONTIGUOUS, 0, FMHA_ERR_BAD_SIZE);

    fmha_problem_init(&p, 2, 4, 2, 16, 16, 32, 32, FMHA_LAYOUT_BSHD);
    fmha_problem_init(&p, 2, 4, 2, 15, 15, 32, 32, FMHA_LAYOUT_BSHD);
    expect_error("zigzag odd length", &p, MPI_COMM_WORLD, FMHA_RING_ZIGZAG, 0, FMHA_ERR_BAD_SIZE);
    const int64_t zlen = rank == last ? 8 : 16;
    fmha_problem_init(&p, 2, 4, 2, zlen, zlen, 32, 32, FMHA_LAYOUT_BSHD);
    expect_error("zigzag uneven slices", &p, MPI_COMM_WORLD, FMHA_RING_ZIGZAG, 0, FMHA_ERR_BAD_SIZE);
    fmha_problem_init(&p, 2, 4, 2, 16, 16, 32, 32, FMHA_LAYOUT_BSHD);
    expect_error("zigzag on rank 1 only", &p, MPI_COMM_WORLD, rank == 1 ? FMHA_RING_ZIGZAG : FMHA_RING_CONTIGUOUS, 0,
                 FMHA_ERR_BAD_SIZE);
    fmha_problem_init(&p, 2, 4, 2, 16, 16, 32, 32, FMHA_LAYOUT_BSHD);
    expect_error("layout 7", &p, MPI_COMM_WORLD, (fmha_ring_layout)7, 0, FMHA_ERR_BAD_OPTION);
    fmha_problem_init(&p, 2, 4, 2, 16, 16, 32, 32, FMHA_LAYOUT_BSHD);
    expect_error("MPI_COMM_NULL", &p, MPI_COMM_NULL, FMHA_RING_CONTIGUOUS, 0, FMHA_ERR_BAD_OPTION);
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    const ring_case cases[] = {
        {"plain", 2, 2, 2, 32, 32, 24, 24, FMHA_CAUSAL_NONE, FMHA_RING_CONTIGUOUS},
        {"causal", 2, 2, 2, 32, 32, 24, 24, FMHA_CAUSAL_TOP_LEFT, FMHA_RING_CONTIGUOUS},
        {"causal bottom-right", 1, 2, 2, 64, 64, 40, 40, FMHA_CAUSAL_BOTTOM_RIGHT, FMHA_RING_CONTIGUOUS},
        {"GQA 4/2 causal", 2, 4, 2, 32, 32, 24, 24, FMHA_CAUSAL_TOP_LEFT, FMHA_RING_CONTIGUOUS},
        {"Dv 16 != D 48", 1, 2, 1, 48, 16, 17, 17, FMHA_CAUSAL_NONE, FMHA_RING_CONTIGUOUS},
        {"uneven last slice", 2, 4, 2, 32, 32, 24, 9, FMHA_CAUSAL_NONE, FMHA_RING_CONTIGUOUS},
        {"uneven last slice causal", 2, 4, 2, 32, 32, 24, 1, FMHA_CAUSAL_TOP_LEFT, FMHA_RING_CONTIGUOUS},
        {"zigzag", 2, 2, 2, 32, 32, 24, 24, FMHA_CAUSAL_NONE, FMHA_RING_ZIGZAG},
        {"zigzag causal", 2, 2, 2, 32, 32, 24, 24, FMHA_CAUSAL_TOP_LEFT, FMHA_RING_ZIGZAG},
        {"zigzag GQA 4/2 causal", 1, 4, 2, 64, 32, 10, 10, FMHA_CAUSAL_BOTTOM_RIGHT, FMHA_RING_ZIGZAG},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) run_case(&cases[i]);
    test_errors();
    const int64_t st[4] = {64, 8, 4, 1}, neg[4] = {64, 8, -4, 1};
    float x[128] = {0}, y[128];
    check(fmha_ring_zigzag_permute(2, 8, 2, 4, st, 3, 1, x, y) == FMHA_ERR_BAD_SIZE &&
              fmha_ring_zigzag_permute(2, 8, 2, 4, st, 2, 1, NULL, y) == FMHA_ERR_NULL_POINTER &&
              fmha_ring_zigzag_permute(2, 8, 2, 4, neg, 2, 1, x, y) == FMHA_ERR_BAD_STRIDE,
          "zigzag permute errors (S not a multiple of 2P, NULL, negative stride)");
    check(!strcmp(fmha_ring_last_error_message(), "st[2] must not be negative, got -4"),
          "zigzag permute: the negative stride is named");
    int all = 0;
    MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) printf("%d ranks: %d checks per rank, %d failed in all\n", nranks, checks, all);
    MPI_Finalize();
    return all ? 1 : 0;
}
