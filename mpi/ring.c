/* ring.c: ring attention over MPI (fmha_mpi.h). Each rank keeps its query
 * slice and passes K/V blocks to the next rank while it computes on the one
 * in hand; results are combined with fmha_merge (forward) or summed
 * (backward, with the global lse). Only the public fmha API is used. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmha_mpi.h"

enum { TAG_KV = 7101, TAG_DKV = 7102 };

/* What every rank tells the others before the ring starts. */
enum { F_STATUS, F_B, F_HQ, F_HKV, F_D, F_DV, F_DTYPE, F_CAUSAL, F_SCALE, F_LAYOUT, F_LEN, F_COUNT };

typedef struct ring {
    MPI_Comm comm;
    int rank, size;
    int64_t *len, *start;   /* [size] slice lengths and global starts */
    int64_t lmax;
    int zigzag;             /* layout FMHA_RING_ZIGZAG: two chunks per rank */
    int nchunk;             /* chunks per rank: 1 contiguous, 2 zigzag */
    fmha_problem p;         /* the caller's problem, widened to this header's size */
} ring;

/* Copies x [n0, n1, n2, n3] between two stride sets. */
static void copy_strided(const float *src, const int64_t ss[4], float *dst, const int64_t ds[4],
                         const int64_t n[4]) {
    for (int64_t a = 0; a < n[0]; a++)
        for (int64_t b = 0; b < n[1]; b++)
            for (int64_t c = 0; c < n[2]; c++)
                for (int64_t d = 0; d < n[3]; d++)
                    dst[a * ds[0] + b * ds[1] + c * ds[2] + d * ds[3]] =
                        src[a * ss[0] + b * ss[1] + c * ss[2] + d * ss[3]];
}

/* The thread's last failure (fmha_ring_last_error_message). */
static _Thread_local char ring_message[512];

static fmha_status ring_fail(fmha_status st, const char *format, ...) __attribute__((format(printf, 2, 3)));
static fmha_status ring_fail(fmha_status st, const char *format, ...) {
    va_list ap;
    va_start(ap, format);
    vsnprintf(ring_message, sizeof ring_message, format, ap);
    va_end(ap);
    return st;
}

const char *fmha_ring_last_error_message(void) { return ring_message; }

static void bshd_strides(int64_t st[4], int64_t s, int64_t h, int64_t d) {
    st[3] = 1, st[2] = d, st[1] = h * d, st[0] = s * h * d;
}

static fmha_status local_check(const fmha_problem *p, fmha_problem *out, int have_pointers) {
    if (!p || !have_pointers) return ring_fail(FMHA_ERR_NULL_POINTER, "the problem or a tensor pointer is NULL");
    fmha_status s = fmha_problem_check(p); /* struct_size among those the library knows */
    if (s != FMHA_OK) return ring_fail(s, "%s", fmha_last_error_message());
    memset(out, 0, sizeof *out); /* an older problem: its prefix, the rest off */
    memcpy(out, p, p->struct_size);
    out->struct_size = sizeof *out;
    fmha_problem plain;
    fmha_problem_init(&plain, 1, 1, 1, 1, 1, 1, 1, FMHA_LAYOUT_BSHD);
    if (memcmp(&out->masks, &plain.masks, sizeof plain.masks) ||
        memcmp(&out->biases, &plain.biases, sizeof plain.biases) || out->sinks || out->block_table ||
        out->dropout_p != 0 || out->dtype != FMHA_DTYPE_F32 ||
        (out->kv_dtype != FMHA_KV_DTYPE_SAME && out->kv_dtype != FMHA_KV_DTYPE_F32))
        return ring_fail(FMHA_ERR_UNSUPPORTED, "ring attention takes float32 problems with causal masking at most: "
                         "no other mask, bias, sinks, paged cache or dropout");
    if (out->seq_q != out->seq_kv)
        return ring_fail(FMHA_ERR_BAD_SIZE, "seq_q and seq_kv must be equal (one rank's slice), got %lld and %lld",
                         (long long)out->seq_q, (long long)out->seq_kv);
    out->alignment = FMHA_ALIGN_CAUSAL; /* Sq = Skv and no window or bias: every alignment is the same */
    return FMHA_OK;
}

/* Elements of one travelling K|V (or dK|dV) block of `len` keys. */
static int64_t block_elems(const ring *r, int64_t len) {
    return r->p.batch * len * r->p.heads_kv * (r->p.head_dim + r->p.head_dim_v);
}

