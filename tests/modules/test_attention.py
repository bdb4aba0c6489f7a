"""Attention: GQA/MQA semantics, masks, KV cache."""

import pytest
import torch
from torch import nn

from transformer.models.builder import build_attention
from transformer.modules.attention import Attention
from transformer.modules.attention_core import AttentionInputs, KVCache, build_attention_mask, sdpa
from transformer.modules.positions import ALiBi, NoPositions, RotaryEmbedding


def _mha_from_gqa(gqa: Attention) -> Attention:
    """An MHA module whose k/v heads are the GQA heads repeated for their query groups."""
    h, hkv, hd = gqa.n_heads, gqa.n_kv_heads, gqa.head_dim
    g = h // hkv
    w = gqa.in_proj.weight.detach()
    b = gqa.in_proj.bias.detach()
    q_w, k_w, v_w = w[: h * hd], w[h * hd : (h + hkv) * hd], w[(h + hkv) * hd :]
    q_b, k_b, v_b = b[: h * hd], b[h * hd : (h + hkv) * hd], b[(h + hkv) * hd :]

    def rep(t):  # (hkv*hd, ...) -> (h*hd, ...): kv head j serves query heads j*g .. j*g+g-1
        return t.reshape(hkv, 1, hd, *t.shape[1:]).expand(hkv, g, hd, *t.shape[1:]).reshape(h * hd, *t.shape[1:])

    mha = build_attention(h * hd, h, h, True, 0.0)
    with torch.no_grad():
        mha.in_proj.weight.copy_(torch.cat([q_w, rep(k_w), rep(v_w)]))
        mha.in_proj.bias.copy_(torch.cat([q_b, rep(k_b), rep(v_b)]))
        mha.out_proj.load_state_dict(gqa.out_proj.state_dict())
    return mha


def test_gqa_with_all_heads_equals_mha_weights():
    mha = build_attention(32, 4, 4, True, 0.0)
    x = torch.randn(2, 5, 32)
    # the same weights loaded into an identically shaped module give identical outputs
    other = build_attention(32, 4, 4, True, 0.0)
    other.load_state_dict(mha.state_dict())
    torch.testing.assert_close(mha(x, is_causal=True), other(x, is_causal=True), rtol=0, atol=0)


def test_gqa_query_head_h_reads_kv_head_h_div_group():
    for n_kv in (2, 1):
        gqa = build_attention(32, 4, n_kv, True, 0.0)
        mha = _mha_from_gqa(gqa)
        x = torch.randn(2, 6, 32)
        torch.testing.assert_close(gqa(x, is_causal=True), mha(x, is_causal=True), atol=1e-5, rtol=1e-5)


def test_cross_attention_cache_computed_once_and_reused():
    attn = build_attention(32, 4, 2, True, 0.0)
    x, memory = torch.randn(2, 1, 32), torch.randn(2, 7, 32)
    cache = KVCache(static=True)
    first = attn(x, memory=memory, cache=cache)
    k_before = cache.k
    second = attn(x, memory=None, cache=cache)
    assert cache.k is k_before and cache.k.shape == (2, 2, 7, 8)
    torch.testing.assert_close(first, second)


