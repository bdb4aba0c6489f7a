"""The README and the documentation pages are held to the code.

The text lives in README.md and the pages of the documentation site, ``docs/*.md`` (:data:`PAGES`);
every check reads all of them, so a table or a command line is checked wherever it lives:

* every ``python scripts/<name>.py ...`` command line in a bash block of the pages, and of the
  results' and benchmarks' READMEs under ``docs/`` (``torchrun ... scripts/train.py`` and
  environment prefixes included) composes: the Hydra scripts' overrides compose into their config
  (a sweep's first job; ``train.py``'s config is validated too), the argparse scripts' arguments
  parse (``<date>``-style placeholders stand for what the user fills in; redirections are dropped);
* every field of the schema (``transformer.config.Config``) is named in a table of the pages;
* each ``key=value`` in the first column of a switch table is the default, or the row says
  ``e.g.``;
* every measured number the pages state points at a committed file that holds it: a file under
  ``docs/`` that is not itself one of the pages (a result or a benchmark), linked from the paragraph
  (a relative Markdown link, resolved from the page's folder, or a ```docs/...``` path).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import sys
import typing
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from tests.conftest import REPO_ROOT
from tests.generation.helpers import load_script
from transformer.config import Config, register_configs, validate_config
from transformer.plugins import command_line_plugins

PAGES: list[Path] = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
"""The README and the pages of the documentation site (``mkdocs.yml``'s ``docs_dir``)."""
COMMAND_PAGES: list[Path] = PAGES + sorted(
    p for p in (REPO_ROOT / "docs").rglob("*.md") if p.parent != REPO_ROOT / "docs" and "runs" not in p.parts
)
"""Pages whose command lines are checked: :data:`PAGES` and the READMEs of the results and benchmarks."""
DOCS = REPO_ROOT / "docs"


def _rel(page: Path) -> str:
    return str(page.relative_to(REPO_ROOT))


def _text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


HYDRA_SCRIPTS = {
    "train": "train",
    "translate": "translate",
    "evaluate": "evaluate",
    "export": "export",
    "preprocess": "preprocess",
}
ARGPARSE_SCRIPTS = ("compare", "average_checkpoints")


# ----------------------------------------------------------------------------- command lines


def _code_lines(text: str) -> list[str]:
    """Lines of a page's bash blocks, continuation lines joined."""
    lines, block = [], None
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("```"):
            block = None if block is not None else stripped[3:]
            continue
        if block not in (None, "") and block != "bash":
            continue
        if block is None:
            continue
        if lines and lines[-1].endswith("\\"):
            lines[-1] = lines[-1][:-1] + " " + stripped
        else:
            lines.append(stripped)
    return lines


def script_commands(text: str) -> list[tuple[str, list[str], str]]:
    """``(script name, its arguments, the line)`` for every scripts/*.py command of a page's text."""
    found, variables = [], {}
    for line in _code_lines(text):
        assignment = re.fullmatch(r"([A-Z_]+)=(\"[^\"]*\"|'[^']*'|\S*)\s*(#.*)?", line)
        if assignment:  # NAME="..." on its own line: later lines of the page use $NAME
            variables[assignment.group(1)] = shlex.split(assignment.group(2))[0] if assignment.group(2) else ""
            continue
        line = re.sub(r"\$\{?([A-Z_]+)\}?", lambda m: variables.get(m.group(1), m.group(0)), line)
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        # one command per segment of && ; |
        segment: list[str] = []
        skip = False
        for word in [*words, ";"]:
            if skip:  # the file of a redirection
                skip = False
                continue
            if re.fullmatch(r"\d?>>?|<|\d?>&\d", word):
                skip = not word.endswith(("&1", "&2"))
                continue
            word = re.sub(r"<[^<>\s]+>", "PLACEHOLDER", word)  # <date>, <hash>: what the user fills in
            if word in ("&&", ";", "|", "||", "&"):
                for i, w in enumerate(segment):
                    m = re.fullmatch(r"(?:\./)?scripts/(\w+)\.py", w)
                    if m and m.group(1) in (*HYDRA_SCRIPTS, *ARGPARSE_SCRIPTS):
                        found.append((m.group(1), segment[i + 1 :], line))
                        break
                segment = []
            else:
                segment.append(word)
    return found


def _first_job(overrides: list[str]) -> list[str]:
    """The first job of a Hydra sweep's overrides (``seed=1,2`` -> ``seed=1``; no sweep: as is)."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    if not any(o.is_sweep_override() for o in parsed):
        return overrides
    sweeps = [o for o in parsed if o.is_sweep_override()]
    if any(o.value_type is not None and "GLOB" in str(o.value_type) for o in sweeps) or any(
        "interval" in o.input_line or "tag(" in o.input_line for o in sweeps
    ):
        return [o.input_line for o in parsed if not o.is_sweep_override()]
    return list(BasicSweeper.split_arguments(parsed, None)[0][0])


def _compose_script(name: str, args: list[str]):
    overrides = [a for a in args if not a.startswith("-")]
    overrides = [a for a in overrides if a not in ("job", "hydra", "all")]  # --cfg job
    load_script(name)  # registers its structured configs (preprocess.py: base_preprocess)
    overrides = command_line_plugins(overrides)  # plugins=[...]: imported, their configs/ on the search path
    register_configs()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base="1.3"):
        return compose(config_name=HYDRA_SCRIPTS[name], overrides=_first_job(overrides), return_hydra_config=True)


COMMANDS = [
    (_rel(page), name, args, line) for page in COMMAND_PAGES for name, args, line in script_commands(_text(page))
]


def test_the_pages_have_commands_for_every_script():
    names = {name for _, name, _, _ in COMMANDS}
    assert names >= set(HYDRA_SCRIPTS) | set(ARGPARSE_SCRIPTS), names
    assert len(COMMANDS) > 40
    assert {page for page, _, _, _ in COMMANDS} > {"README.md"}  # the pages are read, not only the README


def test_the_readme_has_a_command_to_train_translate_evaluate_run_the_ladder_and_compare():
    readme = [(name, args) for page, name, args, _ in COMMANDS if page == "README.md"]
    assert {name for name, _ in readme} >= {"train", "translate", "evaluate", "compare"}, readme
    assert any(name == "train" and "experiment=ladder" in args for name, args in readme), readme


@pytest.mark.parametrize(
    ("page", "name", "args", "line"), COMMANDS, ids=[f"{p}:{n}:{i}" for i, (p, n, _, _) in enumerate(COMMANDS)]
)
def test_every_command_composes(page, name, args, line):
    if name in ARGPARSE_SCRIPTS:
        parser = load_script(name).build_parser()
        try:
            parser.parse_args(args)
        except SystemExit as err:
            raise AssertionError(f"{page} line does not parse: {line}") from err
        return
    cfg = _compose_script(name, args)
    if name == "train":
        cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]) if "hydra" in cfg else cfg
        validate_config(cfg)


def benchmark_commands(text: str) -> list[tuple[str, list[str], str]]:
    """``(module, its arguments, the line)`` for every ``python -m benchmarks.NAME ...`` of a page's bash
    blocks and inline code, up to a comment, ``&&``, ``;``, ``|`` or a redirection."""
    lines = _code_lines(text) + re.findall(r"`([^`\n]*python -m benchmarks\.[^`\n]*)`", text)
    found = []
    for line in lines:
        for m in re.finditer(r"python -m benchmarks\.([a-z_][a-z_.]*)(.*)", line):
            rest = re.split(r"\s(?:#|&&|;|\||\d?>)", " " + m.group(2))[0]
            try:
                words = shlex.split(rest)
            except ValueError:
                continue
            found.append((m.group(1), [re.sub(r"<[^<>\s]+>", "PLACEHOLDER", w) for w in words], line))
    return found


BENCHMARK_COMMANDS = [
    (_rel(page), name, args, line) for page in COMMAND_PAGES for name, args, line in benchmark_commands(_text(page))
]


class _Parsed(Exception):
    """Raised in place of running a benchmark once its command line has parsed."""


def test_the_pages_run_benchmarks_as_modules_of_the_package():
    assert len(BENCHMARK_COMMANDS) > 20
    by_path = [
        f"{_rel(page)}: {line}"
        for page in COMMAND_PAGES
        for line in _code_lines(_text(page)) + re.findall(r"`([^`\n]+)`", _text(page))
        if re.search(r"python3? (?:-u )?benchmarks/", line)
    ]
    assert not by_path, "run a benchmark as python -m benchmarks.NAME:\n" + "\n".join(by_path)
    runnable = {
        path.stem if path.name != "__main__.py" else path.parent.name
        for path in (REPO_ROOT / "benchmarks").rglob("*.py")
        if 'if __name__ == "__main__":' in path.read_text(encoding="utf-8")
    }
    assert runnable - {name for _, name, _, _ in BENCHMARK_COMMANDS} == set(), (
        "benchmarks without a command in the pages"
    )


@pytest.mark.parametrize(
    ("page", "name", "args", "line"),
    BENCHMARK_COMMANDS,
    ids=[f"{p}:{n}:{i}" for i, (p, n, _, _) in enumerate(BENCHMARK_COMMANDS)],
)
def test_every_benchmark_command_parses(page, name, args, line, monkeypatch):
    """The module exists and its own argument parser takes the page's arguments (the benchmark does not run)."""
    import argparse
    import runpy

    real_parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(parser, argv=None, namespace=None):
        real_parse(parser, argv, namespace)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.setattr(sys, "argv", [f"benchmarks.{name}", *args])
    monkeypatch.delitem(sys.modules, f"benchmarks.{name}", raising=False)  # run as __main__, not as imported
    with pytest.raises(_Parsed):
        try:
            runpy.run_module(f"benchmarks.{name}", run_name="__main__", alter_sys=False)
        except SystemExit as err:
            raise AssertionError(f"{page}: the arguments of this command do not parse: {line}") from err


# ----------------------------------------------------------------------------- fields in tables


def schema_fields(cls: type = Config, prefix: str = "") -> list[str]:
    """Every dotted leaf field of the schema (``model.norm.eps``, ``train.max_tokens``, ...)."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            out += schema_fields(kind, f"{prefix}{f.name}.")
        else:
            out.append(f"{prefix}{f.name}")
    return out


def _table_rows() -> list[str]:
    return [
        line
        for page in PAGES
        for line in _text(page).splitlines()
        if line.startswith("|") and not set(line) <= set("|-: ")
    ]


def _documented(field: str, rows: list[str]) -> bool:
    """The field's dotted name is in a table row; a group's ``name`` counts as the group switch
    (``optim=adam`` for ``optim.name``, ``model/norm=`` for ``model.norm.name``); a name listed after
    its group prefix in the same cell counts too (``model.d_model``, ``n_heads``)."""
    parent, _, leaf = field.rpartition(".")
    for row in rows:
        cells = row.split("|")
        for cell in cells:
            names = re.findall(r"`([^`]+)`", cell)
            text = " ".join(names)
            if re.search(rf"(?<![\w.]){re.escape(field)}(?![\w])", text):
                return True
            if leaf == "name" and re.search(rf"(?<![\w.]){re.escape(parent.replace('.', '/'))}=", text):
                return True
            if (
                parent
                and any(n.startswith(f"{parent}.") for n in names)
                and any(re.fullmatch(rf"{re.escape(leaf)}(=.*)?", n) for n in names)
            ):
                return True
    return False


def test_every_schema_field_is_in_a_table():
    rows = _table_rows()
    missing = [f for f in schema_fields() if not _documented(f, rows)]
    assert missing == [], "fields no table of README.md or docs/*.md names: " + ", ".join(missing)


# ----------------------------------------------------------------------------- first-column defaults


def _switch_tables() -> list[list[str]]:
    """Rows of the tables whose header's first cell is ``switch``, on every page."""
    tables, current = [], None
    for line in (line for page in PAGES for line in [*_text(page).splitlines(), ""]):
        if line.startswith("| switch |"):
            current = []
            tables.append(current)
        elif line.startswith("|") and current is not None:
            if not set(line) <= set("|-: "):
                current.append(line)
        else:
            current = None
    return tables


def _defaults() -> tuple[dict, dict]:
    """``(flat default values, default group choices)`` of the bare ``scripts/train.py``."""
    register_configs()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base="1.3"):
        cfg = compose(config_name="train", return_hydra_config=True)
    choices = {k: str(v) for k, v in cfg.hydra.runtime.choices.items() if v is not None}
    plain = OmegaConf.to_container(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]), resolve=True)

    def flat(tree, p=""):
        if isinstance(tree, dict):
            o = {}
            for k, v in tree.items():
                o.update(flat(v, f"{p}{k}."))
            return o
        return {p[:-1]: tree}

    return flat(plain), choices


