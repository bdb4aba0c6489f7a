"""The data package's error type (a module of its own, so that every data module can import it)."""

from __future__ import annotations


class DataError(ValueError):
    """Unusable input data: the message names the file(s), and the line or the counts involved."""


__all__ = ["DataError"]
