"""2017 encoder-decoders -> Hugging Face ``MarianMTModel`` (Junczys-Dowmunt et al. 2018) and its
``generate``; docs/export.md#marian-formathf-encoder-decoder.

The q/k/v rows are split, and the hidden dimension is permuted so that Marian's own sinusoid
table gives our logits (docs/design.md#marians-sinusoids-a-permuted-hidden-dimension). Tied
embeddings map to ``share_encoder_decoder_embeddings`` / ``tie_word_embeddings``; ``bias=false``
becomes zero biases."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from torch import Tensor, nn

from transformer.config import resolve_n_kv_heads
from transformer.interop.export_common import (
    KV_HEAD_KINDS,
    ExportError,
    attention_unsupported,
    refuse,
    state_dict_fp32,
    vocabulary,
)
from transformer.interop.hf_decoder import ZOO_CONFIG

__all__ = ["marian_generate", "marian_permutation", "marian_state", "marian_unsupported", "save_marian", "to_marian"]

TARGET = "Hugging Face MarianMTModel"
MARIAN_LAYERNORM_EPS = 1e-5  # nn.LayerNorm's default; Marian has no setting for it


def marian_unsupported(cfg: Any) -> list[str]:
    """One sentence per switch of model config ``cfg`` that ``MarianMTModel`` cannot hold (empty: it can)."""
    why = []
    if cfg.arch != "encoder_decoder":
        why.append(
            f"model.arch={cfg.arch}: MarianMTModel is an encoder-decoder (format=hf exports "
            "decoder-only models as LlamaForCausalLM)"
        )
    if cfg.norm_position != "post":
        why.append(f"model.norm_position={cfg.norm_position}: Marian normalises after each residual (post)")
    if cfg.norm.name != "layernorm":
        why.append(f"model/norm={cfg.norm.name}: Marian uses LayerNorm")
    elif abs(cfg.norm.eps - MARIAN_LAYERNORM_EPS) > 1e-12:
        why.append(f"model.norm.eps={cfg.norm.eps}: Marian's LayerNorm eps is fixed at {MARIAN_LAYERNORM_EPS}")
    if cfg.ffn.name not in ("relu", "gelu"):
        why.append(f"model/ffn={cfg.ffn.name}: Marian's feed-forward block has two matrices (model/ffn=relu or gelu)")
    if cfg.position.name != "sinusoidal":
        why.append(f"model/position={cfg.position.name}: Marian encodes positions with fixed sinusoids only")
    if cfg.attention.name in KV_HEAD_KINDS and resolve_n_kv_heads(cfg) != cfg.n_heads:
        why.append(
            f"model/attention={cfg.attention.name} (n_kv_heads={resolve_n_kv_heads(cfg)}): Marian has one "
            "key/value head per query head (model/attention=mha)"
        )
    return why + attention_unsupported(cfg, "MarianMTModel")


def marian_permutation(d_model: int) -> Tensor:
    """``(d_model,)`` long ``[0, 2, 4, ..., 1, 3, 5, ...]``: ``marian_hidden[j] = our_hidden[p[j]]``."""
    return torch.cat((torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)))


def marian_state(model: nn.Module, cfg: Any) -> dict[str, Tensor]:
    """Our encoder-decoder state dict in ``MarianMTModel``'s names and hidden order (fp32, CPU), without
    the position tables Marian computes."""
    ours = state_dict_fp32(model)
    d = cfg.d_model
    p = marian_permutation(d)

    def cols(w: Tensor) -> Tensor:  # reads the residual stream
        return w[:, p]

    new: dict[str, Tensor] = {
        "model.encoder.embed_tokens.weight": cols(ours["src_embed.embedding.weight"]),
        "model.decoder.embed_tokens.weight": cols(ours["tgt_embed.embedding.weight"]),
        "lm_head.weight": cols(ours["output_proj.weight"]),
        "final_logits_bias": torch.zeros(1, ours["output_proj.weight"].shape[0]),
    }
    if cfg.tie_embeddings == "all":
        new["model.shared.weight"] = new["model.encoder.embed_tokens.weight"]

    def linear(dst: str, w: Tensor, b: Tensor | None, reads: bool, writes: bool) -> None:
        w = cols(w) if reads else w
        new[f"{dst}.weight"] = w[p] if writes else w
        b = torch.zeros(w.shape[0]) if b is None else b
        new[f"{dst}.bias"] = b[p] if writes else b

    def attn(dst: str, src: str) -> None:
        w, b = ours[f"{src}.sublayer.in_proj.weight"], ours.get(f"{src}.sublayer.in_proj.bias")
        for i, name in enumerate(("q", "k", "v")):
            linear(
                f"{dst}.{name}_proj",
                w[i * d : (i + 1) * d],
                None if b is None else b[i * d : (i + 1) * d],
                reads=True,
                writes=False,
            )
        linear(
            f"{dst}.out_proj",
            ours[f"{src}.sublayer.out_proj.weight"],
            ours.get(f"{src}.sublayer.out_proj.bias"),
            reads=False,
            writes=True,
        )

    def norm(dst: str, src: str) -> None:
        new[f"{dst}.weight"], new[f"{dst}.bias"] = ours[f"{src}.norm.weight"][p], ours[f"{src}.norm.bias"][p]

    for side, n in (("encoder", cfg.n_encoder_layers), ("decoder", cfg.n_decoder_layers)):
        for i in range(n):
            dst, src = f"model.{side}.layers.{i}", f"{side}.layers.{i}"
            attn(f"{dst}.self_attn", f"{src}.self_attn")
            norm(f"{dst}.self_attn_layer_norm", f"{src}.self_attn")
            if side == "decoder":
                attn(f"{dst}.encoder_attn", f"{src}.cross_attn")
                norm(f"{dst}.encoder_attn_layer_norm", f"{src}.cross_attn")
            f = f"{src}.ffn.sublayer"
            linear(f"{dst}.fc1", ours[f"{f}.w1.weight"], ours.get(f"{f}.w1.bias"), reads=True, writes=False)
            linear(f"{dst}.fc2", ours[f"{f}.w2.weight"], ours.get(f"{f}.w2.bias"), reads=False, writes=True)
            norm(f"{dst}.final_layer_norm", f"{src}.ffn")
    return new


def _marian_config(cfg: Any, src_vocab: int, tgt_vocab: int, model: nn.Module) -> Any:
    from transformers import MarianConfig

    return MarianConfig(
        vocab_size=src_vocab,
        decoder_vocab_size=tgt_vocab,
        d_model=cfg.d_model,
        encoder_layers=cfg.n_encoder_layers,
        decoder_layers=cfg.n_decoder_layers,
        encoder_attention_heads=cfg.n_heads,
        decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff,
        decoder_ffn_dim=cfg.d_ff,
        activation_function=cfg.ffn.name,
        max_position_embeddings=cfg.max_positions,
        scale_embedding=bool(cfg.scale_embeddings),
        share_encoder_decoder_embeddings=cfg.tie_embeddings == "all",
        tie_word_embeddings=cfg.tie_embeddings in ("decoder", "all"),
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=model.pad_id,
        eos_token_id=model.eos_id,
        bos_token_id=model.bos_id,
        decoder_start_token_id=model.bos_id,
        forced_eos_token_id=model.eos_id,
        architectures=["MarianMTModel"],
    )


def to_marian(model: nn.Module, cfg: Any) -> Any:
    """A ``MarianMTModel`` (fp32, eval mode) whose ``logits`` equal ``model(src, prev)``.

    Raises:
        ExportError: a switch Marian cannot represent (named).
    """
    from transformers import MarianMTModel

    refuse(TARGET, marian_unsupported(cfg))
    state = marian_state(model, cfg)
    src_v, tgt_v = state["model.encoder.embed_tokens.weight"].shape[0], state["lm_head.weight"].shape[0]
    hf_cfg = _marian_config(cfg, src_v, tgt_v, model)
    hf_cfg._attn_implementation = "sdpa"
    hf = MarianMTModel(hf_cfg).eval()
    expected = hf.state_dict()
    unmapped = sorted(k for k in expected if k not in state and "embed_positions" not in k)
    unknown = sorted(k for k in state if k not in expected)
    if unmapped or unknown:
        raise ExportError(f"the Marian mapping does not fit: unmapped {unmapped[:5]}, unknown {unknown[:5]}")
    with torch.no_grad():
        for k, v in state.items():
            expected[k].copy_(v)  # tied names share storage: the same values are written twice
    return hf


def marian_generate_kwargs(gen: Any, model: Any) -> dict[str, Any]:
    """``hf.generate`` arguments (without the length limit) reproducing our search settings:
    ``len ** alpha`` penalty, PAD banned, EOS forced at the maximum length, ``min_len``."""
    c = model.config
    beam = int(gen.beam_size) if gen.strategy == "beam" else 1
    return dict(
        num_beams=beam,
        do_sample=False,
        min_new_tokens=int(gen.min_len),
        length_penalty=float(gen.length_penalty),
        early_stopping="never",
        num_return_sequences=1,
        decoder_start_token_id=c.decoder_start_token_id,
        eos_token_id=c.eos_token_id,
        pad_token_id=c.pad_token_id,
        forced_eos_token_id=c.eos_token_id,
        bad_words_ids=[[c.pad_token_id]],
        no_repeat_ngram_size=int(gen.no_repeat_ngram_size),
    )


def marian_generate(hf: Any, src_tokens: Tensor, gen: Any, **overrides: Any) -> list[list[int]]:
    """Decode ``(batch, src_len)`` ids + EOS with ``hf.generate`` under our settings; one token list per
    sentence, without the start token, ending with EOS.

    HF's maximum length is one per batch, ``int(max_len_a * longest + max_len_b)`` (ours with
    ``max_len_a = 0``), and it has no GNMT penalty: use ``length_penalty_form=fairseq`` for equal
    results. ``overrides`` change ``generate`` arguments (``early_stopping=True``)."""
    pad, eos = hf.config.pad_token_id, hf.config.eos_token_id
    n_src = int(src_tokens.ne(pad).sum(1).max())
    max_new = int(float(gen.max_len_a) * n_src + int(gen.max_len_b)) + 1
    kwargs = marian_generate_kwargs(gen, hf)
    kwargs["min_new_tokens"] = min(kwargs["min_new_tokens"], max_new)
    kwargs.update(overrides)
    with torch.inference_mode():
        out = hf.generate(input_ids=src_tokens, attention_mask=src_tokens.ne(pad), max_new_tokens=max_new, **kwargs)
    rows = []
    for row in out.tolist():
        toks = row[1:]  # drop the decoder start token
        rows.append(toks[: toks.index(eos) + 1] if eos in toks else toks)
    return rows


def save_marian(model: nn.Module, cfg: Any, tokenizers: Sequence[Any], folder: Path, run_cfg: Any = None) -> None:
    """Write a ``MarianMTModel`` folder with its ``MarianTokenizer`` (``source.spm``/``target.spm``,
    ``vocab.json`` of our ids) and the run's beam size and length penalty in ``generation_config.json``.

    Raises:
        ExportError: as :func:`to_marian`.
    """
    hf = to_marian(model, cfg)
    src_tok, tgt_tok = tokenizers
    gen = dict(
        bad_words_ids=[[model.pad_id]],
        forced_eos_token_id=model.eos_id,
        decoder_start_token_id=model.bos_id,
        eos_token_id=model.eos_id,
        pad_token_id=model.pad_id,
    )
    if run_cfg is not None:
        g = run_cfg.generation
        gen.update(num_beams=int(g.beam_size) if g.strategy == "beam" else 1, max_new_tokens=int(g.max_len_b) + 1)
        if g.length_penalty_form == "fairseq":
            gen["length_penalty"] = float(g.length_penalty)
    hf.generation_config.update(**gen)
    hf.save_pretrained(folder, safe_serialization=True)
    separate = src_tok is not tgt_tok
    shutil.copyfile(src_tok.model_path, folder / "source.spm")
    shutil.copyfile(tgt_tok.model_path, folder / "target.spm")

    def vocab_json(tok: Any) -> str:
        return json.dumps({piece: i for i, piece in enumerate(vocabulary(tok))}, ensure_ascii=False, indent=0)

    (folder / "vocab.json").write_text(vocab_json(src_tok), encoding="utf-8")
    if separate:
        (folder / "target_vocab.json").write_text(vocab_json(tgt_tok), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "MarianTokenizer",
                "separate_vocabs": separate,
                "unk_token": "<unk>",
                "eos_token": "</s>",
                "pad_token": "<pad>",
                "model_max_length": int(cfg.max_positions),
            },
            indent=2,
        )
        + "\n"
    )
    if run_cfg is not None:
        OmegaConf.save(run_cfg, folder / ZOO_CONFIG)
