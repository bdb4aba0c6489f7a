"""The zoo's module checks as a kit: the properties every option is held to, for any option of any
group, built-in or a plugin's (:mod:`transformer.registry`).

Each check builds a tiny model (``d_model`` 32, 4 heads of 8, two layers a stack, dropout 0) of a
family with the option chosen, and raises ``AssertionError`` with a sentence when the property
fails:

- :func:`check_incremental_decoding`: ``start_decoding`` + ``decode_step`` (the KV cache) gives the
  full forward's logits at every target position, for a batch of sources of different lengths;
- :func:`check_padding`: a sentence's logits do not change when it is padded, or batched with a
  longer neighbour;
- :func:`check_search_batching`: greedy and beam search of a batch of sentences of different lengths
  (right-padded sources; decoder-only decoding left-pads) give each sentence's own hypotheses;
- :func:`check_causality`: changing target token ``j`` leaves the logits before ``j`` unchanged;
- :func:`check_gradients`: every trainable parameter gets a finite gradient;
- :func:`check_bf16`: the forward and backward under bf16 autocast stay finite;
- :func:`check_compiles`: ``torch.compile(fullgraph=True)`` traces the training loss with its
  backward, and decoding's ``decode_step``, without a graph break, and they compute eager's values.

A learning-rate schedule (``lr_scheduler``) is no module: :func:`check_schedule` holds it to its own
properties (a finite rate ``>= 0`` at every update, a rising warmup, a pure function of its arguments).

Use :func:`check_option` for all of them on both families, from pytest or the command line::

    python -m transformer.testing plugins=[examples/plugins/diff_attention] model/attention=diff
    python -m transformer.testing model/ffn=moe model.ffn.n_experts=4          # a built-in option
    python -m transformer.testing lr_scheduler=cosine lr_scheduler.min_lr=1e-5   # a schedule

    # in a test file
    from transformer.testing import check_option
    def test_my_attention():
        check_option("model/attention", "diff", plugins=["path/to/my_ideas"])

Where things are: ``models.py`` (:func:`tiny_model`, the vocabulary, the checks' inputs),
``checks.py`` (the module checks, :func:`check_model`, :func:`check_option`), ``compiles.py``
(:func:`check_compiles`), ``schedules.py`` (:func:`check_schedule`), ``cli.py`` (:func:`main`, run by
``__main__.py``).
"""

from transformer.testing.checks import (
    CHECKS,
    check_bf16,
    check_causality,
    check_gradients,
    check_incremental_decoding,
    check_model,
    check_option,
    check_padding,
    check_search_batching,
)
from transformer.testing.cli import CHECKED, MODULES, main
from transformer.testing.compiles import check_compiles
from transformer.testing.models import ARCHS, tiny_model
from transformer.testing.schedules import check_schedule

__all__ = [
    "ARCHS",
    "CHECKED",
    "CHECKS",
    "MODULES",
    "check_bf16",
    "check_causality",
    "check_compiles",
    "check_gradients",
    "check_incremental_decoding",
    "check_model",
    "check_option",
    "check_padding",
    "check_schedule",
    "check_search_batching",
    "main",
    "tiny_model",
]
