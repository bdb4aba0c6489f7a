"""Same-dims peer models for ``benchmarks/train_throughput.py`` (benchmark-only dependencies).

Every peer exposes ``step_loss(batch) -> loss`` (a mean over target tokens, with the peer's own
loss code) so that the benchmark times forward + backward + optimizer step the same way for all.
``batch`` is ``{"src": (B, S), "prev": (B, T), "target": (B, T)}`` for encoder-decoders and
``{"tokens": (B, L), "target": (B, L)}`` (``-100``/pad over the source) for decoder-only models.

Peers: ``torch.nn.Transformer`` (with our own embeddings/positions/output layer around it),
Hugging Face ``MarianMTModel`` and ``BartForConditionalGeneration``, ``LlamaForCausalLM`` and
x-transformers (encoder-decoder and decoder-only); ``MixtralForCausalLM`` for the mixture of
experts (``benchmarks/moe_throughput.py``). Transformers and x-transformers come from the
``bench`` extra (``pip install -e '.[bench]'``); a peer whose package is missing is skipped.

Every peer also carries ``dropout_desc``: the dropout it actually applies, read back from its own
configuration (``"0.3"``; where it differs from ours, which drops embeddings and residual branches,
where: ``"0.3 (emb, ff)"``). ``preload(name)`` imports what a peer's constructor imports, so the
benchmark can take its memory baseline after module imports.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from benchmarks import prob

PAD = 0


class TorchTransformerPeer(nn.Module):
    """``torch.nn.Transformer`` (post-LN, ReLU) with tied embeddings, sinusoids and an output layer."""

    def __init__(self, d: dict[str, Any], vocab: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d["d_model"], padding_idx=PAD)
        nn.init.normal_(self.emb.weight, std=d["d_model"] ** -0.5)
        self.scale = math.sqrt(d["d_model"])
        pos = torch.arange(1024)[:, None]
        div = torch.exp(torch.arange(0, d["d_model"], 2) * (-math.log(10000.0) / d["d_model"]))
        pe = torch.zeros(1024, d["d_model"])
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
        self.register_buffer("pe", pe)
        self.drop = nn.Dropout(d["dropout"])
        self.core = nn.Transformer(
            d["d_model"], d["n_heads"], d["enc_layers"], d["dec_layers"], d["d_ff"], d["dropout"], batch_first=True
        )
        self.out = nn.Linear(d["d_model"], vocab, bias=False)
        self.out.weight = self.emb.weight
        self.eps = d["label_smoothing"]
        layer = self.core.encoder.layers[0]
        # nn.Transformer drops the residual branches, and also the attention weights and FFN hidden units
        assert self.drop.p == layer.self_attn.dropout == layer.dropout.p
        self.dropout_desc = f"{prob(self.drop.p)} (+ attn weights, ff)"

    def _embed(self, x: Tensor) -> Tensor:
        return self.drop(self.emb(x) * self.scale + self.pe[: x.shape[1]])

    def step_loss(self, batch: dict[str, Tensor]) -> Tensor:
        t = batch["prev"].shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=batch["prev"].device)
        h = self.core(
            self._embed(batch["src"]),
            self._embed(batch["prev"]),
            tgt_mask=mask,
            tgt_is_causal=True,
        )
        logits = self.out(h)
        return F.cross_entropy(
            logits.flatten(0, 1), batch["target"].flatten(), ignore_index=PAD, label_smoothing=self.eps
        )


class HFSeq2SeqPeer(nn.Module):
    """Hugging Face Marian / BART at the same dims; HF's own loss (``labels``), plain cross entropy."""

    def __init__(self, d: dict[str, Any], vocab: int, kind: str) -> None:
        super().__init__()
        import transformers

        common = dict(
            vocab_size=vocab,
            d_model=d["d_model"],
            encoder_layers=d["enc_layers"],
            decoder_layers=d["dec_layers"],
            encoder_attention_heads=d["n_heads"],
            decoder_attention_heads=d["n_heads"],
            encoder_ffn_dim=d["d_ff"],
            decoder_ffn_dim=d["d_ff"],
            dropout=d["dropout"],
            attention_dropout=0.0,
            activation_dropout=0.0,
            activation_function="relu",
            max_position_embeddings=1024,
            pad_token_id=PAD,
            eos_token_id=3,
            decoder_start_token_id=2,
            scale_embedding=True,
        )
        if kind == "marian":
            cfg = transformers.MarianConfig(**common, share_encoder_decoder_embeddings=True)
            self.core = transformers.MarianMTModel(cfg)
        else:
            cfg = transformers.BartConfig(**common)
            self.core = transformers.BartForConditionalGeneration(cfg)
        self.core.config._attn_implementation = "sdpa"
        c = self.core.config
        extra = [f"{k} {prob(v)}" for k, v in (("attn", c.attention_dropout), ("ff", c.activation_dropout)) if v]
        self.dropout_desc = prob(c.dropout) + (f" (+ {', '.join(extra)})" if extra else "")

    def step_loss(self, batch: dict[str, Tensor]) -> Tensor:
        labels = batch["target"].masked_fill(batch["target"].eq(PAD), -100)
        return self.core(input_ids=batch["src"], decoder_input_ids=batch["prev"], labels=labels).loss


