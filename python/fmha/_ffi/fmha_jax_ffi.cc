// fmha_jax_ffi.cc: XLA FFI handlers (CPU custom calls) that run fmha_forward
// and fmha_backward on XLA's buffers, for fmha.jax. Compiled by fmha/jax.py
// against the headers jaxlib ships (jax.ffi.include_dir()) and linked to
// libfmha; registered as the targets "fmha_forward" and "fmha_backward".
//
// Operands (row-major, as XLA lays them out for custom calls):
//   forward  args q [B,T,N,H], k [B,S,K,H], v [B,S,K,Hv], then the extras
//            named by the `extras` bit set, in this order:
//              bias [b,n,t,s] f32, mask [b,n,t,s] pred (each dim 1 or full),
//              q_lengths [B] s32, kv_lengths [B] s32,
//              q_segment_ids [B,T] s32, kv_segment_ids [B,S] s32,
//              alibi_slopes [N] f32, rel_table [N,buckets] f32, sinks [N] f32,
//              dropout_seed [2] u32 (seed = s[0] << 32 | s[1], offset 0),
//              block_table [B,max_pages] s32 (a paged KV cache: k and v are
//              page pools [P,page,K,H] / [P,page,K,Hv], fmha_problem's
//              block_table; forward only)
//            rets o [B,T,N,Hv] (q's dtype), lse [B,N,T] f32
//            k and v may be bfloat16 or float16 beside float32 q and o (a
//            cache dtype of their own, fmha_problem.kv_dtype; forward only).
//   backward args q, k, v, o, lse, d_o, extras; rets dq, dk, dv, then one
//            f32 result in the shape of each parameter named by the `grads`
//            bit set (1 d_bias, 2 d_alibi, 4 d_rel_table, 8 d_sinks), in
//            that order. d_sinks comes from fmha_sinks_backward.
//   attributes scale, causal (an fmha_causal, or kCausalNoneBottomRight:
//            none with bottom-right alignment), window_left/right,
//            strategy, extras, softcap, precision, rel_max_distance,
//            rel_bidirectional, dropout_p (backward: grads).
// Every operand may carry the same number of extra leading dimensions (vmap
// with vmap_method="expand_dims"): size 1 broadcasts, the results have the
// full size. Those dimensions fold into the batch when every operand allows
// it, otherwise each leading index is one library call.
//
// Runs go through fmha plans kept in a small cache (PlanCache below), so a
// jitted step pays for validation and workspace allocation once per shape.
#include <cstdint>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "fmha.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// The codes, bits and attribute names below are python/fmha/_spec.py's;
// tests/python/test_spec.py reads them out of this file and compares.
enum ExtraBits : int64_t {
  kBias = 1, kMask = 2, kQLengths = 4, kKvLengths = 8, kQSegments = 16, kKvSegments = 32,
  kAlibi = 64, kRelTable = 128, kSinks = 256, kDropoutSeed = 512, kBlockTable = 1024
};
enum GradBits : int64_t { kGradBias = 1, kGradAlibi = 2, kGradRelTable = 4, kGradSinks = 8 };
// The bindings' causal code past fmha_causal's: no causal mask, bottom-right alignment.
constexpr int64_t kCausalNoneBottomRight = 3;

const char *StatusName(fmha_status st) {
  static const char *const names[] = {
      "FMHA_OK",           "FMHA_ERR_NULL_POINTER", "FMHA_ERR_BAD_SIZE",
      "FMHA_ERR_BAD_HEADS", "FMHA_ERR_BAD_HEAD_DIM", "FMHA_ERR_BAD_SCALE",
      "FMHA_ERR_BAD_STRIDE", "FMHA_ERR_OVERLAP",    "FMHA_ERR_BAD_OPTION",
      "FMHA_ERR_UNSUPPORTED", "FMHA_ERR_WORKSPACE_TOO_SMALL",
      "FMHA_ERR_OUT_OF_MEMORY", "FMHA_ERR_BAD_THREAD_COUNT", "FMHA_ERR_BAD_MASK",
      "FMHA_ERR_CALLBACK", "FMHA_ERR_STRUCT_SIZE", "FMHA_ERR_BAD_PAGE",
      "FMHA_ERR_BAD_FILE"};
  unsigned i = static_cast<unsigned>(st);
  return i < sizeof names / sizeof names[0] ? names[i] : "FMHA_ERR_?";
}