def _same(value: str, default) -> bool:
    """Whether ``value`` (as Hydra parses a command-line value) is ``default``."""
    try:
        parsed = OverridesParser.create().parse_override(f"k={value}").value()
    except Exception:
        return False
    if isinstance(parsed, list) or isinstance(default, list):
        return list(parsed) == list(default) if isinstance(parsed, list) and isinstance(default, list) else False
    if isinstance(default, dict):
        return parsed == default or (parsed == {} and default == {})
    return (
        parsed == default
        and type(parsed) is type(default)
        or (
            isinstance(parsed, (int, float))
            and not isinstance(parsed, bool)
            and isinstance(default, float)
            and parsed == default
        )
    )


def test_first_column_values_are_defaults_or_marked_as_examples():
    values, choices = _defaults()
    problems = []
    for table in _switch_tables():
        for row in table:
            first = row.split("|")[1]
            if "e.g." in first:
                continue
            for item in re.findall(r"`([^`]+)`", first):
                for pair in item.split():
                    key, eq, value = pair.partition("=")
                    if not eq or value.startswith(("[", "<")) and value.endswith(("]", ">")) and "," not in value:
                        continue
                    key = key.lstrip("+~")
                    if key in choices:
                        ok = choices[key] == value
                    elif key in values:
                        ok = _same(value, values[key])
                    else:
                        continue  # not a field of the bare config (e.g. a preset's own group)
                    if not ok:
                        problems.append(f"{pair} (default {choices.get(key, values.get(key))!r}) in: {first.strip()}")
    assert problems == [], "first-column values that are neither the default nor marked 'e.g.':\n" + "\n".join(problems)