class HFLlamaPeer(nn.Module):
    """``LlamaForCausalLM`` at the dims of our Llama-style preset; labels ``-100`` over the source."""

    def __init__(self, d: dict[str, Any], vocab: int) -> None:
        super().__init__()
        import transformers

        cfg = transformers.LlamaConfig(
            vocab_size=vocab,
            hidden_size=d["d_model"],
            intermediate_size=d["ffn_hidden"],
            num_hidden_layers=d["dec_layers"],
            num_attention_heads=d["n_heads"],
            num_key_value_heads=d["n_kv_heads"],
            max_position_embeddings=1024,
            rms_norm_eps=1e-6,
            tie_word_embeddings=False,
            pad_token_id=PAD,
            attn_implementation="sdpa",
        )
        self.core = transformers.LlamaForCausalLM(cfg)
        # LlamaForCausalLM has no embedding or residual dropout; attention_dropout is its only one
        self.dropout_desc = prob(self.core.config.attention_dropout)

    def step_loss(self, batch: dict[str, Tensor]) -> Tensor:
        # HF shifts labels itself: labels[i] is predicted from position i - 1
        labels = torch.cat((batch["tokens"][:, :1], batch["target"][:, :-1]), 1)
        labels = labels.masked_fill(labels.eq(PAD), -100)
        return self.core(input_ids=batch["tokens"], labels=labels).loss


class HFMixtralPeer(nn.Module):
    """``MixtralForCausalLM`` at the dims of our ``model/ffn=moe`` decoder-only model: ``d["experts"]``
    SwiGLU experts of width ``d["ffn_hidden"]``, ``d["top_k"]`` per token, HF's own loss with its
    load-balancing term (``output_router_logits=True``, ``router_aux_loss_coef=d["aux_coef"]``);
    labels ``-100`` over the source. ``experts_implementation`` is HF's dispatch (``grouped_mm``,
    ``eager``: a loop over the experts hit, ``batched_mm``)."""

    def __init__(self, d: dict[str, Any], vocab: int, experts_implementation: str = "grouped_mm") -> None:
        super().__init__()
        import transformers

        cfg = transformers.MixtralConfig(
            vocab_size=vocab,
            hidden_size=d["d_model"],
            intermediate_size=d["ffn_hidden"],
            num_hidden_layers=d["dec_layers"],
            num_attention_heads=d["n_heads"],
            num_key_value_heads=d["n_kv_heads"],
            num_local_experts=d["experts"],
            num_experts_per_tok=d["top_k"],
            router_aux_loss_coef=d["aux_coef"],
            output_router_logits=True,
            router_jitter_noise=0.0,
            max_position_embeddings=1024,
            rms_norm_eps=d["norm_eps"],
            rope_parameters={"rope_type": "default", "rope_theta": d["rope_theta"]},
            tie_word_embeddings=False,
            pad_token_id=PAD,
            attn_implementation="sdpa",
            experts_implementation=experts_implementation,
        )
        self.core = transformers.MixtralForCausalLM(cfg)
        self.experts_implementation = self.core.config._experts_implementation
        self.dropout_desc = prob(self.core.config.attention_dropout)  # Mixtral has no other dropout

    def step_loss(self, batch: dict[str, Tensor]) -> Tensor:
        labels = torch.cat((batch["tokens"][:, :1], batch["target"][:, :-1]), 1)  # HF shifts labels itself
        labels = labels.masked_fill(labels.eq(PAD), -100)
        return self.core(input_ids=batch["tokens"], labels=labels).loss


