"""Which validation pairs the loss covers (learned positions), in transformer.training.loop.validation."""

from dataclasses import dataclass

import pytest

from tests.conftest import tiny_model_config
from transformer.training.loop.trainer import TrainingError
from transformer.training.loop.validation import scorable_pairs


@dataclass
class _Pairs:
    src_lengths: list[int]
    tgt_lengths: list[int]

    def subset(self, keep):
        return _Pairs([self.src_lengths[i] for i in keep], [self.tgt_lengths[i] for i in keep])


def test_scorable_pairs_keep_what_fits_learned_positions_and_name_the_field_when_nothing_does():
    valid = _Pairs([3, 9, 4], [5, 2, 8])
    assert scorable_pairs(valid, tiny_model_config(**{"position.name": "sinusoidal", "max_positions": 4})) == (
        valid,
        None,
    )
    enc_dec = tiny_model_config(**{"position.name": "learned", "max_positions": 9})  # max(src, tgt) + 1 <= 9
    pairs, note = scorable_pairs(valid, enc_dec)
    assert pairs == _Pairs([3, 4], [5, 8]) and note.startswith("[valid] loss over the 2 of 3 pairs")
    dec = tiny_model_config(arch="decoder_only", **{"position.name": "learned", "max_positions": 12})  # src + tgt + 2
    assert scorable_pairs(valid, dec)[0] == _Pairs([3], [5])
    with pytest.raises(TrainingError, match="none of the 3 validation pairs fits model.max_positions=5"):
        scorable_pairs(valid, tiny_model_config(**{"position.name": "learned", "max_positions": 5}))