# ----------------------------------------------------------------------------- measured numbers


_MEASURE = re.compile(r"\b(BLEU|chrF|tok/s|tokens/s|measured|GFLOP/s|MFU|faster|slower|peak|RSS)\b", re.I)
_NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+\.\d+)(?:x|%)?(?![\w.])")
_LINK = re.compile(r"\]\(([^)\s]+)\)|`(docs/[^`\s]+)`")


def _paragraphs(text: str) -> list[str]:
    """Prose paragraphs and table rows outside code blocks."""
    out, current, in_code = [], [], False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        if line.startswith("|"):
            out.append(line)
        elif line.strip():
            current.append(line)
            continue
        if current:
            out.append(" ".join(current))
            current = []
    if current:
        out.append(" ".join(current))
    return out


def _sources(page: Path, para: str) -> list[Path]:
    """The files under ``docs/`` that a paragraph links (Markdown links from the page's folder,
    ```docs/...``` paths from the repository root), the pages themselves left out (prose is no
    source of a measurement)."""
    found = []
    for link, code in _LINK.findall(para):
        if link:
            target = link.split("#")[0]
            if not target or re.match(r"[a-z]+:", target):
                continue
            path = (page.parent / target).resolve()
        else:
            path = (REPO_ROOT / code.split("#")[0]).resolve()
        if path.is_relative_to(DOCS.resolve()) and path not in {p.resolve() for p in PAGES}:
            found.append(path)
    return found