ffi::Error StatusError(const char *fn, fmha_status st) {
  // The text fmha.jax turns back into an FmhaError: "fmha: <fn>: <message>[: <detail>] (<NAME>)",
  // the detail being the library's fmha_last_error_message on this thread.
  std::string detail = fmha_last_error_message();
  return ffi::Error(ffi::ErrorCode::kInvalidArgument,
                    std::string("fmha: ") + fn + ": " + fmha_status_string(st) +
                        (detail.empty() ? "" : ": " + detail) + " (" + StatusName(st) + ")");
}

ffi::Error ArgError(const std::string &what) {
  return ffi::Error(ffi::ErrorCode::kInvalidArgument, "fmha: " + what);
}

// Plans keyed by the full bytes of the fmha_problem a call builds (zeroed
// first, so padding compares equal). The problem holds the addresses of the
// mask, bias and length buffers it names, so a call whose buffers moved
// misses and makes a new plan, which is correct (a plan reads the arrays at
// its problem's addresses), and a call whose buffers stayed put (constants,
// reused arguments) hits. Bounded: past kCapacity the least recently used
// entry is dropped; shared ownership frees its plan when the last run using
// it returns. Handlers may run concurrently: one mutex guards the index,
// and runs on one plan are serialised by the library.
class PlanCache {
 public:
  using PlanPtr = std::shared_ptr<fmha_plan>;
  static constexpr size_t kCapacity = 32;

  // The plan of *p in *out, made on a miss; the status of fmha_plan_create otherwise.
  fmha_status Get(const fmha_problem &p, PlanPtr *out) {
    std::string key(reinterpret_cast<const char *>(&p), sizeof p);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (Find(key, out)) {
        hits_++;
        return FMHA_OK;
      }
      misses_++;
    }
    fmha_plan *raw = nullptr;
    fmha_status st = fmha_plan_create(&p, &raw);
    if (st != FMHA_OK) return st;
    PlanPtr plan(raw, fmha_plan_destroy);
    std::vector<PlanPtr> evicted;  // released after the lock
    std::lock_guard<std::mutex> lock(mu_);
    if (Find(key, out)) return FMHA_OK;  // another thread made it meanwhile
    lru_.push_front(Entry{key, plan});
    index_[key] = lru_.begin();
    while (lru_.size() > kCapacity) {
      evicted.push_back(std::move(lru_.back().plan));
      index_.erase(lru_.back().key);
      lru_.pop_back();
    }
    *out = std::move(plan);
    return FMHA_OK;
  }

  // size, capacity, hits, misses
  void Stats(int64_t out[4]) {
    std::lock_guard<std::mutex> lock(mu_);
    out[0] = static_cast<int64_t>(lru_.size());
    out[1] = static_cast<int64_t>(kCapacity);
    out[2] = hits_;
    out[3] = misses_;
  }

  void Clear() {
    std::list<Entry> dropped;
    std::lock_guard<std::mutex> lock(mu_);
    dropped.swap(lru_);
    index_.clear();
    hits_ = misses_ = 0;
  }

 private:
  struct Entry {
    std::string key;
    PlanPtr plan;
  };

  // Under mu_: the entry of key moved to the front, its plan in *out.
  bool Find(const std::string &key, PlanPtr *out) {
    auto it = index_.find(key);
    if (it == index_.end()) return false;
    lru_.splice(lru_.begin(), lru_, it->second);
    *out = it->second->plan;
    return true;
  }

  std::mutex mu_;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  int64_t hits_ = 0, misses_ = 0;
};

// Never destroyed: plans must not outlive libfmha at exit.
PlanCache &Plans() {
  static PlanCache *cache = new PlanCache;
  return *cache;
}

// One operand: data, element size and row-major element strides, with
// `lead` leading (vmap) dimensions before its core dimensions.
struct Operand {
  char *data = nullptr;
  size_t elem = 0;
  int lead = 0;
  std::vector<int64_t> dims, strides;

