"""Documents as readable text: docx paragraphs and tables, HTML text, CSV rows, JSON and XML values.

Each format is read so that a small hostile file cannot cost much:

- docx is a zip. Its central directory is checked before anything is inflated
  (entry count, total size, each entry's compression ratio: a 150 KB file that
  claims 40 MB of XML is refused), and ``word/document.xml`` is then inflated
  through a reader that stops at ``max_unzipped_bytes`` whatever the headers say.
  It is parsed as a stream with defusedxml (no DTD, no entities), one body element
  at a time, and reading stops at ``max_segments`` paragraphs and rows, so memory
  stays flat however long the document.
- XML files are parsed with defusedxml: entity declarations are refused outright.
- HTML goes through the standard library's HTMLParser, which expands only the
  predefined character references.
- JSON is flattened without recursion, and stops at ``max_chars``.

Secrets are redacted, and output capped, by ``extract`` like every format's. Tables are
the exception that proves it: a row is read apart from its header (a CSV row, a docx row
each a segment of its own), so a cell under a column whose header names a secret
("password", "API Key") is redacted here, whole, where the header is known.
"""

from __future__ import annotations

import csv
import io
import json
import os
import zipfile
from collections.abc import Iterator
from html.parser import HTMLParser
from typing import IO

from memory_pipeline.discovery import DOCX_MIME
from memory_pipeline.errors import ExtractionError
from memory_pipeline.extraction.markdown import read_text
from memory_pipeline.extraction.media import MediaOptions, Segments, media_segment
from memory_pipeline.extraction.output import clean_text
from memory_pipeline.extraction.redact import redact_cell, table_header_kinds
from memory_pipeline.models import Segment
from memory_pipeline.safeio import OpenedFile

_MAX_CELL = 500
# No Office document has this many parts; a central directory this long is itself the attack.
MAX_ZIP_ENTRIES = 10_000
# Small entries may compress extremely (a page of spaces) without costing anything to inflate.
_RATIO_FLOOR_BYTES = 1 << 20
_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
_MC_FALLBACK = "{http://schemas.openxmlformats.org/markup-compatibility/2006}Fallback"


def check_zip(zf: zipfile.ZipFile, path: str, options: MediaOptions) -> None:
    """Refuse a zip whose central directory promises more than a document needs (a zip bomb)."""
    infos = zf.infolist()
    if len(infos) > MAX_ZIP_ENTRIES:
        raise ExtractionError(path, f"zip holds {len(infos)} entries, over {MAX_ZIP_ENTRIES}; not opened")
    total = sum(i.file_size for i in infos)
    if total > options.max_unzipped_bytes:
        raise ExtractionError(
            path,
            f"zip would expand to {total} bytes, over max_unzipped_bytes={options.max_unzipped_bytes} (a zip bomb?); not opened",
        )
    for info in infos:
        if info.file_size > _RATIO_FLOOR_BYTES and info.file_size > options.max_zip_ratio * max(info.compress_size, 1):
            ratio = info.file_size / max(info.compress_size, 1)
            raise ExtractionError(
                path,
                f"{info.filename} would expand {ratio:.0f}x ({info.compress_size} to {info.file_size} bytes), "
                f"over max_zip_ratio={options.max_zip_ratio:g} (a zip bomb?); not opened",
            )


class _Bounded(io.RawIOBase):
    """Reads at most ``limit`` bytes of an inflating stream; more is an ExtractionError, not more memory."""

    def __init__(self, raw: IO[bytes], limit: int, path: str, name: str) -> None:
        self.raw, self.limit, self.path, self.name_in_zip = raw, limit, path, name
        self.seen = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.raw.read(min(len(buffer), 1 << 16))
        self.seen += len(data)
        if self.seen > self.limit:
            raise ExtractionError(self.path, f"{self.name_in_zip} inflates past {self.limit} bytes; not read further")
        buffer[: len(data)] = data
        return len(data)


def _para_text(p) -> str:
    """A paragraph's text as Word shows it: runs, tabs and breaks; text boxes and fallbacks left out."""
    parts: list[str] = []
    stack = [p]
    while stack:
        el = stack.pop()
        tag = el.tag
        if tag == _W + "t":
            parts.append(el.text or "")
        elif tag in (_W + "tab", _W + "ptab"):
            parts.append("\t")
        elif tag in (_W + "br", _W + "cr"):
            parts.append("\n")
        elif tag == _W + "noBreakHyphen":
            parts.append("-")
        if tag not in (_W + "txbxContent", _MC_FALLBACK):
            stack.extend(reversed(list(el)))
    return "".join(parts)