static void ring_free(ring *r) {
    free(r->len), free(r->start);
    r->len = r->start = NULL;
}

/* The collective check: the same status on every rank, blocks too large
 * for one MPI message included. On success r->len and r->start are set
 * (freed by ring_free); on failure nothing is left to free. */
static fmha_status ring_setup(ring *r, const fmha_problem *p, MPI_Comm comm, fmha_ring_layout layout,
                              int have_pointers) {
    memset(r, 0, sizeof *r);
    r->zigzag = layout == FMHA_RING_ZIGZAG;
    r->nchunk = r->zigzag ? 2 : 1;
    int inter = 0;
    if (comm == MPI_COMM_NULL || MPI_Comm_test_inter(comm, &inter) != MPI_SUCCESS || inter)
        return ring_fail(FMHA_ERR_BAD_OPTION, "comm must be an intracommunicator");
    r->comm = comm;
    MPI_Comm_rank(comm, &r->rank);
    MPI_Comm_size(comm, &r->size);
    int64_t mine[F_COUNT] = {0};
    mine[F_STATUS] = local_check(p, &r->p, have_pointers);
    if (mine[F_STATUS] == FMHA_OK && layout != FMHA_RING_CONTIGUOUS && layout != FMHA_RING_ZIGZAG)
        mine[F_STATUS] = ring_fail(FMHA_ERR_BAD_OPTION, "layout must be FMHA_RING_CONTIGUOUS or _ZIGZAG, got %d",
                                   (int)layout);
    if (mine[F_STATUS] == FMHA_OK && r->zigzag && r->p.seq_q % 2)
        mine[F_STATUS] = ring_fail(FMHA_ERR_BAD_SIZE, "a zigzag slice must have an even length, got %lld",
                                   (long long)r->p.seq_q);
    if (mine[F_STATUS] == FMHA_OK) {
        const fmha_problem *q = &r->p;
        uint32_t scale_bits;
        memcpy(&scale_bits, &q->scale, sizeof scale_bits);
        const int64_t f[F_COUNT] = {0, q->batch, q->heads_q, q->heads_kv, q->head_dim, q->head_dim_v,
                                    q->dtype, q->causal != FMHA_CAUSAL_NONE, scale_bits, layout, q->seq_q};
        memcpy(mine, f, sizeof f);
    }
    int64_t *all = malloc((size_t)r->size * F_COUNT * sizeof(int64_t));
    r->len = malloc((size_t)r->size * sizeof(int64_t));
    r->start = malloc((size_t)r->size * sizeof(int64_t));
    /* allocation failures are agreed on first, so every rank makes the
     * same collective calls */
    int64_t oom = !all || !r->len || !r->start, any_oom = 0, status = 0;
    MPI_Allreduce(&oom, &any_oom, 1, MPI_INT64_T, MPI_MAX, comm);
    if (any_oom) {
        free(all);
        ring_free(r);
        return ring_fail(FMHA_ERR_OUT_OF_MEMORY, "a rank could not allocate the ring's tables");
    }
    MPI_Allgather(mine, F_COUNT, MPI_INT64_T, all, F_COUNT, MPI_INT64_T, comm);
    for (int i = 0; i < r->size && !status; i++) {
        status = all[i * F_COUNT + F_STATUS];
        if (status && i != r->rank) ring_fail((fmha_status)status, "rank %d refused the call (status %d)", i, (int)status);
    }
    if (!status) {
        const int last = r->size - 1;
        for (int i = 0; i < r->size && !status; i++) {
            for (int f = F_B; f < F_LEN; f++)
                if (all[i * F_COUNT + f] != all[f])
                    status = ring_fail(FMHA_ERR_BAD_SIZE, "rank %d's problem differs from rank 0's (sizes, dtype, "
                                       "causal, scale or layout)", i);
            const int64_t len = all[i * F_COUNT + F_LEN];
            /* zigzag: every slice the same length */
            if (!status && (i < last || r->zigzag ? len != all[F_LEN] : len > all[F_LEN]))
                status = ring_fail(FMHA_ERR_BAD_SIZE, "rank %d's slice of %lld keys: every slice but the last must "
                                   "have rank 0's length %lld (zigzag: all of them), the last at most that",
                                   i, (long long)len, (long long)all[F_LEN]);
        }
    }
    if (!status) {
        int64_t at = 0;
        for (int i = 0; i < r->size; i++) {
            r->len[i] = all[i * F_COUNT + F_LEN];
            r->start[i] = at;
            at += r->len[i];
        }
        r->lmax = r->len[0];
    }
    free(all);
    /* every rank has the same sizes now, so this answer is agreed too */
    if (!status && block_elems(r, r->lmax) > INT32_MAX)
        status = ring_fail(FMHA_ERR_UNSUPPORTED, "a travelling K|V block of %lld elements exceeds one MPI message "
                           "(2^31 - 1)", (long long)block_elems(r, r->lmax));
    if (status) ring_free(r);
    return (fmha_status)status;
}

