"""Text from files (names, reasons) printed as data, never as terminal control."""

from __future__ import annotations


def shown(text: object) -> str:
    """``text`` safe to print on a terminal: control characters (a newline or an escape
    sequence in a file name) are written as visible escapes instead of acting."""
    value = str(text)
    if value.isprintable():
        return value
    return "".join(ch if ch.isprintable() or ch == " " else ascii(ch)[1:-1] for ch in value)
