"""The hand-written autograd kernels, in one place, each beside a test against its textbook formula
(``tests/kernels/``).

Each is a :class:`torch.autograd.Function` (or a pair of them) that computes a textbook formula
with fewer passes over memory than autograd's graph of that formula, on the CPU where the zoo is
mostly trained; their callers fall back to the plain formula (or PyTorch's own op) where the kernel
does not apply (``torch.compile``, other devices, other dtypes), as each module documents.

* :mod:`.rms_norm` — ``x / sqrt(mean(x^2) + eps) * weight`` (Zhang & Sennrich 2019), used by
  :class:`transformer.modules.norms.RMSNorm`;
* :mod:`.dropout` — inverted dropout and ``residual + dropout(x)`` (Srivastava et al. 2014),
  used by :class:`transformer.modules.dropout.Dropout` and the residual blocks;
* :mod:`.rotary` — RoPE's rotation ``x cos + rotate_half(x) sin`` (Su et al. 2021), used by
  :class:`transformer.modules.attention.Attention`;
* :mod:`.fused_loss` — the output layer fused with the label-smoothed cross entropy (Liger-Kernel,
  Hsu et al. 2024), used by :mod:`transformer.training.step.criterion`.

This package imports nothing else from :mod:`transformer`: modules and training import it.
"""

from transformer.kernels.dropout import dropout, dropout_add
from transformer.kernels.fused_loss import linear_label_smoothed_loss
from transformer.kernels.rms_norm import rms_norm
from transformer.kernels.rotary import apply_rotary

__all__ = ["apply_rotary", "dropout", "dropout_add", "linear_label_smoothed_loss", "rms_norm"]
