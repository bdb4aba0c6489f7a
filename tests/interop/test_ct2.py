"""Our models -> CTranslate2 model folders (transformer.interop.ct2); skipped without ``ctranslate2``."""

from __future__ import annotations

import json

import pytest
import torch

import transformer.interop.ct2 as ct2_module
from tests.conftest import tiny_model_config
from tests.generation.helpers import make_run_dir
from tests.interop.helpers import LLAMA
from transformer.config import GenerationConfig
from transformer.generation import translate_sentences
from transformer.interop import ExportError, export_run
from transformer.interop.ct2 import ct2_translate, ct2_unsupported, load_ct2
from transformer.modules.ffn import FFNS, FFNChoice, GatedFeedForward
from transformer.plugins import plugin_of

ctranslate2 = pytest.importorskip("ctranslate2")

_DEC = {k: v for k, v in LLAMA.items() if k not in ("arch", "n_encoder_layers")}
CASES = {  # name: (arch, joint vocabulary, model overrides)
    "2017": ("encoder_decoder", True, {}),
    "pre_rms_swiglu_gqa_learned_separate": (
        "encoder_decoder",
        False,
        {
            "norm_position": "pre",
            "norm.name": "rmsnorm",
            "norm.eps": 1e-6,
            "ffn.name": "swiglu",
            "position.name": "learned",
            "attention.name": "gqa",
            "attention.n_kv_heads": 2,
            "bias": False,
        },
    ),
    "rope_mqa_encdec": (
        "encoder_decoder",
        True,
        {"position.name": "rope", "attention.name": "mqa", "attention.n_kv_heads": 1},
    ),
    "llama": ("decoder_only", True, _DEC),
    "decoder_alibi_geglu_tied": (
        "decoder_only",
        True,
        {"norm_position": "pre", "position.name": "alibi", "ffn.name": "geglu", "tie_embeddings": "all"},
    ),
    "decoder_post_sinusoidal": ("decoder_only", True, {}),
}
SOURCES = [
    "A man is riding a bike.",
    "Two dogs play in the snow.",
    "People.",
    "A girl in a red dress smiles at the camera.",
    "A group of people stand in front of a building.",
]
TARGETS = [
    "Ein Mann fährt Fahrrad.",
    "Zwei Hunde spielen im Schnee.",
    "Leute.",
    "Ein Mädchen lacht.",
    "Eine Gruppe von Menschen.",
]


@pytest.fixture(scope="module", params=list(CASES))
def exported(request, tmp_path_factory):
    arch, joint, overrides = CASES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    run_dir, model, src_tok, tgt_tok = make_run_dir(root / "run", arch=arch, joint=joint, **overrides)
    out = export_run(run_dir, "ctranslate2", root / "ct2")
    return out, arch, model, src_tok, tgt_tok


def test_folder_holds_model_vocabulary_and_spm(exported) -> None:
    out, arch, _, src_tok, tgt_tok = exported
    names = {p.name for p in out.iterdir()}
    assert {"model.bin", "config.json"} <= names
    if arch == "decoder_only":
        assert json.loads((out / "vocabulary.json").read_text()) == [
            src_tok.id_to_piece(i) for i in range(len(src_tok))
        ]
    elif src_tok is tgt_tok:
        assert {"shared_vocabulary.json", "spm.model"} <= names
    else:
        assert {"source_vocabulary.json", "target_vocabulary.json", "source.spm", "target.spm"} <= names
        assert json.loads((out / "target_vocabulary.json").read_text())[: len(tgt_tok)] == [
            tgt_tok.id_to_piece(i) for i in range(len(tgt_tok))
        ]


def test_scores_equal_ours(exported) -> None:
    """CTranslate2's log-probabilities of given targets equal our teacher-forced ones (<= 1e-4)."""
    out, arch, model, src_tok, tgt_tok = exported
    engine = load_ct2(out, arch, threads=1)
    srcs, tgts = src_tok.encode_batch(SOURCES), tgt_tok.encode_batch(TARGETS)
    pieces = lambda tok, ids: [tok.id_to_piece(i) for i in ids]  # noqa: E731
    with torch.no_grad():
        if arch == "encoder_decoder":
            results = engine.score_batch([pieces(src_tok, s) for s in srcs], [pieces(tgt_tok, t) for t in tgts])
        else:
            results = engine.score_batch(
                [pieces(src_tok, s + [src_tok.sep_id] + t + [src_tok.eos_id]) for s, t in zip(srcs, tgts)]
            )
        for s, t, r in zip(srcs, tgts, results):
            if arch == "encoder_decoder":
                lp = model(torch.tensor([s + [3]]), torch.tensor([[2] + t])).log_softmax(-1)[0]
                want = lp.gather(1, torch.tensor(t + [3])[:, None]).squeeze(1)
            else:
                seq = s + [4] + t + [3]
                lp = model(torch.tensor([seq])).log_softmax(-1)[0, :-1]
                want = lp.gather(1, torch.tensor(seq[1:])[:, None]).squeeze(1)
            torch.testing.assert_close(torch.tensor(r.log_probs), want, atol=1e-4, rtol=0)


