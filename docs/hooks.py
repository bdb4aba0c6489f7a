"""MkDocs hook (mkdocs.yml ``hooks:``): the package's docstrings are written with Sphinx roles
(``:func:`x```, ``:class:`~a.B```); mkdocstrings renders them as the role's name followed by a code
span. This hook drops the role name (and, as Sphinx does, shows only the last part of a ``~`` name),
so the API reference reads ``x`` and ``B``."""

from __future__ import annotations

import re

_ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|obj|exc|const):<code>(~?)([^<]*)</code>")


def _code(match: re.Match) -> str:
    tilde, name = match.groups()
    if tilde:
        name = name.rsplit(".", 1)[-1]
    return f"<code>{name}</code>"


def on_page_content(html: str, **kwargs) -> str:
    return _ROLE.sub(_code, html)