def test_self_attention_cache_grows_per_step():
    attn = build_attention(32, 4, 4, True, 0.0)
    x = torch.randn(2, 4, 32)
    cache = KVCache()
    steps = [attn(x[:, t : t + 1], cache=cache) for t in range(4)]
    assert len(cache) == 4
    full = attn(x, is_causal=True)
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-6, rtol=1e-5)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_a_reserved_self_attention_cache_writes_in_place_and_reorders_into_a_second_buffer():
    """After ``reserve`` the steps write into one buffer (no copy of the cached entries per step),
    and a reorder gathers into a second one and swaps: two buffers for the whole search, with the
    keys and values a growing concatenation gives (beams expanded, reordered, rows leaving)."""
    g = torch.Generator().manual_seed(0)
    cache = KVCache()
    cache.reserve(6)
    ref_k = ref_v = None  # what the cache must hold: the concatenation of every step, rows followed
    buffers = set()
    for step, index in enumerate(([0, 0, 1, 1], [1, 0, 3, 3], [2, 0, 1], None, [0, 2], None)):
        rows = 2 if ref_k is None else ref_k.shape[0]
        k = torch.randn(rows, 2, 1, 4, generator=g)
        v = torch.randn(rows, 2, 1, 3, generator=g)  # another width, as latent attention's rotated key
        ref_k = k if ref_k is None else torch.cat((ref_k, k), 2)
        ref_v = v if ref_v is None else torch.cat((ref_v, v), 2)
        got_k, got_v = cache.extend(k, v)
        assert torch.equal(got_k, ref_k) and torch.equal(got_v, ref_v) and len(cache) == step + 1
        assert torch.equal(cache.k, ref_k) and torch.equal(cache.v, ref_v)
        buffers.add(_storage(got_k))
        if index is not None:
            ix = torch.tensor(index)
            cache.reorder(ix)
            ref_k, ref_v = ref_k[ix], ref_v[ix]
            assert torch.equal(cache.k, ref_k) and torch.equal(cache.v, ref_v)
            buffers.add(_storage(cache.k))
    # the first step's 2-row buffer, then two 4-row ones (the expansion's and its spare); no growth
    assert len(buffers) <= 3, len(buffers)


def test_a_self_attention_cache_without_a_reservation_grows_and_keeps_its_entries():
    cache, ref = KVCache(), None
    for step in range(9):
        k = torch.full((2, 1, 1, 2), float(step))
        ref = k if ref is None else torch.cat((ref, k), 2)
        got, _ = cache.extend(k, k)
        assert torch.equal(got, ref)
    cache.reorder(torch.tensor([1, 1, 0]))
    got, _ = cache.extend(torch.full((3, 1, 2, 2), 9.0), torch.full((3, 1, 2, 2), 9.0))
    assert got.shape == (3, 1, 11, 2) and torch.equal(got[:, :, :9], ref[[1, 1, 0]]) and len(cache) == 11


def test_mask_builder_combines_padding_causality_and_bias():
    pad = torch.tensor([[False, False, True]])
    mask, is_causal = build_attention_mask(pad, True, 3, 3)
    assert not is_causal and mask.dtype == torch.bool
    expected = torch.tensor([[True, False, False], [True, True, False], [True, True, False]])
    assert torch.equal(mask[0, 0], expected)
    bias = torch.ones(1, 2, 3, 3)
    fmask, _ = build_attention_mask(pad, True, 3, 3, bias)
    assert fmask.shape == (1, 2, 3, 3) and torch.isinf(fmask[0, 0, 0, 1]) and fmask[0, 1, 2, 1] == 1
    assert build_attention_mask(None, True, 4, 4) == (None, True)
    assert build_attention_mask(None, True, 1, 4) == (None, False)


def test_fully_masked_rows_are_finite_in_fp32_and_bf16():
    for dtype in (torch.float32, torch.bfloat16):
        attn = build_attention(32, 4, 2, True, 0.0).to(dtype)
        x = torch.randn(2, 3, 32, dtype=dtype)
        pad = torch.ones(2, 3, dtype=torch.bool)
        mask, _ = build_attention_mask(pad, False, 3, 3, None, dtype)
        out = attn(x, attn_mask=mask)
        assert torch.isfinite(out).all()
        fmask, _ = build_attention_mask(pad, True, 3, 3, torch.zeros(1, 4, 3, 3), dtype)
        assert torch.isfinite(attn(x, attn_mask=fmask)).all()


