"""Export a trained run to Hugging Face or CTranslate2, or import a HF Llama folder
(Hydra app; config: configs/export.yaml).

    python scripts/export.py run=outputs/exp/RUN format=hf out=exports/run_hf
    python scripts/export.py run=outputs/exp/RUN format=ctranslate2 out=exports/run_ct2 quantization=int8
    python scripts/export.py run=exports/run_hf format=zoo out=outputs/imported

``format=hf`` writes a ``LlamaForCausalLM`` folder for decoder-only Llama-style models (pre-RMSNorm,
SwiGLU/GEGLU, RoPE, MHA/GQA/MQA) and a ``MarianMTModel`` folder for 2017-style encoder-decoders
(post-LN, ReLU/GELU, sinusoidal, MHA); ``format=ctranslate2`` a CTranslate2 model folder for either
family; ``format=zoo`` reads a ``LlamaForCausalLM`` folder back into a run folder. A model the
target cannot represent is refused with a sentence naming the switch, before anything is written;
output is written into a temporary folder and renamed when complete. Exit status 2 with a
one-line message on stderr for refused exports, missing packages or unloadable checkpoints.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow running from a checkout without installing
    sys.path.insert(0, str(ROOT))

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402


def run(cfg: DictConfig) -> Path:
    """Export (or import) as ``cfg`` says. Returns the folder written."""
    from transformer.interop import export_run, import_hf_llama

    if cfg.format == "zoo":
        if cfg.quantization is not None:
            from transformer.interop import ExportError

            raise ExportError("quantization applies to format=ctranslate2 only")
        out = import_hf_llama(cfg.run, cfg.out, force=bool(cfg.force))
    else:
        out = export_run(cfg.run, str(cfg.format), cfg.out, force=bool(cfg.force), quantization=cfg.quantization)
    print(f"wrote {out} (format={cfg.format})", file=sys.stderr)
    return out


@hydra.main(version_base="1.3", config_path=str(ROOT / "configs"), config_name="export")
def main(cfg: DictConfig) -> None:
    """Entry point: clear one-line errors (exit status 2) instead of tracebacks for user mistakes."""
    from transformer.generation import LoadError
    from transformer.interop import ExportError

    try:
        run(cfg)
    except (ExportError, LoadError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
