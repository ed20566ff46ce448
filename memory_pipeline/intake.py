"""`memory store`: put a file (and the user's note about it) into the memory folder and index it at once.

A file already inside a source folder is indexed where it is; any other file is
copied into ``<source>/media/`` (never over a different file of the same name).
The note is written beside the file as ``<file>.note.md``: it is part of the file's
derived text (changing it re-indexes the file), and search lists it once, with the
file's media result (the note file alone shows only when the file is not a result).
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


def _refuse_link_out(given: str, settings: Settings) -> None:
    """A path inside a source folder that leads outside it (a link) is never stored: indexing
    never follows such links, and storing would copy the outside file into the memory."""
    literal = Path(os.path.abspath(os.path.expanduser(given)))
    for s in settings.sources:
        root = Path(os.path.abspath(s.path))
        if _inside(literal, root) and not _inside(literal.resolve(), root.resolve()):
            raise MemoryPipelineError(
                f"{given} is a link that leads outside the source folder {s.name!r}; refusing to store it",
                hint="store the file it points to by its own path, or copy it into the folder",
            )


def _inbox(source: SourceConfig) -> Path:
    """``<source>/media``, refused when it is (or leads through) a link out of the source folder."""
    folder = source.path / INBOX
    root = source.path.resolve()
    if not _inside(folder.resolve(), root):
        raise MemoryPipelineError(
            f"{folder} leads outside the source folder {source.name!r} (a link); refusing to write there",
            hint=f"make {folder} a real folder inside {source.path}",
        )
    return folder


def _copy_new(src: Path, dest: Path) -> None:
    """Copy into a file that must not exist yet; a link planted at ``dest`` is never followed."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(dest, flags, 0o644)
    try:
        with open(src, "rb") as fin, os.fdopen(fd, "wb") as fout:
            fd = -1
            shutil.copyfileobj(fin, fout, 1024 * 1024)
        shutil.copystat(src, dest)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        dest.unlink(missing_ok=True)
        raise


def _destination(src: Path, source: SourceConfig) -> Path:
    folder = _inbox(source)
    dest = folder / src.name
    n = 2
    while dest.exists() or dest.is_symlink():
        if dest.is_file() and not dest.is_symlink() and sha256_file(str(dest), source.path) == sha256_file(str(src), src.parent):
            return dest  # the same file was stored before
        dest = folder / f"{src.stem}-{n}{src.suffix}"
        n += 1
    return dest


def _write_note(path: Path, text: str) -> None:
    """Write the note beside the file, never through a link planted at its name."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


def store_file(settings: Settings, file: str, note: str | None = None, source_name: str | None = None) -> dict:
    """Copy (or keep) ``file`` in the memory folder, write its note, index; returns what was done."""
    from memory_pipeline.runner import run_index

    _refuse_link_out(file, settings)
    src = Path(file).expanduser().resolve()
    if not src.is_file():
        raise ConfigError(f"File {file} not found (or not a regular file)", key="file")
    mime, modality = sniff_file(str(src), src.name, src.parent)
    limit = settings.multimodal.max_file_bytes if modality in MEDIA_MODALITIES else settings.limits.max_file_bytes
    size = src.stat().st_size
    if size > limit:
        raise MemoryPipelineError(
            f"File {file} exceeds {limit} bytes limit for embedding",
            hint=f"the file is {size} bytes; raise multimodal.max_file_bytes or store a smaller file",
        )
    source = next((s for s in settings.sources if _inside(src, s.path.resolve())), None)
    in_place = source is not None
    created: list[Path] = []  # what this call wrote: removed again when the file cannot be indexed
    if source is None:
        source = settings.source(source_name) if source_name else settings.sources[0]
        dest = _destination(src, source)
        dest.parent.mkdir(parents=True, exist_ok=True)
        _inbox(source)  # again, now that it exists: mkdir never follows a link out, but check
        if not dest.exists():
            _copy_new(src, dest)
            created.append(dest)
    else:
        dest = src
    try:
        rel = dest.resolve().relative_to(source.path.resolve()).as_posix()
        if not is_selected(rel, source):
            raise ConfigError(f"{dest} is excluded by the include/exclude globs of source {source.name!r}", key="sources")
        if note is not None and note.strip():
            note_path = Path(str(dest) + NOTE_SUFFIX)
            if not note_path.exists():
                created.append(note_path)
            _write_note(note_path, note.strip() + "\n")
        summary = run_index(settings)
        errors = [e for e in summary["errors"] if os.path.abspath(e["path"]) == str(dest) and e["status"] != "partial"]
        if errors:
            raise MemoryPipelineError(f"{dest} could not be indexed: {errors[0]['reason']}" + ("; nothing was stored" if created else ""))
    except BaseException:
        for path in created:  # a failed store leaves no copy behind (the next run forgets its records)
            path.unlink(missing_ok=True)
        raise
    return {
        "file": str(dest),
        "copied": not in_place,
        "doc_id": doc_id(source.name, rel),
        "mime_type": mime,
        "modality": modality,
        "note": str(dest) + NOTE_SUFFIX if note and note.strip() else None,
        "run": {k: summary[k] for k in ("files_changed", "chunks_total", "rows_written", "table_rows")},
    }
