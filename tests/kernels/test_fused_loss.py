"""The output layer fused with the label-smoothed loss against the formula
``(1 - eps) * (-log p[y]) + eps * mean_c(-log p[c])`` of ``log p = log_softmax(hidden @ weight.T)``,
and against logits + :func:`label_smoothed_nll_loss`, values and gradients; its chunk sizes (the
CPU's rule, Liger-Kernel's on an accelerator, a fixed count under ``torch.compile``)."""

import contextlib

import pytest
import torch
import torch._dynamo.testing
import torch.nn.functional as F

import transformer.kernels.fused_loss as fused_loss
from transformer.kernels.fused_loss import chunk_rows, compiled_chunks, linear_label_smoothed_loss
from transformer.training.step.criterion import label_smoothed_nll_loss, linear_label_smoothed_nll_loss

PAD = 0


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("chunk", [3, 1000])
def test_fused_loss_equals_the_textbook_formula_values_and_gradients(eps, chunk, monkeypatch):
    monkeypatch.setattr(fused_loss, "chunk_rows", lambda device, n, vocab, hidden: chunk)
    torch.manual_seed(3)
    hidden = torch.randn(10, 8, requires_grad=True)
    weight = torch.randn(25, 8, requires_grad=True)
    target = torch.randint(0, 25, (10,))
    loss, nll = linear_label_smoothed_loss(hidden, weight, target, eps)
    logits = hidden @ weight.t()
    log_p = logits - logits.exp().sum(-1, keepdim=True).log()  # log softmax, written out
    want_nll = -log_p[torch.arange(10), target].sum()
    want = (1 - eps) * want_nll + eps * (-log_p).mean(-1).sum()
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(nll, want_nll)
    assert not nll.requires_grad
    g = torch.autograd.grad(0.7 * loss, (hidden, weight))
    torch.testing.assert_close(g, torch.autograd.grad(0.7 * want, (hidden, weight)))


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("chunk", [4, 1000])
def test_fused_equals_logits_then_loss(eps, chunk, monkeypatch):
    monkeypatch.setattr(fused_loss, "chunk_rows", lambda device, n, vocab, hidden: chunk)
    torch.manual_seed(0)
    hidden = torch.randn(3, 9, 16, requires_grad=True)
    weight = torch.randn(40, 16, requires_grad=True)
    target = torch.randint(1, 40, (3, 9))
    target[1, 4:] = PAD
    target[2, :3] = PAD
    loss, nll, n = label_smoothed_nll_loss(hidden @ weight.t(), target, eps, PAD)
    ref = torch.autograd.grad(0.5 * loss, (hidden, weight))
    loss2, nll2, n2 = linear_label_smoothed_nll_loss(hidden, weight, target, eps, PAD)
    got = torch.autograd.grad(0.5 * loss2, (hidden, weight))
    assert n == n2 == int((target != PAD).sum())
    torch.testing.assert_close(loss2, loss)
    torch.testing.assert_close(nll2, nll)
    torch.testing.assert_close(got, ref)
    assert got[0][target == PAD].abs().max() == 0  # no gradient at ignored positions


def test_fused_without_grad_and_under_bf16_autocast():
    torch.manual_seed(1)
    hidden, weight = torch.randn(2, 5, 8), torch.randn(30, 8)
    target = torch.randint(1, 30, (2, 5))
    with torch.no_grad():
        loss, nll, _ = linear_label_smoothed_nll_loss(hidden, weight, target, 0.1, PAD)
    ref, ref_nll, _ = label_smoothed_nll_loss(hidden @ weight.t(), target, 0.1, PAD)
    torch.testing.assert_close(loss, ref)
    h = hidden.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low, _, _ = linear_label_smoothed_nll_loss(h, weight, target, 0.1, PAD)
    low.backward()
    assert low.dtype == torch.float32 and h.grad.dtype == torch.float32
    torch.testing.assert_close(low, ref, rtol=2e-2, atol=0.5)


def test_fused_bf16_autocast_gradients_within_bf16_tolerance_of_fp32():
    """bf16 matmuls, fp32 softmax/loss and fp32 weight gradient: close to the fp32 reference."""
    torch.manual_seed(2)
    hidden, weight = torch.randn(40, 16), torch.randn(300, 16) * 0.3
    target = torch.randint(1, 300, (40,))
    target[-5:] = PAD
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low, low_nll, n = linear_label_smoothed_nll_loss(h, w, target, 0.1, PAD)
    low.backward()
    h_ref, w_ref = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    ref, ref_nll, n_ref = label_smoothed_nll_loss(h_ref @ w_ref.t(), target, 0.1, PAD)
    ref.backward()
    assert n == n_ref == 35 and low.dtype == low_nll.dtype == torch.float32
    assert h.grad.dtype == w.grad.dtype == torch.float32
    torch.testing.assert_close(low, ref, rtol=1e-2, atol=0.0)
    torch.testing.assert_close(low_nll, ref_nll, rtol=1e-2, atol=0.0)
    torch.testing.assert_close(h.grad, h_ref.grad, rtol=0.0, atol=2e-2)
    torch.testing.assert_close(w.grad, w_ref.grad, rtol=0.0, atol=2e-2)


