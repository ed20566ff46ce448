"""PDF: text per page (pypdf), page numbers as locators; pages without a text layer are OCRed.

At most ``multimodal.pdf_max_pages`` pages are read (the file is indexed with a
warning saying so). A PDF that yields no text at all fails with the reason: it is
never indexed empty.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from typing import BinaryIO

from memory_pipeline.errors import ExtractionError
from memory_pipeline.extraction.media import Deadline, MediaOptions, Segments, media_segment, ocr_image
from memory_pipeline.models import Segment
from memory_pipeline.safeio import OpenedFile


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def _pypdf_warnings():
    """pypdf repairs a broken file quietly (through its logger): collect what it repaired."""
    logger = logging.getLogger("pypdf")
    handler = _Collect()
    logger.addHandler(handler)
    propagate, logger.propagate = logger.propagate, False
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def _reader(fh: BinaryIO, abs_path: str):
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(fh, strict=False)
        if reader.is_encrypted:
            try:
                if not reader.decrypt(""):
                    raise ExtractionError(abs_path, "PDF is password-protected; cannot read its text")
            except ExtractionError:
                raise
            except Exception as err:
                raise ExtractionError(abs_path, f"PDF is encrypted and cannot be opened: {err}") from err
        return reader, len(reader.pages)
    except ExtractionError:
        raise
    except (PdfReadError, ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError) as err:
        raise ExtractionError(abs_path, f"PDF is corrupt and cannot be read: {err.__class__.__name__}: {err}") from err


def _page_ocr(page, deadline: Deadline) -> list[str]:
    lines: list[str] = []
    for image in page.images:
        deadline.check("reading the PDF's scanned pages")
        try:
            pil = image.image
        except Exception:  # noqa: BLE001 - an undecodable embedded image: other images of the page may still read
            continue
        if pil is not None and pil.width * pil.height >= 10_000:
            lines.extend(ocr_image(pil, deadline))
    return lines


def extract_pdf(src: OpenedFile, mime: str, options: MediaOptions) -> list[Segment]:
    with _pypdf_warnings() as repaired, src.stream() as fh:
        return _extract_pdf(fh, src.path, options, repaired)


def _extract_pdf(fh: BinaryIO, abs_path: str, options: MediaOptions, repaired: list[str]) -> list[Segment]:
    deadline = Deadline(abs_path, options.timeout_seconds)
    reader, n_pages = _reader(fh, abs_path)
    if n_pages == 0:
        raise ExtractionError(abs_path, "PDF has no pages (or its page tree is broken)")
    limit = min(n_pages, options.pdf_max_pages)
    pages: list[Segment] = []
    ocr_pages = 0
    failed_pages = 0
    for number in range(1, limit + 1):
        deadline.check("reading PDF pages")
        try:
            page = reader.pages[number - 1]
            text = (page.extract_text() or "").strip()
            if not text:
                lines = _page_ocr(page, deadline)
                ocr_pages += bool(lines)
                text = "\n".join(lines)
        except ExtractionError:
            raise
        except Exception:  # noqa: BLE001 - one broken page (bad content stream) must not lose the others
            failed_pages += 1
            continue
        if text:
            pages.append(Segment(text=text, line_start=number, line_end=number, kind="page"))
    if not pages:
        why = f"{failed_pages} of {limit} pages could not be parsed" if failed_pages else "no text layer, and OCR found no text"
        raise ExtractionError(abs_path, f"PDF yields no text ({why}); not indexed empty")
    name = os.path.basename(abs_path)
    about = f"PDF document {name}, {n_pages} page{'s' if n_pages != 1 else ''}."
    if ocr_pages:
        about += f" {ocr_pages} scanned page{'s' if ocr_pages != 1 else ''} read by OCR."
    segments = Segments([media_segment(about)])
    segments.extend(pages)
    warnings = []
    if n_pages > limit:
        warnings.append(f"indexed the first {limit} of {n_pages} pages (multimodal.pdf_max_pages)")
    if failed_pages:
        warnings.append(f"{failed_pages} page(s) could not be parsed")
    xref = [m for m in repaired if "xref" in m.lower() or "object" in m.lower() or "startxref" in m.lower()]
    if xref:
        warnings.append(f"the PDF is damaged (broken cross-reference table: {xref[0]}); its text was recovered by scanning the file")
    segments.warning = "; ".join(warnings)
    return segments
