"""One extractor per format; ``extract`` dispatches on the sniffed modality.

Every extractor raises ``ExtractionError`` with a reason a person can act on;
the caller records it and carries on with the next file. Media extractors
(image, audio, video, pdf, document) return segments with a ``kind`` and a
locator range (pages, milliseconds, paragraph or row numbers); they may set a
``warning`` on the list when a file was indexed only in part.
"""

from __future__ import annotations

from memory_pipeline.errors import ExtractionError
from memory_pipeline.extraction.markdown import extract_text_file
from memory_pipeline.extraction.media import MediaOptions
from memory_pipeline.extraction.session import extract_session
from memory_pipeline.models import Segment


def _media_extractor(modality: str):
    # Imported on use: a text-only run never pays for PIL, pypdf, PyAV or Whisper.
    if modality == "image":
        from memory_pipeline.extraction.image import extract_image as fn
    elif modality == "audio":
        from memory_pipeline.extraction.audio import extract_audio as fn
    elif modality == "video":
        from memory_pipeline.extraction.video import extract_video as fn
    elif modality == "pdf":
        from memory_pipeline.extraction.pdf import extract_pdf as fn
    elif modality == "document":
        from memory_pipeline.extraction.document import extract_document as fn
    else:
        return None
    return fn


def extract(abs_path: str, modality: str, mime: str = "", options: MediaOptions | None = None) -> list[Segment]:
    """Text segments of one file; raises ExtractionError when it cannot be read."""
    try:
        if modality in ("markdown", "text"):
            return extract_text_file(abs_path)
        if modality == "session":
            return extract_session(abs_path)
        fn = _media_extractor(modality)
        if fn is not None:
            try:
                return fn(abs_path, mime, options or MediaOptions())
            except (ExtractionError, OSError, MemoryError):
                raise
            except Exception as err:  # a decoder library's own error on a malformed file
                raise ExtractionError(abs_path, f"{modality} is malformed: {type(err).__name__}: {err}") from err
    except ExtractionError as err:
        if not err.path:
            raise ExtractionError(abs_path, err.reason) from err
        raise
    except PermissionError as err:
        raise ExtractionError(abs_path, "permission denied") from err
    except FileNotFoundError as err:
        raise ExtractionError(abs_path, "file vanished while indexing") from err
    except MemoryError as err:
        raise ExtractionError(abs_path, "ran out of memory while extracting") from err
    except OSError as err:
        raise ExtractionError(abs_path, f"cannot read: {err.strerror or err}") from err
    raise ExtractionError(abs_path, f"no extractor for {modality} files")


__all__ = ["extract", "MediaOptions"]
