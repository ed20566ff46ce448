"""The ``retrievalMode`` contract for a query by a file (an image, a recording).

* ``auto`` (default): the file's derived text (OCR, photo details, transcript); its own bytes
  embedded natively as well when this index has native media vectors.
* ``text``: the derived text only.
* ``native``: the native vector only; an error when the index has no native media vectors.
* ``hybrid``: both, fused (the native vector drives the vector leg, the derived text the
  full-text leg); an error when the index has no native media vectors.

Used by `memory search --retrieval-mode` and the query-by-file routes alike.
"""

from __future__ import annotations

from memory_pipeline.errors import ConfigError

RETRIEVAL_MODES = ("auto", "text", "native", "hybrid")


def plan(mode: str, native: bool, *, field: str = "retrievalMode") -> tuple[bool, bool]:
    """``(use derived text, use the native vector)`` for ``mode`` on an index with/without native vectors."""
    if mode not in RETRIEVAL_MODES:
        raise ConfigError(f"{field} must be one of {', '.join(RETRIEVAL_MODES)}, got {mode!r}", key=field)
    if mode in ("native", "hybrid") and not native:
        raise ConfigError(
            f"{field} {mode} needs native media vectors, and this index has none",
            key=field,
            hint="use auto or text; native vectors need provider gemini, model gemini-embedding-2-preview and multimodal.native: true",
        )
    if mode == "text":
        return True, False
    if mode == "native":
        return False, True
    return True, native  # auto: text, plus native when there; hybrid: both (native checked above)
