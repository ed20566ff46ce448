"""Property tests for chunking: any input chunks without error, every chunk fits the embedding
model's input limit, no character is lost, and every chunk of a file has its own index.

Inputs are hypothesis-built: any unicode, punctuation runs and table rows of 100 to 20,000
characters, repetition, very long lines, CJK, emoji, mixed newlines (``\\n``, ``\\r\\n``, ``\\r``),
NUL and control characters; chunked as markdown, plain text, transcript messages (with labels)
and media parts (with a kind), against the local model's real tokenizer and against deliberately
hostile counters (one token per character, one per UTF-8 byte).

Profiles, chosen by the environment variable ``MEMORY_PIPELINE_FUZZ`` (read here, in the test
module, as the extractor fuzz tests do): ``quick`` (default, the file in about a minute) and
``long`` (25 times the examples).
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import time
from collections.abc import Callable, Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_pipeline.chunking import _MAX_TOKEN_CHARS, _encoding, chunk_segments, locator_for
from memory_pipeline.models import Chunk, Segment
from memory_pipeline.providers.local import LocalProvider

FUZZ_ENV = "MEMORY_PIPELINE_FUZZ"
_COMMON = dict(deadline=None, database=None, suppress_health_check=list(HealthCheck))
settings.register_profile("chunking-quick", max_examples=60, **_COMMON)
settings.register_profile("chunking-long", max_examples=1500, **_COMMON)
PROFILE = settings.get_profile(f"chunking-{os.environ.get(FUZZ_ENV, 'quick')}")


def examples(weight: float) -> settings:
    """The profile, with this test's share of examples (transcripts of several documents cost more)."""
    return settings(PROFILE, max_examples=max(1, round(PROFILE.max_examples * weight)))


Counter = Callable[[Sequence[str]], list[int]]

# Labels are written in private-use characters, which generated text never holds: taking them
# out of a chunk leaves exactly the input's characters, wherever a split cut a label.
_LABEL_CHARS = re.compile("[\ue000-\ue0ff]")


@pytest.fixture(scope="module")
def provider() -> LocalProvider:
    return LocalProvider()


def per_char(texts: Sequence[str]) -> list[int]:
    """Hostile: one token per character (plus [CLS] and [SEP]), ~4x what cl100k counts for prose."""
    return [len(t) + 2 for t in texts]


def per_byte(texts: Sequence[str]) -> list[int]:
    """Hostile: one token per UTF-8 byte, so an emoji is 4 and CJK 3."""
    return [len(t.encode()) + 2 for t in texts]


def counter_and_limit(provider: LocalProvider, name: str, limit: int) -> tuple[Counter, int]:
    if name == "local":
        return provider.count_tokens, provider.max_input_tokens
    return (per_char if name == "per_char" else per_byte), limit


def squash(text: str) -> str:
    """The non-whitespace characters of ``text`` (whitespace as ``str.isspace`` has it), labels removed."""
    return "".join(_LABEL_CHARS.sub("", text).split())


# --- the properties --------------------------------------------------------------------------------


def assert_nothing_lost(source: str, chunks: Sequence[Chunk], overlap: int) -> None:
    """Every non-whitespace character of the input is in the chunks, in order, and nothing else is.

    Let S be the input's non-whitespace characters and s_i chunk i's, labels removed (the
    chunker adds them). Chunk i must be a stretch of S, ``s_i == S[p_i : p_i + len(s_i)]``, that
    starts no later than where the chunks before it reach, ``p_i <= E_(i-1)`` (``E_(-1) = 0``,
    ``E_i = max(E_(i-1), p_i + len(s_i))``), and at the end ``E == len(S)``. Removing from each
    chunk what the chunks before it already hold (the overlap) leaves ``S[E_(i-1) : E_i]``: those
    pieces concatenate to exactly S, so no character is lost, none is invented, and none is out of
    order. Without overlap the check is stricter still: S is exactly the concatenation of the s_i.
    (With overlap a chunk may hold only text already covered: re-splitting a chunk that began with
    the previous chunk's last lines, to fit the model, can cut off a piece made of those lines.)

    The p_i are chosen greedily, the occurrence reaching furthest; that finds them whenever they
    exist, because reaching further only ever allows more positions for the next chunk.
    """
    s = squash(source)
    pieces = [squash(c.text) for c in chunks]
    if overlap == 0:
        assert "".join(pieces) == s
        return
    reach = 0
    for i, piece in enumerate(pieces):
        start = s.rfind(piece, 0, reach + len(piece))
        assert start >= 0, f"chunk {i} is not a stretch of the input that continues the chunks before it"
        reach = max(reach, start + len(piece))
    assert reach == len(s), f"the chunks stop at {reach} of {len(s)} characters"


