"""test_torch_transformers: fmha.torch.register_transformers() makes
attn_implementation="fmha" serve transformers models with no other glue.
A tiny random Llama (hidden 64, 2 layers, 4 heads, 2 key/value heads: GQA)
built with "fmha" and with "sdpa" from the same weights must agree:
logits (with and without a padding mask), parameter gradients, the loss
curve of a few training steps, greedy generate with the dynamic cache
(decode: one query against the cache) and with a static cache, and logits
under bf16 autocast; tiny GPT-2, BERT (an encoder) and gpt-oss (sinks,
sliding windows; against its eager attention) too. Skipped when PyTorch or transformers
is not installed."""

import copy

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import fmha.torch as FT  # noqa: E402

from conftest import rel_error  # noqa: E402

TOL = 1e-5       # logits, float32 (both sides round differently in float32)
GRAD_TOL = 1e-4  # parameter gradients through two layers
VOCAB = 101


@pytest.fixture(scope="module", autouse=True)
def registered():
    FT.register_transformers()


def pair(config, auto=None, peer="sdpa"):
    """(fmha model, `peer` model) with the same random weights, in eval mode."""
    auto = auto or transformers.AutoModelForCausalLM
    torch.manual_seed(0)
    ours = auto.from_config(copy.deepcopy(config), attn_implementation="fmha")
    theirs = auto.from_config(copy.deepcopy(config), attn_implementation=peer)
    theirs.load_state_dict(ours.state_dict())
    assert ours.config._attn_implementation == "fmha"
    return ours.eval(), theirs.eval()


def llama():
    return pair(transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                         max_position_embeddings=128))


def batch(seed=1, length=12):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (2, length), generator=gen)
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, :3] = 0  # left padding
    return ids, mask


def test_fmha_is_called():
    ours, _ = llama()
    ids, _ = batch()
    calls = []
    original = FT.scaled_dot_product_attention

    def spy(*args, **kw):
        calls.append(tuple(args[1].shape))
        return original(*args, **kw)

    FT.scaled_dot_product_attention = spy
    try:
        ours(ids)
    finally:
        FT.scaled_dot_product_attention = original
    assert calls == [(2, 2, 12, 16)] * 2  # both layers, key/value heads not repeated


@pytest.mark.parametrize("padded", [False, True])
def test_logits_and_gradients_match_sdpa(padded):
    ours, theirs = llama()
    ids, mask = batch()
    mask = mask if padded else None
    results = []
    for model in (ours, theirs):
        out = model(ids, attention_mask=mask, labels=ids)
        out.loss.backward()
        results.append((out.logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (a, grads_a), (b, grads_b) = results
    assert rel_error(a.numpy(), b.numpy()) < TOL
    for name, g in grads_a.items():
        assert rel_error(g.numpy(), grads_b[name].numpy()) < GRAD_TOL, name


def test_training_loss_curve_matches_sdpa():
    ours, theirs = llama()
    curves = []
    for model in (ours, theirs):
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = []
        ids, mask = batch(seed=10)
        for step in range(4):
            loss = model(ids, attention_mask=mask, labels=ids).loss
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        curves.append(losses)
    assert curves[0][-1] < curves[0][0]  # it learns
    for a, b in zip(*curves):
        assert abs(a - b) < 1e-4 * abs(b)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_greedy_generate_matches_sdpa(cache):
    ours, theirs = llama()
    ids, mask = batch(seed=3, length=7)
    kw = dict(max_new_tokens=10, do_sample=False, attention_mask=mask, pad_token_id=0)
    if cache == "static":
        kw["cache_implementation"] = "static"
    a, b = ours.generate(ids, **kw), theirs.generate(ids, **kw)
    assert a.tolist() == b.tolist()


def test_bf16_autocast_matches_sdpa():
    ours, theirs = llama()
    ids, mask = batch(seed=4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = ours(ids, attention_mask=mask).logits
        b = theirs(ids, attention_mask=mask).logits
    assert a.dtype == b.dtype
    assert rel_error(a.detach().float().numpy(), b.detach().float().numpy()) < 2e-2


def test_gpt2_matches_sdpa():
    ours, theirs = pair(transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=64))
    ids, mask = batch(seed=5)
    a = ours(ids, attention_mask=mask).logits
    b = theirs(ids, attention_mask=mask).logits
    assert rel_error(a.detach().numpy(), b.detach().numpy()) < TOL
    kw = dict(max_new_tokens=6, do_sample=False, attention_mask=mask, pad_token_id=0)
    assert ours.generate(ids, **kw).tolist() == theirs.generate(ids, **kw).tolist()


def test_attention_dropout_in_training():
    """attention_dropout reaches fmha's dropout in training mode (seeded by
    torch's generator: reproducible under manual_seed) and not in eval."""
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                      attention_dropout=0.2)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="fmha")
    ids, mask = batch(seed=6)
    losses = []
    for seed in (1, 1, 2):
        torch.manual_seed(seed)
        model.train()
        loss = model(ids, attention_mask=mask, labels=ids).loss
        loss.backward()
        losses.append(loss.item())
    assert losses[0] == losses[1] and losses[0] != losses[2]
    model.eval()
    with torch.no_grad():
        assert model(ids, attention_mask=mask, labels=ids).loss.item() not in losses


def test_bert_matches_sdpa():
    """An encoder: no causal mask, right padding."""
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, vocab_size=VOCAB)
    ours, theirs = pair(config, transformers.AutoModel)
    ids, _ = batch(seed=7)
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0
    a = ours(ids, attention_mask=mask).last_hidden_state
    b = theirs(ids, attention_mask=mask).last_hidden_state
    assert rel_error(a.detach().numpy(), b.detach().numpy()) < TOL


def test_gpt_oss_sinks_and_sliding_window_match_eager():
    """gpt-oss passes its per-head sinks as s_aux (served by fmha's sinks,
    their gradient included) and alternates sliding-window layers (masks
    from transformers); compared with its eager attention (sdpa cannot
    serve sinks)."""
    config = transformers.GptOssConfig(hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=VOCAB,
                                       num_local_experts=4, num_experts_per_tok=2, sliding_window=4)
    ours, theirs = pair(config, peer="eager")
    ids, mask = batch(seed=8)
    results = []
    for model in (ours, theirs):
        out = model(ids, attention_mask=mask, labels=ids)
        out.loss.backward()
        results.append((out.logits.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (a, grads_a), (b, grads_b) = results
    assert rel_error(a.numpy(), b.numpy()) < TOL
    assert any(name.endswith("sinks") for name in grads_a)
    assert grads_a.keys() == grads_b.keys()
    for name, g in grads_a.items():
        assert rel_error(g.numpy(), grads_b[name].numpy()) < GRAD_TOL, name
    kw = dict(max_new_tokens=8, do_sample=False)
    assert ours.generate(ids[:1], **kw).tolist() == theirs.generate(ids[:1], **kw).tolist()


def test_compiled_model_matches_sdpa():
    """torch.compile(fullgraph=True) of the fmha model (masks built by
    transformers inside the graph, the custom op opaque in it)."""
    ours, theirs = llama()
    ids, mask = batch(seed=9)
    compiled = torch.compile(ours, backend="aot_eager", fullgraph=True)
    a = compiled(ids, attention_mask=mask).logits
    b = theirs(ids, attention_mask=mask).logits
    assert rel_error(a.detach().numpy(), b.detach().numpy()) < TOL