  bool present() const { return data != nullptr || !dims.empty(); }
  int64_t core(int i) const { return dims[lead + i]; }
  int64_t core_stride(int i) const { return strides[lead + i]; }
};

Operand Describe(void *data, ffi::DataType dt, ffi::AnyBuffer::Dimensions dims, int core_rank) {
  Operand op;
  op.data = static_cast<char *>(data);
  op.elem = ffi::ByteWidth(dt);
  op.dims.assign(dims.begin(), dims.end());
  op.lead = static_cast<int>(op.dims.size()) - core_rank;
  op.strides.assign(op.dims.size(), 1);
  for (int i = static_cast<int>(op.dims.size()) - 2; i >= 0; i--)
    op.strides[i] = op.strides[i + 1] * op.dims[i + 1];
  return op;
}

Operand Describe(const ffi::AnyBuffer &b, int core_rank) {
  return Describe(b.untyped_data(), b.element_type(), b.dimensions(), core_rank);
}

bool DtypeCode(ffi::DataType dt, fmha_dtype *code) {
  switch (dt) {
    case ffi::DataType::F32: *code = FMHA_DTYPE_F32; return true;
    case ffi::DataType::BF16: *code = FMHA_DTYPE_BF16; return true;
    case ffi::DataType::F16: *code = FMHA_DTYPE_F16; return true;
    default: return false;
  }
}

struct Options {
  float scale;
  int64_t causal, window_left, window_right, strategy, extras;
  float softcap;
  int64_t precision, rel_max_distance, rel_bidirectional;
  float dropout_p;
};

// Operand slots.
enum Slot {
  Q, K, V, O, LSE, DO, DQ, DK, DV, BIAS, MASK, QLEN, KVLEN, QSEG, KVSEG, ALIBI, REL, SINKS,
  DROPOUT_SEED, BLOCK_TABLE, DBIAS, DALIBI, DREL, DSINKS, NSLOTS
};

// Operands that serve every batch entry at once (per-head [N] arrays, the
// dropout seed, whose draw depends on the batch index): leading (vmap)
// dimensions cannot fold into the batch.
bool PerHead(int s) {
  return s == ALIBI || s == REL || s == SINKS || s == DROPOUT_SEED || s == DALIBI || s == DREL ||
         s == DSINKS;
}

struct Call {
  Operand op[NSLOTS];
  std::vector<int64_t> lead_dims;  // the results' leading dimensions
  int lead = 0;
};

// Dense mask/bias strides [b, h, t, s] with 0 on broadcast dimensions.
void BroadcastStrides(const Operand &op, int64_t out[4]) {
  for (int i = 0; i < 4; i++) out[i] = op.core(i) == 1 ? 0 : op.core_stride(i);
}

// Builds the problem for `batch` batch entries from the core shapes. With
// a block table, k and v are page pools [P, page, K, H] and a sequence
// holds up to max_pages * page keys.
void MakeProblem(const Call &c, const Options &o, fmha_dtype dtype, fmha_kv_dtype kv_dtype, int64_t batch,
                 fmha_problem *p) {
  const Operand &q = c.op[Q], &k = c.op[K], &v = c.op[V], &table = c.op[BLOCK_TABLE];
  const bool paged = table.present();
  const int64_t seq_kv = paged ? table.core(1) * k.core(1) : k.core(1);
  std::memset(p, 0, sizeof *p);  // the plan cache compares every byte
  fmha_problem_init(p, batch, q.core(2), k.core(2), q.core(1), seq_kv, q.core(3), v.core(3),
                    FMHA_LAYOUT_BSHD);
  p->dtype = dtype;
  p->kv_dtype = kv_dtype;
  if (paged) {  // pool strides [page, row in page, head, dim]: only the page stride differs
    p->k_strides[0] = k.core_stride(0);
    p->v_strides[0] = v.core_stride(0);
    p->block_table_stride = table.core(1);
    p->page_size = k.core(1);
    p->num_pages = k.core(0);
  }
  p->scale = o.scale;
  const bool none_bottom_right = o.causal == kCausalNoneBottomRight;
  p->causal = static_cast<fmha_causal>(none_bottom_right ? FMHA_CAUSAL_NONE : o.causal);
  p->alignment = none_bottom_right ? FMHA_ALIGN_BOTTOM_RIGHT : FMHA_ALIGN_CAUSAL;
  p->strategy = static_cast<fmha_strategy>(o.strategy);
  p->masks.window_left = o.window_left;
  p->masks.window_right = o.window_right;
  p->biases.softcap = o.softcap;
  p->precision = static_cast<fmha_precision>(o.precision);
  if (c.op[DROPOUT_SEED].present()) p->dropout_p = o.dropout_p;
  if (c.op[REL].present()) {
    p->biases.rel_max_distance = static_cast<int32_t>(o.rel_max_distance);
    p->biases.rel_bidirectional = static_cast<int32_t>(o.rel_bidirectional);
  }
}