def assert_fits(chunks: Sequence[Chunk], count: Counter, limit: int) -> None:
    """The model counts every chunk's embed_text within its limit, as chunk.model_tokens says."""
    counts = count([c.embed_text for c in chunks])
    assert [c.model_tokens for c in chunks] == counts
    assert max(counts, default=0) <= limit


def assert_distinct(chunks: Sequence[Chunk], modality: str) -> None:
    """Indexes are the positions 0..n-1, so (locator, text, index) names one chunk even where pieces
    of one long line share locator and text."""
    assert [c.index for c in chunks] == list(range(len(chunks)))
    keys = {(locator_for(modality, c.line_start, c.line_end, c.kind), c.embed_text, c.index) for c in chunks}
    assert len(keys) == len(chunks)


def check(modality: str, segments: list[Segment], source: str, budget: int, overlap: int, count: Counter, limit: int, title: str = "") -> list[Chunk]:
    chunks = chunk_segments(
        modality, segments, budget=budget, overlap=overlap, model_limit=limit, count_model=count, title=title
    )  # fmt: skip
    assert_fits(chunks, count, limit)
    assert_nothing_lost(source, chunks, overlap)
    assert_distinct(chunks, modality)
    return chunks


# --- inputs ----------------------------------------------------------------------------------------

_char = st.characters(exclude_categories=("Cs", "Co"))  # no surrogates; private use is for labels
_any_text = st.text(_char, max_size=200)
_runs = st.builds(lambda ch, n: ch * n, st.sampled_from(list("-=.*#_")), st.integers(100, 20_000))
_table = st.builds(lambda cell, n: (cell * n)[:n] + "|", st.sampled_from(["|---", "| --- ", "|:--:", "| a | b "]), st.integers(100, 20_000))
_repeated = st.builds(lambda s, n: (s * n)[:20_000], st.text(_char, min_size=1, max_size=12), st.integers(2, 3000))
_cjk = st.builds(lambda s, n: s * n, st.text(st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF), min_size=1, max_size=40), st.integers(1, 300))
_emoji = st.lists(st.sampled_from(["🙂", "🚀", "👩\u200d👩\u200d👧\u200d👦", "🇫🇷", "👍🏽", "\u2764\ufe0f", "e\u0301"]), max_size=2000).map("".join)
_words = st.builds(lambda w, n: (w + " ") * n, st.sampled_from(["bigword", "x_1", "数据", "🙂", "--", "|---|"]), st.integers(100, 3000))
_unbroken = st.builds(lambda c, n: c * n, st.sampled_from(["x", "0", "🙂", "中", "ab", "\x00"]), st.integers(100, 20_000))
_control = st.text(st.sampled_from("\x00\x01\x07\x08\x0b\x0c\x1b\x1c\x1f\x7f\x85\xa0\u2028\u2029\ufeff\u200bab "), max_size=200)
_heading = st.builds(lambda level, title: "#" * level + " " + title, st.integers(1, 6), st.one_of(_any_text, _runs, _unbroken))
_line = st.one_of(_any_text, _runs, _table, _repeated, _cjk, _emoji, _words, _unbroken, _control, _heading, st.sampled_from(["", "```", "~~~"]))
_newline = st.sampled_from(["\n", "\r\n", "\r"])
_document = st.lists(st.tuples(_line, _newline), min_size=1, max_size=6).map(lambda parts: "".join(p + nl for p, nl in parts))
_label = st.text(st.sampled_from([chr(c) for c in range(0xE000, 0xE020)] + [" "]), min_size=1, max_size=30)
_kinds = st.sampled_from(["media", "note", "exif", "ocr", "page", "time", "frame", "para", "row", "text"])

