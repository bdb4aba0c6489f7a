"""The work of ``scripts/translate.py`` (``configs/translate.yaml``): translate a text file or stdin
line by line with a run or an ensemble. Chunks of ``buffer_lines`` are sorted, batched by tokens,
decoded and written back in input order, so the output stays line-aligned: an empty line gives an
empty line, and a line that fails is reported and left empty (:class:`LinesFailed` at the end).
With ``generation.nbest > 1`` or ``scores=true`` each hypothesis is ``index ||| text ||| score |||
logprob`` (index from 0, best first)."""

from __future__ import annotations

import gzip
import io
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from tqdm import tqdm

from transformer.generation.prepare import prepare_decoding
from transformer.generation.translate import translate_sentences

__all__ = ["LinesFailed", "open_input", "read_chunks", "translate_file"]


class LinesFailed(RuntimeError):
    """Some lines could not be translated (each was reported; every other line was written)."""


def open_input(name: str) -> IO[str]:
    """A text stream of ``-`` (stdin, UTF-8, undecodable bytes replaced) or a file, plain or ``.gz``.

    Raises:
        FileNotFoundError: ``input file not found: <path>``.
    """
    if name == "-":
        return io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")
    path = Path(name)
    if not path.is_file():
        raise FileNotFoundError(f"input file not found: {path}")
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def read_chunks(stream: IO[str], size: int) -> Iterator[list[str]]:
    """Yield the lines of ``stream`` without their endings, ``size`` at a time."""
    chunk: list[str] = []
    for line in stream:
        chunk.append(line.rstrip("\r\n"))
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def translate_file(cfg: Any) -> int:
    """Translate ``cfg.input`` into ``cfg.output`` (stdout when null); return the number of input lines.

    A failed line is reported at once on stderr and its output left empty; a summary line ends the run.
    ``checkpoint`` may be a list (an ensemble; the first's generation settings apply); ``precision``
    null takes the run's (fp32 on the CPU).

    Raises:
        LinesFailed: after everything was written, when some lines could not be translated.
        LoadError: a missing or foreign checkpoint, a mismatched tokenizer, ensemble members of
            different vocabularies, or a test-time RoPE scaling without RoPE or with invalid fields.
        ConfigError: invalid generation settings, or ``device=cuda`` without a GPU.
        FileNotFoundError: a missing input file.
    """
    prepared = prepare_decoding(cfg)
    loaded, gen, device = prepared.loaded, prepared.gen, prepared.device
    src_tok, tgt_tok = loaded.tokenizers
    with_scores = bool(cfg.scores) or gen.nbest > 1
    out: IO[str] = open(cfg.output, "w", encoding="utf-8") if cfg.output else sys.stdout
    n = 0
    failed = 0
    start = time.time()
    bar = None
    if cfg.progress:
        bar = tqdm(desc="translate", unit="line", file=sys.stderr, dynamic_ncols=True, mininterval=1.0)
    try:
        with open_input(str(cfg.input)) as stream:
            for lines in read_chunks(stream, max(1, int(cfg.buffer_lines))):
                todo = [i for i, line in enumerate(lines) if line.strip()]
                errors: dict[int, str] = {}
                hyps = translate_sentences(
                    loaded.model,
                    src_tok.encode_batch([lines[i] for i in todo]),
                    gen,
                    device,
                    loaded.model.arch,
                    errors=errors,
                    progress=False if bar is None else bar,
                    precision=prepared.precision,
                )
                for j, msg in sorted(errors.items()):
                    line_no = n + todo[j] + 1
                    print(f"error: line {line_no}: {msg}; its output line is left empty", file=sys.stderr, flush=True)
                failed += len(errors)
                if bar is not None:
                    bar.update(len(lines) - len(todo))
                by_line = {todo[j]: h for j, h in enumerate(hyps) if h}
                for i in range(len(lines)):
                    found = by_line.get(i, [])
                    if not with_scores:
                        out.write((tgt_tok.decode(found[0].tokens) if found else "") + "\n")
                        continue
                    for h in found or []:
                        out.write(f"{n + i} ||| {tgt_tok.decode(h.tokens)} ||| {h.score:.6f} ||| {h.logprob:.6f}\n")
                    if not found:
                        out.write(f"{n + i} |||  ||| 0.000000 ||| 0.000000\n")
                out.flush()
                n += len(lines)
    finally:
        if bar is not None:
            bar.close()
        if out is not sys.stdout:
            out.close()
    what = f"beam {gen.beam_size}" if gen.strategy == "beam" else gen.strategy
    if prepared.precision != "fp32":
        what += f", {prepared.precision}"
    at_test = f", at test time {' '.join(prepared.test_time)}" if prepared.test_time else ""
    print(
        f"translated {n - failed} of {n} lines in {time.time() - start:.1f}s ({prepared.source}, {what}{at_test})",
        file=sys.stderr,
    )
    if failed:
        raise LinesFailed(
            f"{failed} of {n} lines could not be translated (reported above; their output lines are empty)"
        )
    return n
