"""BLEU and chrF of a trained run on its test splits, and paired bootstrap between systems
(Hydra app; config: configs/evaluate.yaml).

    python scripts/evaluate.py checkpoint=outputs/exp/RUN                 # the run's data.test_splits
    python scripts/evaluate.py checkpoint=RUN splits=[test_2016_flickr] limit=200 generation.beam_size=4
    python scripts/evaluate.py checkpoint=RUN splits=[test_2016_flickr] baseline=base/test_2016_flickr.txt
    python scripts/evaluate.py checkpoint=[RUN_A,RUN_B,RUN_C]               # an ensemble of checkpoints
    python scripts/evaluate.py checkpoint=RUN model.position.rope_scaling.rope_type=dynamic model.position.rope_scaling.factor=2 model.position.rope_scaling.original_max_position_embeddings=16
    python scripts/evaluate.py refs=test.de hyps=[base.hyp,new.hyp]       # files only: scores + bootstrap

Checkpoint mode reads each split's raw source and reference lines (the run's ``data`` config, with
``data.root`` overridable), encodes the sources with the run's tokenizer, translates with the run's
``generation`` settings (``generation.*`` overrides), and scores the detokenised output against the
raw references with sacreBLEU: BLEU with ``data.bleu_tokenize`` (``none`` for ``multi30k_tok_*``,
i.e. tokenized BLEU) and chrF, each with its signature. Hypotheses go to
``<output_dir>/<split>.txt`` and everything to ``<output_dir>/results.json``; the default
``output_dir`` is ``<run folder>/eval/<checkpoint name>/`` (e.g. ``eval/checkpoint_best/``), so
evaluating another checkpoint of the same run never overwrites the first one's results.
``model.position.rope_scaling.*`` (null: the run's) applies a RoPE scaling at test time only to a
run trained with RoPE (settings that change nothing are refused); its results go to
``eval/<checkpoint name>+<settings>/`` (e.g. ``eval/checkpoint_best+rope_dynamic_x2_L0=16/``), and
the folder of one checkpoint evaluated on whole splits reads as a run in ``scripts/compare.py``.
Every split's files are found before any translation, and the files are written once every split
is done. Every
line of a split is translated and scored (an empty source line gives an empty hypothesis); a line
that cannot be translated (e.g. longer than the model's learned positions) is reported on stderr,
left empty, and counted in ``failed_lines``. ``progress=false`` turns off the progress bar.
Several checkpoints with the same vocabulary (``checkpoint=[a,b,c]``) are evaluated as one ensemble
(log-probabilities averaged at each step; the first checkpoint's run gives the data and generation
settings; results in ``<first run>/eval/ensemble_<n>_<hash of the paths>/``).
On a GPU the search runs under autocast in the run's ``train.precision`` (``precision=`` overrides
it; the CPU decodes in fp32), recorded as ``precision`` in ``results.json``.

Paired bootstrap resampling (Koehn 2004; sacreBLEU's implementation, seeded) compares systems with a
baseline: in files mode the first of ``hyps`` is the baseline; in checkpoint mode ``baseline=FILE``
compares the checkpoint's output of the one requested split with that file.

Exit status 2 with a one-line message for a missing/foreign checkpoint, a tokenizer that does not
match it, ensemble members with different vocabularies, missing data, invalid settings, or a
plugin's code raising (its constructor or forward: the line names the plugin, file and line; no
score is written).

The work is :func:`transformer.evaluation.command.evaluate` (``command`` here); this file parses the
config and reports errors (:func:`transformer.cli.run_script`).
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from transformer.cli import run_script
from transformer.config import ConfigError, register_configs
from transformer.data.corpus import DataError
from transformer.evaluation.command import evaluate
from transformer.generation import LoadError

ROOT = Path(__file__).resolve().parents[1]  # the checkout: its configs/ are the scripts' config

register_configs()  # generation_overrides, the schema of the generation.* fields

run = evaluate  # the script's work (what main calls; tests call it in-process)
ERRORS = {(LoadError, ConfigError, DataError, FileNotFoundError): 2}
"""The user errors this script reports on one line, and their exit status."""


@hydra.main(version_base="1.3", config_path=str(ROOT / "configs"), config_name="evaluate")
def main(cfg: DictConfig) -> None:
    """Entry point: evaluate as ``cfg`` says; a user error is one line on stderr and exit status 2."""
    run_script(cfg, evaluate, ERRORS)


if __name__ == "__main__":
    main()