/* Agrees on a status over the ring (the largest code). */
static fmha_status agree(const ring *r, fmha_status s) {
    int mine = (int)s, all = 0;
    MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MAX, r->comm);
    return (fmha_status)all;
}

/* Chunks: rank rk holds nchunk chunks of len[rk] / nchunk tokens; their
 * places among the global chunks (contiguous: rk; zigzag: rk, 2P-1-rk). */
static int64_t chunk_len(const ring *r, int rk) { return r->len[rk] / r->nchunk; }
static int64_t chunk_place(const ring *r, int rk, int i) { return i ? 2 * (int64_t)r->size - 1 - rk : rk; }

/* The problem of this rank's query chunk qi against key chunk kj of rank
 * src's block: views into the contiguous [B, S, H, D] buffers (q, o, dO
 * local; K|V the block). Causal: a chunk pair on the diagonal is causal
 * top-left, a key chunk before the query chunk unmasked, one after it
 * skipped (returns 0). */
static int pair_problem(const ring *r, int src, int qi, int kj, fmha_problem *pb) {
    const int causal = r->p.causal != FMHA_CAUSAL_NONE;
    const int64_t a = chunk_place(r, r->rank, qi), b = chunk_place(r, src, kj);
    if (causal && b > a) return 0;
    *pb = r->p;
    const int64_t S = r->p.seq_q, L = r->len[src], Hq = r->p.heads_q, Hkv = r->p.heads_kv;
    pb->seq_q = chunk_len(r, r->rank);
    pb->seq_kv = chunk_len(r, src);
    pb->causal = causal && a == b ? FMHA_CAUSAL_TOP_LEFT : FMHA_CAUSAL_NONE;
    bshd_strides(pb->q_strides, S, Hq, r->p.head_dim);
    bshd_strides(pb->k_strides, L, Hkv, r->p.head_dim);
    bshd_strides(pb->v_strides, L, Hkv, r->p.head_dim_v);
    bshd_strides(pb->o_strides, S, Hq, r->p.head_dim_v);
    return 1;
}

/* dst[b, s0 + s, :] += src[b, s0 + s, :] for s < rows, both [B, S, width]. */
static void add_rows(float *dst, const float *src, int64_t B, int64_t S, int64_t s0, int64_t rows,
                     int64_t width) {
    for (int64_t b = 0; b < B; b++) {
        const int64_t at = (b * S + s0) * width;
        for (int64_t i = 0; i < rows * width; i++) dst[at + i] += src[at + i];
    }
}

/* Copies this rank's K and V (caller strides) into a travelling block
 * (to_block) or a block back into them. */
static void kv_block_copy(const ring *r, int to_block, float *k, float *v, float *blk) {
    const fmha_problem *p = &r->p;
    const int64_t L = p->seq_kv;
    int64_t kst[4], vst[4];
    bshd_strides(kst, L, p->heads_kv, p->head_dim);
    bshd_strides(vst, L, p->heads_kv, p->head_dim_v);
    const int64_t nk[4] = {p->batch, L, p->heads_kv, p->head_dim};
    const int64_t nv[4] = {p->batch, L, p->heads_kv, p->head_dim_v};
    float *blk_v = blk + p->batch * L * p->heads_kv * p->head_dim;
    if (to_block) {
        copy_strided(k, p->k_strides, blk, kst, nk);
        copy_strided(v, p->v_strides, blk_v, vst, nv);
    } else {
        copy_strided(blk, kst, k, p->k_strides, nk);
        copy_strided(blk_v, vst, v, p->v_strides, nv);
    }
}

/* Posts the receive of the next block from the left and the send of the
 * block in hand to the right. */
