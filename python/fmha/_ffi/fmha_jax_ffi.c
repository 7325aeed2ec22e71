/* fmha_jax_ffi.c: XLA FFI handlers (CPU custom calls) that run fmha_forward
 * and fmha_backward on XLA's buffers, for fmha.jax. C11 against XLA's C
 * API (xla/ffi/api/c_api.h, from jax.ffi.include_dir()), so the handler
 * needs no C++ runtime; linked to libfmha and registered as the targets
 * "fmha_forward" and "fmha_backward".
 *
 * Operands (row-major, as XLA lays them out for custom calls):
 *   forward  args q [B,T,N,H], k [B,S,K,H], v [B,S,K,Hv], then the extras
 *            named by the `extras` bit set, in this order:
 *              bias [b,n,t,s] f32, mask [b,n,t,s] pred (each dim 1 or full),
 *              q_lengths [B] s32, kv_lengths [B] s32,
 *              q_segment_ids [B,T] s32, kv_segment_ids [B,S] s32,
 *              alibi_slopes [N] f32, rel_table [N,buckets] f32, sinks [N] f32,
 *              dropout_seed [2] u32 (seed = s[0] << 32 | s[1], offset 0),
 *              block_table [B,max_pages] s32 (a paged KV cache: k and v are
 *              page pools [P,page,K,H] / [P,page,K,Hv], fmha_problem's
 *              block_table; forward only)
 *            rets o [B,T,N,Hv] (q's dtype), lse [B,N,T] f32
 *            k and v may be bfloat16 or float16 beside float32 q and o (a
 *            cache dtype of their own, fmha_problem.kv_dtype; forward only).
 *   backward args q, k, v, o, lse, d_o, extras; rets dq, dk, dv, then one
 *            f32 result in the shape of each parameter named by the `grads`
 *            bit set (1 d_bias, 2 d_alibi, 4 d_rel_table, 8 d_sinks), in
 *            that order. d_sinks comes from fmha_sinks_backward.
 *   attributes (scalars, looked up by name) scale, causal (an fmha_causal,
 *            or kCausalNoneBottomRight: none with bottom-right alignment),
 *            window_left/right, strategy, extras, softcap, precision,
 *            rel_max_distance, rel_bidirectional, dropout_p (backward: grads).
 * Every operand may carry the same number of extra leading dimensions (vmap
 * with vmap_method="expand_dims"): size 1 broadcasts, the results have the
 * full size. Those dimensions fold into the batch when every operand allows
 * it, otherwise each leading index is one library call.
 *
 * Runs go through fmha plans kept in a small cache (the plan cache below),
 * so a jitted step pays for validation and workspace allocation once per
 * shape. */
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmha.h"
#include "xla/ffi/api/c_api.h"

/* The codes, bits and attribute names below are python/fmha/_spec.py's;
 * tests/python/test_spec.py reads them out of this file and compares. */
enum ExtraBits {
  kBias = 1, kMask = 2, kQLengths = 4, kKvLengths = 8, kQSegments = 16, kKvSegments = 32,
  kAlibi = 64, kRelTable = 128, kSinks = 256, kDropoutSeed = 512, kBlockTable = 1024
};
enum GradBits { kGradBias = 1, kGradAlibi = 2, kGradRelTable = 4, kGradSinks = 8 };
/* The bindings' causal code past fmha_causal's: no causal mask, bottom-right alignment. */
enum { kCausalNoneBottomRight = 3 };

#define FMHA_FFI_EXPORT __attribute__((visibility("default")))

/* ---- errors ------------------------------------------------------------------------ */

static const char *status_name(fmha_status st) {
  static const char *const names[] = {
      "FMHA_OK",           "FMHA_ERR_NULL_POINTER", "FMHA_ERR_BAD_SIZE",
      "FMHA_ERR_BAD_HEADS", "FMHA_ERR_BAD_HEAD_DIM", "FMHA_ERR_BAD_SCALE",
      "FMHA_ERR_BAD_STRIDE", "FMHA_ERR_OVERLAP",    "FMHA_ERR_BAD_OPTION",
      "FMHA_ERR_UNSUPPORTED", "FMHA_ERR_WORKSPACE_TOO_SMALL",
      "FMHA_ERR_OUT_OF_MEMORY", "FMHA_ERR_BAD_THREAD_COUNT", "FMHA_ERR_BAD_MASK",
      "FMHA_ERR_CALLBACK", "FMHA_ERR_STRUCT_SIZE", "FMHA_ERR_BAD_PAGE",
      "FMHA_ERR_BAD_FILE"};
  unsigned i = (unsigned)st;
  return i < sizeof names / sizeof names[0] ? names[i] : "FMHA_ERR_?";
}