// Folds the leading dimensions into the batch when every present operand
// has them at full size and its batch dimension allows it. A block table
// never folds: its entries index the pages of its own slice's pools.
bool CanFold(const Call &c, int64_t B) {
  for (int s = 0; s < NSLOTS; s++) {
    const Operand &op = c.op[s];
    if (!op.present()) continue;
    if (PerHead(s) || s == BLOCK_TABLE) return false;
    for (int i = 0; i < c.lead; i++)
      if (op.dims[i] != c.lead_dims[i]) return false;
    if ((s == BIAS || s == MASK || s == DBIAS) && op.core(0) != B && B != 1) return false;
  }
  return true;
}

// Calls fn(batch, pointers, per_slice) once with the leading dimensions
// folded into the batch (per_slice false), or once per leading index with
// each operand's slice (per_slice true).
template <typename Fn>
ffi::Error ForEachSlice(Call &c, int64_t B, Fn fn) {
  int64_t count = 1;
  for (int64_t d : c.lead_dims) count *= d;
  if (count == 0) return ffi::Error::Success();
  if (c.lead == 0 || CanFold(c, B)) {
    char *ptr[NSLOTS];
    for (int s = 0; s < NSLOTS; s++) ptr[s] = c.op[s].data;
    return fn(B * count, ptr, false);
  }
  std::vector<int64_t> idx(c.lead, 0);
  for (int64_t n = 0; n < count; n++) {
    char *ptr[NSLOTS];
    for (int s = 0; s < NSLOTS; s++) {
      const Operand &op = c.op[s];
      ptr[s] = op.data;
      if (!op.present() || !op.data) continue;
      int64_t off = 0;
      for (int i = 0; i < c.lead; i++)
        if (op.dims[i] != 1) off += idx[i] * op.strides[i];
      ptr[s] = op.data + off * static_cast<int64_t>(op.elem);
    }
    ffi::Error err = fn(B, ptr, true);
    if (!err.success()) return err;
    for (int i = c.lead - 1; i >= 0; i--) {
      if (++idx[i] < c.lead_dims[i]) break;
      idx[i] = 0;
    }
  }
  return ffi::Error::Success();
}

