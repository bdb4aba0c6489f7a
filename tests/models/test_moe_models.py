"""``model/ffn=moe`` in both model families: sizes, total and active parameters, FLOPs, the
builder's initialisation, and KV-cache decoding through routed layers."""

from __future__ import annotations

import math

import pytest
import torch

from tests.conftest import tiny_model_config
from tests.models.test_models import EOS, PAD, V
from transformer.config import model_sizes
from transformer.models import build_model, count_parameters, forward_flops, moe_blocks
from transformer.testing import check_model

ARCHS = ["encoder_decoder", "decoder_only"]
MOE = dict(ffn__name="moe", ffn__n_experts=4, ffn__top_k=2, ffn__n_shared_experts=1)


def _cfg(arch: str, **overrides):
    return tiny_model_config(arch=arch, norm_position="pre", **{**MOE, **overrides})


def test_sizes_of_the_experts_follow_the_expert_option():
    sizes = model_sizes(_cfg("decoder_only"))  # swiglu experts at d_ff 64: GLU width 48
    assert (sizes.ffn_hidden, sizes.ffn_matrices, sizes.n_experts, sizes.top_k, sizes.shared_hidden) == (
        48,
        3,
        4,
        2,
        48,
    )
    assert model_sizes(_cfg("decoder_only", ffn__expert_d_ff=32)).ffn_hidden == 24  # int(21.3) -> 24
    relu = model_sizes(_cfg("decoder_only", ffn__expert="relu", ffn__n_shared_experts=2))
    assert (relu.ffn_hidden, relu.ffn_matrices, relu.shared_hidden) == (64, 2, 128)
    dense = model_sizes(tiny_model_config(ffn__name="swiglu"))
    assert (dense.n_experts, dense.top_k, dense.shared_hidden) == (0, 0, 0)


@pytest.mark.parametrize("arch", ARCHS)
def test_total_and_active_parameters_and_flops_in_closed_form(arch):
    moe, dense = (
        build_model(_cfg(arch), V),
        build_model(tiny_model_config(arch=arch, norm_position="pre", ffn__name="swiglu"), V),
    )
    d, h, e, k, layers = 32, 48, 4, 2, 4
    expert = 3 * d * h + (2 * h + d)  # one SwiGLU expert with biases (tiny_model_config has model.bias=true)
    router = d * e
    # each layer: the router, 4 routed experts and 1 shared expert, in place of one dense SwiGLU block
    assert count_parameters(moe) - count_parameters(dense) == layers * (router + e * expert)
    assert count_parameters(moe, active_only=True) - count_parameters(dense) == layers * (router + k * expert)
    assert count_parameters(dense, active_only=True) == count_parameters(dense)
    src, tgt = 9, 7
    tokens = 2 * src + 2 * tgt if arch == "encoder_decoder" else layers * (src + 1 + tgt)
    extra = 2 * 3 * d * h * (k + 1) + 2 * d * e - 2 * 3 * d * h  # active experts + shared + router - dense
    got = forward_flops(_cfg(arch), V, src, tgt)["total"]
    want = forward_flops(tiny_model_config(arch=arch, norm_position="pre", ffn__name="swiglu"), V, src, tgt)["total"]
    assert got - want == tokens * extra


@pytest.mark.parametrize("init", ["xavier", "normal"])
def test_experts_get_the_builders_init_one_expert_at_a_time(init):
    model = build_model(_cfg("decoder_only", init=init, ffn__n_experts=6), V)
    blocks = moe_blocks(model)
    assert len(blocks) == 4
    w13 = blocks[0].experts.w13  # (E, 2h, d)
    if init == "xavier":  # the fans of one (2h, d) matrix, not of the (E, 2h, d) stack
        bound = math.sqrt(6 / (w13.shape[1] + w13.shape[2]))
        assert 0.9 * bound < w13.abs().max() <= bound
    else:
        assert abs(w13.std().item() - 0.02) < 0.002
    assert torch.count_nonzero(blocks[0].experts.b13) == 0 and torch.count_nonzero(blocks[0].router.expert_bias) == 0
    assert not torch.equal(w13[0], w13[1])