/* An INVALID_ARGUMENT error with the printf-formatted text (XLA copies it). */
static XLA_FFI_Error *ffi_error(const XLA_FFI_Api *api, const char *fmt, ...) {
  char message[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(message, sizeof message, fmt, ap);
  va_end(ap);
  XLA_FFI_Error_Create_Args args;
  memset(&args, 0, sizeof args);
  args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
  args.message = message;
  args.errc = XLA_FFI_Error_Code_INVALID_ARGUMENT;
  return api->XLA_FFI_Error_Create(&args);
}

/* The text fmha.jax turns back into an FmhaError: "fmha: <fn>: <message>[: <detail>] (<NAME>)",
 * the detail being the library's fmha_last_error_message on this thread. */
static XLA_FFI_Error *status_error(const XLA_FFI_Api *api, const char *fn, fmha_status st) {
  const char *detail = fmha_last_error_message();
  const bool has_detail = detail && detail[0];
  return ffi_error(api, "fmha: %s: %s%s%s (%s)", fn, fmha_status_string(st), has_detail ? ": " : "",
                   has_detail ? detail : "", status_name(st));
}

/* ---- the plan cache ------------------------------------------------------------------
 * Plans keyed by the full bytes of the fmha_problem a call builds (zeroed
 * first, so padding compares equal). The problem holds the addresses of the
 * mask, bias and length buffers it names, so a call whose buffers moved
 * misses and makes a new plan, which is correct (a plan reads the arrays at
 * its problem's addresses), and a call whose buffers stayed put (constants,
 * reused arguments) hits. Bounded: past kPlanCapacity the least recently
 * used entry is dropped; a count of holders frees its plan when the last
 * run using it returns. Handlers may run concurrently: one mutex guards the
 * cache and the counts, and runs on one plan are serialised by the library.
 * Never freed at exit: plans must not outlive libfmha. */
enum { kPlanCapacity = 32 };

typedef struct {
  fmha_plan *plan;
  int64_t holders; /* the cache (while it lists the plan) and the runs using it */
} shared_plan;

typedef struct {
  fmha_problem key;
  shared_plan *shared;
  uint64_t last_used; /* plan_cache.clock at the last hit or insertion */
} plan_entry;

static struct {
  pthread_mutex_t mu;
  plan_entry entries[kPlanCapacity];
  int size;
  uint64_t clock;
  int64_t hits, misses;
} plan_cache = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* Drops one holder of sp; the last one frees the plan. */
static void plan_release(shared_plan *sp) {
  pthread_mutex_lock(&plan_cache.mu);
  const bool last = --sp->holders == 0;
  pthread_mutex_unlock(&plan_cache.mu);
  if (last) {
    fmha_plan_destroy(sp->plan);
    free(sp);
  }
}

/* Under the mutex: the entry of *key made most recent, its plan held once more; NULL when absent. */
static shared_plan *plan_find(const fmha_problem *key) {
  for (int i = 0; i < plan_cache.size; i++) {
    plan_entry *e = &plan_cache.entries[i];
    if (memcmp(&e->key, key, sizeof *key) == 0) {
      e->last_used = ++plan_cache.clock;
      e->shared->holders++;
      return e->shared;
    }
  }
  return NULL;
}

/* The plan of *p in *out (the caller releases it with plan_release), made on
 * a miss; the status of fmha_plan_create otherwise. */
static fmha_status plan_get(const fmha_problem *p, shared_plan **out) {
  pthread_mutex_lock(&plan_cache.mu);
  *out = plan_find(p);
  if (*out) plan_cache.hits++;
  else plan_cache.misses++;
  pthread_mutex_unlock(&plan_cache.mu);
  if (*out) return FMHA_OK;

  fmha_plan *raw = NULL;
  fmha_status st = fmha_plan_create(p, &raw);
  if (st != FMHA_OK) return st;
  shared_plan *made = malloc(sizeof *made);
  if (!made) {
    fmha_plan_destroy(raw);
    return FMHA_ERR_OUT_OF_MEMORY;
  }
  made->plan = raw;
  made->holders = 2; /* the cache and this run */
  shared_plan *evicted = NULL;
  pthread_mutex_lock(&plan_cache.mu);
  shared_plan *other = plan_find(p); /* another thread made it meanwhile */
  if (!other) {
    int slot = plan_cache.size;
    if (slot == kPlanCapacity) { /* replace the least recently used */
      slot = 0;
      for (int i = 1; i < kPlanCapacity; i++)
        if (plan_cache.entries[i].last_used < plan_cache.entries[slot].last_used) slot = i;
      evicted = plan_cache.entries[slot].shared;
    } else {
      plan_cache.size++;
    }
    plan_entry *e = &plan_cache.entries[slot];
    memcpy(&e->key, p, sizeof *p);
    e->shared = made;
    e->last_used = ++plan_cache.clock;
  }
  pthread_mutex_unlock(&plan_cache.mu);
  if (other) { /* ours was never listed: this run held its only other count */
    fmha_plan_destroy(made->plan);
    free(made);
    *out = other;
    return FMHA_OK;
  }
  if (evicted) plan_release(evicted);
  *out = made;
  return FMHA_OK;
}

/* ---- operands ------------------------------------------------------------------------ */

enum { kMaxRank = 16 }; /* core dimensions (at most 4) and leading (vmap) ones */

/* One operand: data, element size and row-major element strides, with
 * `lead` leading (vmap) dimensions before its core dimensions. */
typedef struct {
  bool present;
  char *data;
  size_t elem;
  int rank, lead;
  int64_t dims[kMaxRank], strides[kMaxRank];
} operand;

static int64_t core(const operand *op, int i) { return op->dims[op->lead + i]; }
static int64_t core_stride(const operand *op, int i) { return op->strides[op->lead + i]; }

static size_t byte_width(XLA_FFI_DataType dt) {
  switch (dt) {
    case XLA_FFI_DataType_PRED: case XLA_FFI_DataType_S8: case XLA_FFI_DataType_U8: return 1;
    case XLA_FFI_DataType_F16: case XLA_FFI_DataType_BF16: return 2;
    case XLA_FFI_DataType_F32: case XLA_FFI_DataType_S32: case XLA_FFI_DataType_U32: return 4;
    default: return 0; /* never described: the types are checked first */
  }
}

/* Fills *op from a buffer with core_rank core dimensions; false when its rank is past kMaxRank. */
static bool describe(const XLA_FFI_Buffer *b, int core_rank, operand *op) {
  memset(op, 0, sizeof *op);
  if (b->rank > kMaxRank) return false;
  op->present = true;
  op->data = (char *)b->data;
  op->elem = byte_width(b->dtype);
  op->rank = (int)b->rank;
  op->lead = op->rank - core_rank;
  for (int i = op->rank - 1; i >= 0; i--) {
    op->dims[i] = b->dims[i];
    op->strides[i] = i == op->rank - 1 ? 1 : op->strides[i + 1] * op->dims[i + 1];
  }
  return true;
}

static bool dtype_code(XLA_FFI_DataType dt, fmha_dtype *code) {
  switch (dt) {
    case XLA_FFI_DataType_F32: *code = FMHA_DTYPE_F32; return true;
    case XLA_FFI_DataType_BF16: *code = FMHA_DTYPE_BF16; return true;
    case XLA_FFI_DataType_F16: *code = FMHA_DTYPE_F16; return true;
    default: return false;
  }
}

/* ---- the call frame -------------------------------------------------------------------- */

typedef struct {
  float scale;
  int64_t causal, window_left, window_right, strategy, extras;
  float softcap;
  int64_t precision, rel_max_distance, rel_bidirectional;
  float dropout_p;
  int64_t grads; /* backward only */
} options;

typedef enum { ATTR_F32, ATTR_I64 } attr_kind;
typedef struct {
  const char *name;
  attr_kind kind;
  size_t offset; /* of its field in options */
} attr_spec;

#define OPT(field) offsetof(options, field)
/* The forward's attributes; the backward's are these and `grads`. */
static const attr_spec kForwardAttrs[] = {
    {"scale", ATTR_F32, OPT(scale)},
    {"causal", ATTR_I64, OPT(causal)},
    {"window_left", ATTR_I64, OPT(window_left)},
    {"window_right", ATTR_I64, OPT(window_right)},
    {"strategy", ATTR_I64, OPT(strategy)},
    {"extras", ATTR_I64, OPT(extras)},
    {"softcap", ATTR_F32, OPT(softcap)},
    {"precision", ATTR_I64, OPT(precision)},
    {"rel_max_distance", ATTR_I64, OPT(rel_max_distance)},
    {"rel_bidirectional", ATTR_I64, OPT(rel_bidirectional)},
    {"dropout_p", ATTR_F32, OPT(dropout_p)},
};
static const attr_spec kBackwardOnlyAttrs[] = {
    {"grads", ATTR_I64, OPT(grads)},
};
#undef OPT

/* Reads one attribute by name into its field of *o. */
static XLA_FFI_Error *read_attr(const XLA_FFI_CallFrame *cf, const attr_spec *spec, options *o) {
  const size_t len = strlen(spec->name);
  for (int64_t i = 0; i < cf->attrs.size; i++) {
    const XLA_FFI_ByteSpan *name = cf->attrs.names[i];
    if (name->len != len || memcmp(name->ptr, spec->name, len) != 0) continue;
    const XLA_FFI_Scalar *s = (const XLA_FFI_Scalar *)cf->attrs.attrs[i];
    const XLA_FFI_DataType want = spec->kind == ATTR_F32 ? XLA_FFI_DataType_F32 : XLA_FFI_DataType_S64;
    if (cf->attrs.types[i] != XLA_FFI_AttrType_SCALAR || s->dtype != want)
      return ffi_error(cf->api, "fmha: attribute %s must be a scalar %s", spec->name,
                       spec->kind == ATTR_F32 ? "float32" : "int64");
    memcpy((char *)o + spec->offset, s->value, spec->kind == ATTR_F32 ? sizeof(float) : sizeof(int64_t));
    return NULL;
  }
  return ffi_error(cf->api, "fmha: missing attribute %s", spec->name);
}

static XLA_FFI_Error *read_attrs(const XLA_FFI_CallFrame *cf, bool backward, options *o) {
  const size_t nf = sizeof kForwardAttrs / sizeof kForwardAttrs[0];
  const size_t nb = backward ? sizeof kBackwardOnlyAttrs / sizeof kBackwardOnlyAttrs[0] : 0;
  memset(o, 0, sizeof *o);
  if (cf->attrs.size != (int64_t)(nf + nb))
    return ffi_error(cf->api, "fmha: wrong number of attributes: expected %zu but got %lld", nf + nb,
                     (long long)cf->attrs.size);
  for (size_t i = 0; i < nf + nb; i++) {
    XLA_FFI_Error *err = read_attr(cf, i < nf ? &kForwardAttrs[i] : &kBackwardOnlyAttrs[i - nf], o);
    if (err) return err;
  }
  return NULL;
}

/* The checks of every call: the frame's size, the metadata query (answered
 * here: *answered set), the stage, the counts of buffers. */
static XLA_FFI_Error *check_frame(XLA_FFI_CallFrame *cf, int64_t min_args, int64_t min_rets, bool exact_rets,
                                  bool *answered) {
  *answered = false;
  if (cf->struct_size != XLA_FFI_CallFrame_STRUCT_SIZE)
    return ffi_error(cf->api, "Unexpected XLA_FFI_CallFrame size: expected %zu got %zu. Check installed "
                     "software versions.", (size_t)XLA_FFI_CallFrame_STRUCT_SIZE, cf->struct_size);
  if (cf->extension_start && cf->extension_start->type == XLA_FFI_Extension_Metadata) {
    XLA_FFI_Metadata_Extension *ext = (XLA_FFI_Metadata_Extension *)cf->extension_start;
    if (ext->extension_base.struct_size < XLA_FFI_Metadata_Extension_STRUCT_SIZE ||
        ext->metadata->struct_size < XLA_FFI_Metadata_STRUCT_SIZE)
      return ffi_error(cf->api, "Unexpected XLA_FFI_Metadata size. Check installed software versions.");
    XLA_FFI_Metadata *m = ext->metadata;
    m->api_version.struct_size = XLA_FFI_Api_Version_STRUCT_SIZE;
    m->api_version.extension_start = NULL;
    m->api_version.major_version = XLA_FFI_API_MAJOR;
    m->api_version.minor_version = XLA_FFI_API_MINOR;
    m->traits = 0;
    if (m->struct_size >= offsetof(XLA_FFI_Metadata, state_type_id) + sizeof m->state_type_id)
      m->state_type_id.type_id = 0; /* stateless */
    *answered = true;
    return NULL;
  }
  if (cf->stage != XLA_FFI_ExecutionStage_EXECUTE)
    return ffi_error(cf->api, "Wrong execution stage: expected %d but got %d", XLA_FFI_ExecutionStage_EXECUTE,
                     (int)cf->stage);
  if (cf->args.size < min_args)
    return ffi_error(cf->api, "Wrong number of arguments: expected at least %lld but got %lld",
                     (long long)min_args, (long long)cf->args.size);
  if (exact_rets ? cf->rets.size != min_rets : cf->rets.size < min_rets)
    return ffi_error(cf->api, "Wrong number of results: expected %s%lld but got %lld", exact_rets ? "" : "at least ",
                     (long long)min_rets, (long long)cf->rets.size);
  for (int64_t i = 0; i < cf->args.size; i++)
    if (cf->args.types[i] != XLA_FFI_ArgType_BUFFER) return ffi_error(cf->api, "fmha: argument %lld is not a buffer", (long long)i);
  for (int64_t i = 0; i < cf->rets.size; i++)
    if (cf->rets.types[i] != XLA_FFI_RetType_BUFFER) return ffi_error(cf->api, "fmha: result %lld is not a buffer", (long long)i);
  return NULL;
}

static const XLA_FFI_Buffer *arg(const XLA_FFI_CallFrame *cf, int64_t i) { return (const XLA_FFI_Buffer *)cf->args.args[i]; }
static const XLA_FFI_Buffer *ret(const XLA_FFI_CallFrame *cf, int64_t i) { return (const XLA_FFI_Buffer *)cf->rets.rets[i]; }

/* ---- one call ------------------------------------------------------------------------- */

/* Operand slots. */
enum Slot {
  Q, K, V, O, LSE, DO, DQ, DK, DV, BIAS, MASK, QLEN, KVLEN, QSEG, KVSEG, ALIBI, REL, SINKS,
  DROPOUT_SEED, BLOCK_TABLE, DBIAS, DALIBI, DREL, DSINKS, NSLOTS
};

/* Operands that serve every batch entry at once (per-head [N] arrays, the
 * dropout seed, whose draw depends on the batch index): leading (vmap)
 * dimensions cannot fold into the batch. */
static bool per_head(int s) {
  return s == ALIBI || s == REL || s == SINKS || s == DROPOUT_SEED || s == DALIBI || s == DREL || s == DSINKS;
}

typedef struct {
  const XLA_FFI_Api *api;
  operand op[NSLOTS];
  int lead;                     /* leading dimensions of every operand */
  int64_t lead_dims[kMaxRank];  /* the results' leading dimensions */
  options opt;
  fmha_dtype dtype;
  fmha_kv_dtype kv_dtype;
  int64_t B;                    /* the core batch (for_each_slice sets these three) */
  bool one_shot, uncached;
} call;

/* Puts a buffer in a slot with core_rank core dimensions; false on a rank past kMaxRank. */
static XLA_FFI_Error *take(call *c, int slot, const XLA_FFI_Buffer *b, int core_rank, const char *name) {
  if (!describe(b, core_rank, &c->op[slot]))
    return ffi_error(c->api, "fmha: %s has more than %d dimensions", name, kMaxRank);
  return NULL;
}

/* Dense mask/bias strides [b, h, t, s] with 0 on broadcast dimensions. */
static void broadcast_strides(const operand *op, int64_t out[4]) {
  for (int i = 0; i < 4; i++) out[i] = core(op, i) == 1 ? 0 : core_stride(op, i);
}

/* Builds the problem for `batch` batch entries from the core shapes. With
 * a block table, k and v are page pools [P, page, K, H] and a sequence
 * holds up to max_pages * page keys. */
static void make_problem(const call *c, int64_t batch, fmha_problem *p) {
  const operand *q = &c->op[Q], *k = &c->op[K], *v = &c->op[V], *table = &c->op[BLOCK_TABLE];
  const options *o = &c->opt;
  const bool paged = table->present;
  const int64_t seq_kv = paged ? core(table, 1) * core(k, 1) : core(k, 1);
  memset(p, 0, sizeof *p); /* the plan cache compares every byte */
  fmha_problem_init(p, batch, core(q, 2), core(k, 2), core(q, 1), seq_kv, core(q, 3), core(v, 3),
                    FMHA_LAYOUT_BSHD);
  p->dtype = c->dtype;
  p->kv_dtype = c->kv_dtype;
  if (paged) { /* pool strides [page, row in page, head, dim]: only the page stride differs */
    p->k_strides[0] = core_stride(k, 0);
    p->v_strides[0] = core_stride(v, 0);
    p->block_table_stride = core(table, 1);
    p->page_size = core(k, 1);
    p->num_pages = core(k, 0);
  }
  p->scale = o->scale;
  const bool none_bottom_right = o->causal == kCausalNoneBottomRight;
  p->causal = (fmha_causal)(none_bottom_right ? FMHA_CAUSAL_NONE : o->causal);
  p->alignment = none_bottom_right ? FMHA_ALIGN_BOTTOM_RIGHT : FMHA_ALIGN_CAUSAL;
  p->strategy = (fmha_strategy)o->strategy;
  p->masks.window_left = o->window_left;
  p->masks.window_right = o->window_right;
  p->biases.softcap = o->softcap;
  p->precision = (fmha_precision)o->precision;
  if (c->op[DROPOUT_SEED].present) p->dropout_p = o->dropout_p;
  if (c->op[REL].present) {
    p->biases.rel_max_distance = (int32_t)o->rel_max_distance;
    p->biases.rel_bidirectional = (int32_t)o->rel_bidirectional;
  }
}

/* Points the problem's masks and biases at one slice. */
static void attach_extras(const call *c, char *const ptr[], fmha_problem *p) {
  if (c->op[BIAS].present) {
    p->biases.dense = (const float *)ptr[BIAS];
    broadcast_strides(&c->op[BIAS], p->biases.dense_strides);
  }
  if (c->op[MASK].present) {
    p->masks.dense = (const uint8_t *)ptr[MASK];
    broadcast_strides(&c->op[MASK], p->masks.dense_strides);
  }
  if (c->op[QLEN].present) p->masks.q_lengths = (const int32_t *)ptr[QLEN];
  if (c->op[KVLEN].present) p->masks.kv_lengths = (const int32_t *)ptr[KVLEN];
  if (c->op[QSEG].present) {
    p->masks.q_segment_ids = (const int32_t *)ptr[QSEG];
    p->masks.kv_segment_ids = (const int32_t *)ptr[KVSEG];
  }
  if (c->op[ALIBI].present) p->biases.alibi_slopes = (const float *)ptr[ALIBI];
  if (c->op[REL].present) {
    p->biases.rel_table = (const float *)ptr[REL];
    p->biases.rel_num_buckets = (int32_t)core(&c->op[REL], 1);
  }
  if (c->op[SINKS].present) p->sinks = (const float *)ptr[SINKS];
  if (c->op[BLOCK_TABLE].present) p->block_table = (const int32_t *)ptr[BLOCK_TABLE];
  if (c->op[DROPOUT_SEED].present) {
    const uint32_t *seed = (const uint32_t *)ptr[DROPOUT_SEED];
    p->dropout_seed = (uint64_t)seed[0] << 32 | seed[1];
  }
}

/* When folded, a broadcast bias/mask with batch 1 and B == 1 steps by its
 * leading stride; its strides from broadcast_strides already give 0 for the
 * batch, so fix the batch stride up for the folded batch. */
static void fix_folded_batch_strides(const call *c, int64_t batch, fmha_problem *p) {
  if (batch == c->B) return;
  if (c->op[BIAS].present && core(&c->op[BIAS], 0) == 1)
    p->biases.dense_strides[0] = c->op[BIAS].lead ? c->op[BIAS].strides[c->lead - 1] : 0;
  if (c->op[MASK].present && core(&c->op[MASK], 0) == 1)
    p->masks.dense_strides[0] = c->op[MASK].lead ? c->op[MASK].strides[c->lead - 1] : 0;
}

/* Folds the leading dimensions into the batch when every present operand
 * has them at full size and its batch dimension allows it. A block table
 * never folds: its entries index the pages of its own slice's pools. */
static bool can_fold(const call *c) {
  for (int s = 0; s < NSLOTS; s++) {
    const operand *op = &c->op[s];
    if (!op->present) continue;
    if (per_head(s) || s == BLOCK_TABLE) return false;
    for (int i = 0; i < c->lead; i++)
      if (op->dims[i] != c->lead_dims[i]) return false;
    if ((s == BIAS || s == MASK || s == DBIAS) && core(op, 0) != c->B && c->B != 1) return false;
  }
  return true;
}

/* True when the problem names a buffer besides the tensors (mask, bias,
 * lengths, block table): per slice, those addresses differ, so each slice
 * would miss the plan cache and push useful plans out; such runs take the
 * one-shot calls. So do runs with dropout, whose seed (a value in the
 * problem) is new each step. */
static bool has_extras(const call *c) {
  for (int s = BIAS; s <= BLOCK_TABLE; s++)
    if (c->op[s].present) return true;
  return false;
}

typedef XLA_FFI_Error *slice_fn(const call *c, int64_t batch, char *const ptr[], bool per_slice);

/* Once every operand is in its slot: the core batch and the call's kind
 * (one-shot, uncached), then fn(batch, pointers, per_slice) once with the
 * leading dimensions folded into the batch (per_slice false), or once per
 * leading index with each operand's slice (per_slice true). */
static XLA_FFI_Error *for_each_slice(call *c, slice_fn *fn) {
  c->B = core(&c->op[Q], 0);
  c->one_shot = has_extras(c);
  c->uncached = c->op[DROPOUT_SEED].present;
  int64_t count = 1;
  for (int i = 0; i < c->lead; i++) count *= c->lead_dims[i];
  if (count == 0) return NULL;
  char *ptr[NSLOTS];
  if (c->lead == 0 || can_fold(c)) {
    for (int s = 0; s < NSLOTS; s++) ptr[s] = c->op[s].data;
    return fn(c, c->B * count, ptr, false);
  }
  int64_t idx[kMaxRank] = {0};
  for (int64_t n = 0; n < count; n++) {
    for (int s = 0; s < NSLOTS; s++) {
      const operand *op = &c->op[s];
      ptr[s] = op->data;
      if (!op->present || !op->data) continue;
      int64_t off = 0;
      for (int i = 0; i < c->lead; i++)
        if (op->dims[i] != 1) off += idx[i] * op->strides[i];
      ptr[s] = op->data + off * (int64_t)op->elem;
    }
    XLA_FFI_Error *err = fn(c, c->B, ptr, true);
    if (err) return err;
    for (int i = c->lead - 1; i >= 0; i--) {
      if (++idx[i] < c->lead_dims[i]) break;
      idx[i] = 0;
    }
  }
  return NULL;
}

/* Reads the extras (arguments from `first` on) into their slots and checks their types and ranks. */
static XLA_FFI_Error *read_extras(const XLA_FFI_CallFrame *cf, int64_t first, call *c) {
  int64_t next = first;
  static const struct { int64_t bit; int slot; int rank; const char *name; } kinds[] = {
      {kBias, BIAS, 4, "bias"}, {kMask, MASK, 4, "mask"},
      {kQLengths, QLEN, 1, "query_seq_lengths"}, {kKvLengths, KVLEN, 1, "key_value_seq_lengths"},
      {kQSegments, QSEG, 2, "query segment_ids"}, {kKvSegments, KVSEG, 2, "key_value segment_ids"},
      {kAlibi, ALIBI, 1, "alibi_slopes"}, {kRelTable, REL, 2, "rel_table"}, {kSinks, SINKS, 1, "sinks"},
      {kDropoutSeed, DROPOUT_SEED, 1, "dropout seed"}, {kBlockTable, BLOCK_TABLE, 2, "block_table"}};
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
    if (!(c->opt.extras & kinds[i].bit)) continue;
    if (next >= cf->args.size) return ffi_error(c->api, "fmha: missing operand %s", kinds[i].name);
    const XLA_FFI_Buffer *buf = arg(cf, next++);
    const int slot = kinds[i].slot;
    const XLA_FFI_DataType dt = buf->dtype;
    const bool is_float = slot == BIAS || slot == ALIBI || slot == REL || slot == SINKS;
    const bool ok = is_float               ? dt == XLA_FFI_DataType_F32
                    : slot == MASK         ? (dt == XLA_FFI_DataType_PRED || dt == XLA_FFI_DataType_U8 ||
                                              dt == XLA_FFI_DataType_S8)
                    : slot == DROPOUT_SEED ? dt == XLA_FFI_DataType_U32
                                           : dt == XLA_FFI_DataType_S32;
    if (!ok) return ffi_error(c->api, "fmha: wrong element type for %s", kinds[i].name);
    XLA_FFI_Error *err = take(c, slot, buf, kinds[i].rank, kinds[i].name);
    if (err) return err;
    if (c->op[slot].lead != c->lead) return ffi_error(c->api, "fmha: wrong rank for %s", kinds[i].name);
  }
  if (c->op[DROPOUT_SEED].present && core(&c->op[DROPOUT_SEED], 0) != 2)
    return ffi_error(c->api, "fmha: the dropout seed must hold two uint32");
  if (next != cf->args.size) return ffi_error(c->api, "fmha: unexpected extra operands");
  return NULL;
}

