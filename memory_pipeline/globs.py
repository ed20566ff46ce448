"""Path globs as regular expressions: one translator for the sources' include/exclude globs
(matched in Python) and ``--path GLOB`` (matched by LanceDB's SQL ``regexp_like``, Rust syntax).

Glob syntax, on POSIX relative paths: ``**/`` is zero or more whole folders, ``**`` elsewhere
any run of characters (``/`` included), ``*`` any run within one folder, ``?`` one character
other than ``/``; everything else is literal. Matching is case-sensitive and whole-path.

The translated body is written in the common subset of Python ``re`` and Rust ``regex``
(literals escaped from one fixed set of metacharacters, both dialects accept those escapes),
so the two engines select the same paths; only the anchors differ (``\\Z`` in Python,
``$`` in Rust, where it means the very end of the text).
"""

from __future__ import annotations

import re
from functools import lru_cache

# Escaping these is valid, and enough, in both Python re and Rust regex.
_META = frozenset("\\.+*?()|[]{}^$#&-~")


def glob_regex(pattern: str) -> str:
    """The unanchored regex body of a path glob, valid in Python ``re`` and Rust ``regex`` alike."""
    out = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            ch = pattern[i]
            out.append("\\" + ch if ch in _META else ch)
            i += 1
    return "".join(out)


def glob_to_rust_regex(pattern: str) -> str:
    """A path glob as an anchored regex for LanceDB's SQL ``regexp_like`` (Rust syntax). ``(?s)``:
    ``**`` spans a newline in a folder or file name too, as in :func:`compile_glob`."""
    return "(?s)^" + glob_regex(pattern) + "$"


@lru_cache(maxsize=256)
def compile_glob(pattern: str) -> re.Pattern[str]:
    """A path glob compiled for Python; use ``.match`` (the end is anchored by ``\\Z``).
    ``re.DOTALL``: ``**`` spans a newline in a name (the files of a folder named with one were
    neither indexed nor reported)."""
    return re.compile(glob_regex(pattern) + r"\Z", re.DOTALL)


def glob_match(rel_path: str, pattern: str) -> bool:
    """Whether a POSIX relative path matches a glob where ``**`` spans folders."""
    return compile_glob(pattern).match(rel_path) is not None
