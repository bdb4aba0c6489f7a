"""Export a trained run to Hugging Face or CTranslate2, or import a HF decoder-only folder
(Hydra app; config: configs/export.yaml).

    python scripts/export.py run=outputs/exp/RUN format=hf out=exports/run_hf
    python scripts/export.py run=outputs/exp/RUN format=ctranslate2 out=exports/run_ct2 quantization=int8
    python scripts/export.py run=exports/run_hf format=zoo out=outputs/imported

``format=hf`` writes a ``LlamaForCausalLM`` folder for decoder-only Llama-style models (pre-RMSNorm,
SwiGLU/GEGLU, RoPE, MHA/GQA/MQA; ``Qwen3ForCausalLM`` with QK-norm, ``MixtralForCausalLM`` with
``model/ffn=moe``, ``DeepseekV3ForCausalLM`` with ``model/attention=mla``) and a ``MarianMTModel``
folder for 2017-style encoder-decoders (post-LN, ReLU/GELU, sinusoidal, MHA); ``format=ctranslate2``
a CTranslate2 model folder for either family; ``format=zoo`` reads a Llama, Qwen3, Mixtral or
DeepSeek-V3 folder back into a run folder. A model the
target cannot represent is refused with a sentence naming the switch, before anything is written;
output is written into a temporary folder and renamed when complete. Exit status 2 with a
one-line message on stderr for refused exports, missing packages, unloadable checkpoints or a
plugin's code raising (e.g. its constructor while the run is loaded: the line names the plugin,
file and line).

The work is :func:`transformer.interop.run_export` (``run`` here); this file parses the config and
reports errors (:func:`transformer.cli.user_errors`).
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from transformer.cli import user_errors
from transformer.config import ConfigError
from transformer.generation import LoadError
from transformer.interop import ExportError, run_export
from transformer.plugins import PluginError, set_user_choice

ROOT = Path(__file__).resolve().parents[1]  # the checkout: its configs/ are the scripts' config

run = run_export  # the script's work (what main calls; tests call it in-process)
ERRORS = {(ExportError, LoadError, ConfigError, PluginError, FileNotFoundError): 2}
"""The user errors this script reports on one line, and their exit status."""


@hydra.main(version_base="1.3", config_path=str(ROOT / "configs"), config_name="export")
def main(cfg: DictConfig) -> None:
    """Entry point: export (or import) as ``cfg`` says; a user error is one line on stderr and exit status 2."""
    with user_errors(ERRORS, plugins=2):
        set_user_choice(cfg.plugins, cfg.plugins_trust)  # a run trained with plugins: where they are, or trust its copy
        run_export(cfg)


if __name__ == "__main__":
    main()