/* After read_extras (q, k and v of one rank, checked first): with a block
 * table, k and v are pools [P, page, K, H]. */
static XLA_FFI_Error *check_main(const call *c) {
  const operand *q = &c->op[Q], *k = &c->op[K], *v = &c->op[V], *table = &c->op[BLOCK_TABLE];
  if ((!table->present && core(k, 0) != core(q, 0)) || core(v, 0) != core(k, 0) || core(k, 3) != core(q, 3) ||
      core(v, 1) != core(k, 1) || core(v, 2) != core(k, 2))
    return ffi_error(c->api, "fmha: inconsistent q, k, v shapes");
  if (table->present && core(table, 0) != core(q, 0))
    return ffi_error(c->api, "fmha: block_table must be [B, max_pages]");
  return NULL;
}

/* The common start of both handlers: the frame's checks (a metadata query
 * is answered there: *answered set), the attributes, then q, k, v in their
 * slots. */
static XLA_FFI_Error *start_call(XLA_FFI_CallFrame *cf, bool backward, call *c, bool *answered) {
  XLA_FFI_Error *err =
      backward ? check_frame(cf, 6, 3, false, answered) : check_frame(cf, 3, 2, true, answered);
  if (err || *answered) return err;
  memset(c, 0, sizeof *c);
  c->api = cf->api;
  err = read_attrs(cf, backward, &c->opt);
  static const char *const names[] = {"q", "k", "v"};
  for (int s = Q; !err && s <= V; s++) err = take(c, s, arg(cf, s), 4, names[s]);
  if (err) return err;
  c->lead = c->op[Q].lead;
  if (c->lead < 0 || c->op[K].lead != c->lead || c->op[V].lead != c->lead)
    return ffi_error(c->api, "fmha: q, k, v must be [B, T, N, H]");
  return NULL;
}

