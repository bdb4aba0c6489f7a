"""Learning-rate schedules (values of :func:`lr_at`, the optimizer's rate during each update) and
the optimizer builder they drive."""

import io
import math

import pytest
import torch

from transformer.config import OptimConfig, SchedulerConfig
from transformer.training.step.optim import build_optimizer
from transformer.training.step.schedules import build_scheduler, lr_at


def _cfg(**kw):
    return SchedulerConfig(**kw)


def test_inverse_sqrt_fairseq_values():
    cfg = _cfg(name="inverse_sqrt", warmup_updates=10, warmup_init_lr=0.0)
    lrs = [lr_at(u, cfg, 0.01, 512, 0) for u in range(1, 31)]
    for u in range(1, 11):
        assert lrs[u - 1] == pytest.approx(0.001 * u, rel=1e-12)
    assert lrs[9] == pytest.approx(0.01, rel=1e-12)
    for u in range(11, 31):
        assert lrs[u - 1] == pytest.approx(0.01 * math.sqrt(10 / u), rel=1e-12)


def test_inverse_sqrt_warmup_init_lr():
    cfg = _cfg(name="inverse_sqrt", warmup_updates=4, warmup_init_lr=1e-7)
    assert lr_at(1, cfg, 1e-3, 512, 0) == pytest.approx(1e-7 + (1e-3 - 1e-7) / 4)
    assert lr_at(4, cfg, 1e-3, 512, 0) == pytest.approx(1e-3)


def test_noam_values_and_equivalence_with_fairseq_form():
    d_model, warmup, scale = 512, 4000, 2.0
    noam = _cfg(name="inverse_sqrt", form="noam", warmup_updates=warmup, noam_scale=scale)
    peak = scale * d_model**-0.5 * warmup**-0.5
    fairseq = _cfg(name="inverse_sqrt", form="fairseq", warmup_updates=warmup)
    for u in (1, 2, 100, 3999, 4000, 4001, 10_000, 100_000):
        expected = scale * d_model**-0.5 * min(u**-0.5, u * warmup**-1.5)
        got = lr_at(u, noam, base_lr=123.0, d_model=d_model, max_updates=0)  # base_lr unused
        assert got == pytest.approx(expected, rel=1e-12)
        assert got == pytest.approx(lr_at(u, fairseq, peak, d_model, 0), rel=1e-12)
    # Vaswani et al. 2017 base: peak lr at step 4000.
    paper = _cfg(name="inverse_sqrt", form="noam", warmup_updates=4000)
    assert lr_at(4000, paper, 0.0, 512, 0) == pytest.approx(6.9877e-4, rel=1e-4)


def test_cosine_and_constant_values():
    cfg = _cfg(name="cosine", warmup_updates=4, min_lr=1e-4)
    base, total = 1e-3, 14
    assert lr_at(2, cfg, base, 512, total) == pytest.approx(5e-4)
    assert lr_at(4, cfg, base, 512, total) == pytest.approx(base)
    assert lr_at(9, cfg, base, 512, total) == pytest.approx(1e-4 + 9e-4 * 0.5)  # half way
    assert lr_at(14, cfg, base, 512, total) == pytest.approx(1e-4)
    assert lr_at(50, cfg, base, 512, total) == pytest.approx(1e-4)
    const = _cfg(name="constant", warmup_updates=4)
    assert [lr_at(u, const, 1e-3, 512, 0) for u in (1, 4, 5, 1000)] == pytest.approx([2.5e-4, 1e-3, 1e-3, 1e-3])
    no_warmup = _cfg(name="constant", warmup_updates=0)
    assert lr_at(1, no_warmup, 1e-3, 512, 0) == 1e-3


@pytest.mark.parametrize(
    "kw, update, max_updates, match",
    [
        (dict(name="inverse_sqrt", warmup_updates=0), 1, 0, "warmup_updates > 0"),
        (dict(name="inverse_sqrt", warmup_updates=10), 0, 0, "numbered from 1"),
        (dict(name="cosine", warmup_updates=10), 1, 10, "max_updates"),
        (dict(name="linear"), 1, 0, "not one of"),
        (dict(form="other"), 1, 0, "not one of"),
        (dict(name="cosine", form="noam"), 1, 100, "inverse_sqrt only"),
        (dict(form="noam", warmup_init_lr=1e-7), 1, 0, "warmup_init_lr"),
    ],
)
def test_invalid_configs_raise(kw, update, max_updates, match):
    with pytest.raises(ValueError, match=match):
        lr_at(update, _cfg(**kw), 1e-3, 512, max_updates)


def _drive(cfg, base_lr, max_updates, n, d_model=512, groups=2):
    """Run ``n`` real updates; return the lr read from every param group before each step."""
    params = [torch.nn.Parameter(torch.ones(2)) for _ in range(groups)]
    opt = torch.optim.Adam([{"params": [p]} for p in params], lr=base_lr)
    sched = build_scheduler(opt, cfg, base_lr, d_model, max_updates)
    seen = []
    for _ in range(n):
        seen.append([g["lr"] for g in opt.param_groups])
        sum(p.sum() for p in params).backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    return seen, opt, sched