// Reads the extras into c.op[BIAS..KVLEN] and checks their types and ranks.
ffi::Error ReadExtras(const ffi::RemainingArgs &extras, const Options &o, Call &c) {
  size_t next = 0;
  const struct { int64_t bit; Slot slot; int rank; const char *name; } kinds[] = {
      {kBias, BIAS, 4, "bias"}, {kMask, MASK, 4, "mask"},
      {kQLengths, QLEN, 1, "query_seq_lengths"}, {kKvLengths, KVLEN, 1, "key_value_seq_lengths"},
      {kQSegments, QSEG, 2, "query segment_ids"}, {kKvSegments, KVSEG, 2, "key_value segment_ids"},
      {kAlibi, ALIBI, 1, "alibi_slopes"}, {kRelTable, REL, 2, "rel_table"}, {kSinks, SINKS, 1, "sinks"},
      {kDropoutSeed, DROPOUT_SEED, 1, "dropout seed"}, {kBlockTable, BLOCK_TABLE, 2, "block_table"}};
  for (const auto &kind : kinds) {
    if (!(o.extras & kind.bit)) continue;
    if (next >= extras.size()) return ArgError(std::string("missing operand ") + kind.name);
    auto buf = extras.get<ffi::AnyBuffer>(next++);
    if (buf.has_error()) return buf.error();
    ffi::DataType dt = buf->element_type();
    bool is_float = kind.slot == BIAS || kind.slot == ALIBI || kind.slot == REL || kind.slot == SINKS;
    bool ok = is_float                    ? dt == ffi::DataType::F32
              : kind.slot == MASK         ? (dt == ffi::DataType::PRED || dt == ffi::DataType::U8 ||
                                             dt == ffi::DataType::S8)
              : kind.slot == DROPOUT_SEED ? dt == ffi::DataType::U32
                                          : dt == ffi::DataType::S32;
    if (!ok) return ArgError(std::string("wrong element type for ") + kind.name);
    c.op[kind.slot] = Describe(*buf, kind.rank);
    if (c.op[kind.slot].lead != c.lead) return ArgError(std::string("wrong rank for ") + kind.name);
  }
  if (c.op[DROPOUT_SEED].present() && c.op[DROPOUT_SEED].core(0) != 2)
    return ArgError("the dropout seed must hold two uint32");
  if (next != extras.size()) return ArgError("unexpected extra operands");
  return ffi::Error::Success();
}

// Points the problem's masks and biases at one slice.
void AttachExtras(const Call &c, char *const ptr[], fmha_problem *p) {
  if (c.op[BIAS].present()) {
    p->biases.dense = reinterpret_cast<const float *>(ptr[BIAS]);
    BroadcastStrides(c.op[BIAS], p->biases.dense_strides);
  }
  if (c.op[MASK].present()) {
    p->masks.dense = reinterpret_cast<const uint8_t *>(ptr[MASK]);
    BroadcastStrides(c.op[MASK], p->masks.dense_strides);
  }
  if (c.op[QLEN].present()) p->masks.q_lengths = reinterpret_cast<const int32_t *>(ptr[QLEN]);
  if (c.op[KVLEN].present()) p->masks.kv_lengths = reinterpret_cast<const int32_t *>(ptr[KVLEN]);
  if (c.op[QSEG].present()) {
    p->masks.q_segment_ids = reinterpret_cast<const int32_t *>(ptr[QSEG]);
    p->masks.kv_segment_ids = reinterpret_cast<const int32_t *>(ptr[KVSEG]);
  }
  if (c.op[ALIBI].present()) p->biases.alibi_slopes = reinterpret_cast<const float *>(ptr[ALIBI]);
  if (c.op[REL].present()) {
    p->biases.rel_table = reinterpret_cast<const float *>(ptr[REL]);
    p->biases.rel_num_buckets = static_cast<int32_t>(c.op[REL].core(1));
  }
  if (c.op[SINKS].present()) p->sinks = reinterpret_cast<const float *>(ptr[SINKS]);
  if (c.op[BLOCK_TABLE].present()) p->block_table = reinterpret_cast<const int32_t *>(ptr[BLOCK_TABLE]);
  if (c.op[DROPOUT_SEED].present()) {
    const uint32_t *seed = reinterpret_cast<const uint32_t *>(ptr[DROPOUT_SEED]);
    p->dropout_seed = static_cast<uint64_t>(seed[0]) << 32 | seed[1];
  }
}

// When folded, a broadcast bias/mask with batch 1 and B == 1 steps by its
// leading stride; its strides from BroadcastStrides already give 0 for the
// batch, so fix the batch stride up for the folded batch.
void FixFoldedBatchStrides(const Call &c, int64_t batch, int64_t B, fmha_problem *p) {
  if (batch == B) return;
  if (c.op[BIAS].present() && c.op[BIAS].core(0) == 1)
    p->biases.dense_strides[0] = c.op[BIAS].lead ? c.op[BIAS].strides[c.lead - 1] : 0;
  if (c.op[MASK].present() && c.op[MASK].core(0) == 1)
    p->masks.dense_strides[0] = c.op[MASK].lead ? c.op[MASK].strides[c.lead - 1] : 0;
}