# (counter, limit for the hostile ones, budget, overlap): budgets from the smallest the config allows
# to the pipeline's default for the local model (0.8 of its 256).
_config = st.tuples(
    st.sampled_from(["local", "per_char", "per_byte"]),
    st.sampled_from([64, 256]),
    st.sampled_from([(32, 0), (32, 8), (64, 16), (204, 0), (204, 51)]),
)


# --- property tests --------------------------------------------------------------------------------


@examples(2.5)
@given(doc=_document, modality=st.sampled_from(["markdown", "text"]), config=_config)
def test_property_any_document(provider, doc, modality, config):
    """Markdown and plain text: never raises, fits the model, loses nothing, distinct indexes."""
    name, limit, (budget, overlap) = config
    count, limit = counter_and_limit(provider, name, limit)
    n = doc.count("\n") + 1
    check(modality, [Segment(doc, 1, n)], doc, budget, overlap, count, limit)


@examples(0.7)
@given(
    messages=st.lists(st.tuples(st.one_of(st.just(""), _label), _document), min_size=1, max_size=5),
    config=_config,
)
def test_property_any_transcript(provider, messages, config):
    """Transcript messages with (or without) labels: the same properties; labels are not input."""
    name, limit, (budget, overlap) = config
    count, limit = counter_and_limit(provider, name, limit)
    segments = [Segment(text, 2 * i + 1, 2 * i + 1, label) for i, (label, text) in enumerate(messages)]
    check("session", segments, "".join(text for _, text in messages), budget, overlap, count, limit)


@examples(1)
@given(
    parts=st.lists(st.tuples(_kinds, st.one_of(st.just(""), _label), _document), min_size=1, max_size=5),
    title=st.sampled_from(["", "photo.jpg", "a very long file name " * 8]),
    config=_config,
)
def test_property_any_media_parts(provider, parts, title, config):
    """Media parts (segments with a kind): the same properties, per run of one kind."""
    name, limit, (budget, overlap) = config
    count, limit = counter_and_limit(provider, name, limit)
    segments = [Segment(text, i + 1, i + 1, label, kind) for i, (kind, label, text) in enumerate(parts)]
    check("image", segments, "".join(text for _, _, text in parts), budget, overlap, count, limit, title=title)


def test_no_cl100k_token_is_longer_than_the_bound():
    """The chunker skips counting texts longer than max_tokens * _MAX_TOKEN_CHARS: no token is longer."""
    enc = _encoding()
    longest = 0
    for token in range(enc.n_vocab):
        try:
            longest = max(longest, len(enc.decode_single_token_bytes(token)))
        except KeyError:  # the ids between the ordinary and the special tokens are unused
            continue
    assert longest <= _MAX_TOKEN_CHARS


def test_a_counter_nothing_satisfies_does_not_fail_the_file():
    """Chunking never raises, even when the counter puts every text over the limit: the chunks it
    cannot fit are kept (the model would truncate them) and nothing is lost."""
    text = "# Heading\nshort line\n" + "-" * 300 + "\nlast words here\n"
    chunks = chunk_segments(
        "markdown", [Segment(text, 1, 4)], budget=64, overlap=16, model_limit=256, count_model=lambda ts: [10**6] * len(ts)
    )  # fmt: skip
    assert chunks and all(c.model_tokens == 10**6 for c in chunks)
    assert_nothing_lost(text, chunks, 16)
    assert_distinct(chunks, "markdown")