def test_state_dict_names_and_dense_models_unchanged():
    names = list(build_model(_cfg("decoder_only"), V).state_dict())
    assert "decoder.layers.0.ffn.sublayer.router.expert_bias" in names
    assert {
        "decoder.layers.0.ffn.sublayer.experts.w13",
        "decoder.layers.0.ffn.sublayer.experts.w2",
        "decoder.layers.0.ffn.sublayer.router.gate.weight",
        "decoder.layers.0.ffn.sublayer.shared_experts.w13.weight",
    } <= set(names)
    dense = build_model(tiny_model_config(), V)  # a dense model has no buffer: its checkpoints load as before
    assert list(dense.state_dict()) == [n for n, _ in dense.named_parameters(remove_duplicate=False)]


@pytest.mark.parametrize("arch,router", [(a, r) for a in ARCHS for r in ("softmax", "sigmoid")])
def test_kv_cache_decoding_equals_full_forward_through_routed_layers(arch, router):
    model = build_model(_cfg(arch, ffn__router=router, ffn__routed_scaling_factor=1.5), V).eval()
    check_model(model, ["incremental_decoding"])  # the kit's check (transformer/testing/), through routed layers


def _masks_seen(model) -> tuple[list, list]:
    """Record the ``token_mask`` each MoE block of ``model`` is called with (None or a clone)."""
    seen: list = []
    hooks = [
        b.register_forward_pre_hook(
            lambda m, args, kwargs: seen.append(
                None if kwargs.get("token_mask") is None else kwargs["token_mask"].clone()
            ),
            with_kwargs=True,
        )
        for b in moe_blocks(model)
    ]
    return seen, hooks


@pytest.mark.parametrize("arch", ARCHS)
def test_the_padding_mask_reaches_every_routed_layer_and_only_when_there_is_padding(arch):
    """Encoder: the source's padding; decoder: ``prev_output_tokens``'; decoder-only: the whole
    row's. No padding, decoding steps and dense models: no mask at all."""
    model = build_model(_cfg(arch), V).train()
    seen, _ = _masks_seen(model)
    src = torch.tensor([[7, 8, 9, EOS], [7, 8, EOS, PAD]])
    tgt = torch.tensor([[2, 11, 12, 13, 14], [2, 11, PAD, PAD, PAD]])
    inputs = (
        {"src_tokens": src, "prev_output_tokens": tgt}
        if arch == "encoder_decoder"
        else {"tokens": torch.cat([src, tgt], 1)}
    )
    model.features(**inputs)
    expected = [src.ne(PAD)] * 2 + [tgt.ne(PAD)] * 2 if arch == "encoder_decoder" else [inputs["tokens"].ne(PAD)] * 4
    assert len(seen) == 4 and all(torch.equal(got, want) for got, want in zip(seen, expected))
    seen.clear()  # nothing padded: no mask, the unmasked path
    model.features(**{k: v[:1, :4] for k, v in inputs.items()})
    assert seen == [None] * 4
    model.eval()
    seen.clear()  # decoding: the left-padded prefix of the decoder-only model has its mask, each step none
    with torch.no_grad():
        state = model.start_decoding(torch.tensor([[7, 8, 9], [7, 8, PAD]]))
        n_start = len(seen)
        model.decode_step(torch.full((2, 1), model.decoder_start_token_id), state)
    starts, steps = seen[:n_start], seen[n_start:]
    assert steps == [None] * len(model.decoder.layers)  # one token per row, no padding
    if arch == "encoder_decoder":
        assert len(starts) == 2 and torch.equal(starts[0], torch.tensor([[True] * 3, [True, True, False]]))
    else:
        assert len(starts) == 4 and torch.equal(starts[0], torch.tensor([[True] * 3, [False, True, True]]))
    dense = build_model(tiny_model_config(arch=arch, norm_position="pre", ffn__name="swiglu"), V)
    assert not dense.decoder.routes_tokens and model.decoder.routes_tokens
