"""Fuzz every extractor's input: ``extract()`` returns segments or raises ExtractionError, nothing else,
and never runs past its hard deadline.

Inputs are hypothesis-built text for the formats we parse ourselves (markdown, JSONL,
HTML, CSV, JSON, XML) and mutations (bit flips, inserted, deleted, duplicated and
truncated bytes) of valid generated files for the ones libraries parse (PDF, PNG,
JPEG, WAV, docx: the zip itself, and a well-formed zip around a mutated
document.xml). Each input is also sniffed, which must never raise either.

Profiles, chosen by the environment variable ``MEMORY_PIPELINE_FUZZ`` (read here,
in the test module): ``quick`` (default, the whole file in about a minute, for
``make test``) and ``long`` (30 times the examples, for ``make fuzz``: 18 minutes on two busy cores).
"""

from __future__ import annotations

import io
import json
import math
import os
import struct
import time
import wave
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_pipeline.discovery import DOCX_MIME, sniff_file
from memory_pipeline.errors import ExtractionError
from memory_pipeline.extraction import ExtractionWorker, MediaOptions, extract
from memory_pipeline_tests import sample_media as sm

# A failing example's repr can be a whole mutated file: hypothesis warns that it is long, and that is fine.
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")

FUZZ_ENV = "MEMORY_PIPELINE_FUZZ"
_COMMON = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck))
settings.register_profile("fuzz-quick", max_examples=80, **_COMMON)
settings.register_profile("fuzz-long", max_examples=2400, **_COMMON)
PROFILE = settings.get_profile(f"fuzz-{os.environ.get(FUZZ_ENV, 'quick')}")

# Tight limits, so a hang costs seconds: the contract is that the worker kills it there.
OPTIONS = MediaOptions(timeout_seconds=4, max_extract_seconds=8, max_extract_mb=768, pdf_max_pages=5, max_segments=2_000, max_chars=200_000)
SLACK_SECONDS = 3.0


def examples(weight: float) -> settings:
    """The profile, with this test's share of examples (slow media formats get fewer)."""
    return settings(PROFILE, max_examples=max(1, round(PROFILE.max_examples * weight)))


# --- seeds: one valid file of each library-parsed format ---------------------------------------------


def _wav(seconds: float = 0.6) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"".join(struct.pack("<h", int(8000 * math.sin(i / 8))) for i in range(int(16000 * seconds))))
    return buf.getvalue()


@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> dict[str, bytes]:
    d = tmp_path_factory.mktemp("seeds")
    sm.text_image(d / "s.png", ["Fuzz 42"], size=(160, 60), fmt="PNG")
    sm.text_image(d / "s.jpg", ["Fuzz 42"], size=(160, 60), fmt="JPEG")
    sm.text_pdf(d / "s.pdf", [["Fuzzing page one"], ["Page two"]])
    sm.docx_file(d / "s.docx", "Title", ["A paragraph."], [["a", "b"], ["c", "d"]])
    with zipfile.ZipFile(d / "s.docx") as zf:
        document_xml = zf.read("word/document.xml")
    return {
        "png": (d / "s.png").read_bytes(),
        "jpeg": (d / "s.jpg").read_bytes(),
        "pdf": (d / "s.pdf").read_bytes(),
        "docx": (d / "s.docx").read_bytes(),
        "document_xml": document_xml,
        "wav": _wav(),
    }


@pytest.fixture(scope="module")
def worker():
    w = ExtractionWorker()
    yield w
    w.close()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


# --- the property ------------------------------------------------------------------------------------


def check(workdir: Path, name: str, data: bytes, modality: str, mime: str, worker: ExtractionWorker) -> None:
    """Sniffing never raises; extraction returns segments or raises ExtractionError, within the deadline."""
    path = workdir / name
    path.write_bytes(data)
    sniff_file(str(path), name, workdir)
    start = time.monotonic()
    try:
        segments = extract(str(path), modality, mime, OPTIONS, workdir, worker=worker)
    except ExtractionError as err:
        assert err.reason and err.path == str(path)
    else:
        assert isinstance(segments, list) and isinstance(segments.warning, str)
        assert len(segments) <= OPTIONS.max_segments and sum(len(s.text) for s in segments) <= OPTIONS.max_chars
        for s in segments:
            assert isinstance(s.text, str) and s.text.strip() and "\x00" not in s.text and "\x1b" not in s.text + s.label
            # What Arrow, the table and every record must store: a lone surrogate (a JSON "\ud800"
            # escape) passed extraction and failed the whole run where the shard's frame was built.
            (s.text + s.label).encode("utf-8")
    elapsed = time.monotonic() - start
    assert elapsed < OPTIONS.hard_seconds() + SLACK_SECONDS, f"{name}: {elapsed:.1f}s"


# --- strategies -------------------------------------------------------------------------------------


@st.composite
def mutated(draw, seed: bytes) -> bytes:
    """The seed with a few byte-level mutations: what a damaged download or a hostile file looks like."""
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 6))):
        if not data:
            data += draw(st.binary(min_size=1, max_size=32))
            continue
        i = draw(st.integers(0, len(data) - 1))
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "duplicate"]))
        if op == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            data[i] = draw(st.sampled_from([0x00, 0xFF, 0x7F, 0x80, 0x3C, 0x30, 0x39, 0x25]))
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=64))
        elif op == "delete":
            del data[i : i + draw(st.integers(1, 512))]
        elif op == "truncate":
            del data[i:]
        else:
            n = draw(st.integers(1, 4096))
            data[i:i] = data[i : i + n] * draw(st.integers(1, 8))
    return bytes(data)


