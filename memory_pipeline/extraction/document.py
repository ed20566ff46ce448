"""Documents as readable text: docx paragraphs and tables, HTML text, CSV rows, JSON and XML values.

Every text is redacted of obvious secrets, like notes.
"""

from __future__ import annotations

import csv
import io
import json
import os
from html.parser import HTMLParser

from memory_pipeline.discovery import DOCX_MIME
from memory_pipeline.errors import ExtractionError
from memory_pipeline.extraction.markdown import decode_utf8
from memory_pipeline.extraction.media import MediaOptions, Segments, media_segment, note_segment
from memory_pipeline.extraction.redact import redact
from memory_pipeline.models import Segment

_MAX_CELL = 500


def _docx_blocks(abs_path: str) -> list[str]:
    """Paragraphs and table rows in document order."""
    try:
        import docx
        from docx.table import Table
        from docx.text.paragraph import Paragraph
    except ImportError as err:
        raise ExtractionError(abs_path, "reading .docx needs python-docx, which is not installed") from err
    try:
        document = docx.Document(abs_path)
    except Exception as err:  # python-docx raises zip, XML and its own errors
        raise ExtractionError(abs_path, f"Word document is corrupt: {err.__class__.__name__}: {err}") from err
    blocks = []
    for item in document.iter_inner_content():
        if isinstance(item, Paragraph):
            if item.text.strip():
                blocks.append(item.text.strip())
        elif isinstance(item, Table):
            for row in item.rows:
                cells = []
                for cell in row.cells:
                    text = " ".join(cell.text.split())
                    if text and (not cells or cells[-1] != text):  # merged cells repeat
                        cells.append(text[:_MAX_CELL])
                if cells:
                    blocks.append(" | ".join(cells))
    return blocks


class _HTMLText(HTMLParser):
    _SKIP = {"script", "style", "noscript", "template", "svg", "head"}
    _BLOCK = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article", "table", "ul", "ol", "pre", "blockquote", "title"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip = 0
        self.title = ""
        self._in_title = False

    def handle_starttag(self, tag, attrs):
        if tag == "title":
            self._in_title = True
        elif tag in self._SKIP:
            self.skip += 1
        if tag in self._BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag == "title":
            self._in_title = False
        elif tag in self._SKIP and self.skip:
            self.skip -= 1
        if tag in self._BLOCK:
            self.parts.append("\n")

    def handle_data(self, data):
        if self._in_title:
            self.title += data
        elif not self.skip:
            self.parts.append(data)


def html_text(text: str) -> str:
    parser = _HTMLText()
    parser.feed(text)
    parser.close()
    lines = [" ".join(line.split()) for line in "".join(parser.parts).split("\n")]
    body = "\n".join(line for line in lines if line)
    title = " ".join(parser.title.split())
    return f"{title}\n{body}" if title else body


def _csv_rows(text: str) -> list[Segment]:
    try:
        dialect = csv.Sniffer().sniff(text[:4096], delimiters=",;\t|")
    except csv.Error:
        dialect = csv.excel
    rows = list(csv.reader(io.StringIO(text), dialect))
    if not rows:
        return []
    header = [h.strip() for h in rows[0]]
    out = [Segment(text="Columns: " + ", ".join(h for h in header if h), line_start=1, line_end=1, kind="row")]
    for n, row in enumerate(rows[1:], start=2):
        cells = [f"{h or f'col{i + 1}'}: {v.strip()[:_MAX_CELL]}" for i, (h, v) in enumerate(zip(header + [""] * len(row), row)) if v.strip()]
        if cells:
            out.append(Segment(text="; ".join(cells), line_start=n, line_end=n, kind="row"))
    return out


def _json_lines(value, prefix: str = "") -> list[str]:
    if isinstance(value, dict):
        out = []
        for k, v in value.items():
            out.extend(_json_lines(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, list):
        out = []
        for i, v in enumerate(value):
            out.extend(_json_lines(v, f"{prefix}[{i}]"))
        return out
    if value is None or value == "":
        return []
    return [f"{prefix}: {value}" if prefix else str(value)]


def _xml_lines(abs_path: str, data: bytes) -> list[str]:
    import xml.etree.ElementTree as ET

    try:
        # The standard parser expands no external entities; internal entity bombs are refused by size.
        if data.count(b"<!ENTITY") > 20:
            raise ExtractionError(abs_path, "XML declares many entities (an entity-expansion bomb?); not parsed")
        root = ET.fromstring(data)
    except ET.ParseError as err:
        raise ExtractionError(abs_path, f"XML is not well-formed: {err}") from err
    lines = []
    for el in root.iter():
        tag = el.tag.split("}")[-1] if isinstance(el.tag, str) else ""
        text = " ".join((el.text or "").split())
        attrs = " ".join(f"{k.split('}')[-1]}={v}" for k, v in el.attrib.items())
        if text or attrs:
            lines.append(f"{tag}: {text}{' (' + attrs + ')' if attrs else ''}".strip())
    return lines


def extract_document(abs_path: str, mime: str, options: MediaOptions) -> list[Segment]:
    name = os.path.basename(abs_path)
    if mime == DOCX_MIME:
        blocks = _docx_blocks(abs_path)
        body = [Segment(text=redact(b)[0], line_start=i, line_end=i, kind="para") for i, b in enumerate(blocks, 1)]
        kind_name = "Word document"
    else:
        with open(abs_path, "rb") as fh:
            data = fh.read()
        if mime == "application/xml":
            lines = _xml_lines(abs_path, data)
            body = [Segment(text=redact("\n".join(lines))[0], line_start=1, line_end=len(lines), kind="text")] if lines else []
            kind_name = "XML document"
        else:
            text = decode_utf8(data, abs_path).replace("\r\n", "\n")
            if mime == "text/csv":
                body = [Segment(redact(s.text)[0], s.line_start, s.line_end, kind="row") for s in _csv_rows(text)]
                kind_name = "CSV table"
            elif mime == "application/json":
                try:
                    lines = _json_lines(json.loads(text))
                except json.JSONDecodeError as err:
                    raise ExtractionError(abs_path, f"not valid JSON: {err}") from err
                body = [Segment(text=redact("\n".join(lines))[0], line_start=1, line_end=len(lines), kind="text")] if lines else []
                kind_name = "JSON document"
            else:
                rendered = html_text(text)
                n = rendered.count("\n") + 1
                body = [Segment(text=redact(rendered)[0], line_start=1, line_end=n, kind="text")] if rendered.strip() else []
                kind_name = "Web page"
    if not body:
        raise ExtractionError(abs_path, f"{kind_name.lower()} has no text; not indexed empty")
    segments = Segments(note_segment(abs_path))
    segments.append(media_segment(f"{kind_name} {name}."))
    segments.extend(body)
    return segments
