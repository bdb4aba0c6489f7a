"""The reading tour of ``docs/contributing.md`` ("A reading tour") is held to the code: every file it
cites exists, every function, class or ``Class.method`` it names on a file's line is defined in
that file, and the number of files each path states ("Thirteen files: ...") is the number it cites."""

import ast
import re
from pathlib import Path

from tests.conftest import REPO_ROOT

STEP = re.compile(r"\d+\. `(?P<path>[\w/]+\.py)` (?P<names>(?:`[\w.]+`(?:, )?)+):")
"""A tour line: ``1. `path/to/file.py` `Class.method`, `function`: what to read there``."""

TOURS = ("One encoder-decoder forward pass", "One training update", "One beam-search step")

NUMBERS = {
    word: n
    for n, word in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
        "seventeen eighteen nineteen twenty".split()
    )
}
FILE_COUNT = re.compile(r"\b(\d+|" + "|".join(NUMBERS) + r") files\b", re.IGNORECASE)
"""A count of files in a tour's prose: ``Thirteen files``, ``13 files``."""


def _sections() -> dict[str, str]:
    """Each tour's text under its heading: ``{title: body}``."""
    text = (REPO_ROOT / "docs" / "contributing.md").read_text(encoding="utf-8")
    section = text.split("\n## A reading tour\n", 1)[1].split("\n## ", 1)[0]
    return {title.strip(): body for title, body in (part.split("\n", 1) for part in section.split("\n### ")[1:])}


def _file_counts(body: str) -> list[int]:
    """The counts of files a tour's prose states, outside its numbered steps."""
    prose = "\n".join(line for line in body.splitlines() if not re.match(r"\d+\. ", line))
    return [int(m) if m.isdigit() else NUMBERS[m.lower()] for m in FILE_COUNT.findall(prose)]


def _tour() -> dict[str, list[tuple[str, list[str]]]]:
    """Each tour's steps, in order: ``{title: [(file, [names])]}``."""
    tours: dict[str, list[tuple[str, list[str]]]] = {}
    for title, body in _sections().items():
        steps = [m for line in body.splitlines() if re.match(r"\d+\. ", line) for m in [STEP.match(line)]]
        assert all(steps), f"a step of {title!r} is not '1. `file.py` `Name`, `Class.method`: ...'"
        tours[title] = [(m["path"], re.findall(r"`([\w.]+)`", m["names"])) for m in steps]
    return tours


def _definitions(path: Path) -> set[str]:
    """``name`` for each top-level function and class of a file, ``Class.name`` for their methods."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names |= {
                f"{node.name}.{item.name}"
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
            }
    return names


def test_the_tour_has_its_three_paths():
    tours = _tour()
    assert list(tours) == list(TOURS)
    assert all(len(steps) >= 5 for steps in tours.values()), {t: len(s) for t, s in tours.items()}


def test_every_file_and_name_the_tour_cites_exists():
    missing = []
    for title, steps in _tour().items():
        for path, names in steps:
            file = REPO_ROOT / path
            if not file.is_file():
                missing.append(f"{title}: {path}")
                continue
            defined = _definitions(file)
            missing += [f"{title}: {path} {name}" for name in names if name not in defined]
    assert missing == [], "the tour cites what the code lacks: " + ", ".join(missing)


def test_each_path_states_the_number_of_files_it_cites():
    tours = _tour()
    stated = {title: _file_counts(body) for title, body in _sections().items()}
    cited = {title: len({path for path, _ in steps}) for title, steps in tours.items()}
    assert all(stated[title] for title in tours), f"a path states no count of its files: {stated}"
    wrong = {title: (counts, cited[title]) for title, counts in stated.items() if set(counts) != {cited[title]}}
    assert wrong == {}, "counts stated (left) against the distinct files cited (right): " + repr(wrong)


def test_the_counter_reads_words_and_digits():
    assert _file_counts("1. `a.py` `f`: three files\nEleven files: each.\nIn 13 files, twelve filesystems") == [11, 13]


def test_the_checker_sees_a_missing_name(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("class A:\n    def f(self): ...\n\ndef g(): ...\n")
    assert {"A", "A.f", "g"} <= _definitions(module)
    assert "A.h" not in _definitions(module)