class XTransformersEncDecPeer(nn.Module):
    """x-transformers encoder + cross-attending decoder (post-LN, ReLU, sinusoids, tied embeddings)."""

    def __init__(self, d: dict[str, Any], vocab: int) -> None:
        super().__init__()
        from x_transformers import Decoder, Encoder, TransformerWrapper

        emb_dropout, ff_dropout = d["dropout"], d["dropout"]
        layer = dict(
            dim=d["d_model"],
            heads=d["n_heads"],
            ff_mult=d["d_ff"] / d["d_model"],
            ff_custom_activation=nn.ReLU(),  # x-transformers defaults to GELU
            pre_norm=False,
            layer_dropout=0.0,
            attn_dropout=0.0,
            ff_dropout=ff_dropout,
            attn_flash=True,
            attn_dim_head=d["d_model"] // d["n_heads"],
        )
        self.encoder = TransformerWrapper(
            num_tokens=vocab,
            max_seq_len=1024,
            return_only_embed=True,
            scaled_sinu_pos_emb=True,
            emb_dropout=emb_dropout,
            attn_layers=Encoder(depth=d["enc_layers"], **layer),
        )
        self.decoder = TransformerWrapper(
            num_tokens=vocab,
            max_seq_len=1024,
            emb_dropout=emb_dropout,
            scaled_sinu_pos_emb=True,
            tie_embedding=True,
            attn_layers=Decoder(depth=d["dec_layers"], cross_attend=True, **layer),
        )
        self.decoder.token_emb = self.encoder.token_emb  # one table for source, target and output
        self.eps = d["label_smoothing"]
        # x-transformers drops the embeddings and the FFN hidden units, not the residual branches
        self.dropout_desc = (
            f"{prob(emb_dropout)} (emb, ff)"
            if emb_dropout == ff_dropout
            else f"emb {prob(emb_dropout)}, ff {prob(ff_dropout)}"
        )

    def step_loss(self, batch: dict[str, Tensor]) -> Tensor:
        enc = self.encoder(batch["src"], return_embeddings=True)
        logits = self.decoder(batch["prev"], context=enc)
        return F.cross_entropy(
            logits.flatten(0, 1), batch["target"].flatten(), ignore_index=PAD, label_smoothing=self.eps
        )


class XTransformersDecoderPeer(nn.Module):
    """x-transformers decoder-only with RMSNorm, SwiGLU, RoPE and GQA (Llama-style)."""

    def __init__(self, d: dict[str, Any], vocab: int) -> None:
        super().__init__()
        from x_transformers import Decoder, TransformerWrapper

        emb_dropout = attn_dropout = ff_dropout = 0.0  # as LlamaForCausalLM: no dropout
        self.core = TransformerWrapper(
            num_tokens=vocab,
            max_seq_len=1024,
            use_abs_pos_emb=False,
            emb_dropout=emb_dropout,
            attn_layers=Decoder(
                dim=d["d_model"],
                depth=d["dec_layers"],
                heads=d["n_heads"],
                attn_kv_heads=d["n_kv_heads"],
                rotary_pos_emb=True,
                use_rmsnorm=True,
                ff_glu=True,
                ff_swish=True,
                ff_no_bias=True,
                attn_flash=True,
                attn_dim_head=d["d_model"] // d["n_heads"],
                ff_mult=d["ffn_hidden"] / d["d_model"],
                attn_dropout=attn_dropout,
                ff_dropout=ff_dropout,
            ),
        )
        self.eps = d["label_smoothing"]
        self.dropout_desc = prob(max(emb_dropout, attn_dropout, ff_dropout))

    def step_loss(self, batch: dict[str, Tensor]) -> Tensor:
        logits = self.core(batch["tokens"])
        return F.cross_entropy(
            logits.flatten(0, 1), batch["target"].flatten(), ignore_index=PAD, label_smoothing=self.eps
        )


def encdec_peers() -> dict[str, Callable[[dict[str, Any], int], nn.Module]]:
    """Name -> constructor of the encoder-decoder peers."""
    return {
        "torch nn.Transformer": TorchTransformerPeer,
        "HF Marian": lambda d, v: HFSeq2SeqPeer(d, v, "marian"),
        "HF BART": lambda d, v: HFSeq2SeqPeer(d, v, "bart"),
        "x-transformers": XTransformersEncDecPeer,
    }


def decoder_only_peers() -> dict[str, Callable[[dict[str, Any], int], nn.Module]]:
    """Name -> constructor of the decoder-only peers."""
    return {"HF Llama": HFLlamaPeer, "x-transformers": XTransformersDecoderPeer}


_TRANSFORMERS_CLASSES = {
    "HF Marian": ("MarianConfig", "MarianMTModel"),
    "HF BART": ("BartConfig", "BartForConditionalGeneration"),
    "HF Llama": ("LlamaConfig", "LlamaForCausalLM"),
    "HF Mixtral": ("MixtralConfig", "MixtralForCausalLM"),
}


def preload(name: str) -> None:
    """Import the package (and, for transformers, the lazily loaded model module) peer ``name`` needs.

    Raises ImportError when the package is missing.
    """
    if name in _TRANSFORMERS_CLASSES:
        import transformers

        for cls in _TRANSFORMERS_CLASSES[name]:
            getattr(transformers, cls)  # transformers imports its model modules on first attribute access
    elif name.startswith("x-transformers"):
        import x_transformers  # noqa: F401