static void exchange(const ring *r, int tag, float *recv_buf, int64_t recv_len, const float *send_buf,
                     int64_t send_len, MPI_Request req[2]) {
    const int left = (r->rank + r->size - 1) % r->size, right = (r->rank + 1) % r->size;
    MPI_Irecv(recv_buf, (int)block_elems(r, recv_len), MPI_FLOAT, left, tag, r->comm, &req[0]);
    MPI_Isend(send_buf, (int)block_elems(r, send_len), MPI_FLOAT, right, tag, r->comm, &req[1]);
}

/* Allocates n float buffers of the given element counts, all or none;
 * the answer is agreed over the ring. On failure the ring is freed too
 * (ring_free), so the caller only returns the status. */
static fmha_status alloc_all(ring *r, int n, float **buf, const int64_t *elems) {
    int ok = 1;
    for (int i = 0; i < n; i++) ok &= (buf[i] = malloc((size_t)elems[i] * sizeof(float) + 1)) != NULL;
    fmha_status s = agree(r, ok ? FMHA_OK : FMHA_ERR_OUT_OF_MEMORY);
    if (s != FMHA_OK) {
        ring_fail(s, "a rank could not allocate its ring buffers");
        for (int i = 0; i < n; i++) free(buf[i]), buf[i] = NULL;
        ring_free(r);
    }
    return s;
}

fmha_status fmha_ring_forward(const fmha_problem *p, MPI_Comm comm, fmha_ring_layout layout,
                              const void *q, const void *k, const void *v, void *o, float *lse) {
    ring r;
    ring_message[0] = '\0';
    fmha_status st = ring_setup(&r, p, comm, layout, q && k && v && o);
    if (st != FMHA_OK) return st;
    const fmha_problem *lp = &r.p;
    const int64_t B = lp->batch, S = lp->seq_q, Hq = lp->heads_q, Hkv = lp->heads_kv, D = lp->head_dim,
                  Dv = lp->head_dim_v, C = chunk_len(&r, r.rank);
    /* qc [B, S, Hq, D], kv[2] travelling K|V [B, L, Hkv, D] + [B, L, Hkv, Dv],
     * per query chunk: oacc [B, C, Hq, Dv], lacc [B, Hq, C]; one pair's
     * result oblk [B, C, Hq, Dv], lblk [B, Hq, C] */
    enum { QC, KV0, KV1, OACC0, OACC1, LACC0, LACC1, OBLK, LBLK, NBUF };
    float *buf[NBUF];
    const int64_t elems[NBUF] = {B * S * Hq * D, block_elems(&r, r.lmax), block_elems(&r, r.lmax),
                                 B * C * Hq * Dv, B * C * Hq * Dv, B * Hq * C, B * Hq * C,
                                 B * C * Hq * Dv, B * Hq * C};
    st = alloc_all(&r, NBUF, buf, elems);
    if (st != FMHA_OK) return st;
    int64_t cst[4], ost[4];
    bshd_strides(cst, S, Hq, D);
    bshd_strides(ost, C, Hq, Dv);
    const int64_t nq[4] = {B, S, Hq, D};
    copy_strided(q, lp->q_strides, buf[QC], cst, nq);
    kv_block_copy(&r, 1, (float *)k, (float *)v, buf[KV0]);

    fmha_status run = FMHA_OK;
    const int P = r.size;
    int have[2] = {0, 0};
    for (int t = 0; t < P; t++) {
        const int src = (r.rank - t + P) % P, next = (src + P - 1) % P;
        float *cur = buf[KV0 + (t & 1)], *nxt = buf[KV0 + ((t + 1) & 1)];
        MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
        if (t < P - 1) exchange(&r, TAG_KV, nxt, r.len[next], cur, r.len[src], req);
        const int64_t L = r.len[src], Lc = chunk_len(&r, src);
        for (int qi = 0; qi < r.nchunk; qi++)
            for (int kj = 0; kj < r.nchunk; kj++) {
                fmha_problem pb;
                if (run != FMHA_OK || !pair_problem(&r, src, qi, kj, &pb)) continue;
                bshd_strides(pb.o_strides, C, Hq, Dv);
                const float *qv = buf[QC] + qi * C * Hq * D, *kb = cur + kj * Lc * Hkv * D;
                const float *vb = cur + B * L * Hkv * D + kj * Lc * Hkv * Dv;
                float *oacc = buf[OACC0 + qi], *lacc = buf[LACC0 + qi];
                if (!have[qi]) {
                    run = fmha_forward(&pb, qv, kb, vb, oacc, lacc, NULL, 0);
                    have[qi] = 1;
                } else {
                    run = fmha_forward(&pb, qv, kb, vb, buf[OBLK], buf[LBLK], NULL, 0);
                    if (run == FMHA_OK)
                        run = fmha_merge(B, Hq, C, Dv, ost, oacc, lacc, buf[OBLK], buf[LBLK], oacc, lacc);
                }
            }
        MPI_Waitall(2, req, MPI_STATUSES_IGNORE);
    }
    st = agree(&r, run);
    if (st == FMHA_OK) {
        const int64_t no[4] = {B, C, Hq, Dv};
        for (int qi = 0; qi < r.nchunk; qi++) {
            copy_strided(buf[OACC0 + qi], ost, (float *)o + qi * C * lp->o_strides[1], lp->o_strides, no);
            if (lse)
                for (int64_t bh = 0; bh < B * Hq; bh++)
                    memcpy(lse + bh * S + qi * C, buf[LACC0 + qi] + bh * C, (size_t)C * sizeof(float));
        }
    }
    for (int i = 0; i < NBUF; i++) free(buf[i]);
    ring_free(&r);
    return st;
}

