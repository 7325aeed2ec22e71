/* fmha_mpi.h: ring attention over MPI (library fmha_mpi, CMake target
 * fmha::fmha_mpi, built when MPI is found and FMHA_WITH_MPI is on).
 *
 * The global sequence is split over the ranks of a communicator in rank
 * order: rank r holds the contiguous slice [start_r, start_r + len_r) of the
 * queries and of the keys/values, every slice of the same length except the
 * last, which may be shorter (1 <= len_{P-1} <= len_0). The problem passed on
 * each rank describes its LOCAL slice: seq_q = seq_kv = len_r, with that
 * rank's strides. K/V blocks travel around the ring (MPI_Isend/MPI_Irecv,
 * double buffered, overlapped with the computation of the block in hand)
 * and each block's partial (O, lse) is merged with fmha_merge in a fixed
 * order: results equal single-process fmha on the whole sequence within
 * float32 rounding, and are the same from run to run.
 *
 * Supported: float32 (other dtypes: FMHA_ERR_UNSUPPORTED), any B, Hq, Hkv
 * (GQA/MQA), D, Dv, scale, strides, and causal (top-left and bottom-right
 * agree, as Sq = Skv globally: key chunks wholly in the future are skipped). Other
 * masks, biases, sinks, dropout and paged caches: FMHA_ERR_UNSUPPORTED.
 *
 * Errors are collective: before the ring starts every rank's problem is
 * checked locally (fmha_problem_check, pointers) and then compared with the
 * other ranks' (B, Hq, Hkv, D, Dv, dtype, causal, scale, slice lengths) by
 * one MPI_Allgather, so every rank returns the same status (the lowest
 * failing rank's; FMHA_ERR_BAD_SIZE for ranks that disagree or slices of
 * a wrong length) and none hangs or writes anything. MPI_COMM_NULL or an
 * intercommunicator is FMHA_ERR_BAD_OPTION (no communication). Every rank
 * of comm must make the call. */
#ifndef FMHA_MPI_H
#define FMHA_MPI_H

#include <mpi.h>

#include "fmha.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How the global sequence is split over the P ranks.
 *   FMHA_RING_CONTIGUOUS  rank r holds one contiguous slice, in rank order
 *                         (the last may be shorter, see above)
 *   FMHA_RING_ZIGZAG      the sequence in 2P equal chunks; rank r holds chunk
 *                         r then chunk 2P-1-r (its local rows in that order),
 *                         which balances causal work over the ranks. Every
 *                         slice the same, even length. fmha_ring_zigzag_permute
 *                         converts a global tensor to and from this order. */
typedef enum fmha_ring_layout { FMHA_RING_CONTIGUOUS = 0, FMHA_RING_ZIGZAG = 1 } fmha_ring_layout;

/* Forward on this rank's slice: o [B, len_r, Hq, Dv] (p->o_strides) and,
 * when lse is not NULL, lse [B, Hq, len_r] float32 contiguous, the global
 * row lse (over every key the row sees on every rank). */
FMHA_API fmha_status fmha_ring_forward(const fmha_problem *p, MPI_Comm comm,
                                       fmha_ring_layout layout, const void *q, const void *k,
                                       const void *v, void *o, float *lse);

/* Backward on this rank's slice, given the forward's o and (global) lse:
 * dq, dk, dv of the local slice with the strides of q, k, v. dK/dV
 * accumulators travel with the K/V blocks and return to their owner; each
 * block's share comes from fmha_backward with the global lse. */
FMHA_API fmha_status fmha_ring_backward(const fmha_problem *p, MPI_Comm comm,
                                        fmha_ring_layout layout, const void *q, const void *k,
                                        const void *v, const void *o, const void *d_o,
                                        const float *lse, void *dq, void *dk, void *dv);

/* Reorders a global [B, S, H, D] float32 tensor (element strides st, the
 * same for src and dst, which must not overlap) between sequence order and
 * the zigzag order of `ranks` ranks (rank r's slice, chunk r then chunk
 * 2P-1-r, at rank r's place). to_zigzag = 1: sequence -> zigzag, 0: back.
 * S must be a multiple of 2 * ranks: FMHA_ERR_BAD_SIZE otherwise; NULL:
 * FMHA_ERR_NULL_POINTER; negative strides: FMHA_ERR_BAD_STRIDE. */
/* Why the calling thread's last fmha_ring_* call failed: the ring's own
 * reason (a rank that refused, slices of different lengths, a block too
 * large for one MPI message), or the library's fmha_last_error_message when
 * the problem was refused; "" after a success. */
FMHA_API const char *fmha_ring_last_error_message(void);

FMHA_API fmha_status fmha_ring_zigzag_permute(int64_t batch, int64_t seq, int64_t heads,
                                              int64_t dim, const int64_t st[4], int ranks,
                                              int to_zigzag, const float *src, float *dst);

#ifdef __cplusplus
}
#endif
#endif /* FMHA_MPI_H */
