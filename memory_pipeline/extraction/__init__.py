"""One extractor per format; ``extract`` dispatches on the sniffed modality.

``extract`` is the one door: it opens the file once, contained in its source folder
(``memory_pipeline.safeio``), and every extractor reads that descriptor, never the
path. Markdown, text and session transcripts are read here, in this process (linear
code of our own, bounded by the output caps). Images, audio, video, PDFs and
documents are read in the extraction worker process (``extraction.worker``), which
is killed at the file's time or memory limit. Whatever comes back goes through
``output.finish`` in one place: control characters removed, secrets redacted (every
format: OCR, transcripts, pages, documents, messages, notes), output capped.

Every failure is an ``ExtractionError`` with a reason a person can act on; the
caller records it and carries on with the next file. Media extractors return
segments with a ``kind`` and a locator range (pages, milliseconds, paragraph or row
numbers). The returned list's ``warning`` is set when a file was indexed only in
part (a page or output cap, broken JSONL lines, control characters removed).
"""

from __future__ import annotations

import os

from memory_pipeline.discovery import MEDIA_MODALITIES, NOTE_SUFFIX
from memory_pipeline.errors import ExtractionError
from memory_pipeline.extraction.markdown import text_segments
from memory_pipeline.extraction.media import MediaOptions, Segments, note_segment
from memory_pipeline.extraction.output import finish
from memory_pipeline.extraction.session import session_segments
from memory_pipeline.extraction.worker import ExtractionWorker, Extractor, default_worker, run_extractor, shutdown_worker
from memory_pipeline.models import Segment
from memory_pipeline.safeio import OpenedFile, UnsafeFileError, open_file

NOTE_MAX_BYTES = 64 * 1024


def extract(
    abs_path: str,
    modality: str,
    mime: str = "",
    options: MediaOptions | None = None,
    root: str | os.PathLike[str] | None = None,
    *,
    isolate: bool = True,
    worker: ExtractionWorker | None = None,
    extractor: Extractor | None = None,
) -> Segments:
    """Text segments of one file; raises ExtractionError when it cannot be read.

    ``root``: the source folder the file was found in; links are followed only inside it
    (without it, a link at the file itself is refused). ``isolate=False`` runs a media
    extractor in this process, without the time and memory kill (a debugger, a test that
    patches a decoder). ``worker``: the worker to use instead of the process-wide one.
    ``extractor``: a replacement media extractor run in the worker (a test hook: it must be
    importable by name, since it is sent to the worker).
    """
    options = options or MediaOptions()
    if modality not in ("markdown", "text", "session") and modality not in MEDIA_MODALITIES and extractor is None:
        raise ExtractionError(abs_path, f"no extractor for {modality} files")
    try:
        with open_file(abs_path, root) as src:
            if modality in ("markdown", "text"):
                return finish(text_segments(src, options), options)
            if modality == "session":
                return finish(session_segments(src, options), options)
            note, note_warning = _note(abs_path, root)
            segments = _media(src, modality, mime, options, isolate, worker, extractor)
            if note_warning:
                segments.warn(note_warning)
            return finish(segments, options, note)
    except ExtractionError as err:
        if not err.path:
            raise ExtractionError(abs_path, err.reason) from err
        raise
    except PermissionError as err:
        raise ExtractionError(abs_path, "permission denied") from err
    except FileNotFoundError as err:
        raise ExtractionError(abs_path, "file vanished while indexing") from err
    except RecursionError as err:
        raise ExtractionError(abs_path, f"{modality} is nested too deeply to read") from err
    except MemoryError as err:
        raise ExtractionError(abs_path, "ran out of memory while extracting") from err
    except OSError as err:
        raise ExtractionError(abs_path, f"cannot read: {err.strerror or err}") from err


def _media(
    src: OpenedFile,
    modality: str,
    mime: str,
    options: MediaOptions,
    isolate: bool,
    worker: ExtractionWorker | None,
    extractor: Extractor | None,
) -> Segments:
    if not isolate:
        return run_extractor(src, modality, mime, options, extractor)
    return (worker or default_worker()).run(src, modality, mime, options, extractor)


def _note(abs_path: str, root: str | os.PathLike[str] | None) -> tuple[list[Segment], str]:
    """The note beside a media file (``<file>.note.md``), opened as contained as the file; and a warning."""
    note_path = abs_path + NOTE_SUFFIX
    try:
        with open_file(note_path, root) as f:
            return note_segment(f.pread(NOTE_MAX_BYTES)), ""
    except FileNotFoundError:
        return [], ""
    except UnsafeFileError as err:
        return [], f"its note {os.path.basename(note_path)} was not read: {err.reason}"
    except OSError as err:
        return [], f"its note {os.path.basename(note_path)} could not be read: {err.strerror or err}"


__all__ = ["extract", "shutdown_worker", "ExtractionWorker", "MediaOptions", "Segments"]
