"""Interoperability: export runs to Hugging Face (``LlamaForCausalLM``, ``Qwen3ForCausalLM``,
``MixtralForCausalLM``, ``DeepseekV3ForCausalLM``, ``MarianMTModel``) and CTranslate2 model folders,
and import the decoder-only HF folders back (``hf_llama.py``: Llama, Qwen3; ``hf_moe.py``: Mixtral,
DeepSeek-V3, imported by ``hf_moe_import.py``; ``hf_decoder.py``: what they share;
``export_common.py``: what every exporter shares).

    from transformer.interop import export_run, import_hf_llama
    export_run("outputs/RUN", "ctranslate2", "exports/run_ct2")         # or "hf"
    import_hf_llama("exports/run_hf", "outputs/imported")               # a run folder again

Each target lists the switches it cannot represent (``*_unsupported(cfg)``); an export is refused
with those sentences before anything is written, and output goes to a temporary folder renamed
at the end. The optional packages come with ``pip install -e '.[interop]'``. ``run_export(cfg)`` is
the work of ``scripts/export.py``.
"""

from transformer.interop.export import FORMATS, export_run, import_hf_llama, run_export, unsupported
from transformer.interop.export_common import ExportError

__all__ = ["FORMATS", "ExportError", "export_run", "import_hf_llama", "run_export", "unsupported"]