def test_sizes_are_checked():
    import pytest

    with pytest.raises(ValueError, match="divisible"):
        Attention(n_heads=4, n_kv_heads=3, head_dim=8, in_proj=nn.Linear(32, 80), out_proj=nn.Linear(32, 32))
    with pytest.raises(ValueError, match="in_proj"):
        Attention(n_heads=4, n_kv_heads=2, head_dim=8, in_proj=nn.Linear(32, 32), out_proj=nn.Linear(32, 32))


@pytest.mark.parametrize("causal", [False, True])
def test_cpu_bf16_autocast_attention_runs_in_fp32_and_matches(causal):
    """Under CPU autocast the SDPA kernel runs in fp32 (q/k/v from bf16 projections) and returns bf16."""
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 4, 6, 8).bfloat16().requires_grad_() for _ in range(3))
    mask = torch.zeros(2, 1, 6, 6)
    mask[0, :, :, -2:] = float("-inf")  # a float mask (ALiBi-like) in fp32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = sdpa(q, k, v, None if causal else mask, 0.0, causal, False)
    assert out.dtype == torch.bfloat16
    ref_in = [t.detach().float().requires_grad_() for t in (q, k, v)]
    ref = torch.nn.functional.scaled_dot_product_attention(
        *ref_in, attn_mask=None if causal else mask, is_causal=causal
    )
    torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=1e-2)
    g = torch.randn_like(ref)
    grads = torch.autograd.grad(out, (q, k, v), g.bfloat16())
    ref_grads = torch.autograd.grad(ref, ref_in, g)
    for a, b in zip(grads, ref_grads):
        assert a.dtype == torch.bfloat16
        torch.testing.assert_close(a.float(), b, rtol=2e-2, atol=2e-2)


def test_is_causal_with_a_cache_aligns_bottom_right():
    """One new query over a cache with ``is_causal=True`` sees every cached key."""
    attn = build_attention(32, 4, 2, True, 0.0)
    x = torch.randn(2, 6, 32)
    full = attn(x, is_causal=True)  # (2, 6, 32)
    cache = KVCache()
    attn(x[:, :5], is_causal=True, cache=cache)
    last = attn(x[:, 5:], is_causal=True, cache=cache)
    torch.testing.assert_close(last, full[:, 5:], atol=1e-6, rtol=1e-5)


def test_several_new_queries_over_a_cache_match_the_full_forward():
    """Chunked prefill / speculative steps: chunks of 3, 2 and 1 queries over a growing cache give
    the rows of one full causal forward, with ``is_causal`` and with an explicit mask."""
    attn = build_attention(32, 4, 2, True, 0.0)
    x = torch.randn(2, 6, 32)
    full = attn(x, is_causal=True)
    for explicit_mask in (False, True):
        cache, outs, start = KVCache(), [], 0
        for size in (3, 2, 1):
            chunk = x[:, start : start + size]
            if explicit_mask:
                mask, is_causal = build_attention_mask(None, True, size, start + size)
                outs.append(attn(chunk, attn_mask=mask, is_causal=is_causal, cache=cache))
            else:
                outs.append(attn(chunk, is_causal=True, cache=cache))
            start += size
        torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-6, rtol=1e-5)


def test_mask_builder_bottom_right_without_padding_or_bias():
    """``build_attention_mask(None, True, q_len < k_len)`` is the bottom-right causal mask."""
    mask, is_causal = build_attention_mask(None, True, 2, 6)
    assert not is_causal and mask.dtype == torch.bool and mask.shape == (1, 1, 2, 6)
    expected = torch.tensor([[True] * 5 + [False], [True] * 6])
    assert torch.equal(mask[0, 0], expected)
    meta, _ = build_attention_mask(None, True, 2, 6, device=torch.device("meta"))
    assert meta.device.type == "meta"


