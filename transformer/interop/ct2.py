"""Our models -> CTranslate2 model folders (Klein et al.), written by CTranslate2's own converter
from its spec API (``TransformerSpec``, ``TransformerDecoderModelSpec``), with the vocabulary and
SentencePiece model(s); usage: docs/export.md#ctranslate2-formatctranslate2.

Mapping: our packed ``in_proj`` is CTranslate2's fused q/k/v (q + fused k/v in cross-attention);
``w13`` splits into ``linear_0`` (gate) and ``linear_0_noact`` (up); absolute positions are
written out as a ``model.max_positions``-row table; RoPE is the half-split rotation
(``rotary_interleave=False``); ALiBi is the decoder bias (decoder-only only)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer.config import resolve_n_kv_heads
from transformer.interop.export_common import attention_unsupported, refuse, state_dict_fp32, vocabulary
from transformer.modules.ffn import FFNS
from transformer.modules.positions import sinusoidal_table

__all__ = ["ct2_spec", "ct2_translate", "ct2_unsupported", "load_ct2", "save_ct2"]

TARGET = "CTranslate2"
# the activation of a model/ffn option (FFNS[name].activation) -> its member of CTranslate2's
# common_spec.Activation; an FFN option whose activation is missing here is refused
_ACTIVATIONS = {F.relu: "RELU", F.gelu: "GELU", F.silu: "SWISH"}


def ct2_unsupported(cfg: Any) -> list[str]:
    """One sentence per switch of model config ``cfg`` that CTranslate2 cannot represent (empty: it can)."""
    why = []
    ffn = FFNS.get(cfg.ffn.name)
    if ffn is not None and ffn.routed:
        why.append(f"model/ffn={cfg.ffn.name}: CTranslate2's Transformer specs have no mixture-of-experts layer")
    elif ffn is None or ffn.activation not in _ACTIVATIONS:
        why.append(
            f"model/ffn={cfg.ffn.name}: CTranslate2 has no such activation "
            f"(model/ffn offers {', '.join(n for n, c in FFNS.items() if c.activation in _ACTIVATIONS)})"
        )
    if cfg.position.name == "alibi" and cfg.arch == "encoder_decoder":
        why.append(
            "model/position=alibi in an encoder-decoder: CTranslate2 has ALiBi only in decoders "
            "(its encoder has no ALiBi bias)"
        )
    return why + attention_unsupported(cfg, TARGET)


def _activation(cfg: Any) -> Any:
    from ctranslate2.specs import common_spec

    return getattr(common_spec.Activation, _ACTIVATIONS[FFNS[cfg.ffn.name].activation])


def _position_table(cfg: Any, state: dict[str, Tensor], prefix: str) -> Tensor:
    """``(max_positions, d_model)`` absolute position vectors (zeros for ``model/position=none``)."""
    name = cfg.position.name
    if name == "sinusoidal":
        return sinusoidal_table(cfg.max_positions, cfg.d_model)
    if name == "learned":
        return state[f"{prefix}.position.weight"]
    return torch.zeros(cfg.max_positions, cfg.d_model)


def _set_linear(spec: Any, state: dict[str, Tensor], name: str, rows: slice | None = None) -> None:
    w = state[f"{name}.weight"]
    b = state.get(f"{name}.bias")
    spec.weight = (w if rows is None else w[rows]).contiguous()
    if b is not None:
        spec.bias = (b if rows is None else b[rows]).contiguous()


def _set_norm(spec: Any, state: dict[str, Tensor], name: str) -> None:
    spec.gamma = state[f"{name}.weight"]
    if f"{name}.bias" in state and hasattr(spec, "beta"):
        spec.beta = state[f"{name}.bias"]


def _set_layer(spec: Any, state: dict[str, Tensor], src: str, cfg: Any, cross: bool) -> None:
    q = cfg.n_heads * (cfg.d_model // cfg.n_heads)
    _set_linear(spec.self_attention.linear[0], state, f"{src}.self_attn.sublayer.in_proj")
    _set_linear(spec.self_attention.linear[1], state, f"{src}.self_attn.sublayer.out_proj")
    _set_norm(spec.self_attention.layer_norm, state, f"{src}.self_attn.norm")
    if cross:
        _set_linear(spec.attention.linear[0], state, f"{src}.cross_attn.sublayer.in_proj", slice(0, q))
        _set_linear(spec.attention.linear[1], state, f"{src}.cross_attn.sublayer.in_proj", slice(q, None))
        _set_linear(spec.attention.linear[2], state, f"{src}.cross_attn.sublayer.out_proj")
        _set_norm(spec.attention.layer_norm, state, f"{src}.cross_attn.norm")
    f = f"{src}.ffn.sublayer"
    if f"{f}.w13.weight" in state:  # gated: gate rows first, then up rows
        hidden = state[f"{f}.w2.weight"].shape[1]
        _set_linear(spec.ffn.linear_0, state, f"{f}.w13", slice(0, hidden))
        _set_linear(spec.ffn.linear_0_noact, state, f"{f}.w13", slice(hidden, None))
    else:
        _set_linear(spec.ffn.linear_0, state, f"{f}.w1")
    _set_linear(spec.ffn.linear_1, state, f"{f}.w2")
    _set_norm(spec.ffn.layer_norm, state, f"{src}.ffn.norm")


def _set_stack(
    spec: Any, state: dict[str, Tensor], cfg: Any, embed: str, stack: str, n_layers: int, cross: bool
) -> None:
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = state[f"{embed}.embedding.weight"]
    spec.scale_embeddings = bool(cfg.scale_embeddings)
    if hasattr(spec, "position_encodings"):
        spec.position_encodings.encodings = _position_table(cfg, state, embed).contiguous()
    if cfg.norm_position == "pre":
        _set_norm(spec.layer_norm, state, f"{stack}.final_norm")
    for i in range(n_layers):
        _set_layer(spec.layer[i], state, f"{stack}.layers.{i}", cfg, cross)


def ct2_spec(model: nn.Module, cfg: Any, tokenizers: Sequence[Any]) -> Any:
    """The CTranslate2 specification of our model, weights and vocabularies set (not yet validated).

    Raises:
        ExportError: a switch CTranslate2 cannot represent (named).
    """
    from ctranslate2.specs import transformer_spec

    refuse(TARGET, ct2_unsupported(cfg))
    state = state_dict_fp32(model)
    n_kv = resolve_n_kv_heads(cfg)
    common = dict(
        pre_norm=cfg.norm_position == "pre",
        activation=_activation(cfg),
        ffn_glu=FFNS[cfg.ffn.name].gated,
        rms_norm=cfg.norm.name == "rmsnorm",
        num_heads_kv=None if n_kv == cfg.n_heads else n_kv,
    )
    if cfg.position.name == "rope":  # full head width, half-split layout (GPT-NeoX / HF Llama)
        common.update(rotary_dim=0, rotary_interleave=False, rotary_base=float(cfg.position.rope_theta))
    if cfg.arch == "decoder_only":
        n = cfg.n_encoder_layers + cfg.n_decoder_layers
        alibi = dict(alibi=True) if cfg.position.name == "alibi" else {}
        spec = transformer_spec.TransformerDecoderModelSpec.from_config(n, cfg.n_heads, **common, **alibi)
        _set_stack(spec.decoder, state, cfg, "embed", "decoder", n, cross=False)
        _set_linear(spec.decoder.projection, state, "output_proj")
        spec.register_vocabulary(vocabulary(tokenizers[0]))
    else:
        encoder = transformer_spec.TransformerEncoderSpec(cfg.n_encoder_layers, cfg.n_heads, **common)
        decoder = transformer_spec.TransformerDecoderSpec(cfg.n_decoder_layers, cfg.n_heads, **common)
        spec = transformer_spec.TransformerSpec(encoder, decoder)
        _set_stack(spec.encoder, state, cfg, "src_embed", "encoder", cfg.n_encoder_layers, cross=False)
        _set_stack(spec.decoder, state, cfg, "tgt_embed", "decoder", cfg.n_decoder_layers, cross=True)
        _set_linear(spec.decoder.projection, state, "output_proj")
        spec.register_source_vocabulary(vocabulary(tokenizers[0]))
        spec.register_target_vocabulary(vocabulary(tokenizers[1]))
        spec.config.add_source_eos = True  # our sources end with EOS
        spec.config.decoder_start_token = tokenizers[1].id_to_piece(model.bos_id)
    spec.config.layer_norm_epsilon = float(cfg.norm.eps)
    return spec


def save_ct2(
    model: nn.Module, cfg: Any, tokenizers: Sequence[Any], folder: Path, quantization: str | None = None
) -> None:
    """Write a CTranslate2 folder (``model.bin``, ``config.json``, vocabularies, ``spm.model`` or
    ``source.spm`` + ``target.spm``), replacing ``folder``; ``quantization`` None keeps fp32.

    Raises:
        ExportError: a switch CTranslate2 cannot represent.
        ImportError: ``ctranslate2`` is missing (``pip install -e '.[interop]'``).
    """
    from ctranslate2.converters.converter import Converter

    spec = ct2_spec(model, cfg, tokenizers)
    src_tok, tgt_tok = tokenizers
    if src_tok is tgt_tok:
        spec.register_file(str(src_tok.model_path), "spm.model")
    else:
        spec.register_file(str(src_tok.model_path), "source.spm")
        spec.register_file(str(tgt_tok.model_path), "target.spm")

    class _SpecConverter(Converter):  # CTranslate2's validate / quantize / save sequence
        def _load(self) -> Any:
            return spec

    _SpecConverter().convert(str(folder), quantization=quantization, force=True)


def load_ct2(
    folder: str | Path, arch: str, *, device: str = "cpu", compute_type: str = "default", threads: int = 0
) -> Any:
    """A ``ctranslate2.Translator`` (encoder-decoder) or ``Generator`` (decoder-only); ``compute_type``
    ``default`` keeps the saved type, ``threads`` 0 is CTranslate2's default."""
    import ctranslate2

    cls = ctranslate2.Translator if arch == "encoder_decoder" else ctranslate2.Generator
    return cls(str(folder), device=device, compute_type=compute_type, intra_threads=threads, inter_threads=1)


