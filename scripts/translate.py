"""Translate text line by line with a trained run (Hydra app; config: configs/translate.yaml).

    python scripts/translate.py checkpoint=outputs/exp/RUN input=test.en > test.hyp
    cat test.en | python scripts/translate.py checkpoint=RUN input=- generation.beam_size=10
    python scripts/translate.py checkpoint=RUN input=test.en generation.nbest=4     # n-best with scores
    python scripts/translate.py checkpoint=[RUN_A,RUN_B,RUN_C] input=test.en        # an ensemble
    python scripts/translate.py checkpoint=RUN input=test.en model.position.rope_scaling.rope_type=linear model.position.rope_scaling.factor=4

Lines are read in chunks of ``buffer_lines``, sorted and batched by tokens
(``generation.max_tokens`` x beam), decoded, and written back in input order, detokenised. Empty
input lines give empty output lines. With ``generation.nbest > 1`` or ``scores=true`` every
hypothesis is written as ``index ||| text ||| score ||| logprob`` (index from 0, best first).
A line that cannot be translated (e.g. longer than a model with learned positions can read) gets
a one-line ``error: line N: ...`` on stderr and an empty output line; every other line is still
translated and written, and the exit status is then 1. A progress bar of translated lines goes to
stderr (``progress=false`` turns it off).
Several checkpoints with the same vocabulary (``checkpoint=[a,b,c]``) decode as one ensemble that
averages their log-probabilities at each step (:mod:`transformer.generation.ensemble`); the first
one's generation settings apply. ``model.position.rope_scaling.*`` (null: the run's) decodes a run
trained with RoPE with a RoPE scaling applied at test time only. On a GPU the search runs under
autocast in the run's ``train.precision`` (``precision=`` overrides it; the CPU decodes in fp32).
Exit status 2 with a one-line message on stderr for a missing or foreign checkpoint, a tokenizer
that does not match it, checkpoints of an ensemble with different vocabularies, invalid settings,
or a plugin's code raising (its constructor or forward: the line names the plugin, file and line;
a line is then never left empty in silence).

The work is :func:`transformer.generation.translate_file` (``run`` here); this file parses the
config and reports errors (:func:`transformer.cli.run_script`).
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from transformer.cli import run_script
from transformer.config import ConfigError, register_configs
from transformer.generation import LinesFailed, LoadError, translate_file

ROOT = Path(__file__).resolve().parents[1]  # the checkout: its configs/ are the scripts' config

register_configs()  # generation_overrides, the schema of the generation.* fields

run = translate_file  # the script's work (what main calls; tests call it in-process)
ERRORS = {(LoadError, ConfigError, FileNotFoundError): 2, LinesFailed: 1}
"""The user errors this script reports on one line, and their exit statuses."""


@hydra.main(version_base="1.3", config_path=str(ROOT / "configs"), config_name="translate")
def main(cfg: DictConfig) -> None:
    """Entry point: translate as ``cfg`` says; a user error is one line on stderr and exit status 2
    (1 when some lines could not be translated); a closed stdout (e.g. piped into head) exits 0."""
    run_script(cfg, translate_file, ERRORS, broken_pipe=0)


if __name__ == "__main__":
    main()
