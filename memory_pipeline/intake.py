"""`memory store`: put a file (and the user's note about it) into the memory folder and index it at once.

A file already inside a source folder is indexed where it is; any other file is
copied into ``<source>/media/`` (never over a different file of the same name).
The note is written beside the file as ``<file>.note.md``: it is searchable as a
note of its own, and it is part of the file's derived text (changing it re-indexes
the file).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from memory_pipeline.discovery import MEDIA_MODALITIES, NOTE_SUFFIX, doc_id, is_selected, sha256_file, sniff_file
from memory_pipeline.errors import ConfigError, MemoryPipelineError
from memory_pipeline.settings import Settings, SourceConfig

INBOX = "media"


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False


def _destination(src: Path, source: SourceConfig) -> Path:
    folder = source.path / INBOX
    dest = folder / src.name
    n = 2
    while dest.exists():
        if dest.is_file() and sha256_file(str(dest)) == sha256_file(str(src)):
            return dest  # the same file was stored before
        dest = folder / f"{src.stem}-{n}{src.suffix}"
        n += 1
    return dest


def store_file(settings: Settings, file: str, note: str | None = None, source_name: str | None = None) -> dict:
    """Copy (or keep) ``file`` in the memory folder, write its note, index; returns what was done."""
    from memory_pipeline.runner import run_index

    src = Path(file).expanduser().resolve()
    if not src.is_file():
        raise ConfigError(f"File {file} not found (or not a regular file)", key="file")
    mime, modality = sniff_file(str(src), src.name)
    limit = settings.multimodal.max_file_bytes if modality in MEDIA_MODALITIES else settings.limits.max_file_bytes
    size = src.stat().st_size
    if size > limit:
        raise MemoryPipelineError(
            f"File {file} exceeds {limit} bytes limit for embedding",
            hint=f"the file is {size} bytes; raise multimodal.max_file_bytes or store a smaller file",
        )
    source = next((s for s in settings.sources if _inside(src, s.path.resolve())), None)
    in_place = source is not None
    if source is None:
        source = settings.source(source_name) if source_name else settings.sources[0]
        dest = _destination(src, source)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists():
            shutil.copy2(src, dest)
    else:
        dest = src
    rel = dest.resolve().relative_to(source.path.resolve()).as_posix()
    if not is_selected(rel, source):
        raise ConfigError(f"{dest} is excluded by the include/exclude globs of source {source.name!r}", key="sources")
    if note is not None and note.strip():
        Path(str(dest) + NOTE_SUFFIX).write_text(note.strip() + "\n", encoding="utf-8")
    summary = run_index(settings)
    errors = [e for e in summary["errors"] if os.path.abspath(e["path"]) == str(dest) and e["status"] != "partial"]
    if errors:
        raise MemoryPipelineError(f"{dest} was stored but not indexed: {errors[0]['reason']}")
    return {
        "file": str(dest),
        "copied": not in_place,
        "doc_id": doc_id(source.name, rel),
        "mime_type": mime,
        "modality": modality,
        "note": str(dest) + NOTE_SUFFIX if note and note.strip() else None,
        "run": {k: summary[k] for k in ("files_changed", "chunks_total", "rows_written", "table_rows")},
    }
