"""Native media vectors (gemini-embedding-2): which files go as bytes, and sending them."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from memory_pipeline.errors import ExtractionError
from memory_pipeline.models import Segment
from memory_pipeline.providers.base import EmbeddingProvider
from memory_pipeline.safeio import open_file
from memory_pipeline.settings import Settings

log = logging.getLogger("memory_pipeline")

# What gemini-embedding-2 takes natively (its model card: PNG/JPEG images, PDFs of up to 6
# pages, MP3/WAV audio and MPEG/MP4/MOV video of up to 80 s with sound, 8,192 input tokens).
# Other media (GIF, WebP, FLAC, ...) and all documents are embedded from their derived text.
NATIVE_MIME_TYPES = frozenset(
    {
        "image/png", "image/jpeg",
        "application/pdf",
        "audio/mpeg", "audio/wav",
        "video/mp4", "video/mpeg", "video/quicktime",
    }
)  # fmt: skip
NATIVE_MODALITIES = ("image", "audio", "video", "pdf")
NATIVE_MAX_REQUEST_BYTES = 20 * 1024 * 1024  # inline data travels base64-encoded: 4 bytes per 3
NATIVE_SLICE_BYTES = 16 * 1024 * 1024  # raw bytes held in memory per native request
NATIVE_MAX_PDF_PAGES = 6
NATIVE_MAX_SECONDS = 80
NATIVE_MAX_TEXT_TOKENS = 8192

_PAGES = re.compile(r", (\d+) pages?\.")  # extraction/pdf.py's description: "PDF document NAME, N pages."
_DURATION = re.compile(r", (\d+(?::\d\d){1,2}) long\)")  # extraction/audio.py's: "(MIME, M:SS long)"


def native_media_enabled(settings: Settings, provider: EmbeddingProvider | None) -> bool:
    mm = settings.multimodal
    return bool(mm.enabled and mm.native and provider is not None and provider.supports_multimodal and hasattr(provider, "embed_media"))


def native_problem(mime: str, size: int, segments: Sequence[Segment]) -> str:
    """Why a media file cannot be embedded natively ('' when it can): its type, size, pages or length."""
    if mime not in NATIVE_MIME_TYPES:
        return f"{mime} is not a type the model takes natively"
    if (size + 2) // 3 * 4 > NATIVE_MAX_REQUEST_BYTES:
        return f"{size} bytes, over the model's {NATIVE_MAX_REQUEST_BYTES // 2**20} MiB inline request limit"
    about = " ".join(s.text for s in segments if s.kind == "media")
    if mime == "application/pdf" and (m := _PAGES.findall(about)) and int(m[-1]) > NATIVE_MAX_PDF_PAGES:
        return f"{m[-1]} pages, over the model's native limit of {NATIVE_MAX_PDF_PAGES}"
    if (m := _DURATION.findall(about)) and _seconds(m[-1]) > NATIVE_MAX_SECONDS:
        return f"{m[-1]} long, over the model's native limit of {NATIVE_MAX_SECONDS} s"
    return ""


def native_media_ok(mime: str, size: int, segments: Sequence[Segment] = ()) -> bool:
    """Sent natively only in a type the model takes and within its limits."""
    return not native_problem(mime, size, segments)


def _seconds(clock: str) -> int:
    total = 0
    for part in clock.split(":"):
        total = total * 60 + int(part)
    return total


def media_label(path: str, segments: Sequence[Segment], count_tokens=None, limit: int = NATIVE_MAX_TEXT_TOKENS) -> str:
    """The text part sent with the media bytes, kept under the model's input limit.

    In order of what it says about the file: its name, the user's note, what the file is
    (type, size, pages, duration), then its derived text (OCR lines, transcript, page
    text) while it fits. Counted with the model's tokenizer when given, else at a
    conservative 2 characters per token; what does not fit is cut at a word.
    """
    count = count_tokens or (lambda texts: [len(t) // 2 + 1 for t in texts])
    parts = [os.path.basename(path)]
    parts += [s.text for s in segments if s.kind == "note"]
    parts += [s.text for s in segments if s.kind == "media"]
    parts += [s.text for s in segments if s.kind not in ("note", "media")]
    kept: list[str] = []
    used = 0
    budget = limit - 16  # the request's own framing
    for part in (p.strip() for p in parts):
        if not part:
            continue
        n = count([part])[0] + 1
        if used + n <= budget:
            kept.append(part)
            used += n
            continue
        # The first part that does not fit is cut to what is left (a long note keeps its start).
        room = budget - used
        if room > 8:
            lo, hi = 0, len(part)
            while lo < hi:  # the longest prefix that fits
                mid = (lo + hi + 1) // 2
                if count([part[:mid]])[0] + 1 <= room:
                    lo = mid
                else:
                    hi = mid - 1
            cut = part[:lo].rsplit(" ", 1)[0] if " " in part[:lo] else part[:lo]
            if cut:
                kept.append(cut)
        break
    return "\n".join(kept)


def embed_media(provider, items: dict[str, tuple[str, str, str, Path | None]]) -> dict[str, np.ndarray]:
    """Native vectors by content hash for (abs_path, mime, label, source root) items.

    Bytes are read one request's worth at a time through one contained open: a file that
    became a link out of its folder (or vanished) since discovery gets no vector, so its
    file keeps its current rows and is tried again by the next run.
    """
    from memory_pipeline.providers.gemini import MediaItem

    vectors: dict[str, np.ndarray] = {}
    batch: list = []
    keys: list[str] = []
    size = 0

    def flush() -> None:
        for k, v in zip(keys, provider.embed_media(batch)):
            vectors[k] = v

    for h, (abs_path, mime, label, root) in items.items():
        try:
            with open_file(abs_path, root) as fh:
                data = fh.pread(fh.size)
        except (OSError, ExtractionError) as err:
            log.warning("%s: not embedded natively: %s", abs_path, getattr(err, "reason", None) or err)
            continue
        if batch and size + len(data) > NATIVE_SLICE_BYTES:
            flush()
            batch, keys, size = [], [], 0
        batch.append(MediaItem(label=label, data=data, mime_type=mime))
        keys.append(h)
        size += len(data)
    if batch:
        flush()
    return vectors


__all__ = ["NATIVE_MIME_TYPES", "embed_media", "media_label", "native_media_enabled", "native_media_ok", "native_problem"]