def _dropped_rows_reference(hidden, weight, target, eps):
    """The fused loss with the padding removed, as it was before the masked path (its reference): the
    ignored positions dropped with ``nonzero`` (a data-dependent shape), the rest through the kernel."""
    target = target.reshape(-1)
    keep = (target != PAD).nonzero().squeeze(1)
    h = hidden.reshape(-1, hidden.shape[-1]).index_select(0, keep)
    loss, nll = linear_label_smoothed_loss(h.contiguous(), weight, target.index_select(0, keep), eps)
    return loss, nll, int(keep.numel())


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("chunk", [4, 1000])
@pytest.mark.parametrize("autocast", [False, True])
def test_masked_padding_equals_dropped_padding_values_and_gradients(eps, chunk, autocast, monkeypatch):
    """The accelerator's path (fixed shapes: padding masked, not removed; no host sync) against the
    rows-dropped computation: the same loss, NLL, token count and gradients (padding rows get 0),
    with NaN hidden states at padded positions changing nothing."""
    monkeypatch.setattr(fused_loss, "chunk_rows", lambda device, n, vocab, hidden: chunk)
    torch.manual_seed(4)
    hidden = torch.randn(3, 9, 16, requires_grad=True)
    weight = torch.randn(40, 16, requires_grad=True)
    target = torch.randint(1, 40, (3, 9))
    target[1, 4:] = PAD
    target[2, :3] = PAD
    with torch.no_grad():
        hidden[target == PAD] = float("nan")  # whatever padding holds, it takes no part
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    with ctx:
        ref_loss, ref_nll, ref_n = _dropped_rows_reference(hidden, weight, target, eps)
    ref = torch.autograd.grad(0.5 * ref_loss, (hidden, weight))
    with ctx:
        loss, nll, n = linear_label_smoothed_nll_loss(hidden, weight, target, eps, PAD, masked=True)
    got = torch.autograd.grad(0.5 * loss, (hidden, weight))
    assert int(n) == ref_n == int((target != PAD).sum())
    tol = dict(rtol=1e-2, atol=1e-2) if autocast else {}
    torch.testing.assert_close(loss, ref_loss, **tol)
    torch.testing.assert_close(nll, ref_nll, **tol)
    torch.testing.assert_close(got[1], ref[1], **tol)
    torch.testing.assert_close(got[0][target != PAD], ref[0][target != PAD], **tol)
    assert got[0][target == PAD].abs().max() == 0
    # eager CPU drops the rows as before: the same numbers bit for bit
    dropped = linear_label_smoothed_nll_loss(hidden, weight, target, eps, PAD)
    if not autocast:
        assert torch.equal(dropped[0], ref_loss) and dropped[2] == ref_n


