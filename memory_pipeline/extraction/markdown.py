"""Markdown and plain text: the whole file as one segment; the chunker keeps line numbers.

Runs in the calling process (linear code of our own) and is bounded by the output
caps: at most ``max_chars`` characters are decoded (UTF-8 takes at most four bytes
a character, so at most four times that many bytes are read).

NUL bytes: a file is sniffed as text from its first 8 KB, so NULs further on still
arrive here. A few stray NULs (and other control characters) are removed, keeping
every line where it was, and the warning counts them; a file where NULs make more
than 1% of the text is binary data behind a text header and fails with that reason.
"""

from __future__ import annotations

import codecs
import os

from memory_pipeline.errors import ExtractionError
from memory_pipeline.extraction.media import MediaOptions, Segments
from memory_pipeline.extraction.output import clean_text
from memory_pipeline.models import Segment
from memory_pipeline.safeio import OpenedFile

_BINARY_NUL_SHARE = 0.01
_BINARY_NUL_MIN = 16


def decode_utf8(data: bytes, path: str, *, final: bool = True) -> str:
    """Strict UTF-8 (a BOM is dropped); a clear reason naming the first bad byte otherwise.

    ``final=False``: the bytes were cut at a limit, so a character split by the cut is dropped.
    """
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(data, final=final)
    except UnicodeDecodeError as err:
        bad = data[err.start : err.start + 1].hex()
        raise ExtractionError(path, f"not valid UTF-8 (byte 0x{bad} at offset {err.start}); convert the file to UTF-8") from err
    return text.removeprefix("\ufeff")


def read_text(src: OpenedFile, options: MediaOptions) -> tuple[str, bool]:
    """The file decoded, at most ``max_chars`` characters' worth of bytes; True when it was cut."""
    limit = max(options.max_chars, 1) * 4
    data = src.pread(limit + 1)
    cut = len(data) > limit
    return decode_utf8(data[:limit], src.path, final=not cut), cut


def text_segments(src: OpenedFile, options: MediaOptions) -> Segments:
    """One segment for the whole (capped) file, control characters removed."""
    text, cut = read_text(src, options)
    nuls = text.count("\x00")
    if nuls > max(_BINARY_NUL_MIN, len(text) * _BINARY_NUL_SHARE):
        raise ExtractionError(src.path, f"binary data: {nuls} NUL bytes among {len(text)} characters (past the first 8 KB that looked like text)")
    text, removed = clean_text(text)
    out = Segments()
    if removed:
        out.warn(f"removed {removed} control character(s) (NUL and the like), which are not text")
    if cut:
        out.warn(f"indexed the first {options.max_chars * 4} bytes of {src.size} (max_chars={options.max_chars})")
    if not text.strip():
        return out
    n_lines = text.count("\n") + (0 if text.endswith("\n") else 1)
    out.append(Segment(text=text, line_start=1, line_end=max(n_lines, 1)))
    return out


def extract_text_file(abs_path: str, root: str | os.PathLike[str] | None = None) -> list[Segment]:
    """A text file's segments, through ``extract`` (opened contained, cleaned, redacted, capped)."""
    from memory_pipeline.extraction import extract

    return extract(abs_path, "text", root=root)
