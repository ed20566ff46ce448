"""One extractor per format; ``extract`` dispatches on the sniffed modality.

Every extractor raises ``ExtractionError`` with a reason a person can act on;
the caller records it and carries on with the next file.
"""

from __future__ import annotations

from memory_pipeline.errors import ExtractionError
from memory_pipeline.extraction.markdown import extract_text_file
from memory_pipeline.extraction.session import extract_session
from memory_pipeline.models import Segment


def extract(abs_path: str, modality: str) -> list[Segment]:
    """Text segments of one file; raises ExtractionError when it cannot be read."""
    try:
        if modality in ("markdown", "text"):
            return extract_text_file(abs_path)
        if modality == "session":
            return extract_session(abs_path)
    except ExtractionError:
        raise
    except PermissionError as err:
        raise ExtractionError(abs_path, "permission denied") from err
    except FileNotFoundError as err:
        raise ExtractionError(abs_path, "file vanished while indexing") from err
    except OSError as err:
        raise ExtractionError(abs_path, f"cannot read: {err.strerror or err}") from err
    raise ExtractionError(abs_path, f"no extractor for {modality} files")


__all__ = ["extract"]