def ct2_translate(
    engine: Any,
    src_ids: Sequence[Sequence[int]],
    gen: Any,
    src_tok: Any,
    tgt_tok: Any,
    arch: str,
    max_batch_tokens: int = 8000,
) -> list[list[int]]:
    """Decode with CTranslate2 under our settings: one id list per sentence (EOS when produced; an
    empty source gives an empty list).

    PAD is suppressed, ``min_len`` holds, and the maximum is one per call, ``int(max_len_a * longest
    + max_len_b)`` (a cut output has no EOS). The penalty is ``len ** alpha``: use
    ``length_penalty_form=fairseq`` for comparable beams."""
    todo = [i for i, s in enumerate(src_ids) if len(s)]
    out: list[list[int]] = [[] for _ in src_ids]
    if not todo:
        return out
    beam = int(gen.beam_size) if gen.strategy == "beam" else 1
    longest = max(len(src_ids[i]) for i in todo) + (1 if arch == "encoder_decoder" else 0)
    max_len = int(float(gen.max_len_a) * longest + int(gen.max_len_b))
    pieces = [[src_tok.id_to_piece(t) for t in src_ids[i]] for i in todo]
    eos_piece = tgt_tok.id_to_piece(tgt_tok.eos_id)
    opts = dict(
        beam_size=beam,
        length_penalty=float(gen.length_penalty) if beam > 1 else 1.0,
        suppress_sequences=[[tgt_tok.id_to_piece(tgt_tok.pad_id)]],
        return_end_token=True,
        no_repeat_ngram_size=int(gen.no_repeat_ngram_size),
        max_batch_size=max_batch_tokens,
        batch_type="tokens",
        sampling_topk=1,
    )
    if arch == "encoder_decoder":
        results = engine.translate_batch(
            pieces, max_decoding_length=max_len, min_decoding_length=int(gen.min_len), **opts
        )
    else:
        prompts = [p + [src_tok.id_to_piece(src_tok.sep_id)] for p in pieces]
        results = engine.generate_batch(
            prompts,
            max_length=max_len,
            min_length=int(gen.min_len),
            include_prompt_in_result=False,
            end_token=eos_piece,
            **opts,
        )
    piece_id = {p: i for i, p in enumerate(vocabulary(tgt_tok))}
    for i, r in zip(todo, results):
        ids = list(r.sequences_ids[0]) if arch == "decoder_only" else [piece_id[p] for p in r.hypotheses[0]]
        if tgt_tok.eos_id in ids:
            ids = ids[: ids.index(tgt_tok.eos_id) + 1]
        out[i] = ids
    return out