def test_chunk_rows_cpu_rule_and_a_memory_budget_on_an_accelerator():
    for n, vocab, hidden in ((25_000, 37_000, 512), (100, 8000, 256), (7, 40, 16), (0, 300, 16)):
        assert chunk_rows("cpu", n, vocab, hidden) == max(16, (1 << 22) // vocab)  # the CPU's rule as measured
    # 128M logits a chunk, rows a multiple of 128: WMT base at 16k target tokens is 4 chunks, not 32
    assert chunk_rows("cuda", 16_384, 32_000, 512) == 4096 == chunk_rows("cuda", 16_384, 32_000, 1024)
    assert chunk_rows("cuda", 25_000, 37_000, 512) == 3584  # 7 chunks
    assert chunk_rows("cuda", 1000, 300, 512) == 1000  # never more rows than N
    assert chunk_rows("cuda", 5, 37_000, 512) == 5 and chunk_rows("cuda", 0, 37_000, 512) == 1
    assert chunk_rows("cuda", 10**6, 10**7, 512) == 128  # a huge vocabulary: one tile of rows
    assert compiled_chunks(37_000, 512) == 32 and compiled_chunks(40, 16) == 3 and compiled_chunks(300, 512) == 1


def test_addmm_with_an_fp32_output_into_fp32_is_used_from_torch_2_10(monkeypatch):
    """``torch.addmm(fp32, bf16, bf16, out_dtype=float32)`` came with torch 2.10 (2.8 and 2.9 raise
    "self and mat2 must have the same dtype"), so older versions take the cast-and-add path."""
    assert [
        fused_loss.addmm_out_dtype_available(v) for v in ("2.5.1", "2.8.0+cu128", "2.9.1", "2.10.0", "2.13.0+cpu")
    ] == [
        False,
        False,
        False,
        True,
        True,
    ]
    calls = []
    monkeypatch.setattr(fused_loss, "addmm_out_dtype_available", lambda: calls.append("asked") or False)
    grad_w, g, h = torch.zeros(4, 3), torch.ones(2, 4, dtype=torch.bfloat16), torch.ones(2, 3, dtype=torch.bfloat16)
    fused_loss._accumulate_grad_w(grad_w, g, h)  # the CPU: the cast-and-add path whatever the version
    assert torch.equal(grad_w, torch.full((4, 3), 2.0)) and calls == ["asked"]


def _unfused(hidden, weight, target, eps):
    """``F.linear`` then the textbook label-smoothed loss, its log-softmax in fp32."""
    log_p = torch.log_softmax(F.linear(hidden, weight).float(), -1)
    nll = -log_p.gather(1, target[:, None]).sum()
    return (1 - eps) * nll - eps * log_p.mean(-1).sum(), nll


@pytest.mark.parametrize("autocast", [False, True])
@pytest.mark.parametrize("chunk", [23, 10, 2])  # one chunk, a ragged last chunk (10, 10, 3), twelve chunks
def test_fused_equals_unfused_for_any_chunk_count(chunk, autocast, monkeypatch):
    """Values and gradients against ``F.linear`` + the loss, in fp32 and under bf16 autocast (both
    sides' matmuls in bf16, the fused weight gradient accumulated in fp32)."""
    monkeypatch.setattr(fused_loss, "chunk_rows", lambda device, n, vocab, hidden: chunk)
    torch.manual_seed(5)
    hidden, weight = torch.randn(23, 16), torch.randn(70, 16) * 0.3
    target = torch.randint(0, 70, (23,))
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    results = []
    for fn in (linear_label_smoothed_loss, _unfused):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with ctx:
            loss, nll = fn(h, w, target, 0.1)
        results.append((loss, nll, *torch.autograd.grad(loss, (h, w))))
    tol = dict(rtol=1e-2, atol=2e-2) if autocast else {}
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, **tol)


def test_compiled_loss_takes_fixed_chunks_one_graph_for_many_row_counts():
    """Under ``torch.compile`` (dynamic shapes): :func:`compiled_chunks` chunks of the rows, not one
    ``(N, V)`` logits tensor, still one graph for every row count, and eager's values and gradients."""
    torch._dynamo.reset()
    graphs = []
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")

    def backend(gm, example_inputs):
        graphs.append(gm)
        return counter(gm, example_inputs)

    compiled = torch.compile(linear_label_smoothed_nll_loss, backend=backend, dynamic=True, fullgraph=True)
    torch.manual_seed(7)
    weight = torch.randn(40, 16, requires_grad=True)
    for n in (37, 50, 64, 41, 13):  # ragged: 37 rows are 3 chunks of 13, two of them padding
        hidden = torch.randn(n, 16, requires_grad=True)
        target = torch.randint(1, 40, (n,))
        target[::5] = PAD
        got = compiled(hidden, weight, target, 0.1, PAD)
        want = label_smoothed_nll_loss(hidden @ weight.t(), target, 0.1, PAD)
        torch.testing.assert_close(got[:2], want[:2])
        assert int(got[2]) == want[2]
        torch.testing.assert_close(
            torch.autograd.grad(got[0], (hidden, weight)), torch.autograd.grad(want[0], (hidden, weight))
        )
    assert counter.frame_count == 1
    softmaxes = sum("log_softmax" in str(node.target) for m in graphs[0].modules() for node in m.graph.nodes)
    assert softmaxes == compiled_chunks(40, 16) == 3


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("rows", [None, 10, 2])  # the memory budget, a ragged last chunk, many chunks
def test_fused_on_cuda_under_bf16_autocast_equals_unfused(rows, monkeypatch):
    """The accelerator's path: the weight gradient accumulated by ``addmm(out_dtype=float32)``."""
    if rows is not None:
        monkeypatch.setattr(fused_loss, "chunk_rows", lambda device, n, vocab, hidden: rows)
    torch.manual_seed(8)
    hidden, weight = torch.randn(23, 16, device="cuda"), torch.randn(70, 16, device="cuda") * 0.3
    target = torch.randint(0, 70, (23,), device="cuda")
    results = []
    for fn in (linear_label_smoothed_loss, _unfused):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, nll = fn(h, w, target, 0.1)
        results.append((loss, nll, *torch.autograd.grad(loss, (h, w))))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, rtol=1e-2, atol=2e-2)
