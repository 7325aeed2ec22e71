"""conftest: what the binding tests share: a float64 NumPy reference of
attention with every mask and bias of fmha.h (the oracle, independent of
the C library), random inputs, and `require`, which skips a test while the
C library answers FMHA_ERR_UNSUPPORTED for a feature it needs (found by a
tiny probe call, so the tests start running when the feature lands).
"""

import numpy as np
import pytest

# ---- the float64 reference ---------------------------------------------------------------


def rel_bucket(rel, num_buckets, max_distance, bidirectional):
    """T5 bucket of relative positions rel = key - query (array in, array out)."""
    n = -np.asarray(rel, dtype=np.int64)
    base = np.zeros_like(n)
    nb = num_buckets
    if bidirectional:
        nb //= 2
        base = np.where(n < 0, nb, 0)
        n = np.abs(n)
    else:
        n = np.maximum(n, 0)
    if nb <= 1:
        return np.minimum(base, num_buckets - 1)
    max_exact = nb // 2
    large = np.full_like(n, nb - 1)
    if max_distance > max_exact:
        with np.errstate(divide="ignore"):
            v = max_exact + np.log(np.maximum(n, 1) / max_exact) / np.log(max_distance / max_exact) * (
                nb - max_exact) + 1e-9
        large = np.where(v < nb - 1, np.floor(v).astype(np.int64), large)
    return base + np.where(n < max_exact, n, large)