/* ---- the forward ---------------------------------------------------------------------- */

static XLA_FFI_Error *forward_slice(const call *c, int64_t batch, char *const ptr[], bool per_slice) {
  fmha_problem p;
  make_problem(c, batch, &p);
  attach_extras(c, ptr, &p);
  fix_folded_batch_strides(c, batch, &p);
  float *lse = (float *)ptr[LSE];
  fmha_status st;
  if ((per_slice && c->one_shot) || c->uncached) {
    st = fmha_forward(&p, ptr[Q], ptr[K], ptr[V], ptr[O], lse, NULL, 0);
  } else {
    shared_plan *sp = NULL;
    st = plan_get(&p, &sp);
    if (st == FMHA_OK) {
      st = fmha_plan_forward(sp->plan, ptr[Q], ptr[K], ptr[V], ptr[O], lse);
      plan_release(sp);
    }
  }
  return st == FMHA_OK ? NULL : status_error(c->api, "fmha_forward", st);
}

FMHA_FFI_EXPORT XLA_FFI_Error *fmha_ffi_forward(XLA_FFI_CallFrame *cf);
FMHA_FFI_EXPORT XLA_FFI_Error *fmha_ffi_forward(XLA_FFI_CallFrame *cf) {
  bool answered;
  call c;
  XLA_FFI_Error *err = start_call(cf, false, &c, &answered);
  if (err || answered) return err;
  fmha_dtype kv_code;
  const XLA_FFI_Buffer *q = arg(cf, 0), *k = arg(cf, 1), *v = arg(cf, 2), *o = ret(cf, 0), *lse = ret(cf, 1);
  if (!dtype_code(q->dtype, &c.dtype) || o->dtype != q->dtype || !dtype_code(k->dtype, &kv_code) ||
      v->dtype != k->dtype || (kv_code != c.dtype && c.dtype != FMHA_DTYPE_F32))
    return ffi_error(c.api, "fmha: q, k, v and o must share a dtype of float32, bfloat16 or float16 (or k and v "
                     "one of bfloat16 or float16 beside float32 q and o)");
  c.kv_dtype = kv_code == c.dtype ? FMHA_KV_DTYPE_SAME : (fmha_kv_dtype)(kv_code + 1);
  if (lse->dtype != XLA_FFI_DataType_F32) return ffi_error(c.api, "fmha: lse must be float32");
  if ((err = take(&c, O, o, 4, "o")) || (err = take(&c, LSE, lse, 3, "lse"))) return err;
  if ((err = read_extras(cf, 3, &c)) || (err = check_main(&c))) return err;
  if (c.op[O].lead != c.lead || c.op[LSE].lead != c.lead) return ffi_error(c.api, "fmha: wrong rank of o or lse");
  memcpy(c.lead_dims, c.op[O].dims, sizeof(int64_t) * (size_t)c.lead);
  return for_each_slice(&c, forward_slice);
}