// True when the problem names a buffer besides the tensors (mask, bias,
// lengths, block table): per slice, those addresses differ, so each slice would miss
// the plan cache and push useful plans out; such runs take the one-shot calls.
// So do runs with dropout, whose seed (a value in the problem) is new each step.
bool HasExtras(const Call &c) {
  for (int s = BIAS; s <= BLOCK_TABLE; s++)
    if (c.op[s].present()) return true;
  return false;
}

// After ReadExtras: with a block table, k and v are pools [P, page, K, H].
ffi::Error CheckMain(const Call &c) {
  const Operand &q = c.op[Q], &k = c.op[K], &v = c.op[V], &table = c.op[BLOCK_TABLE];
  if (q.lead < 0 || k.lead != q.lead || v.lead != q.lead) return ArgError("q, k, v must be [B, T, N, H]");
  if ((!table.present() && k.core(0) != q.core(0)) || v.core(0) != k.core(0) || k.core(3) != q.core(3) ||
      v.core(1) != k.core(1) || v.core(2) != k.core(2))
    return ArgError("inconsistent q, k, v shapes");
  if (table.present() && table.core(0) != q.core(0)) return ArgError("block_table must be [B, max_pages]");
  return ffi::Error::Success();
}

ffi::Error Forward(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::RemainingArgs extras,
                   ffi::Result<ffi::AnyBuffer> o, ffi::Result<ffi::AnyBuffer> lse, float scale,
                   int64_t causal, int64_t window_left, int64_t window_right, int64_t strategy,
                   int64_t extra_bits, float softcap, int64_t precision, int64_t rel_max_distance,
                   int64_t rel_bidirectional, float dropout_p) {
  Options opt{scale,   causal,    window_left,      window_right,      strategy, extra_bits,
              softcap, precision, rel_max_distance, rel_bidirectional, dropout_p};
  fmha_dtype dtype, kv_code;
  if (!DtypeCode(q.element_type(), &dtype) || o->element_type() != q.element_type() ||
      !DtypeCode(k.element_type(), &kv_code) || v.element_type() != k.element_type() ||
      (kv_code != dtype && dtype != FMHA_DTYPE_F32))
    return ArgError("q, k, v and o must share a dtype of float32, bfloat16 or float16 (or k and v one of "
                    "bfloat16 or float16 beside float32 q and o)");
  const fmha_kv_dtype kv_dtype =
      kv_code == dtype ? FMHA_KV_DTYPE_SAME : static_cast<fmha_kv_dtype>(kv_code + 1);
  if (lse->element_type() != ffi::DataType::F32) return ArgError("lse must be float32");
  Call c;
  c.op[Q] = Describe(q, 4);
  c.op[K] = Describe(k, 4);
  c.op[V] = Describe(v, 4);
  c.op[O] = Describe(*o, 4);
  c.op[LSE] = Describe(*lse, 3);
  c.lead = c.op[Q].lead;
  if (ffi::Error err = ReadExtras(extras, opt, c); !err.success()) return err;
  if (ffi::Error err = CheckMain(c); !err.success()) return err;
  if (c.op[O].lead != c.lead || c.op[LSE].lead != c.lead) return ArgError("wrong rank of o or lse");
  c.lead_dims.assign(c.op[O].dims.begin(), c.op[O].dims.begin() + c.lead);
  const int64_t B = c.op[Q].core(0);
  const bool one_shot = HasExtras(c), uncached = c.op[DROPOUT_SEED].present();
  return ForEachSlice(c, B, [&](int64_t batch, char *const ptr[], bool per_slice) -> ffi::Error {
    fmha_problem p;
    MakeProblem(c, opt, dtype, kv_dtype, batch, &p);
    AttachExtras(c, ptr, &p);
    FixFoldedBatchStrides(c, batch, B, &p);
    float *lse_ptr = reinterpret_cast<float *>(ptr[LSE]);
    if ((per_slice && one_shot) || uncached) {
      fmha_status st = fmha_forward(&p, ptr[Q], ptr[K], ptr[V], ptr[O], lse_ptr, nullptr, 0);
      return st == FMHA_OK ? ffi::Error::Success() : StatusError("fmha_forward", st);
    }
    PlanCache::PlanPtr plan;
    fmha_status st = Plans().Get(p, &plan);
    if (st != FMHA_OK) return StatusError("fmha_forward", st);
    st = fmha_plan_forward(plan.get(), ptr[Q], ptr[K], ptr[V], ptr[O], lse_ptr);
    return st == FMHA_OK ? ffi::Error::Success() : StatusError("fmha_forward", st);
  });
}