@pytest.mark.parametrize(
    "kw, max_updates",
    [
        (dict(name="inverse_sqrt", warmup_updates=10), 0),
        (dict(name="inverse_sqrt", form="noam", warmup_updates=10), 0),
        (dict(name="cosine", warmup_updates=5, min_lr=1e-5), 25),
        (dict(name="constant", warmup_updates=3), 0),
    ],
)
def test_optimizer_lr_during_update_u_is_lr_at_u(kw, max_updates):
    cfg = _cfg(**kw)
    seen, _, sched = _drive(cfg, 0.01, max_updates, 25)
    for u, group_lrs in enumerate(seen, start=1):
        expected = lr_at(u, cfg, 0.01, 512, max_updates)
        assert group_lrs == pytest.approx([expected, expected], rel=1e-12), u
    assert sched.num_updates == 25
    assert sched.get_last_lr() == pytest.approx([lr_at(26, cfg, 0.01, 512, max_updates)] * 2)


def test_resume_restores_position_and_lr():
    cfg = _cfg(name="inverse_sqrt", warmup_updates=10)
    _, opt, sched = _drive(cfg, 0.01, 0, 7)
    buf = io.BytesIO()
    torch.save({"opt": opt.state_dict(), "sched": sched.state_dict()}, buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)

    params = [torch.nn.Parameter(torch.ones(2)) for _ in range(2)]
    opt2 = torch.optim.Adam([{"params": [p]} for p in params], lr=0.01)
    sched2 = build_scheduler(opt2, cfg, 0.01, 512, 0)
    sched2.load_state_dict(state["sched"])
    opt2.load_state_dict(state["opt"])
    assert sched2.num_updates == 7
    assert [g["lr"] for g in opt2.param_groups] == pytest.approx([lr_at(8, cfg, 0.01, 512, 0)] * 2)
    sched2.step()
    assert [g["lr"] for g in opt2.param_groups] == pytest.approx([lr_at(9, cfg, 0.01, 512, 0)] * 2)


# ----------------------------------------------------------------------------- optimizer (optim.py)


class _Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.proj = torch.nn.Linear(4, 4)
        self.norm = torch.nn.LayerNorm(4)
        self.out = torch.nn.Linear(4, 10, bias=False)
        self.out.weight = self.embed.weight  # tied
        self.frozen = torch.nn.Parameter(torch.ones(3, 3), requires_grad=False)


def test_adamw_excludes_biases_norms_and_embeddings_from_decay():
    model = _Tiny()
    cfg = OptimConfig(name="adamw", lr=1e-3, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.01)
    opt = build_optimizer(model, cfg, "cpu")
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    assert [id(p) for p in decay["params"]] == [id(model.proj.weight)]
    assert {id(p) for p in no_decay["params"]} == {
        id(model.embed.weight),
        id(model.proj.bias),
        id(model.norm.weight),
        id(model.norm.bias),
    }
    assert opt.defaults["betas"] == (0.9, 0.98) and opt.defaults["eps"] == 1e-9
    assert opt.defaults["fused"] is True  # the fused kernel on CPU too (3-5x faster than foreach there)
    assert isinstance(opt, torch.optim.AdamW)
    elsewhere = build_optimizer(model, cfg, "mps")
    assert elsewhere.defaults["foreach"] is True and not elsewhere.defaults["fused"]


@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_fused_cpu_update_equals_foreach(name):
    """The default CPU implementation (fused) takes the same steps as the foreach one."""
    torch.manual_seed(0)
    models = [_Tiny(), _Tiny()]
    models[1].load_state_dict(models[0].state_dict())
    cfg = OptimConfig(name=name, lr=1e-2, weight_decay=0.01)
    foreach = OptimConfig(name=name, lr=1e-2, weight_decay=0.01, fused=False)
    opts = [build_optimizer(models[0], cfg, "cpu"), build_optimizer(models[1], foreach, "cpu")]
    assert opts[0].defaults["fused"] and opts[1].defaults["foreach"]
    x = torch.randint(0, 10, (4, 3))
    for _ in range(5):
        for model, opt in zip(models, opts):
            opt.zero_grad()
            model.out(model.norm(model.proj(model.embed(x)))).square().mean().backward()
            opt.step()
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_adam_one_group_fused_on_cuda_and_validation():
    model = _Tiny()
    opt = build_optimizer(model, OptimConfig(name="adam", weight_decay=1e-4), "cuda")
    assert isinstance(opt, torch.optim.Adam) and not isinstance(opt, torch.optim.AdamW)
    assert len(opt.param_groups) == 1 and opt.param_groups[0]["weight_decay"] == 1e-4
    assert len(opt.param_groups[0]["params"]) == 5  # tied weight once, frozen one left out
    assert opt.defaults["fused"] is True
    forced = build_optimizer(model.parameters(), OptimConfig(fused=False), "cuda")
    assert forced.defaults["foreach"] is True and not forced.defaults["fused"]
    with pytest.raises(ValueError, match="optim.name"):
        build_optimizer(model, OptimConfig(name="sgd"), "cpu")
