"""The Dropout module: identity in eval mode, probability checks (the kernel: tests/kernels/test_dropout.py)."""

import pytest
import torch

from transformer.kernels.dropout import dropout, dropout_add
from transformer.modules.dropout import Dropout


def test_identity_in_eval_mode_and_at_zero():
    x = torch.randn(4, 5)
    assert dropout(x, 0.3, training=False) is x
    assert dropout(x, 0.0, training=True) is x
    module = Dropout(0.3).eval()
    assert module(x) is x
    torch.testing.assert_close(dropout_add(x, x, 0.3, training=False), 2 * x)


@pytest.mark.parametrize("p", [-0.1, 1.0])
def test_invalid_probability_raises(p):
    with pytest.raises(ValueError, match="dropout probability"):
        Dropout(p)
    with pytest.raises(ValueError, match="dropout probability"):
        dropout(torch.ones(2), p, training=True)