ffi::Error Backward(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer o,
                    ffi::AnyBuffer lse, ffi::AnyBuffer d_o, ffi::RemainingArgs extras,
                    ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                    ffi::Result<ffi::AnyBuffer> dv, ffi::RemainingRets more, float scale,
                    int64_t causal, int64_t window_left, int64_t window_right, int64_t strategy,
                    int64_t extra_bits, float softcap, int64_t precision, int64_t rel_max_distance,
                    int64_t rel_bidirectional, float dropout_p, int64_t grad_bits) {
  Options opt{scale,   causal,    window_left,      window_right,      strategy, extra_bits,
              softcap, precision, rel_max_distance, rel_bidirectional, dropout_p};
  fmha_dtype dtype;
  ffi::DataType t = q.element_type();
  if (!DtypeCode(t, &dtype) || k.element_type() != t || v.element_type() != t ||
      o.element_type() != t || d_o.element_type() != t || dq->element_type() != t ||
      dk->element_type() != t || dv->element_type() != t)
    return ArgError("q, k, v, o, d_o and the gradients must share a dtype of float32, bfloat16 or float16");
  if (lse.element_type() != ffi::DataType::F32) return ArgError("lse must be float32");
  Call c;
  c.op[Q] = Describe(q, 4);
  c.op[K] = Describe(k, 4);
  c.op[V] = Describe(v, 4);
  c.op[O] = Describe(o, 4);
  c.op[LSE] = Describe(lse, 3);
  c.op[DO] = Describe(d_o, 4);
  c.op[DQ] = Describe(*dq, 4);
  c.op[DK] = Describe(*dk, 4);
  c.op[DV] = Describe(*dv, 4);
  c.lead = c.op[Q].lead;
  if (ffi::Error err = ReadExtras(extras, opt, c); !err.success()) return err;
  if (ffi::Error err = CheckMain(c); !err.success()) return err;
  for (Slot s : {O, DO, DQ, DK, DV})
    if (c.op[s].lead != c.lead) return ArgError("wrong rank of o, d_o or a gradient");
  if (c.op[LSE].lead != c.lead) return ArgError("wrong rank of lse");
  c.lead_dims.assign(c.op[DQ].dims.begin(), c.op[DQ].dims.begin() + c.lead);
  // The parameter gradients asked for, in the order of their bits.
  const struct { int64_t bit; Slot param, grad; int rank; const char *name; } wanted[] = {
      {kGradBias, BIAS, DBIAS, 4, "d_bias"}, {kGradAlibi, ALIBI, DALIBI, 1, "d_alibi"},
      {kGradRelTable, REL, DREL, 2, "d_rel_table"}, {kGradSinks, SINKS, DSINKS, 1, "d_sinks"}};
  size_t next = 0;
  for (const auto &w : wanted) {
    if (!(grad_bits & w.bit)) continue;
    if (!c.op[w.param].present()) return ArgError(std::string(w.name) + " without its parameter");
    if (next >= more.size()) return ArgError(std::string("missing result ") + w.name);
    auto db = more.get<ffi::AnyBuffer>(next++);
    if (db.has_error()) return db.error();
    if ((*db)->element_type() != ffi::DataType::F32) return ArgError(std::string(w.name) + " must be float32");
    c.op[w.grad] = Describe(**db, w.rank);
    if (c.op[w.grad].lead != c.lead) return ArgError(std::string("wrong rank of ") + w.name);
  }
  if (next != more.size()) return ArgError("unexpected extra results");
  const int64_t B = c.op[Q].core(0);
  const bool one_shot = HasExtras(c), uncached = c.op[DROPOUT_SEED].present();
  return ForEachSlice(c, B, [&](int64_t batch, char *const ptr[], bool per_slice) -> ffi::Error {
    fmha_problem p;
    MakeProblem(c, opt, dtype, FMHA_KV_DTYPE_SAME, batch, &p);
    AttachExtras(c, ptr, &p);
    FixFoldedBatchStrides(c, batch, B, &p);
    fmha_param_grads grads;
    std::memset(&grads, 0, sizeof grads);
    if (c.op[DBIAS].present()) {
      grads.d_dense = reinterpret_cast<float *>(ptr[DBIAS]);
      BroadcastStrides(c.op[DBIAS], grads.d_dense_strides);
      if (batch != B && c.op[DBIAS].core(0) == 1)
        grads.d_dense_strides[0] = c.op[DBIAS].strides[c.lead - 1];
    }
    if (c.op[DALIBI].present()) grads.d_alibi = reinterpret_cast<float *>(ptr[DALIBI]);
    if (c.op[DREL].present()) grads.d_rel_table = reinterpret_cast<float *>(ptr[DREL]);
    const float *lse_ptr = reinterpret_cast<const float *>(ptr[LSE]);
    const bool any_grad = grads.d_dense || grads.d_alibi || grads.d_rel_table;
    const fmha_param_grads *g = any_grad ? &grads : nullptr;
    fmha_status st;
    if ((per_slice && one_shot) || uncached) {
      st = fmha_backward(&p, ptr[Q], ptr[K], ptr[V], ptr[O], ptr[DO], lse_ptr, ptr[DQ], ptr[DK],
                         ptr[DV], g, nullptr, 0);
    } else {
      PlanCache::PlanPtr plan;
      st = Plans().Get(p, &plan);
      if (st == FMHA_OK)
        st = fmha_plan_backward(plan.get(), ptr[Q], ptr[K], ptr[V], ptr[O], ptr[DO], lse_ptr,
                                ptr[DQ], ptr[DK], ptr[DV], g);
    }
    if (st != FMHA_OK) return StatusError("fmha_backward", st);
    if (c.op[DSINKS].present()) {
      st = fmha_sinks_backward(&p, ptr[O], ptr[DO], lse_ptr, reinterpret_cast<float *>(ptr[DSINKS]));
      if (st != FMHA_OK) return StatusError("fmha_sinks_backward", st);
    }
    return ffi::Error::Success();
  });
}

}  // namespace