def reference(q, k, v, *, bias=None, mask=None, scale=None, is_causal=False, causal_alignment="top_left",
              window=None, q_lengths=None, kv_lengths=None, segment_ids=None, alibi=None, rel_table=None,
              rel_max_distance=128, rel_bidirectional=True, softcap=None, sinks=None, dropout=None, d_out=None):
    """Attention in float64 with fmha's conventions ([B, T, N, H] inputs,
    rows that see no key give O = 0 and lse = -inf, or lse = sink with sinks).
    Bottom-right alignment follows each sequence's own lengths:
    off[b] = kv_lengths[b] - q_lengths[b] (S and T when not given). Returns a
    dict with o [B, T, N, Hv] and lse [B, N, T]; with d_out also dq, dk, dv
    and the gradients of the bias sources given (d_bias in bias's shape,
    d_sinks [N]). dropout: Z [B, N, T, S], O = (P Z) V (0 or 1 / (1 - p) each)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, T, N, H = q.shape
    S, K = k.shape[1], k.shape[2]
    G = N // K
    kr, vr = np.repeat(k, G, axis=2), np.repeat(v, G, axis=2)
    scale = 1.0 / np.sqrt(H) if scale is None else scale
    x = scale * np.einsum("btnh,bsnh->bnts", q, kr)
    s = softcap * np.tanh(x / softcap) if softcap else x.copy()
    off = np.zeros(B, np.int64)
    if causal_alignment == "bottom_right":
        kv_len = np.asarray(kv_lengths, np.int64) if kv_lengths is not None else np.full(B, S)
        q_len = np.asarray(q_lengths, np.int64) if q_lengths is not None else np.full(B, T)
        off = kv_len - q_len
    # a [B, 1, T, S]: query i minus key j in the alignment's coordinates
    a = (np.arange(T)[None, :, None] + off[:, None, None] - np.arange(S)[None, None, :])[:, None]
    if bias is not None:
        b64 = np.asarray(bias, np.float64)
        s = s + b64.reshape((1,) * (4 - b64.ndim) + b64.shape)
    if alibi is not None:
        s = s - np.asarray(alibi, np.float64)[None, :, None, None] * np.abs(a)
    if rel_table is not None:
        buckets = rel_bucket(-a, rel_table.shape[1], rel_max_distance, rel_bidirectional)
        s = s + np.asarray(rel_table, np.float64)[np.arange(N)[None, :, None, None], buckets]
    vis = np.ones((B, N, T, S), bool)
    if mask is not None:
        mk = np.asarray(mask, bool)
        vis &= mk.reshape((1,) * (4 - mk.ndim) + mk.shape)
    if is_causal:
        vis &= a >= 0
    if window is not None:
        left, right = (window, window) if np.isscalar(window) else window
        if left is not None and left >= 0:
            vis &= a <= left
        if right is not None and right >= 0:
            vis &= a >= -right
    if kv_lengths is not None:
        vis &= np.arange(S)[None, None, None, :] < np.asarray(kv_lengths)[:, None, None, None]
    if q_lengths is not None:
        vis &= np.arange(T)[None, None, :, None] < np.asarray(q_lengths)[:, None, None, None]
    if segment_ids is not None:
        qs, ks = segment_ids if isinstance(segment_ids, tuple) else (segment_ids, segment_ids)
        vis &= np.asarray(qs)[:, None, :, None] == np.asarray(ks)[:, None, None, :]
    sm = np.where(vis, s, -np.inf)
    m = sm.max(axis=-1, keepdims=True)
    z = None
    if sinks is not None:   # one more logit per head in the denominator, no value
        z = np.asarray(sinks, np.float64)[None, :, None, None]
        m = np.maximum(m, z)
    empty = ~np.isfinite(m)
    p = np.where(vis, np.exp(sm - np.where(empty, 0.0, m)), 0.0)
    l = p.sum(axis=-1, keepdims=True)
    if z is not None:
        l = l + np.exp(z - m)
    p = p / np.where(empty, 1.0, l)
    lse = np.where(empty, -np.inf, m + np.log(np.where(empty, 1.0, l)))[..., 0]
    pz = p if dropout is None else p * np.asarray(dropout, np.float64)
    o = np.einsum("bnts,bsnh->btnh", pz, vr)
    out = {"o": o, "lse": lse}
    if d_out is None:
        return out
    do = np.asarray(d_out, np.float64)
    dp = np.einsum("btnh,bsnh->bnts", do, vr)
    if dropout is not None:   # dL/dP = (dO V^T) Z
        dp = dp * np.asarray(dropout, np.float64)
    dsum = np.einsum("btnh,btnh->bnt", do, o)
    ds = p * (dp - dsum[..., None])
    dx = ds * (1.0 - np.tanh(x / softcap) ** 2) if softcap else ds
    out["dq"] = scale * np.einsum("bnts,bsnh->btnh", dx, kr)
    out["dk"] = (scale * np.einsum("bnts,btnh->bsnh", dx, q)).reshape(B, S, K, G, H).sum(axis=3)
    out["dv"] = np.einsum("bnts,btnh->bsnh", pz, do).reshape(B, S, K, G, -1).sum(axis=3)
    if bias is not None:
        shape = np.shape(bias)
        shape4 = (1,) * (4 - len(shape)) + tuple(shape)
        axes = tuple(i for i in range(4) if shape4[i] == 1)
        out["d_bias"] = ds.sum(axis=axes, keepdims=True).reshape(shape)
    if alibi is not None:
        out["d_alibi"] = (ds * -np.abs(a).astype(np.float64)).sum(axis=(0, 2, 3))
    if rel_table is not None:
        d_rel = np.zeros(rel_table.shape)
        for c in range(rel_table.shape[1]):
            d_rel[:, c] = (ds * (buckets == c)).sum(axis=(0, 2, 3))
        out["d_rel_table"] = d_rel
    if z is not None:   # dL/dz = -sum_t P_sink <dO, O>, P_sink = exp(z - lse)
        p_sink = np.where(empty[..., 0], 0.0, np.exp(z[..., 0] - np.where(empty[..., 0], 0.0, lse)))
        out["d_sinks"] = -(p_sink * dsum).sum(axis=(0, 2))
    return out


def rel_error(x, ref):
    """||x - ref|| / ||ref|| in float64 (absolute when ref is 0)."""
    x = np.asarray(x, np.float64)
    ref = np.asarray(ref, np.float64)
    num = np.linalg.norm((x - ref).ravel())
    den = np.linalg.norm(ref.ravel())
    return num / den if den > 0 else num


def uniform(rng, shape, dtype=np.float32):
    return rng.uniform(-1, 1, shape).astype(dtype)


# ---- paged KV caches ---------------------------------------------------------------------------


def paged(rng, k, v, lengths, page):
    """Page pools [P, page, K, H] of caches k, v [B, S, K, H] and their
    shuffled table [B, max_pages] (-1 past each sequence's pages, whose
    entries are never read); one spare page; unused rows NaN."""
    B, S = k.shape[:2]
    max_pages = -(-S // page)
    order = rng.permutation(B * max_pages + 1)
    pools = [np.full((order.size, page) + x.shape[2:], np.nan, x.dtype) for x in (k, v)]
    table = np.full((B, max_pages), -1, np.int32)
    for b in range(B):
        for j in range(-(-int(lengths[b]) // page)):
            table[b, j] = order[b * max_pages + j]
            for pool, x in zip(pools, (k, v)):
                rows = x[b, j * page:(j + 1) * page]
                pool[table[b, j], :rows.shape[0]] = rows
    return pools[0], pools[1], table


def gather(pool, table, lengths):
    """The contiguous float64 cache [B, max_pages * page, K, H] that pool
    [P, page, K, H] and table [B, max_pages] describe: key j of sequence b
    is row j % page of page table[b, j // page]; zeros past lengths[b]."""
    page = pool.shape[1]
    B, max_pages = table.shape
    out = np.zeros((B, max_pages * page) + pool.shape[2:])
    for b in range(B):
        for j in range(int(lengths[b])):
            out[b, j] = pool[table[b, j // page], j % page].astype(np.float64)
    return out


def paged_case(seed, T, N, K, page, kv_dtype=np.float32, *, B=3, H=16, S=None, sinks=False, is_causal=True):
    """A paged decoding / chunked-prefill case: float32 query [B, T, N, H],
    pools of kv_dtype from paged() (shuffled table, NaN in unused rows),
    ragged key lengths (one full, one random, one of 0 or 1) and the float64
    reference on the caches gathered back from the pools (bottom-right
    causal when is_causal, each sequence aligned by its own length).
    Returns a dict: q, k, v (pools), table, lengths, sinks (or None), ref."""
    rng = np.random.default_rng(seed)
    S = S or 2 * page + 5
    q = uniform(rng, (B, T, N, H))
    k, v = (uniform(rng, (B, S, K, H)).astype(kv_dtype) for _ in range(2))
    lengths = np.array([S, rng.integers(1, S), seed % 2][:B], np.int32)
    z = uniform(rng, (N,)) * 2 if sinks else None
    kp, vp, table = paged(rng, k, v, lengths, page)
    ref = reference(q, gather(kp, table, lengths), gather(vp, table, lengths), is_causal=is_causal,
                    causal_alignment="bottom_right", kv_lengths=lengths, sinks=z)
    return dict(q=q, k=kp, v=vp, table=table, lengths=lengths, sinks=z, ref=ref)


# jax.nn's masked score: -0.7 times float32's largest (float32 scores)
JAX_MASKED_SCORE = float(np.float32(-0.7 * np.finfo(np.float32).max))


def jax_reference(q, k, v, **kw):
    """reference() under jax.nn's rule for rows that see no key, which
    fmha.jax follows off paged caches: such a row before its query length
    weighs every key alike (O = the mean of all S values, dV gains dO / S),
    past it O = 0; its lse is jax.nn's masked score. Sinks keep every row
    seeing one (its lse finite)."""
    ref = reference(q, k, v, **kw)
    v64 = np.asarray(v, np.float64)
    B, S, K, Hv = v64.shape
    T, N = ref["o"].shape[1], ref["o"].shape[2]
    G = N // K
    none = np.isneginf(ref["lse"])  # [B, N, T]
    rows = none.copy()
    if kw.get("q_lengths") is not None:
        rows &= np.arange(T)[None, None, :] < np.asarray(kw["q_lengths"])[:, None, None]
    rows_t = np.transpose(rows, (0, 2, 1))[..., None]  # [B, T, N, 1]
    mean = np.repeat(v64.mean(axis=1), G, axis=1)  # [B, N, Hv]: query head n reads kv head n // G
    ref["o"] = np.where(rows_t, mean[:, None], ref["o"])
    ref["lse"] = np.where(none, JAX_MASKED_SCORE, ref["lse"])
    if kw.get("d_out") is not None and "dv" in ref:
        d_o = np.where(rows_t, np.asarray(kw["d_out"], np.float64), 0.0).sum(axis=1)  # [B, N, Hv]
        ref["dv"] = ref["dv"] + (d_o.reshape(B, K, G, Hv).sum(axis=2) / S)[:, None]
    return ref


def check_paged(out, lse, ref, tol=2e-5):
    """out [B, T, N, Hv] and lse [B, N, T] (or None) against the reference:
    relative error of out below tol, the same rows without keys (lse
    -inf), lse within 1e-4 elsewhere."""
    assert rel_error(out, ref["o"]) < tol
    if lse is not None:
        lse = np.asarray(lse)
        seen = np.isfinite(ref["lse"])
        assert np.array_equal(seen, np.isfinite(lse))
        assert np.max(np.abs(lse[seen] - ref["lse"][seen]), initial=0.0) < 1e-4


def prefill_then_decode(attend, rng, *, page, kv_dtype=np.float32, prompts=(9, 5), total=21, N=4, K=2, H=16):
    """Serves len(prompts) sequences of `total` tokens as an inference
    engine does, through attend(q, k_pool, v_pool, table, kv_lengths,
    q_lengths) -> out [B, T, N, H] (a binding's paged call, bottom-right
    causal): each token's key and value are written into its page (a
    shuffled table), then one prefill chunk runs every prompt (ragged:
    prompts[b] queries of a padded chunk, q_lengths), then one token at a
    time (q_lengths 0 for sequences already done). Returns the outputs of
    every token [B, total, N, H] and the contiguous q [B, total, N, H], k, v
    [B, total, K, H] for the one causal forward they must equal."""
    B = len(prompts)
    q = uniform(rng, (B, total, N, H))
    k, v = (uniform(rng, (B, total, K, H)).astype(kv_dtype) for _ in range(2))
    max_pages = -(-total // page)
    table = rng.permutation(B * max_pages).astype(np.int32).reshape(B, max_pages)
    k_pool, v_pool = (np.full((B * max_pages, page, K, H), np.nan, kv_dtype) for _ in range(2))

    def write(b, j):
        k_pool[table[b, j // page], j % page] = k[b, j]
        v_pool[table[b, j // page], j % page] = v[b, j]

    out = np.zeros((B, total, N, H), np.float32)
    pos = np.array(prompts, np.int32)
    for b in range(B):
        for j in range(pos[b]):
            write(b, j)
    o = np.asarray(attend(q[:, :pos.max()], k_pool, v_pool, table, pos, pos))
    for b in range(B):
        out[b, :pos[b]] = o[b, :pos[b]]
    while (pos < total).any():
        live = pos < total
        for b in np.flatnonzero(live):
            write(b, pos[b])
        step = np.minimum(pos, total - 1)
        o = np.asarray(attend(q[np.arange(B), step][:, None], k_pool, v_pool, table, np.minimum(pos + 1, total),
                              live.astype(np.int32)))
        out[live, pos[live]] = o[live, 0]
        pos = pos + live
    return out, q, k, v


# ---- skipping what the C library does not serve yet ------------------------------------------

_PROBES = {}


def _probe_call(feature):
    import fmha

    rng = np.random.default_rng(0)
    B, T, N, H = 1, 4, 2, 8
    q, k, v = (uniform(rng, (B, T, N, H)) for _ in range(3))
    dtype = {"bfloat16": "bfloat16", "float16": np.float16}.get(feature)
    if dtype is not None:
        if dtype == "bfloat16":
            import ml_dtypes

            dtype = ml_dtypes.bfloat16
        q, k, v = (x.astype(dtype) for x in (q, k, v))
    options = {
        "mask": dict(mask=np.ones((B, N, T, T), bool)),
        "bias": dict(bias=np.zeros((B, N, T, T), np.float32)),
        "window": dict(local_window_size=(1, 1)),
        "q_lengths": dict(query_seq_lengths=np.array([T], np.int32)),
        "kv_lengths": dict(key_value_seq_lengths=np.array([T], np.int32)),
        "segments": dict(segment_ids=np.zeros((B, T), np.int32)),
        "alibi": dict(alibi_slopes=np.ones(N, np.float32)),
        "rel_table": dict(rel_table=np.zeros((N, 8), np.float32)),
        "softcap": dict(softcap=10.0),
        "mask_callback": dict(mask_callback=fmha.MaskCallback(lambda tile, visible: None)),
        "bias_callback": dict(bias_callback=fmha.BiasCallback(lambda tile, scores: None, lambda t, g: None)),
        "bottom_right": dict(is_causal=True, causal_alignment="bottom_right"),
        "bfloat16": {},
        "float16": {},
    }[feature]
    o, lse = fmha.attention(q, k, v, return_lse=True, **options)
    fmha.attention_backward(q, k, v, o, lse, o, return_bias_grads=True, **options)


def unsupported_reason(feature):
    """None when the C library serves `feature` (forward and backward), else why not."""
    if feature not in _PROBES:
        from fmha import FmhaError

        try:
            _probe_call(feature)
            _PROBES[feature] = None
        except FmhaError as e:
            if not e.unsupported:
                raise
            _PROBES[feature] = f"the C library answers FMHA_ERR_UNSUPPORTED for {feature} (not implemented yet)"
    return _PROBES[feature]


def require(*features):
    """Skips the calling test while any of `features` is unsupported by the C library."""
    for f in features:
        reason = unsupported_reason(f)
        if reason:
            pytest.skip(reason)