fmha_status fmha_ring_backward(const fmha_problem *p, MPI_Comm comm, fmha_ring_layout layout,
                               const void *q, const void *k, const void *v, const void *o,
                               const void *d_o, const float *lse, void *dq, void *dk, void *dv) {
    ring r;
    ring_message[0] = '\0';
    fmha_status st = ring_setup(&r, p, comm, layout, q && k && v && o && d_o && lse && dq && dk && dv);
    if (st != FMHA_OK) return st;
    const fmha_problem *lp = &r.p;
    const int64_t B = lp->batch, S = lp->seq_q, Hq = lp->heads_q, Hkv = lp->heads_kv, D = lp->head_dim,
                  Dv = lp->head_dim_v, C = chunk_len(&r, r.rank);
    /* qc, dqacc, dqt [B, S, Hq, D]; oc, doc [B, S, Hq, Dv]; lse per query
     * chunk [B, Hq, C]; kv[2] travelling K|V, dkv[2] travelling dK|dV
     * accumulators, dkvt this block's dK|dV share, pairt one chunk pair's
     * (block_elems each) */
    enum { QC, OC, DOC, DQACC, DQT, LSE0, LSE1, KV0, KV1, DKV0, DKV1, DKVT, PAIRT, NBUF };
    float *buf[NBUF];
    const int64_t blk = block_elems(&r, r.lmax);
    const int64_t elems[NBUF] = {B * S * Hq * D, B * S * Hq * Dv, B * S * Hq * Dv, B * S * Hq * D,
                                 B * S * Hq * D, B * Hq * C, B * Hq * C, blk, blk, blk, blk, blk, blk};
    st = alloc_all(&r, NBUF, buf, elems);
    if (st != FMHA_OK) return st;
    int64_t qst[4], ost[4];
    bshd_strides(qst, S, Hq, D);
    bshd_strides(ost, S, Hq, Dv);
    const int64_t nq[4] = {B, S, Hq, D}, no[4] = {B, S, Hq, Dv};
    copy_strided(q, lp->q_strides, buf[QC], qst, nq);
    copy_strided(o, lp->o_strides, buf[OC], ost, no);
    copy_strided(d_o, lp->o_strides, buf[DOC], ost, no);
    for (int qi = 0; qi < r.nchunk; qi++)
        for (int64_t bh = 0; bh < B * Hq; bh++)
            memcpy(buf[LSE0 + qi] + bh * C, lse + bh * S + qi * C, (size_t)C * sizeof(float));
    kv_block_copy(&r, 1, (float *)k, (float *)v, buf[KV0]);
    memset(buf[DQACC], 0, (size_t)elems[DQACC] * sizeof(float));
    memset(buf[DKV0], 0, (size_t)block_elems(&r, r.len[r.rank]) * sizeof(float));

    fmha_status run = FMHA_OK;
    const int P = r.size;
    int dc = 0; /* dkv[dc]: the accumulators of the block in hand */
    for (int t = 0; t < P; t++) {
        const int src = (r.rank - t + P) % P, next = (src + P - 1) % P, prev = (src + 1) % P;
        float *cur = buf[KV0 + (t & 1)], *nxt = buf[KV0 + ((t + 1) & 1)];
        MPI_Request req[4] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL};
        if (t < P - 1) exchange(&r, TAG_KV, nxt, r.len[next], cur, r.len[src], req);
        /* the accumulators of this block arrive from the left while the
         * previous block's leave to the right */
        if (t > 0) exchange(&r, TAG_DKV, buf[DKV0 + dc], r.len[src], buf[DKV0 + (dc ^ 1)], r.len[prev], req + 2);
        const int64_t L = r.len[src], Lc = chunk_len(&r, src);
        /* this block's dK|dV share is staged in DKVT while its
         * accumulators are in flight, and added after the wait; PAIRT holds
         * one chunk pair's dK|dV (fmha_backward writes, not adds) */
        float *stage = buf[DKVT], *pair = buf[PAIRT];
        memset(stage, 0, (size_t)block_elems(&r, L) * sizeof(float));
        for (int qi = 0; qi < r.nchunk; qi++)
            for (int kj = 0; kj < r.nchunk; kj++) {
                fmha_problem pb;
                if (run != FMHA_OK || !pair_problem(&r, src, qi, kj, &pb)) continue;
                const int64_t oq = qi * C * Hq * D, oo = qi * C * Hq * Dv, ok = kj * Lc * Hkv * D,
                              ov = B * L * Hkv * D + kj * Lc * Hkv * Dv;
                run = fmha_backward(&pb, buf[QC] + oq, cur + ok, cur + ov, buf[OC] + oo, buf[DOC] + oo,
                                    buf[LSE0 + qi], buf[DQT] + oq, pair + ok, pair + ov, NULL, NULL, 0);
                if (run != FMHA_OK) continue;
                add_rows(buf[DQACC], buf[DQT], B, S, qi * C, C, Hq * D);
                add_rows(stage, pair, B, L, kj * Lc, Lc, Hkv * D);
                add_rows(stage + B * L * Hkv * D, pair + B * L * Hkv * D, B, L, kj * Lc, Lc, Hkv * Dv);
            }
        MPI_Waitall(4, req, MPI_STATUSES_IGNORE);
        float *acc = buf[DKV0 + dc];
        for (int64_t i = 0; i < block_elems(&r, L); i++) acc[i] += stage[i];
        dc ^= 1;
    }
    /* the last hop brings every rank its own block's accumulators */
    MPI_Request req[2];
    exchange(&r, TAG_DKV, buf[DKV0 + dc], r.len[r.rank], buf[DKV0 + (dc ^ 1)], r.len[(r.rank + 1) % P], req);
    MPI_Waitall(2, req, MPI_STATUSES_IGNORE);
    st = agree(&r, run);
    if (st == FMHA_OK) {
        copy_strided(buf[DQACC], qst, dq, lp->q_strides, nq);
        kv_block_copy(&r, 0, dk, dv, buf[DKV0 + dc]);
    }
    for (int i = 0; i < NBUF; i++) free(buf[i]);
    ring_free(&r);
    return st;
}