def test_greedy_translations_equal_ours(exported) -> None:
    out, arch, model, src_tok, tgt_tok = exported
    ids = src_tok.encode_batch(SOURCES)
    gen = GenerationConfig(strategy="greedy", max_len_a=0.0, max_len_b=15)
    ours = [h[0].tokens for h in translate_sentences(model, ids, gen, "cpu")]
    theirs = ct2_translate(load_ct2(out, arch, threads=1), ids, gen, src_tok, tgt_tok, arch)
    # a cut output: ours ends with a forced EOS, CTranslate2's stops; the texts are the same
    assert [t[:15] for t in theirs] == [t[:15] for t in ours]
    assert [tgt_tok.decode(t) for t in theirs] == [tgt_tok.decode(t) for t in ours]


def test_int8_export_loads_and_translates(tmp_path) -> None:
    run_dir, model, tok, _ = make_run_dir(tmp_path / "run")
    out = export_run(run_dir, "ctranslate2", tmp_path / "int8", quantization="int8")
    assert json.loads((out / "config.json").read_text())["multi_query_attention"] is False
    ids = tok.encode_batch(SOURCES)
    gen = GenerationConfig(strategy="beam", beam_size=3, max_len_a=0.0, max_len_b=6)
    got = ct2_translate(load_ct2(out, "encoder_decoder", threads=1), ids, gen, tok, tok, "encoder_decoder")
    assert len(got) == len(ids) and all(1 <= len(t) <= 7 and 0 not in t for t in got)


def test_refuses_alibi_in_an_encoder_decoder(tmp_path) -> None:
    cfg = tiny_model_config(**{"position.name": "alibi"})
    assert any("model/position=alibi" in why for why in ct2_unsupported(cfg))
    run_dir = make_run_dir(tmp_path / "run", **{"position.name": "alibi"})[0]
    with pytest.raises(ExportError, match="model/position=alibi in an encoder-decoder"):
        export_run(run_dir, "ctranslate2", tmp_path / "out")
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["run"]


def test_an_ffn_option_without_a_ct2_activation_is_refused_by_name(monkeypatch) -> None:
    """A new model/ffn option is one FFNS entry: CTranslate2 refuses it with a sentence (no KeyError)
    until interop/ct2.py maps its activation; then it is exported, as a GLU when gated."""
    for name in [n for n in FFNS if plugin_of("model/ffn", n)]:  # the example plugins' (tests/conftest.py)
        monkeypatch.delitem(FFNS, name)
    monkeypatch.setitem(FFNS, "relu_glu", FFNChoice(GatedFeedForward, torch.relu))  # a name no example plugin holds
    cfg = tiny_model_config(**{"ffn.name": "relu_glu"})
    assert ct2_unsupported(cfg) == [
        "model/ffn=relu_glu: CTranslate2 has no such activation (model/ffn offers relu, gelu, swiglu, geglu)"
    ]
    monkeypatch.setitem(ct2_module._ACTIVATIONS, torch.relu, "RELU")
    assert ct2_unsupported(cfg) == []
    assert ct2_module._activation(cfg) == ctranslate2.specs.common_spec.Activation.RELU


def test_empty_sources_get_no_output(exported) -> None:
    out, arch, model, src_tok, tgt_tok = exported
    ids = [[], src_tok.encode("A dog runs."), []]
    gen = GenerationConfig(strategy="greedy", max_len_a=0.0, max_len_b=6)
    got = ct2_translate(load_ct2(out, arch, threads=1), ids, gen, src_tok, tgt_tok, arch)
    assert got[0] == got[2] == [] and got[1] and ct2_translate(None, [[]], gen, src_tok, tgt_tok, arch) == [[]]
