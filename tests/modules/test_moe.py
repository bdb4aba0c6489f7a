"""Mixture of experts: the block and its losses against Hugging Face's Mixtral, DeepSeek-V3 and
Switch Transformers code on copied weights (tiny random configs, offline), the two dispatch paths,
gradients, and the DeepSeek-V3 bias update."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from transformer.modules.ffn import GatedFeedForward
from transformer.modules.moe import GroupedExperts, MixtureOfExperts
from transformer.modules.moe_losses import moe_blocks, router_losses, update_expert_biases
from transformer.modules.moe_router import ROUTER_SCORES, TopKRouter

transformers = pytest.importorskip("transformers")
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE  # noqa: E402
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock, load_balancing_loss_func  # noqa: E402
from transformers.models.switch_transformers.modeling_switch_transformers import router_z_loss_func  # noqa: E402

D, HIDDEN, E, K = 32, 48, 4, 2


def _moe(
    router: str = "softmax",
    *,
    n_experts: int = E,
    top_k: int = K,
    hidden: int = HIDDEN,
    gated: bool = True,
    activation=F.silu,
    bias: bool = False,
    shared: int = 0,
    dispatch: str = "auto",
    **router_kw,
) -> MixtureOfExperts:
    torch.manual_seed(3)
    experts = GroupedExperts(
        n_experts=n_experts, d_model=D, hidden=hidden, activation=activation, gated=gated, bias=bias, dispatch=dispatch
    )
    experts.reset_parameters(lambda w: nn.init.normal_(w, std=0.2))
    if bias:
        with torch.no_grad():
            for b in (getattr(experts, experts.b_in_name), experts.b2):
                b.normal_(std=0.1)
    gate = nn.Linear(D, n_experts, bias=False)
    router_mod = TopKRouter(gate=gate, scoring=ROUTER_SCORES[router], top_k=top_k, **router_kw)
    shared_block = None
    if shared:
        shared_block = GatedFeedForward.from_sizes(
            d_model=D, hidden=shared * hidden, activation=F.silu, bias=False, dropout=0.0
        )
    return MixtureOfExperts(router=router_mod, experts=experts, shared_experts=shared_block, aux_loss_coef=0.01)


def _mixtral(ours: MixtureOfExperts) -> MixtralSparseMoeBlock:
    cfg = transformers.MixtralConfig(
        hidden_size=D,
        intermediate_size=ours.experts.hidden,
        num_local_experts=ours.experts.n_experts,
        num_experts_per_tok=ours.router.top_k,
        hidden_act="silu",
        router_jitter_noise=0.0,
    )
    ref = MixtralSparseMoeBlock(cfg)
    with torch.no_grad():
        ref.gate.weight.copy_(ours.router.gate.weight)
        ref.experts.gate_up_proj.copy_(ours.experts.w13)
        ref.experts.down_proj.copy_(ours.experts.w2)
    return ref


@pytest.mark.parametrize("dispatch", ["grouped_mm", "loop"])
def test_block_matches_mixtral_sparse_moe_block(dispatch):
    ours = _moe(dispatch=dispatch)
    ref = _mixtral(ours)
    x = torch.randn(3, 7, D)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-6)
    # the router's logits, top-k choice and renormalised weights are Mixtral's
    logits, weights, experts = ref.gate(x)
    route = ours.router(x.reshape(-1, D))
    torch.testing.assert_close(route.logits, logits)
    assert torch.equal(route.experts.sort(-1).values, experts.sort(-1).values)
    torch.testing.assert_close(route.weights.sort(-1).values, weights.sort(-1).values)


def test_aux_loss_and_its_gradient_equal_load_balancing_loss_func_over_several_layers():
    """Two MoE blocks (one stack): the loss HF computes from the tuple of both layers' router
    logits, by value and by gradient w.r.t. the routers."""
    blocks = nn.Sequential(_moe(), _moe())
    with torch.no_grad():
        blocks[1].router.gate.weight.mul_(3.0)  # a different router
    logits = []
    hooks = [b.router.register_forward_hook(lambda m, i, out: logits.append(out.logits)) for b in blocks]
    blocks.train()
    blocks(torch.randn(4, 9, D))
    for h in hooks:
        h.remove()
    ours = router_losses(blocks)
    expected = load_balancing_loss_func(tuple(logits), num_experts=E, top_k=K)
    torch.testing.assert_close(ours.aux_loss, expected)
    gates = [b.router.gate.weight for b in blocks]
    got = torch.autograd.grad(ours.aux_loss, gates, retain_graph=True)
    want = torch.autograd.grad(expected, gates, retain_graph=True)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    # the z-loss: ST-MoE's mean logsumexp^2 over all tokens of the stack (HF Switch Transformers)
    torch.testing.assert_close(ours.z_loss, router_z_loss_func(torch.cat(logits)[None]))
    torch.testing.assert_close(ours.weighted, 0.01 * ours.aux_loss)
    assert ours.load.shape == (2, E) and ours.load.sum().item() == 2 * 4 * 9 * K and ours.dropped == 0


def _two_layers(x: torch.Tensor, token_mask: torch.Tensor | None) -> tuple[nn.ModuleList, list[torch.Tensor]]:
    """Two MoE blocks (one stack, the second router different) applied in turn to ``x`` with
    ``token_mask``; returns them (fresh, same weights each call) and their router logits."""
    blocks = nn.ModuleList([_moe(bias_update_speed=0.01), _moe(bias_update_speed=0.01)]).train()
    with torch.no_grad():
        blocks[1].router.gate.weight.mul_(3.0)
    logits = []
    for b in blocks:
        b.router.register_forward_hook(lambda m, i, out: logits.append(out.logits))
    h = x
    for b in blocks:
        h = b(h, token_mask=token_mask)
    return blocks, logits


def test_padding_is_left_out_as_load_balancing_loss_func_with_an_attention_mask():
    """With a token mask: the aux loss and its gradient are HF's given the attention mask, the
    z-loss and the loads are those of the real tokens alone; None equals an all-True mask."""
    torch.manual_seed(0)
    x = torch.randn(4, 9, D)
    mask = torch.arange(9)[None] < torch.tensor([9, 5, 2, 7])[:, None]  # (4, 9), True at real tokens
    blocks, logits = _two_layers(x, mask)
    ours = router_losses(blocks)
    expected = load_balancing_loss_func(tuple(logits), num_experts=E, top_k=K, attention_mask=mask)
    torch.testing.assert_close(ours.aux_loss, expected)
    assert not torch.allclose(
        expected, load_balancing_loss_func(tuple(logits), num_experts=E, top_k=K)
    )  # padding mattered
    gates = [b.router.gate.weight for b in blocks]
    for g, w in zip(
        torch.autograd.grad(ours.aux_loss, gates, retain_graph=True),
        torch.autograd.grad(expected, gates, retain_graph=True),
    ):
        torch.testing.assert_close(g, w)
    real = mask.reshape(-1)
    torch.testing.assert_close(ours.z_loss, router_z_loss_func(torch.cat([lg[real] for lg in logits])[None]))
    for layer, lg in enumerate(logits):  # loads: the real tokens' top-k choices only
        want = torch.bincount(lg[real].topk(K, dim=-1).indices.reshape(-1), minlength=E)
        assert torch.equal(ours.load[layer], want)
    assert ours.load.sum().item() == 2 * K * int(mask.sum()) and ours.dropped == 0
    # no mask = every position real: the same values as an all-True mask
    unmasked, full = (
        router_losses(_two_layers(x, None)[0]),
        router_losses(_two_layers(x, torch.ones(4, 9, dtype=torch.bool))[0]),
    )
    torch.testing.assert_close(unmasked.aux_loss, full.aux_loss)
    torch.testing.assert_close(unmasked.z_loss, full.z_loss)
    assert torch.equal(unmasked.load, full.load)
    with pytest.raises(ValueError, match=r"token_mask shape \(4, 8\) must be x's without d_model, \(4, 9\)"):
        blocks[0](x, token_mask=mask[:, :8])


def test_extra_padding_changes_no_loss_load_or_bias_update():
    """The same real tokens with 5 padded positions more per row (any values there): the same
    aux loss, z-loss, gradients, loads and DeepSeek-V3 bias update."""
    torch.manual_seed(1)
    x = torch.randn(3, 6, D)
    mask = torch.arange(6)[None] < torch.tensor([6, 4, 1])[:, None]
    x_pad = torch.cat([x, 5 * torch.randn(3, 5, D)], dim=1)  # (3, 11, D)
    mask_pad = torch.cat([mask, torch.zeros(3, 5, dtype=torch.bool)], dim=1)
    runs = [_two_layers(x, mask)[0], _two_layers(x_pad, mask_pad)[0]]
    (a, b) = (router_losses(r) for r in runs)
    torch.testing.assert_close(a.aux_loss, b.aux_loss)
    torch.testing.assert_close(a.z_loss, b.z_loss)
    assert torch.equal(a.load, b.load)
    grads = [
        torch.autograd.grad(r.weighted + r.z_loss, [blk.router.gate.weight for blk in m]) for r, m in zip((a, b), runs)
    ]
    for g, w in zip(*grads):
        torch.testing.assert_close(g, w)
    for r, m in zip((a, b), runs):
        update_expert_biases(m, r.load)
    for u, v in zip(*runs):
        assert torch.equal(u.router.expert_bias, v.router.expert_bias) and torch.count_nonzero(u.router.expert_bias) > 0
    # counting the padding (no mask) would have moved the loss and the loads
    counted = router_losses(_two_layers(x_pad, None)[0])
    assert not torch.allclose(counted.aux_loss, a.aux_loss) and counted.load.sum() > a.load.sum()


def test_switch_top1_aux_loss_equals_switch_transformers_formula():
    from transformers.models.switch_transformers.modeling_switch_transformers import (
        load_balancing_loss_func as switch_loss,
    )

    block = _moe(top_k=1, norm_topk_prob=False).train()
    logits = []
    block.router.register_forward_hook(lambda m, i, out: logits.append(out.logits))
    block(torch.randn(2, 11, D))
    probs = logits[0].softmax(-1)
    expected = switch_loss(probs[None], probs.argmax(-1)[None])  # E^2 * mean(f * P) = E * sum f P
    torch.testing.assert_close(router_losses(block).aux_loss, expected)


def _deepseek(ours: MixtureOfExperts, n_shared: int) -> DeepseekV3MoE:
    cfg = transformers.DeepseekV3Config(
        hidden_size=D,
        moe_intermediate_size=ours.experts.hidden,
        n_routed_experts=ours.experts.n_experts,
        num_experts_per_tok=ours.router.top_k,
        n_shared_experts=n_shared,
        n_group=1,
        topk_group=1,
        norm_topk_prob=ours.router.norm_topk_prob,
        routed_scaling_factor=ours.router.routed_scaling_factor,
        hidden_act="silu",
    )
    ref = DeepseekV3MoE(cfg)
    h = ours.experts.hidden * n_shared
    with torch.no_grad():
        ref.gate.weight.copy_(ours.router.gate.weight)
        ref.gate.e_score_correction_bias.copy_(ours.router.expert_bias)
        ref.experts.gate_up_proj.copy_(ours.experts.w13)
        ref.experts.down_proj.copy_(ours.experts.w2)
        gate, up = ours.shared_experts.w13.weight.split((h, h))
        ref.shared_experts.gate_proj.weight.copy_(gate)
        ref.shared_experts.up_proj.weight.copy_(up)
        ref.shared_experts.down_proj.weight.copy_(ours.shared_experts.w2.weight)
    return ref


@pytest.mark.parametrize("dispatch", ["grouped_mm", "loop"])
def test_deepseek_v3_moe_sigmoid_routing_shared_expert_and_selection_bias(dispatch):
    ours = _moe("sigmoid", n_experts=8, top_k=2, hidden=16, shared=1, dispatch=dispatch, routed_scaling_factor=2.5)
    with torch.no_grad():  # a balancing bias large enough to change the choices
        ours.router.expert_bias.copy_(torch.linspace(-0.4, 0.4, 8))
    ref = _deepseek(ours, n_shared=1)
    x = torch.randn(3, 5, D)
    torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-6)
    _, weights, experts = ref.gate(x)
    route = ours.router(x.reshape(-1, D))
    assert torch.equal(route.experts.sort(-1).values, experts.sort(-1).values)
    torch.testing.assert_close(route.weights.sort(-1).values, weights.sort(-1).values)
    # the bias changed the choice but not the weights: they are the sigmoid scores of the chosen
    unbiased = route.scores.topk(2, dim=-1).indices
    assert not torch.equal(unbiased.sort(-1).values, route.experts.sort(-1).values)
    chosen = torch.sigmoid(route.logits).gather(1, route.experts)
    torch.testing.assert_close(route.weights, 2.5 * chosen / chosen.sum(-1, keepdim=True))


@pytest.mark.parametrize("gated,activation,bias", [(True, F.silu, False), (False, F.relu, True), (True, F.gelu, True)])
def test_grouped_mm_and_loop_dispatch_agree_values_and_gradients(gated, activation, bias):
    x = torch.randn(5, 6, D)
    results = []
    for dispatch in ("grouped_mm", "loop"):
        block = _moe(gated=gated, activation=activation, bias=bias, dispatch=dispatch).train()
        xi = x.clone().requires_grad_()
        out = block(xi)
        (out.square().sum() + router_losses(block).weighted).backward()
        results.append((out, xi.grad, {n: p.grad for n, p in block.named_parameters()}))
    (o1, g1, p1), (o2, g2, p2) = results
    torch.testing.assert_close(o1, o2)
    torch.testing.assert_close(g1, g2)
    assert p1.keys() == p2.keys()
    for name in p1:
        torch.testing.assert_close(p1[name], p2[name], msg=name)


def test_every_parameter_gets_a_gradient_also_an_expert_without_tokens():
    block = _moe("sigmoid", n_experts=6, top_k=2, shared=1, bias=True).train()
    with torch.no_grad():
        block.router.expert_bias[0] = -1e4  # expert 0 is never chosen
    out = block(torch.randn(4, 8, D))
    assert router_losses(block).load[0, 0] == 0
    (out.square().sum() + router_losses(block).weighted).backward()
    grads = {n: p.grad for n, p in block.named_parameters()}
    assert all(g is not None for g in grads.values()), [n for n, g in grads.items() if g is None]
    for name in ("w13", "w2", "b13", "b2"):  # stacked: expert 0's slice exists and is exactly zero
        g = grads[f"experts.{name}"]
        assert torch.count_nonzero(g[0]) == 0 and all(torch.count_nonzero(g[e]) > 0 for e in range(1, 6)), name
    assert torch.count_nonzero(grads["router.gate.weight"][0]) > 0  # the balance loss still reaches its router row
    assert all(torch.count_nonzero(g) > 0 for n, g in grads.items() if not n.startswith("experts."))


def test_eval_forward_keeps_loads_but_no_losses():
    block = _moe().eval()
    with torch.no_grad():
        block(torch.randn(2, 3, D))
    assert block.stats.load.sum().item() == 2 * 3 * K and block.stats.prob_sum is None
    assert router_losses(block) is None


def test_bias_update_is_deepseek_v3_sign_rule():
    model = nn.Sequential(_moe("sigmoid", bias_update_speed=0.01), _moe("sigmoid"))
    load = torch.tensor([[10, 2, 4, 0], [1, 1, 1, 1]])
    update_expert_biases(model, load)
    # mean 4: overloaded expert 0 goes down, underloaded 1 and 3 up, expert 2 stays; speed 0: no change
    torch.testing.assert_close(model[0].router.expert_bias, torch.tensor([-0.01, 0.01, 0.0, 0.01]))
    assert torch.count_nonzero(model[1].router.expert_bias) == 0
    assert "router.expert_bias" in model[0].state_dict() and not any(
        n.endswith("expert_bias") for n, _ in model.named_parameters()
    )
    assert moe_blocks(model) == [model[0], model[1]]


def test_router_runs_in_fp32_under_autocast_and_both_dispatches_agree_in_bf16():
    block, loop = _moe(dispatch="grouped_mm"), _moe(dispatch="loop")
    x = torch.randn(2, 3, D)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        route = block.router(x.reshape(-1, D))
        out, ref = block(x), loop(x)
    assert route.logits.dtype == torch.float32 and out.shape == (2, 3, D)
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)  # bf16 matmuls, summed in another order
    torch.testing.assert_close(out, block(x), atol=5e-2, rtol=5e-2)  # and close to fp32


def test_sizes_are_checked():
    with pytest.raises(ValueError, match="top_k=5 must be between 1 and the number of experts"):
        TopKRouter(gate=nn.Linear(D, 4, bias=False), scoring=ROUTER_SCORES["softmax"], top_k=5)
    with pytest.raises(ValueError, match="dispatch='scatter' is not one of"):
        GroupedExperts(n_experts=2, d_model=D, hidden=8, activation=F.silu, gated=True, dispatch="scatter")


@pytest.mark.parametrize("gated,bias,shared", [(True, False, 0), (False, True, 1)])
def test_the_dense_dispatch_equals_the_loop_by_value_and_gradient(gated, bias, shared):
    """``dispatch="dense"`` (what runs under torch.compile in fp32): every expert on every token,
    each token reading its top-k rows, gives the loop's outputs and gradients."""
    x = torch.randn(3, 7, D)
    outs, grads = [], []
    for dispatch in ("loop", "dense"):
        block = _moe(dispatch=dispatch, gated=gated, activation=F.silu if gated else F.relu, bias=bias, shared=shared)
        assert block.experts.path(x) == dispatch
        xi = x.clone().requires_grad_()
        y = block(xi)
        y.square().sum().backward()
        outs.append(y)
        grads.append([xi.grad, *(p.grad for p in block.parameters())])
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-6)
    for a, b in zip(grads[1], grads[0]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_the_block_compiles_whole_and_equals_eager():
    """torch.compile(fullgraph=True) traces the block with a token mask: fp32 through the dense
    dispatch, bf16 autocast through grouped_mm (its meta function takes bf16); eager's values."""
    block = _moe(router="sigmoid", shared=1, bias_update_speed=0.001).train()
    x, mask = torch.randn(2, 5, D), torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    torch.compiler.reset()
    seen = []

    def forward(x, mask):
        seen.append(block.experts.path(x.reshape(-1, D)))
        return block(x, mask), block.stats.load, block.stats.z_sum

    compiled = torch.compile(forward, fullgraph=True, backend="eager")
    for got, expected in zip(compiled(x, mask), forward(x, mask)):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert seen == ["dense", "grouped_mm"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = torch.compile(forward, fullgraph=True, backend="aot_eager")(x, mask)[0]
        expected = forward(x, mask)[0]
    assert seen[-2:] == ["grouped_mm", "grouped_mm"]
    torch.testing.assert_close(got.float(), expected.float(), rtol=2e-2, atol=2e-2)