fmha_status fmha_ring_zigzag_permute(int64_t batch, int64_t seq, int64_t heads, int64_t dim,
                                     const int64_t st[4], int ranks, int to_zigzag, const float *src,
                                     float *dst) {
    ring_message[0] = '\0';
    if (!st || !src || !dst) return ring_fail(FMHA_ERR_NULL_POINTER, "st, src and dst must not be NULL");
    if (batch < 1 || seq < 1 || heads < 1 || dim < 1 || ranks < 1 || seq % (2 * (int64_t)ranks))
        return ring_fail(FMHA_ERR_BAD_SIZE, "sizes must be at least 1 and seq a multiple of 2 x ranks, got batch %lld, "
                         "seq %lld, heads %lld, dim %lld, ranks %d",
                         (long long)batch, (long long)seq, (long long)heads, (long long)dim, ranks);
    for (int i = 0; i < 4; i++)
        if (st[i] < 0)
            return ring_fail(FMHA_ERR_BAD_STRIDE, "st[%d] must not be negative, got %lld", i, (long long)st[i]);
    const int64_t C = seq / (2 * (int64_t)ranks), n[4] = {batch, C, heads, dim};
    /* zigzag position 2 r C + i C holds chunk place(r, i) */
    for (int r = 0; r < ranks; r++)
        for (int i = 0; i < 2; i++) {
            const int64_t seq_at = (i ? 2 * (int64_t)ranks - 1 - r : r) * C, zig_at = (2 * (int64_t)r + i) * C;
            const int64_t from = (to_zigzag ? seq_at : zig_at) * st[1], to = (to_zigzag ? zig_at : seq_at) * st[1];
            copy_strided(src + from, st, dst + to, st, n);
        }
    return FMHA_OK;
}
