"""train.precision=auto: bf16 only where the device multiplies bf16 in hardware (probes mocked)."""

import pytest
import torch

from transformer import precision as P


@pytest.mark.parametrize(
    "amx,avx512_bf16,expected", [(True, False, "bf16"), (False, True, "bf16"), (False, False, "fp32")]
)
def test_auto_on_cpu_follows_the_bf16_probes(monkeypatch, amx, avx512_bf16, expected):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    assert P.resolve_precision("auto", torch.device("cpu")) == expected


@pytest.mark.parametrize("capability,expected", [((9, 0), "bf16"), ((8, 0), "bf16"), ((7, 5), "fp32")])
def test_auto_on_cuda_needs_sm80(monkeypatch, capability, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert P.resolve_precision("auto", torch.device("cuda", 0)) == expected


def test_explicit_precisions_pass_through_and_unknown_fails():
    for name in ("fp32", "bf16", "fp16"):
        assert P.resolve_precision(name, torch.device("cpu")) == name
    with pytest.raises(ValueError, match="train.precision='half'"):
        P.resolve_precision("half", torch.device("cpu"))


def test_hardware_is_read_from_the_machine():
    info = P.describe_hardware(torch.device("cpu"))
    assert info["cpu"] and info["torch"] == torch.__version__
    assert info["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert info["cpu_fast_bf16"] == P.cpu_has_fast_bf16()
