"""SentencePiece subword vocabulary (Kudo & Richardson 2018): BPE (Sennrich et al. 2016) or unigram
(Kudo 2018), trained on the training split, joint over source and target by default.

=========  ====  ==================================================================
``<pad>``  0     padding, never a loss target
``<unk>``  1     unknown piece
``<s>``    2     BOS: first decoder input of the encoder-decoder
``</s>``   3     EOS: appended to the source and to the target
``<sep>``  4     separator between source and target in the decoder-only prefix-LM
=========  ====  ==================================================================

Text is normalised with ``nmt_nfkc`` (``nmt_nfkc_cf`` with ``lowercase=True``), so decoded text is
normalised: BLEU is computed against the original reference lines."""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import sentencepiece as spm

from transformer.data.reading import iter_line_blocks
from transformer.runs.io import atomic_write_bytes, atomic_write_text

PAD_ID, UNK_ID, BOS_ID, EOS_ID, SEP_ID = 0, 1, 2, 3, 4
SEP_PIECE = "<sep>"
SPECIAL_IDS = frozenset((PAD_ID, BOS_ID, EOS_ID, SEP_ID))


class Tokenizer:
    """A SentencePiece model with the project's special ids (pad 0, unk 1, bos 2, eos 3, ``<sep>`` 4).

    Raises:
        ValueError: the model does not have the expected special ids.
    """

    def __init__(self, model_path: str | os.PathLike, num_threads: int = 2) -> None:
        self.model_path = Path(model_path)
        self.num_threads = num_threads
        self._load(self.model_path.read_bytes())

    def _load(self, proto: bytes) -> None:
        self._proto = proto
        self.sp = spm.SentencePieceProcessor(model_proto=proto)
        got = (self.sp.pad_id(), self.sp.unk_id(), self.sp.bos_id(), self.sp.eos_id(), self.sp.piece_to_id(SEP_PIECE))
        if got != (PAD_ID, UNK_ID, BOS_ID, EOS_ID, SEP_ID):
            raise ValueError(
                f"{self.model_path}: special ids (pad, unk, bos, eos, <sep>) are {got}, expected "
                f"{(PAD_ID, UNK_ID, BOS_ID, EOS_ID, SEP_ID)}"
            )
        self._size = self.sp.get_piece_size()

    # pickling (DataLoader workers, multiprocessing): ship the model bytes, not the path
    def __getstate__(self) -> dict[str, Any]:
        return {"model_path": str(self.model_path), "num_threads": self.num_threads, "proto": self._proto}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.model_path = Path(state["model_path"])
        self.num_threads = state["num_threads"]
        self._load(state["proto"])

    def __len__(self) -> int:
        """Vocabulary size (number of pieces, specials included)."""
        return self._size

    def __repr__(self) -> str:
        return f"Tokenizer({str(self.model_path)!r}, vocab_size={self._size})"

    pad_id, unk_id, bos_id, eos_id, sep_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID, SEP_ID

    def encode(self, text: str) -> list[int]:
        """Piece ids of one raw sentence, without BOS/EOS."""
        return self.sp.encode(text, out_type=int)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Piece ids of each raw sentence, without BOS/EOS (multi-threaded inside SentencePiece)."""
        if not texts:
            return []
        return self.sp.encode(list(texts), out_type=int, num_threads=self.num_threads)

    def decode(self, ids: Sequence[int] | Any) -> str:
        """The normalised text of ``ids`` (a sequence or a ``(seq_len,)`` tensor/array): everything from the
        first EOS on ignored, PAD/BOS/``<sep>`` dropped, ids past the vocabulary decoded as ``<unk>``."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        out = []
        for i in ids:
            i = int(i)
            if i == EOS_ID:
                break
            if i in SPECIAL_IDS:
                continue
            out.append(i if 0 <= i < self._size else UNK_ID)
        return self.sp.decode(out)

    def id_to_piece(self, i: int) -> str:
        """The piece string of id ``i`` (e.g. ``"▁a"``)."""
        return self.sp.id_to_piece(int(i))

    @classmethod
    def train(
        cls,
        inputs: Iterable[str | os.PathLike],
        model_prefix: str | os.PathLike,
        vocab_size: int,
        model_type: str = "bpe",
        character_coverage: float = 1.0,
        *,
        lowercase: bool = False,
        num_threads: int = 2,
        input_sentence_size: int = 2_000_000,
        max_sentence_length: int = 4192,
        seed: int = 17,
    ) -> Tokenizer:
        """Train a SentencePiece model and write ``{model_prefix}.model`` / ``.vocab`` atomically.

        Deterministic for given inputs (a fixed seed for SentencePiece's sample of ``input_sentence_size``
        sentences); ``hard_vocab_limit=False``, so a small corpus gives a slightly smaller vocabulary.

        Args:
            inputs: sentences and/or files (``Path``, plain or gzip, streamed), any iterable; empty lines
                are skipped.
            vocab_size: target number of pieces, specials included.
            model_type: ``bpe`` or ``unigram``.
            character_coverage: 1.0 for alphabetic European languages, ~0.9995 for CJK.
            lowercase: case-fold during normalisation.
            max_sentence_length: longer sentences (bytes) are skipped.

        Raises:
            ValueError: unknown ``model_type``, non-positive ``vocab_size`` or no non-empty sentence.
            DataError: an unreadable input file (file and line named).
        """
        if model_type not in ("bpe", "unigram"):
            raise ValueError(f"model_type={model_type!r} is not one of bpe, unigram")
        if vocab_size <= SEP_ID + 1:
            raise ValueError(f"vocab_size={vocab_size} must be larger than the {SEP_ID + 1} special pieces")
        files = [str(item) for item in inputs if not isinstance(item, str)] if isinstance(inputs, (list, tuple)) else []

        def sentences() -> Iterator[str]:
            for item in inputs:
                if isinstance(item, str):
                    if item.strip():
                        yield item
                else:
                    for block in iter_line_blocks(item):
                        yield from (s for s in block if s.strip())

        stream = sentences()
        first = next(stream, None)  # errors of the input (a DataError naming file and line) surface here
        if first is None:
            where = f" in {', '.join(files)}" if files else ""
            raise ValueError(f"no non-empty sentences{where} to train the SentencePiece model on")
        failure: list[BaseException] = []

        def guarded() -> Iterator[str]:
            try:
                yield first
                yield from stream
            except BaseException as e:  # SentencePiece would turn it into a RuntimeError
                failure.append(e)
                raise

        spm.set_random_generator_seed(seed)
        buf = io.BytesIO()
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=guarded(),
                model_writer=buf,
                vocab_size=vocab_size,
                model_type=model_type,
                character_coverage=character_coverage,
                normalization_rule_name="nmt_nfkc_cf" if lowercase else "nmt_nfkc",
                pad_id=PAD_ID,
                unk_id=UNK_ID,
                bos_id=BOS_ID,
                eos_id=EOS_ID,
                user_defined_symbols=[SEP_PIECE],
                hard_vocab_limit=False,
                input_sentence_size=input_sentence_size,
                shuffle_input_sentence=True,
                max_sentence_length=max_sentence_length,
                num_threads=num_threads,
                minloglevel=2,
            )
        except RuntimeError:
            if failure:
                raise failure[0] from None
            raise
        path = atomic_write_bytes(f"{model_prefix}.model", buf.getvalue())
        sp = spm.SentencePieceProcessor(model_proto=buf.getvalue())
        vocab = "".join(f"{sp.id_to_piece(i)}\t{sp.get_score(i):g}\n" for i in range(sp.get_piece_size()))
        atomic_write_text(f"{model_prefix}.vocab", vocab)
        return cls(path, num_threads=num_threads)


__all__ = ["BOS_ID", "EOS_ID", "PAD_ID", "SEP_ID", "SEP_PIECE", "SPECIAL_IDS", "UNK_ID", "Tokenizer"]