def _table_rows(tbl) -> Iterator[str]:
    kinds: list[str | None] | None = None  # per column, the secret its header names (the first row)
    for tr in tbl.iter(_W + "tr"):
        texts = [" ".join("\n".join(_para_text(p) for p in tc.findall(_W + "p")).split())[:_MAX_CELL] for tc in tr.findall(_W + "tc")]
        if kinds is None:
            kinds = table_header_kinds(texts)
        else:
            texts = [redact_cell(kind, text) for text, kind in zip(texts, kinds + [None] * len(texts))]
        cells: list[str] = []
        for text in texts:
            if text and (not cells or cells[-1] != text):  # merged cells repeat
                cells.append(text)
        if cells:
            yield " | ".join(cells)


def _body_blocks(stream: io.RawIOBase) -> Iterator[str]:
    """Paragraphs and table rows of ``word/document.xml``, in order, one body element in memory at a time."""
    import defusedxml.ElementTree as SafeET

    depth = 0
    body = None
    for event, el in SafeET.iterparse(stream, events=("start", "end"), forbid_dtd=True):
        if event == "start":
            depth += 1
            if depth == 2 and el.tag == _W + "body":
                body = el
            continue
        depth -= 1
        if depth != 2 or body is None:
            continue
        if el.tag == _W + "p":
            text = _para_text(el).strip()
            if text:
                yield text
        elif el.tag == _W + "tbl":
            yield from _table_rows(el)
        elif el.tag == _W + "sdt":  # a content control (a cover page, a table of contents)
            for p in el.iter(_W + "p"):
                text = _para_text(p).strip()
                if text:
                    yield text
        body.clear()  # what is done is dropped: memory stays at one body element


def _docx_body(src: OpenedFile, options: MediaOptions) -> Segments:
    import defusedxml

    body = Segments()
    with src.stream() as fh:
        try:
            zf = zipfile.ZipFile(fh)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as err:
            raise ExtractionError(src.path, f"Word document is corrupt: {err.__class__.__name__}: {err}") from err
        with zf:
            check_zip(zf, src.path, options)
            try:
                info = zf.getinfo("word/document.xml")
            except KeyError as err:
                raise ExtractionError(src.path, "Word document has no word/document.xml") from err
            try:
                with zf.open(info) as raw:
                    limit = min(info.file_size, options.max_unzipped_bytes)
                    for i, block in enumerate(_body_blocks(_Bounded(raw, limit, src.path, info.filename)), 1):
                        if len(body) >= options.body_segments():
                            body.warn(f"indexed the first {len(body)} paragraphs and rows (max_segments={options.max_segments})")
                            break
                        body.append(Segment(text=block, line_start=i, line_end=i, kind="para"))
            except ExtractionError:
                raise
            except defusedxml.DefusedXmlException as err:
                raise ExtractionError(src.path, f"Word document declares a DTD or entities ({err}); not parsed") from err
            except Exception as err:  # zipfile (bad CRC, bad header), expat and zlib raise their own errors
                raise ExtractionError(src.path, f"Word document is corrupt: {err.__class__.__name__}: {err}") from err
    return body


# Tables nested deeper than this are read as blocks and cells (text, no rows): a page of 20,000
# nested tables took 28 s, each level copying the text of the levels inside it.
_MAX_TABLE_DEPTH = 8


class _Table:
    """An HTML table being read: the secret each column names (from its first row) and the row being read."""

    def __init__(self) -> None:
        self.kinds: list[str | None] | None = None
        self.row: list[list[str]] | None = None  # cells, each the text parts read into it
        self.header_row = False  # the row being read has a <th> cell


