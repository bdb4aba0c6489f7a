"""SentencePiece tokenizer: special ids, round trip on real lines, decode rules, determinism."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, SEP_ID, UNK_ID, Tokenizer


def test_special_ids(small_tokenizer: Tokenizer) -> None:
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID, SEP_ID) == (0, 1, 2, 3, 4)
    assert [small_tokenizer.id_to_piece(i) for i in range(5)] == ["<pad>", "<unk>", "<s>", "</s>", "<sep>"]
    assert len(small_tokenizer) == 1000
    assert small_tokenizer.model_path.is_file()


def test_round_trip_real_multi30k_lines(small_tokenizer: Tokenizer, data_dir: Path) -> None:
    from transformer.data.corpus import read_lines

    # validation lines were not seen in training; SentencePiece collapses runs of spaces
    for lang in ("en", "de"):
        lines = read_lines(data_dir / "multi30k" / f"val.{lang}.gz")[:300]
        ids = small_tokenizer.encode_batch(lines)
        assert ids[0] == small_tokenizer.encode(lines[0])
        assert all(i >= 5 for seq in ids for i in seq)  # no specials, no unk (coverage 1.0)
        assert [small_tokenizer.decode(x) for x in ids] == [" ".join(s.split()) for s in lines]


def test_decode_drops_specials_and_stops_at_eos(small_tokenizer: Tokenizer) -> None:
    import torch

    ids = small_tokenizer.encode("A dog runs.")
    noisy = [BOS_ID] + ids[:1] + [SEP_ID, PAD_ID] + ids[1:] + [EOS_ID] + small_tokenizer.encode("junk") + [PAD_ID]
    assert small_tokenizer.decode(noisy) == "A dog runs."
    assert small_tokenizer.decode(torch.tensor(noisy)) == "A dog runs."
    assert small_tokenizer.decode([len(small_tokenizer) + 3]) == small_tokenizer.decode([UNK_ID])


def test_training_is_deterministic_and_pickles(tmp_path: Path, multi30k_lines, small_tokenizer: Tokenizer) -> None:
    lines = multi30k_lines["en"] + multi30k_lines["de"]
    again = Tokenizer.train(lines, tmp_path / "again", vocab_size=1000)
    assert again.model_path.read_bytes() == small_tokenizer.model_path.read_bytes()
    clone = pickle.loads(pickle.dumps(small_tokenizer))
    assert clone.encode("Zwei Männer") == small_tokenizer.encode("Zwei Männer")


def test_unigram_lowercase_and_files(tmp_path: Path, data_dir: Path) -> None:
    from transformer.data.corpus import read_lines

    src = data_dir / "multi30k" / "val.en.gz"
    tok = Tokenizer.train([src], tmp_path / "uni", vocab_size=600, model_type="unigram", lowercase=True)
    assert len(tok) <= 600 and tok.id_to_piece(SEP_ID) == "<sep>"
    line = read_lines(src)[0]
    assert tok.decode(tok.encode(line)) == " ".join(line.lower().split())


def test_bad_options(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="model_type"):
        Tokenizer.train(["a b"], tmp_path / "x", vocab_size=100, model_type="wordpiece")
    with pytest.raises(ValueError, match="no non-empty"):
        Tokenizer.train(["", "  "], tmp_path / "x", vocab_size=100)


def test_no_sentences_names_the_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.en"
    empty.write_text("\n  \n")
    with pytest.raises(ValueError, match=rf"no non-empty sentences in {empty} to train"):
        Tokenizer.train([empty], tmp_path / "x", vocab_size=100)


def test_streamed_input_error_keeps_its_file_and_line(tmp_path: Path) -> None:
    from transformer.data.errors import DataError

    bad = tmp_path / "bad.en"
    # past the first block of 1 MiB: raised while SentencePiece consumes the stream
    bad.write_bytes(b"".join(b"sentence number %d here\n" % i for i in range(60_000)) + b"oops \xff\n")
    with pytest.raises(DataError, match=r"bad\.en: invalid UTF-8 on line 60001"):
        Tokenizer.train([bad], tmp_path / "x", vocab_size=100)
