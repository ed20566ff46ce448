"""Markdown and plain text: the whole file as one segment (secrets redacted); the chunker keeps line numbers."""

from __future__ import annotations

from memory_pipeline.errors import ExtractionError
from memory_pipeline.extraction.redact import redact
from memory_pipeline.models import Segment


def decode_utf8(data: bytes, path: str) -> str:
    """Strict UTF-8 (a BOM is dropped); a clear reason naming the first bad byte otherwise."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        bad = data[err.start : err.start + 1].hex()
        raise ExtractionError(
            path, f"not valid UTF-8 (byte 0x{bad} at offset {err.start}); convert the file to UTF-8"
        ) from err
    return text.removeprefix("\ufeff")


def extract_text_file(abs_path: str) -> list[Segment]:
    with open(abs_path, "rb") as fh:
        data = fh.read()
    text = decode_utf8(data, abs_path).replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        return []
    # Notes get pasted keys too; nothing secret reaches the table or an embedding API.
    text, _ = redact(text)
    n_lines = text.count("\n") + (0 if text.endswith("\n") else 1)
    return [Segment(text=text, line_start=1, line_end=max(n_lines, 1))]
