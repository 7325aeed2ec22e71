/* fmha.h: the public interface of fmha, fused multi-head attention on CPUs.
 *
 * Computes exact attention, O = softmax(scale * Q K^T (+ mask)) V, and its
 * gradients, in memory that grows linearly with the sequence length (the
 * `tiled` strategy). This is the only header a user includes.
 *
 * Conventions used throughout:
 *   B  = batch, Hq = query heads, Hkv = key/value heads (Hq % Hkv == 0; query
 *   head h reads key/value head h / (Hq / Hkv): MHA, GQA and MQA),
 *   Sq = query length, Skv = key/value length, D = head dim of Q and K,
 *   Dv = head dim of V and O.
 *   Q  [B, Sq,  Hq,  D ]   K [B, Skv, Hkv, D ]   V [B, Skv, Hkv, Dv]
 *   O  [B, Sq,  Hq,  Dv]   lse [B, Hq, Sq] (float32, contiguous)
 *   Every tensor is addressed through four element strides in the order
 *   [batch, seq, head, dim], so [B, S, H, D] and [B, H, S, D] layouts (and any
 *   other permutation or padding) work without copies. Strides are counted in
 *   elements, not bytes, and must be >= 0; an input stride of 0 broadcasts.
 *   Pointers need only the alignment of their element type.
 *
 * Causal masking (fmha_causal):
 *   FMHA_CAUSAL_TOP_LEFT     query i sees key j iff j <= i
 *                            (PyTorch is_causal, jax.nn.dot_product_attention)
 *   FMHA_CAUSAL_BOTTOM_RIGHT query i sees key j iff j <= i + (Skv - Sq)
 *                            (FlashAttention >= 2.1; the last query sees every
 *                            key, as in decoding with a KV cache)
 *   When Sq > Skv with bottom-right alignment the first Sq - Skv queries see
 *   no key at all.
 *
 * Fully masked rows: a query that sees no key gets O = 0 and lse = -inf, and
 * contributes zero to every gradient. No NaN is ever produced by masking.
 *
 * Errors: every entry point returns an fmha_status; fmha_status_string()
 * explains it. On any error nothing is written to any output. The library
 * never aborts or exits on a caller's mistake.
 *
 * Threads: a persistent pool, created on first use. The count is, in order:
 * fmha_set_num_threads(n) if called with n > 0, else the environment variable
 * FMHA_NUM_THREADS, else the CPUs this process may run on. Results are bitwise
 * identical for every thread count.
 *
 * Instruction sets: the best microkernels this CPU supports are chosen once
 * at first use (cpuid); the environment variable FMHA_ISA=scalar|avx2|avx512
 * forces a set (falling back to the best supported one if the CPU lacks it).
 */
#ifndef FMHA_H
#define FMHA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define FMHA_API __attribute__((visibility("default")))
#else
#define FMHA_API
#endif

#define FMHA_VERSION_MAJOR 0
#define FMHA_VERSION_MINOR 1
#define FMHA_VERSION_PATCH 0

/* Largest supported D and Dv. */
#define FMHA_MAX_HEAD_DIM 256

typedef enum fmha_status {
    FMHA_OK = 0,
    FMHA_ERR_NULL_POINTER,          /* a required pointer is NULL */
    FMHA_ERR_BAD_SIZE,              /* batch, heads or a sequence length is < 1, or sizes overflow */
    FMHA_ERR_BAD_HEADS,             /* heads_q is not a multiple of heads_kv */
    FMHA_ERR_BAD_HEAD_DIM,          /* head_dim or head_dim_v outside 1..FMHA_MAX_HEAD_DIM */
    FMHA_ERR_BAD_SCALE,             /* scale is NaN or infinite */
    FMHA_ERR_BAD_STRIDE,            /* a negative stride, or an output whose elements overlap each other */
    FMHA_ERR_OVERLAP,               /* an output's memory overlaps an input's */
    FMHA_ERR_BAD_OPTION,            /* an unknown strategy, causal alignment or dtype value */
    FMHA_ERR_UNSUPPORTED,           /* a valid request this build cannot serve (e.g. a dtype not yet implemented) */
    FMHA_ERR_WORKSPACE_TOO_SMALL,   /* the caller's workspace is smaller than the size query returned */
    FMHA_ERR_OUT_OF_MEMORY,         /* the library could not allocate its workspace or threads */
    FMHA_ERR_BAD_THREAD_COUNT       /* fmha_set_num_threads got a negative count or one above 1024 */
} fmha_status;

/* A sentence describing a status; never NULL (unknown codes get a generic text). */
FMHA_API const char *fmha_status_string(fmha_status status);

typedef enum fmha_strategy {
    FMHA_STRATEGY_AUTO = 0,   /* dense for small problems, tiled otherwise (crossover measured, see src/api.c) */
    FMHA_STRATEGY_TILED,      /* online softmax over query x key tiles; workspace O(threads x tile) */
    FMHA_STRATEGY_DENSE,      /* scores of one head materialised: workspace O(threads x Sq x Skv) */
    FMHA_STRATEGY_PORTABLE    /* tiled with the plain-C scalar microkernels only (the reference kernels) */
} fmha_strategy;

typedef enum fmha_causal {
    FMHA_CAUSAL_NONE = 0,
    FMHA_CAUSAL_TOP_LEFT,
    FMHA_CAUSAL_BOTTOM_RIGHT
} fmha_causal;