def test_chunked_prefill_with_alibi_and_padding_matches_the_full_forward():
    """A pre-norm ALiBi decoder stack, left-padded rows: two chunks with caches = one pass."""
    attn = build_attention(32, 4, 4, True, 0.0)
    alibi = ALiBi(n_heads=4)
    x = torch.randn(2, 5, 32)
    pad = torch.tensor([[True, False, False, False, False], [False] * 5])
    pos = (torch.arange(5)[None] - pad.sum(1, keepdim=True)).clamp(min=0)  # (2, 5)
    bias = alibi.score_bias(pos, pos, causal=True)
    mask, _ = build_attention_mask(pad, True, 5, 5, bias)
    full = attn(x, attn_mask=mask)
    cache, outs = KVCache(), []
    for lo, hi in ((0, 3), (3, 5)):
        b = alibi.score_bias(pos[:, lo:hi], pos[:, :hi], causal=True)
        m, _ = build_attention_mask(pad[:, :hi], True, hi - lo, hi, b)
        outs.append(attn(x[:, lo:hi], attn_mask=m, cache=cache))
    torch.testing.assert_close(torch.cat(outs, 1), full, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_inputs_prepare_the_bias_mask_and_rotary_tables_once(causal):
    """AttentionInputs.prepare = score bias -> build_attention_mask -> rotary tables, as written out."""
    pos = torch.tensor([[0, 0, 1, 2], [0, 1, 2, 3]])
    pad = torch.tensor([[True, False, False, False], [False] * 4])
    alibi = ALiBi(n_heads=2)
    got = AttentionInputs.prepare(alibi, pos, causal=causal, key_padding_mask=pad, dtype=torch.float64)
    want, want_causal = build_attention_mask(
        pad, causal, 4, 4, alibi.score_bias(pos, pos, causal=causal), torch.float64
    )
    assert torch.equal(got.mask, want) and got.mask.dtype == torch.float64
    assert got.is_causal == want_causal and got.rotary is None
    rope = RotaryEmbedding(head_dim=8)
    step = AttentionInputs.prepare(rope, pos[:, -1:], pos, causal=True)  # one new query over 4 keys
    assert step.mask is None and not step.is_causal
    for a, b in zip(step.rotary, rope.rotary(pos[:, -1:])):
        assert torch.equal(a, b)
    plain = AttentionInputs.prepare(NoPositions(), pos[:1], causal=True)
    assert plain.mask is None and plain.is_causal and plain.rotary is None


def test_fp32_grouped_query_attention_off_the_cpu_repeats_kv_heads(monkeypatch) -> None:
    """Off the CPU an fp32 grouped-query call gets one key/value head per query head (its fused
    kernel needs that; with ``enable_gqa`` it fell back to the math kernel on an H200), giving what
    ``enable_gqa`` gives; other dtypes and the CPU keep ``enable_gqa``."""
    from transformer.modules import attention_core
    from transformer.modules.attention_core import expand_kv_heads, sdpa

    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 6)
    mask = torch.rand(2, 1, 5, 7) > 0.3
    mask[..., 0] = True
    ek, ev = expand_kv_heads(k, v, 4)
    assert ek.shape == (2, 4, 7, 8) and ev.shape == (2, 4, 7, 6)
    assert torch.equal(ek[:, 1], k[:, 0]) and torch.equal(ek[:, 2], k[:, 1])  # head h reads kv head h // 2
    for attn_mask, causal in ((mask, False), (None, True)):
        want = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, is_causal=causal, enable_gqa=True
        )
        got = torch.nn.functional.scaled_dot_product_attention(q, ek, ev, attn_mask=attn_mask, is_causal=causal)
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(sdpa(q, k, v, attn_mask, 0.0, causal, True), want)  # the CPU: unchanged

    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append((k.shape[1], kw["enable_gqa"]))
        return real(q, k, v, **kw)

    monkeypatch.setattr(attention_core.F, "scaled_dot_product_attention", spy)
    for dtype in (torch.float32, torch.bfloat16):
        sdpa(*(x.to("meta", dtype) for x in (q, k, v)), None, 0.0, True, True)
    assert seen == [(4, False), (2, True)]  # fp32 expanded; bf16 left to flash / cuDNN, which take GQA