# --- regressions: issue 11 -------------------------------------------------------------------------


def chunk_note(text: str, count: Counter, limit: int = 256, budget: int = 204, overlap: int = 51) -> list[Chunk]:
    """A markdown note chunked as the pipeline does for the local model (budget 0.8 of its limit)."""
    return check("markdown", [Segment(text, 1, text.count("\n") + 1)], text, budget, overlap, count, limit)


@pytest.mark.parametrize("length", [254, 260, 5000])
@pytest.mark.parametrize("char", list("-=.*#_"))
def test_punctuation_run_fits_the_local_model(provider, char, length):
    """A line of 254+ '-', '=', '.', '*', '#' or '_' used to raise "chunking could not fit the model's
    input limit": cl100k counts 16 to 64 of them as one token, the model counts each."""
    chunks = chunk_note(f"# Notes\nintro line\n{char * length}\nlast line\n", provider.count_tokens)
    assert any(char * 100 in c.text for c in chunks)


@pytest.mark.parametrize("overlap", [0, 51])
def test_punctuation_heading_longer_than_the_model_limit(provider, overlap):
    """A heading of dashes is a breadcrumb over the model's whole input: chunks under it keep its end."""
    text = f"# {'-' * 600}\n" + "\n".join(f"note {i} under the dashes" for i in range(40)) + f"\n{'=' * 300}\n"
    chunks = chunk_note(text, provider.count_tokens, overlap=overlap)
    assert len(chunks) > 1


_COLLIDING_LINES = {
    "bigword x3000": "bigword " * 3000,
    "20,000 x": "x" * 20_000,
    "repeated CJK": "数据库备份策略" * 3000,
    "emoji run": "🙂" * 5000,
    "emoji ZWJ run": "👩\u200d👩\u200d👧\u200d👦" * 2000,
    "table row": "|---" * 5000 + "|",
    "spaced table row": "| --- " * 4000 + "|",
}


@pytest.mark.parametrize("name", list(_COLLIDING_LINES))
@pytest.mark.parametrize("counter", ["local", "per_byte"])
def test_pieces_of_one_long_line_have_distinct_indexes(provider, name, counter):
    """Pieces of one long line share locator (L2-L2) and often text, so the chunk id needs the index.

    The ids themselves are made in the pipeline; the chunker's part is a distinct index per chunk,
    every piece within the model's limit, and nothing lost.
    """
    count, limit = counter_and_limit(provider, counter, 128)
    chunks = chunk_note(f"# Title\n{_COLLIDING_LINES[name]}\n", count, limit=limit, budget=min(204, int(limit * 0.8)), overlap=32)
    assert len(chunks) > 3


def _json_line(size: int) -> str:
    """A transcript-like JSON line: repeated identical records, then an inline base64 image (no spaces)."""
    rng = random.Random(11)
    record = {"role": "assistant", "content": [{"type": "text", "text": "Moved the orders database to PostgreSQL."}]}
    records = [record] * (size // 2 // len(json.dumps(record)))
    image = base64.b64encode(rng.randbytes(size * 3 // 8)).decode()
    return json.dumps({"messages": records, "image": {"media_type": "image/png", "data": image}})


@pytest.mark.parametrize(("modality", "size"), [("markdown", 5_000_000), ("session", 1_000_000)])
def test_long_json_line_chunks_in_seconds(modality, size):
    """A 5 MB single line, half of it without spaces, is cut in time linear in its length (it was
    quadratic: every piece bisected the whole rest of the line with full cl100k counts: hours)."""
    line = _json_line(size)
    segments = [Segment(line, 1, 1, "\ue000\ue001" if modality == "session" else "")]
    started = time.monotonic()
    chunks = check(modality, segments, line, 204, 51, per_char, 256)
    elapsed = time.monotonic() - started
    assert len(chunks) > size // 500
    assert elapsed < 120, f"{elapsed:.0f} s"
