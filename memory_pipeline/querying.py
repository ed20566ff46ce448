"""Query by a file: the derived text of an image or a recording (OCR, photo details, note, transcript)."""

from __future__ import annotations

import os

from memory_pipeline.discovery import sniff_file
from memory_pipeline.errors import ConfigError, ExtractionError, MemoryPipelineError
from memory_pipeline.extraction import MediaOptions, extract
from memory_pipeline.settings import Settings

MAX_QUERY_CHARS = 2000
# The media description ("Image x.jpg (JPEG, 900x600)") would match every image: not query text.
QUERY_KINDS = ("note", "ocr", "exif", "time", "frame", "page", "para", "row", "text")


def query_file(path: str, expected: str, settings: Settings, *, name: str | None = None) -> tuple[str, str, str]:
    """``(abs_path, mime, modality)`` of a file to query by; ``expected`` is image or audio.

    ``name``: how messages name the file (default: ``path``; the server gives the uploaded file's name).
    """
    name = name or path
    # A file named by the user on the command line: its links are the user's to follow.
    abs_path = os.path.realpath(os.path.expanduser(path))
    if not os.path.isfile(abs_path):
        raise ConfigError(f"--{expected} {name}: no such file", key=expected)
    size = os.path.getsize(abs_path)
    if size > settings.multimodal.max_file_bytes:
        raise MemoryPipelineError(f"File {name} exceeds {settings.multimodal.max_file_bytes} bytes limit for embedding")
    mime, modality = sniff_file(abs_path, os.path.basename(abs_path))
    allowed = ("audio", "video") if expected == "audio" else ("image",)
    if modality not in allowed:
        raise ConfigError(f"--{expected} {name}: the file is {mime}, not {'an' if expected == 'image' else ''} {expected}".replace("  ", " "), key=expected)
    return abs_path, mime, modality


def derived_query_text(path: str, expected: str, settings: Settings, *, allow_empty: bool = False, name: str | None = None) -> str:
    """The text a query by ``path`` searches with; ``expected`` is image or audio.

    ``allow_empty``: a file with no text is fine (its native vector searches alone). ``name``: as
    in :func:`query_file`.
    """
    name = name or path
    abs_path, mime, modality = query_file(path, expected, settings, name=name)
    try:
        segments = extract(abs_path, modality, mime, MediaOptions.from_settings(settings))
    except ExtractionError as err:
        raise MemoryPipelineError(f"cannot read {name}: {err.reason}") from err
    text = " ".join(s.text for s in segments if s.kind in QUERY_KINDS).strip()
    if not text and not allow_empty:
        what = "no text in the image" if expected == "image" else "no speech in the recording"
        raise MemoryPipelineError(
            f"nothing to search with: {what} ({name})",
            hint="native media queries need provider gemini with gemini-embedding-2-preview",
        )
    return text[:MAX_QUERY_CHARS]