// The symbols fmha.jax looks up (the library builds with hidden visibility).
#define FMHA_FFI_EXPORT extern "C" __attribute__((visibility("default")))
FMHA_FFI_EXPORT XLA_FFI_Error *fmha_ffi_forward(XLA_FFI_CallFrame *call_frame);
FMHA_FFI_EXPORT XLA_FFI_Error *fmha_ffi_backward(XLA_FFI_CallFrame *call_frame);

// The plan cache's size, capacity, hits and misses; and emptying it.
FMHA_FFI_EXPORT void fmha_ffi_plan_cache_stats(int64_t out[4]) { Plans().Stats(out); }
FMHA_FFI_EXPORT void fmha_ffi_plan_cache_clear(void) { Plans().Clear(); }

XLA_FFI_DEFINE_HANDLER_SYMBOL(fmha_ffi_forward, Forward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .RemainingArgs()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("causal")
                                  .Attr<int64_t>("window_left")
                                  .Attr<int64_t>("window_right")
                                  .Attr<int64_t>("strategy")
                                  .Attr<int64_t>("extras")
                                  .Attr<float>("softcap")
                                  .Attr<int64_t>("precision")
                                  .Attr<int64_t>("rel_max_distance")
                                  .Attr<int64_t>("rel_bidirectional")
                                  .Attr<float>("dropout_p"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(fmha_ffi_backward, Backward,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .RemainingArgs()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .RemainingRets()
                                  .Attr<float>("scale")
                                  .Attr<int64_t>("causal")
                                  .Attr<int64_t>("window_left")
                                  .Attr<int64_t>("window_right")
                                  .Attr<int64_t>("strategy")
                                  .Attr<int64_t>("extras")
                                  .Attr<float>("softcap")
                                  .Attr<int64_t>("precision")
                                  .Attr<int64_t>("rel_max_distance")
                                  .Attr<int64_t>("rel_bidirectional")
                                  .Attr<float>("dropout_p")
                                  .Attr<int64_t>("grads"));
