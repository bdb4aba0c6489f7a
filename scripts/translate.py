"""Translate text line by line with a trained run (Hydra app; config: configs/translate.yaml).

    python scripts/translate.py checkpoint=outputs/exp/RUN input=test.en > test.hyp
    cat test.en | python scripts/translate.py checkpoint=RUN input=- generation.beam_size=10
    python scripts/translate.py checkpoint=RUN input=test.en generation.nbest=4     # n-best with scores
    python scripts/translate.py checkpoint=[RUN_A,RUN_B,RUN_C] input=test.en        # an ensemble

Lines are read in chunks of ``buffer_lines``, sorted and batched by tokens
(``generation.max_tokens`` x beam), decoded, and written back in input order, detokenised. Empty
input lines give empty output lines. With ``generation.nbest > 1`` or ``scores=true`` every
hypothesis is written as ``index ||| text ||| score ||| logprob`` (index from 0, best first).
A line that cannot be translated (e.g. longer than a model with learned positions can read) gets
a one-line ``error: line N: ...`` on stderr and an empty output line; every other line is still
translated and written, and the exit status is then 1. A progress bar of translated lines goes to
stderr (``progress=false`` turns it off).
Several checkpoints with the same vocabulary (``checkpoint=[a,b,c]``) decode as one ensemble that
averages their log-probabilities at each step (:mod:`transformer.generation.ensemble`); the first
one's generation settings apply.
Exit status 2 with a one-line message on stderr for a missing or foreign checkpoint, a tokenizer
that does not match it, checkpoints of an ensemble with different vocabularies, or invalid settings.
"""

from __future__ import annotations

import gzip
import io
import sys
import time
from pathlib import Path
from typing import IO, Iterator

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # allow running from a checkout without installing
    sys.path.insert(0, str(ROOT))

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from transformer.config import register_configs  # noqa: E402

register_configs()  # generation_overrides, the schema of the generation.* fields


def _open_input(name: str) -> IO[str]:
    if name == "-":
        return io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")
    path = Path(name)
    if not path.is_file():
        raise FileNotFoundError(f"input file not found: {path}")
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def _chunks(stream: IO[str], size: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    for line in stream:
        chunk.append(line.rstrip("\r\n"))
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class LinesFailed(RuntimeError):
    """Some lines could not be translated (each was reported; every other line was written)."""


def run(cfg: DictConfig) -> int:
    """Translate ``cfg.input`` into ``cfg.output`` (stdout).

    Returns:
        The number of lines.

    Raises:
        LinesFailed: after everything was written, when some lines could not be translated (their
            output lines are empty; each one was reported on stderr as ``error: line N: ...``).
    """
    import torch

    from transformer.generation import load_models, merge_generation, resolve_device, translate_sentences

    if cfg.num_threads > 0:
        torch.set_num_threads(int(cfg.num_threads))
    device = resolve_device(cfg.device)
    checkpoints = list(cfg.checkpoint) if OmegaConf.is_list(cfg.checkpoint) else cfg.checkpoint
    loaded = load_models(checkpoints, device, src_tokenizer=cfg.src_tokenizer, tgt_tokenizer=cfg.tgt_tokenizer)
    gen = merge_generation(loaded.cfg.generation, cfg.generation)
    src_tok, tgt_tok = loaded.tokenizers
    with_scores = bool(cfg.scores) or gen.nbest > 1
    out: IO[str] = open(cfg.output, "w", encoding="utf-8") if cfg.output else sys.stdout
    n = 0
    failed = 0
    start = time.time()
    bar = None
    if cfg.progress:
        from tqdm import tqdm

        bar = tqdm(desc="translate", unit="line", file=sys.stderr, dynamic_ncols=True, mininterval=1.0)
    try:
        with _open_input(str(cfg.input)) as stream:
            for lines in _chunks(stream, max(1, int(cfg.buffer_lines))):
                todo = [i for i, line in enumerate(lines) if line.strip()]
                errors: dict[int, str] = {}
                hyps = translate_sentences(
                    loaded.model, src_tok.encode_batch([lines[i] for i in todo]), gen, device, loaded.model.arch,
                    errors=errors, progress=False if bar is None else bar,
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
    members = getattr(loaded.model, "checkpoints", None)
    source = f"ensemble of {', '.join(map(str, members))}" if members else loaded.checkpoint
    print(f"translated {n - failed} of {n} lines in {time.time() - start:.1f}s ({source}, {what})",
          file=sys.stderr)
    if failed:
        raise LinesFailed(f"{failed} of {n} lines could not be translated (reported above; their output lines are empty)")
    return n


@hydra.main(version_base="1.3", config_path=str(ROOT / "configs"), config_name="translate")
def main(cfg: DictConfig) -> None:
    """Entry point: clear one-line errors (exit status 2) instead of tracebacks for user mistakes."""
    from transformer.config import ConfigError
    from transformer.generation import LoadError

    try:
        run(cfg)
    except (LoadError, ConfigError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except LinesFailed as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)
    except BrokenPipeError:  # e.g. piped into head
        sys.exit(0)


if __name__ == "__main__":
    main()