def _files_text(paths: list[Path]) -> str:
    text = []
    for path in paths:
        files = sorted(path.rglob("*")) if path.is_dir() else [path]
        for f in files:
            if f.is_file() and f.suffix in (".md", ".json", ".jsonl", ".csv", ".txt", ".yaml"):
                text.append(f.read_text(encoding="utf-8", errors="replace"))
    return "\n".join(text)


def measured_numbers_without_a_source() -> list[str]:
    """One line per paragraph of the pages that states a measured number which no committed file
    it links (a result or a benchmark under ``docs/``) holds."""
    problems = []
    for page in PAGES:
        for para in _paragraphs(_text(page)):
            if not _MEASURE.search(para):
                continue
            numbers = [n.replace(",", "") for n in _NUMBER.findall(para)]
            if not numbers:
                continue
            where = f"{_rel(page)}: {para[:120]}"
            links = _sources(page, para)
            if not links:
                problems.append(f"no docs/ file for {', '.join(numbers[:5])}: {where}")
                continue
            names = ", ".join(str(p.relative_to(REPO_ROOT.resolve())) for p in links)
            for p in links:
                if not p.exists():
                    problems.append(f"{p.relative_to(REPO_ROOT.resolve())} does not exist: {where}")
            source = _files_text(links).replace(",", "")
            missing = [n for n in numbers if not re.search(rf"(?<![\d.]){re.escape(n)}", source)]
            if missing:
                problems.append(f"{', '.join(missing[:5])} not in {names}: {where}")
    return problems


def test_every_measured_number_points_at_a_committed_file():
    problems = measured_numbers_without_a_source()
    assert problems == [], "\n".join(problems)
