"""Native media vectors (gemini-embedding-2): which files go as bytes, and sending them."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from memory_pipeline.errors import ExtractionError
from memory_pipeline.models import Segment
from memory_pipeline.providers.base import EmbeddingProvider
from memory_pipeline.safeio import open_file
from memory_pipeline.settings import Settings

log = logging.getLogger("memory_pipeline")

# What gemini-embedding-2 takes as inline data; other media (and all documents) are embedded from text.
NATIVE_MIME_TYPES = frozenset(
    {
        "image/png", "image/jpeg", "image/webp", "image/heic", "image/heif",
        "audio/mpeg", "audio/wav", "audio/ogg", "audio/opus", "audio/flac", "audio/aac", "audio/mp4",
        "video/mp4", "video/quicktime", "video/webm", "application/pdf",
    }
)  # fmt: skip
NATIVE_MAX_REQUEST_BYTES = 20 * 1024 * 1024  # inline data travels base64-encoded: 4 bytes per 3
NATIVE_SLICE_BYTES = 16 * 1024 * 1024  # raw bytes held in memory per native request


def native_media_enabled(settings: Settings, provider: EmbeddingProvider | None) -> bool:
    mm = settings.multimodal
    return bool(mm.enabled and mm.native and provider is not None and provider.supports_multimodal and hasattr(provider, "embed_media"))


def native_media_ok(mime: str, size: int) -> bool:
    """Sent natively only in a type the model takes and when its base64 fits one request."""
    return mime in NATIVE_MIME_TYPES and (size + 2) // 3 * 4 <= NATIVE_MAX_REQUEST_BYTES


def media_label(path: str, segments: Sequence[Segment]) -> str:
    """The text part sent with the media bytes: file name, the user's note, what the file is."""
    parts = [os.path.basename(path)]
    parts += [s.text for s in segments if s.kind == "note"]
    parts += [s.text for s in segments if s.kind == "media"]
    return "\n".join(p.strip() for p in parts if p.strip())


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


__all__ = ["NATIVE_MIME_TYPES", "embed_media", "media_label", "native_media_enabled", "native_media_ok"]