class _HTMLText(HTMLParser):
    """Text of an HTML page: blocks on lines of their own, a table's row a line of cells joined by " | "
    (so "<td>Margarethe</td><td>Quartermaster</td>" stays two words, and a cell under a password
    column is redacted whole: a first row of <th> cells is the table's header). A row of one cell
    (a layout table: a page or an email wrapped in <table><tr><td>) keeps its blocks on lines of
    their own. Text goes to the innermost open cell, kept on a stack: linear in nested tables."""

    _SKIP = {"script", "style", "noscript", "template", "svg", "head"}
    _BLOCK = {
        "p", "div", "br", "li", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article", "table", "ul", "ol", "pre",
        "blockquote", "title", "dl", "dt", "dd", "caption", "hr", "header", "footer", "nav", "main", "aside", "figcaption",
    }  # fmt: skip
    _CELLS = {"td", "th"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip = 0
        self.title = ""
        self._in_title = False
        self.tables: list[_Table] = []
        self._filled: list[_Table] = []  # the tables whose row has a cell open, innermost last
        self._deep = 0  # tables nested past _MAX_TABLE_DEPTH: read as blocks (each level copied its cells' text)

    def _out(self, text: str) -> None:
        """Text where it goes: the open cell of the innermost table that has one (a nested table's rows
        go into the cell holding it), or the page."""
        if self._filled:
            row = self._filled[-1].row
            assert row  # a table is on the stack only while its row has a cell
            row[-1].append(text)
        else:
            self.parts.append(text)

    def _end_row(self) -> None:
        table = self.tables[-1]
        row, table.row = table.row, None
        if self._filled and self._filled[-1] is table:
            self._filled.pop()
        header, table.header_row = table.header_row, False
        if not row:
            return
        if len(row) == 1:
            # A layout table's cell: its blocks keep their lines.
            lines = (" ".join(line.split()) for line in "".join(row[0]).split("\n"))
            cell = "\n".join(line for line in lines if line)
            if table.kinds is None:
                table.kinds = table_header_kinds([cell]) if header else []
            if cell:
                self._out(f"\n{cell}\n")
            return
        cells = [" ".join("".join(parts).split()) for parts in row]
        if table.kinds is None:
            # Only a row of <th> cells is a header: a first row of <td> is data as often (a form's
            # "Password | <input>", then "Remember me on this computer" under it).
            table.kinds = table_header_kinds(cells) if header else []
        else:
            cells = [redact_cell(kind, cell) for cell, kind in zip(cells, table.kinds + [None] * len(cells))]
        line = " | ".join(c for c in cells if c)
        if line:
            self._out(f"\n{line}\n")

    def handle_starttag(self, tag, attrs):
        if tag == "title":
            self._in_title = True
        elif tag in self._SKIP:
            self.skip += 1
        if self.skip:
            return
        if self._deep or (tag == "table" and len(self.tables) >= _MAX_TABLE_DEPTH):
            if tag == "table":
                self._deep += 1
            if tag in ("table", "tr") or tag in self._BLOCK:
                self._out("\n")
            elif tag in self._CELLS:
                self._out(" ")
            return
        if tag == "table":
            self._out("\n")
            self.tables.append(_Table())
        elif tag == "tr" and self.tables:
            if self.tables[-1].row is not None:
                self._end_row()  # an end tag left out: <tr> closes the row before it
            self.tables[-1].row = []
        elif tag in self._CELLS and self.tables:
            table = self.tables[-1]
            if table.row is None:
                table.row = []
            table.row.append([])  # </td> may be left out: a cell runs to the next one
            table.header_row |= tag == "th"
            if not self._filled or self._filled[-1] is not table:
                self._filled.append(table)
        elif tag in self._BLOCK:
            self._out("\n")

    def handle_endtag(self, tag):
        if tag == "title":
            self._in_title = False
        elif tag in self._SKIP and self.skip:
            self.skip -= 1
            return
        if self.skip:
            return
        if self._deep:
            if tag == "table":
                self._deep -= 1
            self._out("\n" if tag in ("table", "tr") or tag in self._BLOCK else " " if tag in self._CELLS else "")
            return
        if tag in ("tr", "table") and self.tables:
            if self.tables[-1].row is not None:
                self._end_row()
            if tag == "table":
                gone = self.tables.pop()
                if self._filled and self._filled[-1] is gone:
                    self._filled.pop()
                self._out("\n")
        elif tag in self._CELLS and self.tables and self.tables[-1].row:
            self.tables[-1].row[-1].append(" ")
        elif tag in self._BLOCK:
            self._out("\n")

    def handle_data(self, data):
        if self._in_title:
            self.title += data
        elif not self.skip:
            self._out(data)

    def close(self) -> None:
        super().close()
        while self.tables:  # a table never closed: its last row is still text
            if self.tables[-1].row is not None:
                self._end_row()
            gone = self.tables.pop()
            if self._filled and self._filled[-1] is gone:
                self._filled.pop()


def html_text(text: str) -> str:
    parser = _HTMLText()
    parser.feed(text)
    parser.close()
    lines = [" ".join(line.split()) for line in "".join(parser.parts).split("\n")]
    body = "\n".join(line for line in lines if line)
    title = " ".join(parser.title.split())
    return f"{title}\n{body}" if title else body


def _csv_rows(text: str, path: str, options: MediaOptions) -> Segments:
    try:
        dialect = csv.Sniffer().sniff(text[:4096], delimiters=",;\t|")
    except csv.Error:
        dialect = csv.excel
    out = Segments()
    try:
        rows = csv.reader(io.StringIO(text), dialect)
        header = [h.strip() for h in next(rows, [])]
        if not header:
            return out
        out.append(Segment(text="Columns: " + ", ".join(h for h in header if h), line_start=1, line_end=1, kind="row"))
        # "password: correct horse battery staple" loses the cell's end once written: a
        # cell under a secret's column is redacted whole here, where the header is known.
        kinds = table_header_kinds(header)
        for n, row in enumerate(rows, start=2):
            cells = [
                f"{h or f'col{i + 1}'}: {redact_cell(kind, v.strip()[:_MAX_CELL])}"
                for i, (h, kind, v) in enumerate(zip(header + [""] * len(row), kinds + [None] * len(row), row))
                if v.strip()
            ]
            if not cells:
                continue
            if len(out) >= options.body_segments():
                out.warn(f"indexed the first {len(out) - 1} rows (max_segments={options.max_segments})")
                break
            out.append(Segment(text="; ".join(cells), line_start=n, line_end=n, kind="row"))
    except csv.Error as err:  # a field over the csv module's limit, a quote never closed
        raise ExtractionError(path, f"CSV is malformed: {err}") from err
    return out


def _json_lines(value, budget: int) -> tuple[list[str], bool]:
    """``path.to.key: value`` lines, depth first without recursion; True when cut at ``budget`` characters."""
    out: list[str] = []
    used = 0
    stack: list[tuple[str, object]] = [("", value)]
    while stack:
        prefix, v = stack.pop()
        if isinstance(v, dict):
            stack.extend(reversed([(f"{prefix}.{k}" if prefix else str(k), x) for k, x in v.items()]))
        elif isinstance(v, list):
            stack.extend(reversed([(f"{prefix}[{i}]", x) for i, x in enumerate(v)]))
        elif v is not None and v != "":
            line = f"{prefix}: {v}" if prefix else str(v)
            used += len(line) + 1
            if used > budget:
                return out, True
            out.append(line)
    return out, False


def _xml_lines(abs_path: str, data: bytes) -> list[str]:
    import xml.etree.ElementTree as ET

    import defusedxml
    import defusedxml.ElementTree as SafeET

    try:
        root = SafeET.fromstring(data, forbid_dtd=False, forbid_entities=True, forbid_external=True)
    except defusedxml.DefusedXmlException as err:
        raise ExtractionError(abs_path, f"XML declares entities or external references ({err}); not parsed") from err
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


def _one_segment(lines: list[str]) -> list[Segment]:
    return [Segment(text="\n".join(lines), line_start=1, line_end=len(lines), kind="text")] if lines else []


def extract_document(src: OpenedFile, mime: str, options: MediaOptions) -> list[Segment]:
    name = os.path.basename(src.path)
    warning = ""
    if mime == DOCX_MIME:
        body: list[Segment] = _docx_body(src, options)
        warning = body.warning
        kind_name = "Word document"
    elif mime == "application/xml":
        data = src.pread(options.max_chars * 4 + 1)
        if len(data) > options.max_chars * 4:
            raise ExtractionError(src.path, f"XML file is over {options.max_chars * 4} bytes (max_chars={options.max_chars}); not parsed")
        body = _one_segment(_xml_lines(src.path, data))
        kind_name = "XML document"
    else:
        text, cut = read_text(src, options)
        text = clean_text(text)[0]
        if cut:
            warning = f"read the first {options.max_chars * 4} bytes of {src.size} (max_chars={options.max_chars})"
        if mime == "text/csv":
            body = _csv_rows(text, src.path, options)
            warning = "; ".join(w for w in (warning, body.warning) if w)
            kind_name = "CSV table"
        elif mime == "application/json":
            if cut:  # half a JSON value is no JSON at all
                raise ExtractionError(src.path, f"JSON file is over {options.max_chars * 4} bytes (max_chars={options.max_chars}); not parsed")
            try:
                value = json.loads(text)
            except RecursionError as err:
                raise ExtractionError(src.path, "JSON is nested too deeply to read") from err
            except ValueError as err:  # JSONDecodeError, or a number of more digits than Python converts
                raise ExtractionError(src.path, f"not valid JSON: {err}") from err
            lines, over = _json_lines(value, options.max_chars)
            if over:
                warning = f"indexed the first {len(lines)} values (max_chars={options.max_chars})"
            body = _one_segment(lines)
            kind_name = "JSON document"
        else:
            rendered = html_text(text)
            n = rendered.count("\n") + 1
            body = [Segment(text=rendered, line_start=1, line_end=n, kind="text")] if rendered.strip() else []
            kind_name = "Web page"
    if not body:
        raise ExtractionError(src.path, f"{kind_name.lower()} has no text; not indexed empty")
    segments = Segments([media_segment(f"{kind_name} {name}.")])
    segments.extend(body)
    segments.warning = warning
    return segments