/* ---- the backward --------------------------------------------------------------------- */

static XLA_FFI_Error *backward_slice(const call *c, int64_t batch, char *const ptr[], bool per_slice) {
  fmha_problem p;
  make_problem(c, batch, &p);
  attach_extras(c, ptr, &p);
  fix_folded_batch_strides(c, batch, &p);
  fmha_param_grads grads;
  memset(&grads, 0, sizeof grads);
  if (c->op[DBIAS].present) {
    grads.d_dense = (float *)ptr[DBIAS];
    broadcast_strides(&c->op[DBIAS], grads.d_dense_strides);
    if (batch != c->B && core(&c->op[DBIAS], 0) == 1) grads.d_dense_strides[0] = c->op[DBIAS].strides[c->lead - 1];
  }
  if (c->op[DALIBI].present) grads.d_alibi = (float *)ptr[DALIBI];
  if (c->op[DREL].present) grads.d_rel_table = (float *)ptr[DREL];
  const float *lse = (const float *)ptr[LSE];
  const fmha_param_grads *g = grads.d_dense || grads.d_alibi || grads.d_rel_table ? &grads : NULL;
  fmha_status st;
  if ((per_slice && c->one_shot) || c->uncached) {
    st = fmha_backward(&p, ptr[Q], ptr[K], ptr[V], ptr[O], ptr[DO], lse, ptr[DQ], ptr[DK], ptr[DV], g, NULL, 0);
  } else {
    shared_plan *sp = NULL;
    st = plan_get(&p, &sp);
    if (st == FMHA_OK) {
      st = fmha_plan_backward(sp->plan, ptr[Q], ptr[K], ptr[V], ptr[O], ptr[DO], lse, ptr[DQ], ptr[DK], ptr[DV], g);
      plan_release(sp);
    }
  }
  if (st != FMHA_OK) return status_error(c->api, "fmha_backward", st);
  if (c->op[DSINKS].present) {
    st = fmha_sinks_backward(&p, ptr[O], ptr[DO], lse, (float *)ptr[DSINKS]);
    if (st != FMHA_OK) return status_error(c->api, "fmha_sinks_backward", st);
  }
  return NULL;
}