# Any code point, lone surrogates included (hypothesis leaves them out by default): ``json.dumps``
# writes one as a "\ud800" escape, which a transcript or a JSON file may hold.
# (Drawn apart: merged into one alphabet, 2,048 surrogates among 1.1M code points hardly ever come up.)
_ANY_TEXT = st.lists(st.characters() | st.characters(categories=["Cs"]).map(str) | st.sampled_from(["\ud800", "\udfff", "\udc80"]), max_size=40).map("".join)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40) | _ANY_TEXT,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10) | _ANY_TEXT, children, max_size=5),
    max_leaves=20,
)
_RECORD = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "human", "", "model"])},
    optional={
        "content": st.one_of(
            st.text(max_size=200),
            _ANY_TEXT,
            st.lists(st.one_of(st.text(max_size=40), st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=80)})), max_size=4),
            _JSON,
        ),
        "timestamp": st.one_of(st.text(max_size=30), st.integers(), st.floats(), st.none()),
        "message": _JSON,
        "type": st.sampled_from(["message", "session", "assistant"]),
    },
)
_JSONL_LINE = st.one_of(_RECORD.map(json.dumps), _JSON.map(json.dumps), st.text(max_size=80))
_MARKUP_PIECES = list("<>/&;!-=\"' \n\tabcdpx#[]?x0") + [
    "<p>", "</p>", "<script>", "<title>", "<!--", "-->", "&amp;", "&#x0;", "&#99999999;", "<![CDATA[",
    "<!DOCTYPE x [<!ENTITY e 'ee'>]>", "&e;", "\x00", "\x1b[2J", "<a href='x'>", "<w:p>", "é",
]  # fmt: skip
_MARKUP = st.lists(st.sampled_from(_MARKUP_PIECES), max_size=150).map("".join)
_CSV = st.text(alphabet=st.sampled_from(list(",;|\t\"'\n\r abc123") + ["\x00", "é", "\u2028"]), max_size=400)


# --- the formats we parse ourselves ------------------------------------------------------------------


@examples(2.5)
@given(data=st.one_of(st.binary(max_size=2000), st.text(max_size=2000).map(str.encode)))
def test_fuzz_markdown_and_text(workdir, worker, data):
    check(workdir, "note.md", data, "markdown", "text/markdown", worker)


@examples(2.5)
@given(lines=st.lists(_JSONL_LINE, max_size=30), raw=st.binary(max_size=64))
def test_fuzz_session_jsonl(workdir, worker, lines, raw):
    check(workdir, "s.jsonl", "\n".join(lines).encode() + raw, "session", "application/x-ndjson", worker)


@examples(1)
@given(text=_MARKUP)
def test_fuzz_html(workdir, worker, text):
    check(workdir, "p.html", ("<!doctype html><html>" + text).encode(), "document", "text/html", worker)


@examples(1)
@given(text=_CSV)
def test_fuzz_csv(workdir, worker, text):
    check(workdir, "t.csv", text.encode(), "document", "text/csv", worker)


@examples(1)
@given(data=st.one_of(_JSON.map(lambda v: json.dumps(v).encode()), st.binary(max_size=200), _MARKUP.map(str.encode)))
def test_fuzz_json(workdir, worker, data):
    check(workdir, "d.json", data, "document", "application/json", worker)


@examples(1)
@given(text=_MARKUP)
def test_fuzz_xml(workdir, worker, text):
    check(workdir, "d.xml", ("<?xml version='1.0'?>" + text).encode(), "document", "application/xml", worker)


# --- the formats libraries parse: mutated valid files --------------------------------------------------


@examples(1)
@given(data=st.data())
def test_fuzz_docx_zip(workdir, worker, seeds, data):
    check(workdir, "d.docx", data.draw(mutated(seeds["docx"])), "document", DOCX_MIME, worker)


@examples(1)
@given(data=st.data())
def test_fuzz_docx_xml(workdir, worker, seeds, data):
    """A sound zip around a damaged document.xml: the XML reader's turn."""
    xml = data.draw(mutated(seeds["document_xml"]))
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(seeds["docx"])) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, xml if info.filename == "word/document.xml" else src.read(info.filename))
    check(workdir, "x.docx", out.getvalue(), "document", DOCX_MIME, worker)


@examples(0.75)
@given(data=st.data())
def test_fuzz_pdf(workdir, worker, seeds, data):
    check(workdir, "d.pdf", data.draw(mutated(seeds["pdf"])), "pdf", "application/pdf", worker)


@examples(0.3)
@given(data=st.data(), fmt=st.sampled_from(["png", "jpeg"]))
def test_fuzz_images(workdir, worker, seeds, data, fmt):
    check(workdir, f"i.{fmt}", data.draw(mutated(seeds[fmt])), "image", f"image/{fmt}", worker)


@examples(0.25)
@given(data=st.data())
def test_fuzz_wav(workdir, worker, seeds, data):
    check(workdir, "a.wav", data.draw(mutated(seeds["wav"])), "audio", "audio/wav", worker)