typedef enum fmha_dtype {
    FMHA_DTYPE_F32 = 0        /* float32 Q, K, V, O and gradients */
} fmha_dtype;

/* Strides filled in by fmha_problem_init for contiguous tensors. */
typedef enum fmha_layout {
    FMHA_LAYOUT_BSHD = 0,     /* [batch, seq, head, dim] (JAX, FlashAttention) */
    FMHA_LAYOUT_BHSD          /* [batch, head, seq, dim] (PyTorch) */
} fmha_layout;

/* One attention problem: sizes, options and the strides of every tensor.
 * Fill it with fmha_problem_init, then change what differs. */
typedef struct fmha_problem {
    fmha_dtype dtype;
    int64_t batch;            /* B   >= 1 */
    int64_t heads_q;          /* Hq  >= 1, a multiple of heads_kv */
    int64_t heads_kv;         /* Hkv >= 1 */
    int64_t seq_q;            /* Sq  >= 1 */
    int64_t seq_kv;           /* Skv >= 1 */
    int64_t head_dim;         /* D,  1..FMHA_MAX_HEAD_DIM */
    int64_t head_dim_v;       /* Dv, 1..FMHA_MAX_HEAD_DIM */
    float scale;              /* multiplies Q K^T; 0 selects 1/sqrt(head_dim); NaN/inf is an error */
    fmha_causal causal;
    fmha_strategy strategy;
    /* Element strides, each in the order [batch, seq, head, dim]. The
     * gradients dQ, dK, dV, dO use the strides of Q, K, V, O respectively. */
    int64_t q_strides[4];
    int64_t k_strides[4];
    int64_t v_strides[4];
    int64_t o_strides[4];
} fmha_problem;

/* Fills *p: float32, the given sizes, contiguous strides for `layout` (the
 * same layout for Q, K, V and O), scale 0 (= 1/sqrt(head_dim)), no causal
 * mask, strategy auto. Does not validate; the entry points do. */
FMHA_API void fmha_problem_init(fmha_problem *p, int64_t batch, int64_t heads_q, int64_t heads_kv,
                       int64_t seq_q, int64_t seq_kv, int64_t head_dim, int64_t head_dim_v,
                       fmha_layout layout);

/* Checks a problem without running it: the status the entry points would give
 * for its sizes, options and strides (pointers are not checked). */
FMHA_API fmha_status fmha_problem_check(const fmha_problem *p);

/* ---- forward ------------------------------------------------------------ */

/* Bytes of workspace fmha_forward needs for this problem with the current
 * thread count and instruction set. *bytes is written only on success. */
FMHA_API fmha_status fmha_forward_workspace_size(const fmha_problem *p, size_t *bytes);

/* O = softmax(scale * Q K^T, masked) V.
 *   q, k, v   inputs (dtype of p), shapes and strides as in the header comment
 *   o         output [B, Sq, Hq, Dv] with p->o_strides; must not overlap q, k, v
 *   lse       optional output [B, Hq, Sq] float32 contiguous, the natural log of
 *             the row sum of exp(scores); -inf for a fully masked row. NULL skips it.
 *   workspace optional; NULL lets the library allocate (once per call, outside
 *             the hot loop); otherwise at least fmha_forward_workspace_size bytes,
 *             any alignment. */
FMHA_API fmha_status fmha_forward(const fmha_problem *p, const void *q, const void *k, const void *v,
                         void *o, float *lse, void *workspace, size_t workspace_bytes);

/* ---- backward ------------------------------------------------------------ */

/* Bytes of workspace fmha_backward needs (current thread count and ISA). */
FMHA_API fmha_status fmha_backward_workspace_size(const fmha_problem *p, size_t *bytes);

/* Gradients of O = attention(Q, K, V) given dO = dL/dO.
 *   q, k, v, o  the forward's inputs and output (o with p->o_strides)
 *   d_o         dL/dO, shape and strides of o
 *   lse         the forward's lse [B, Hq, Sq] float32 (required)
 *   dq, dk, dv  outputs with the shapes and strides of q, k, v; dk and dv are
 *               summed over the query heads that share a key/value head.
 *               They must not overlap any input or each other.
 *   workspace   as for fmha_forward. */
FMHA_API fmha_status fmha_backward(const fmha_problem *p, const void *q, const void *k, const void *v,
                          const void *o, const void *d_o, const float *lse, void *dq, void *dk,
                          void *dv, void *workspace, size_t workspace_bytes);

/* Forward then backward in one call (o and lse are written, as by fmha_forward;
 * lse is required). Workspace is allocated by the library. */
FMHA_API fmha_status fmha_forward_backward(const fmha_problem *p, const void *q, const void *k,
                                  const void *v, const void *d_o, void *o, float *lse, void *dq,
                                  void *dk, void *dv);

/* ---- threads and instruction set ------------------------------------------ */

/* n > 0 fixes the thread count; n == 0 returns to the default. */
FMHA_API fmha_status fmha_set_num_threads(int n);
FMHA_API int fmha_get_num_threads(void);

/* The microkernel family in use: "scalar", "avx2" or "avx512". */
FMHA_API const char *fmha_isa_name(void);

/* "major.minor.patch" */
FMHA_API const char *fmha_version_string(void);

#ifdef __cplusplus
}
#endif
#endif /* FMHA_H */