FMHA_FFI_EXPORT XLA_FFI_Error *fmha_ffi_backward(XLA_FFI_CallFrame *cf);
FMHA_FFI_EXPORT XLA_FFI_Error *fmha_ffi_backward(XLA_FFI_CallFrame *cf) {
  bool answered;
  call c;
  XLA_FFI_Error *err = start_call(cf, true, &c, &answered);
  if (err || answered) return err;
  const XLA_FFI_DataType t = arg(cf, 0)->dtype;
  bool same = dtype_code(t, &c.dtype);
  for (int i = 1; i < 6; i++) same = same && (i == 4 || arg(cf, i)->dtype == t);
  for (int i = 0; i < 3; i++) same = same && ret(cf, i)->dtype == t;
  if (!same)
    return ffi_error(c.api, "fmha: q, k, v, o, d_o and the gradients must share a dtype of float32, bfloat16 or "
                     "float16");
  c.kv_dtype = FMHA_KV_DTYPE_SAME;
  if (arg(cf, 4)->dtype != XLA_FFI_DataType_F32) return ffi_error(c.api, "fmha: lse must be float32");
  if ((err = take(&c, O, arg(cf, 3), 4, "o")) || (err = take(&c, LSE, arg(cf, 4), 3, "lse")) ||
      (err = take(&c, DO, arg(cf, 5), 4, "d_o")) || (err = take(&c, DQ, ret(cf, 0), 4, "dq")) ||
      (err = take(&c, DK, ret(cf, 1), 4, "dk")) || (err = take(&c, DV, ret(cf, 2), 4, "dv")))
    return err;
  if ((err = read_extras(cf, 6, &c)) || (err = check_main(&c))) return err;
  static const int core4[] = {O, DO, DQ, DK, DV};
  for (size_t i = 0; i < sizeof core4 / sizeof core4[0]; i++)
    if (c.op[core4[i]].lead != c.lead) return ffi_error(c.api, "fmha: wrong rank of o, d_o or a gradient");
  if (c.op[LSE].lead != c.lead) return ffi_error(c.api, "fmha: wrong rank of lse");
  memcpy(c.lead_dims, c.op[DQ].dims, sizeof(int64_t) * (size_t)c.lead);
  /* The parameter gradients asked for, in the order of their bits. */
  static const struct { int64_t bit; int param, grad, rank; const char *name; } wanted[] = {
      {kGradBias, BIAS, DBIAS, 4, "d_bias"}, {kGradAlibi, ALIBI, DALIBI, 1, "d_alibi"},
      {kGradRelTable, REL, DREL, 2, "d_rel_table"}, {kGradSinks, SINKS, DSINKS, 1, "d_sinks"}};
  int64_t next = 3;
  for (size_t i = 0; i < sizeof wanted / sizeof wanted[0]; i++) {
    if (!(c.opt.grads & wanted[i].bit)) continue;
    if (!c.op[wanted[i].param].present) return ffi_error(c.api, "fmha: %s without its parameter", wanted[i].name);
    if (next >= cf->rets.size) return ffi_error(c.api, "fmha: missing result %s", wanted[i].name);
    const XLA_FFI_Buffer *db = ret(cf, next++);
    if (db->dtype != XLA_FFI_DataType_F32) return ffi_error(c.api, "fmha: %s must be float32", wanted[i].name);
    if ((err = take(&c, wanted[i].grad, db, wanted[i].rank, wanted[i].name))) return err;
    if (c.op[wanted[i].grad].lead != c.lead) return ffi_error(c.api, "fmha: wrong rank of %s", wanted[i].name);
  }
  if (next != cf->rets.size) return ffi_error(c.api, "fmha: unexpected extra results");
  return for_each_slice(&c, backward_slice);
}

/* ---- the plan cache's counts ---------------------------------------------------------- */

/* The plan cache's size, capacity, hits and misses; and emptying it. */
FMHA_FFI_EXPORT void fmha_ffi_plan_cache_stats(int64_t out[4]);
FMHA_FFI_EXPORT void fmha_ffi_plan_cache_stats(int64_t out[4]) {
  pthread_mutex_lock(&plan_cache.mu);
  out[0] = plan_cache.size;
  out[1] = kPlanCapacity;
  out[2] = plan_cache.hits;
  out[3] = plan_cache.misses;
  pthread_mutex_unlock(&plan_cache.mu);
}

FMHA_FFI_EXPORT void fmha_ffi_plan_cache_clear(void);
FMHA_FFI_EXPORT void fmha_ffi_plan_cache_clear(void) {
  shared_plan *dropped[kPlanCapacity];
  pthread_mutex_lock(&plan_cache.mu);
  const int n = plan_cache.size;
  for (int i = 0; i < n; i++) dropped[i] = plan_cache.entries[i].shared;
  plan_cache.size = 0;
  plan_cache.hits = plan_cache.misses = 0;
  pthread_mutex_unlock(&plan_cache.mu);
  for (int i = 0; i < n; i++) plan_release(dropped[i]);
}
