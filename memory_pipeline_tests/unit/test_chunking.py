"""Unit tests for memory_pipeline.chunking: budgets, line alignment, headings, splitting, overlap, stability."""

from __future__ import annotations

import base64
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_pipeline.chunking import breadcrumb_cap, chunk_segments, count_tokens, locator_for
from memory_pipeline.models import Segment

WORDS = "alpha beta gamma delta memory vector search note agent decided lance dagster chunk token the a of and".split()


def chunk_md(text: str, budget: int = 128, overlap: int = 0, **kw):
    """Chunk a markdown document given as one segment, as the pipeline does."""
    n = text.count("\n") + (0 if text.endswith("\n") else 1)
    return chunk_segments("markdown", [Segment(text, 1, n)], budget=budget, overlap=overlap, **kw)


def sentence(rng: random.Random, lo: int = 3, hi: int = 25) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def generated_doc(seed: int = 1, sections: int = 6) -> list[str]:
    """Lines of a nested-heading markdown note with short paragraphs and blank lines."""
    rng = random.Random(seed)
    lines: list[str] = []
    for s in range(sections):
        lines.append(f"# Section {s}")
        for sub in range(3):
            lines += ["", f"## Sub {s}.{sub}"]
            for _ in range(rng.randint(3, 12)):
                lines.append(sentence(rng))
                if rng.random() < 0.3:
                    lines.append("")
    return lines


def squash(text: str) -> str:
    return "".join(text.split())


BUDGETS = [(64, 0), (64, 16), (128, 32), (400, 80), (1000, 100)]


@pytest.mark.parametrize(("budget", "overlap"), BUDGETS)
def test_chunks_within_budget_and_ordered(budget, overlap):
    """Every chunk's embed_text (breadcrumb included) fits the budget; indexes and ranges are sane."""
    lines = generated_doc()
    chunks = chunk_md("\n".join(lines) + "\n", budget, overlap)
    assert chunks and [c.index for c in chunks] == list(range(len(chunks)))
    for c in chunks:
        assert count_tokens(c.embed_text) <= budget
        assert 1 <= c.line_start <= c.line_end <= len(lines)
        assert c.text.strip() and c.text == c.text.strip("\n")
    assert [c.line_start for c in chunks] == sorted(c.line_start for c in chunks)


@pytest.mark.parametrize(("budget", "overlap"), [(128, 0), (128, 32), (400, 80)])
def test_chunks_are_line_aligned(budget, overlap):
    """With no over-long lines, a chunk's text is exactly its source lines line_start..line_end."""
    lines = generated_doc(seed=2)
    assert max(count_tokens(line) for line in lines) < 40
    for c in chunk_md("\n".join(lines) + "\n", budget, overlap):
        assert c.text == "\n".join(lines[c.line_start - 1 : c.line_end])


def test_no_content_lost_without_overlap():
    """With overlap 0 the chunks, in order, hold every character of the document."""
    text = "\n".join(generated_doc(seed=3)) + "\n"
    assert "".join(squash(c.text) for c in chunk_md(text, 64, 0)) == squash(text)


def test_heading_breadcrumb():
    """Chunks under nested headings carry the breadcrumb of their enclosing headings."""
    body = "\n".join(f"decision {i}: we chose lancedb because it is embedded" for i in range(30))
    text = f"# Project\nintro line\n## Decisions\n{body}\n# Other\nunrelated line\n"
    chunks = chunk_md(text, budget=64)
    by_line = {c.line_start: c for c in chunks}
    deep = [c for c in chunks if c.line_start > 3 and c.line_end < 34]
    assert deep and all(c.heading == "Project > Decisions" for c in deep)
    assert all(c.embed_text.startswith("Project > Decisions\n") for c in deep)
    assert by_line[1].heading == ""
    # A chunk spanning into the next section keeps the breadcrumb of its first line; the heading line is in the text.
    assert chunks[-1].text.endswith("# Other\nunrelated line")


@pytest.mark.parametrize("fence", ["```", "~~~", "```python", "  ```"])
def test_headings_inside_fences_are_not_headings(fence):
    """'# comment' lines inside a fenced code block do not change the breadcrumb."""
    filler = "\n".join(f"note line {i} with a few words of content" for i in range(12))
    close = fence.strip()[:3]
    text = f"# Guide\n{fence}\n# just a comment\n## another\n{close}\n{filler}\n"
    chunks = chunk_md(text, budget=40)
    assert len(chunks) > 2
    assert {c.heading for c in chunks[1:]} == {"Guide"}


def test_nested_fence_example_keeps_breadcrumb():
    """A 4-backtick fence showing a ``` python block stays code to its own closing fence."""
    filler = "\n".join(f"note line {i} with a few words of content" for i in range(12))
    text = f"# Guide\n````markdown\n```python\n# not a heading\n```\n````\n{filler}\n"
    assert {c.heading for c in chunk_md(text, budget=40)[1:]} == {"Guide"}


def test_heading_title_ending_in_hash():
    """'## Learning C#' keeps its '#': only a space-separated closing sequence is stripped."""
    filler = "\n".join(f"note line {i} with a few words of content" for i in range(12))
    chunks = chunk_md(f"# Languages\n## Learning C#\n{filler}\n", budget=40)
    assert chunks[-1].heading == "Languages > Learning C#"


def test_no_heading_only_chunks():
    """'# 2026-11-02' followed by a long '## Meeting' section is not emitted as a chunk on its own."""
    body = "\n".join(f"point {i}: we chose lancedb for vectors because it is embedded" for i in range(60))
    chunks = chunk_md(f"# 2026-11-02\n## Meeting with Ana\n{body}\n", budget=400)
    heading_only = [c.text for c in chunks if all(line.startswith("#") for line in c.text.split("\n"))]
    assert heading_only == []


def _long_lines() -> dict[str, str]:
    rng = random.Random(7)
    return {
        "5000 words": " ".join(rng.choice(WORDS) for _ in range(5000)),
        "3000 CJK chars": "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(3000)),
        "10k base64": base64.b64encode(rng.randbytes(7500)).decode(),
    }


@pytest.mark.parametrize("budget", [64, 400])
@pytest.mark.parametrize("name", list(_long_lines()))
def test_long_line_split_within_budget_without_loss(name, budget):
    """One huge line is split into pieces that fit the budget and concatenate back to the line."""
    line = _long_lines()[name]
    chunks = chunk_md(f"# Title\n{line}\n", budget, 0)
    assert len(chunks) > 1
    assert all(count_tokens(c.embed_text) <= budget for c in chunks)
    assert all(c.heading == "Title" for c in chunks[1:])
    assert all(c.line_start == c.line_end == 2 for c in chunks[1:])
    rebuilt = "".join(c.text.replace("\n", "") for c in chunks)
    assert rebuilt == "# Title" + line


def test_overlap_shares_trailing_lines():
    """Consecutive chunks of one long section share whole lines, at most `overlap` tokens of them."""
    lines = [f"fact {i}: the agent noted item {i} in the log" for i in range(80)]
    chunks = chunk_md("\n".join(lines) + "\n", budget=96, overlap=32)
    assert len(chunks) > 3
    for prev, nxt in zip(chunks, chunks[1:]):
        shared = lines[nxt.line_start - 1 : prev.line_end]
        assert shared, "no overlap between consecutive chunks"
        assert prev.text.endswith("\n".join(shared)) and nxt.text.startswith("\n".join(shared))
        assert sum(count_tokens(s) + 1 for s in shared) <= 32
    assert all(a.line_start < b.line_start and a.line_end < b.line_end for a, b in zip(chunks, chunks[1:]))


@pytest.mark.parametrize(("budget", "overlap"), [(64, 16), (128, 32), (400, 80)])
def test_appending_changes_only_last_chunks(budget, overlap):
    """Appending a paragraph to a long note leaves every chunk before the last one identical."""
    rng = random.Random(5)
    lines = ["# Journal"]
    for i in range(200):
        if i % 25 == 0:
            lines += ["", f"## Day {i}"]
        lines.append(sentence(rng, 3, 30))
    before = chunk_md("\n".join(lines) + "\n", budget, overlap)
    extra = "\n\nAppended paragraph about " + " ".join(WORDS * 4) + "\n"
    after = chunk_md("\n".join(lines) + extra, budget, overlap)
    assert len(before) > 5
    assert after[: len(before) - 1] == before[:-1]
    n_after = len(lines) + 2
    assert after[-1].line_end == n_after and squash(after[-1].text).endswith("tokentheaofand")


def count_chars(texts):
    return [len(t) for t in texts]


@pytest.mark.parametrize("limit", [120, 200, 300, 600])
def test_model_limit_enforced(limit):
    """Chunks are re-split until the model's own counter says they fit; nothing is lost."""
    rng = random.Random(3)
    lines = ["# Project", "## Decisions"] + [sentence(rng, 3, 60) for _ in range(80)]
    text = "\n".join(lines) + "\n"
    for overlap in (0, 16):
        chunks = chunk_md(text, 128, overlap, model_limit=limit, count_model=count_chars)
        assert all(len(c.embed_text) <= limit for c in chunks)
        for n in range(1, len(lines) + 1):
            assert any(c.line_start <= n <= c.line_end for c in chunks), f"line {n} not covered"
        if overlap == 0:
            assert "".join(squash(c.text) for c in chunks) == squash(text)
    unlimited = chunk_md(text, 128, 0)
    assert len(chunk_md(text, 128, 0, model_limit=limit, count_model=count_chars)) >= len(unlimited)


def test_session_chunks_keep_labels_and_jsonl_lines():
    """Transcript chunks hold whole labelled messages and the JSONL lines they came from."""
    segs = [
        Segment(
            f"message {i} about the expense receipts and where they are",
            2 * i + 1,
            2 * i + 1,
            f"[2026-11-02 10:{i:02d}] {'user' if i % 2 == 0 else 'assistant'}:",
        )
        for i in range(30)
    ]
    chunks = chunk_segments("session", segs, budget=96, overlap=0)
    assert len(chunks) > 2
    for c in chunks:
        inside = [s for s in segs if f"{s.label} {s.text}" in c.text]
        assert inside and c.text == "\n".join(f"{s.label} {s.text}" for s in inside)
        assert (c.line_start, c.line_end) == (inside[0].line_start, inside[-1].line_end)
        assert c.heading == "" and count_tokens(c.embed_text) <= 96
    assert locator_for("session", chunks[0].line_start, chunks[0].line_end) == f"jsonl:1-{chunks[0].line_end}"


def test_session_long_message_split_keeps_label():
    """A message longer than the budget is split; every piece carries the label and the message's line."""
    rng = random.Random(9)
    seg = Segment("\n".join(sentence(rng, 20, 40) for _ in range(30)), 7, 7, "[2026-11-02 10:15] user:")
    chunks = chunk_segments("session", [seg], budget=64, overlap=0)
    assert len(chunks) > 3
    for c in chunks:
        assert (c.line_start, c.line_end) == (7, 7) and count_tokens(c.embed_text) <= 64
        assert all(line.startswith("[2026-11-02 10:15] user: ") for line in c.text.split("\n"))
    rebuilt = "".join(squash(line.removeprefix(seg.label)) for c in chunks for line in c.text.split("\n"))
    assert rebuilt == squash(seg.text)


@pytest.mark.parametrize(
    ("modality", "start", "end", "expected"),
    [("markdown", 12, 40, "L12-L40"), ("text", 1, 1, "L1-L1"), ("session", 5, 9, "jsonl:5-9")],
)
def test_locator_for(modality, start, end, expected):
    """Locators read L<a>-L<b> for text and jsonl:<a>-<b> for transcripts."""
    assert locator_for(modality, start, end) == expected


def test_small_budget_with_deep_breadcrumb_stays_within_budget():
    """At the smallest allowed budget (32), breadcrumb plus line still fits the budget."""
    text = (
        "# Project Alpha: rollout plan for the memory pipeline\n"
        "## Decisions we made in the November planning meeting\n"
        "### Storage layer and embedding cache choices\n"
    ) + "We chose LanceDB for the vectors and SQLite for the cache.\n" * 3
    assert max(count_tokens(c.embed_text) for c in chunk_md(text, 32, 0)) <= 32


_word = st.text(alphabet=st.sampled_from(list("abcdefghij xyz#`~-*_.,:;!?0123456789éü中文🙂\t")), max_size=12)
_line = st.one_of(
    st.builds(lambda lvl, w: "#" * lvl + " " + w, st.integers(1, 6), _word),
    st.sampled_from(["", "```", "~~~python", "   "]),
    st.lists(_word, max_size=30).map(" ".join),
    st.text(max_size=400).map(lambda s: s.replace("\n", " ").replace("\r", " ")),
)


# Budgets from the smallest the config allows.
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_line, min_size=1, max_size=50), st.sampled_from([(32, 0), (32, 8), (64, 16), (128, 0), (128, 32), (200, 50)]))
def test_property_random_markdown(lines, budget_overlap):
    """Random markdown-ish documents: chunks fit, ranges are valid, every content line is covered."""
    budget, overlap = budget_overlap
    text = "\n".join(lines)
    chunks = chunk_md(text, budget, overlap)
    for c in chunks:
        assert count_tokens(c.embed_text) <= budget
        assert 1 <= c.line_start <= c.line_end <= len(lines)
    for n, line in enumerate(lines, start=1):
        if line.strip():
            assert any(c.line_start <= n <= c.line_end for c in chunks), f"line {n} missing"
            if count_tokens(line) + 1 <= budget - breadcrumb_cap(budget) - 2:
                assert any(line in c.text for c in chunks if c.line_start <= n <= c.line_end)
    if overlap == 0:
        assert "".join(squash(c.text) for c in chunks) == squash(text)


def test_overlap_smaller_than_a_line_is_honoured():
    """tokens 64, overlap 16 over lines longer than 16 tokens: consecutive chunks still share the
    words at the end of the previous chunk, at most 16 tokens of them (issue 13)."""
    lines = [f"entry {i}: " + " ".join(f"alpha{i} beta{i} gamma{i}" for _ in range(4)) for i in range(30)]
    assert min(count_tokens(line) for line in lines) > 16
    chunks = chunk_md("\n".join(lines) + "\n", budget=64, overlap=16)
    assert len(chunks) > 3
    for prev, nxt in zip(chunks, chunks[1:]):
        first_line = nxt.text.split("\n")[0]
        assert prev.text.endswith(first_line), (prev.text[-60:], first_line)
        assert 0 < count_tokens(first_line) + 1 <= 16
        assert nxt.line_start == prev.line_end  # the shared words are on that line


def test_pieces_of_a_split_long_line_overlap():
    line = " ".join(f"w{j}" for j in range(600))
    chunks = chunk_md(line + "\n", budget=64, overlap=16)
    assert len(chunks) > 5
    for prev, nxt in zip(chunks, chunks[1:]):
        shared = nxt.text.split(" ")[:3]
        assert " ".join(shared) in prev.text[-80:], (prev.text[-40:], nxt.text[:40])
    # Without overlap the pieces still concatenate to the line.
    plain = chunk_md(line + "\n", budget=64, overlap=0)
    assert "".join(squash(c.text) for c in plain) == squash(line)


# The chunker's output on a fixed corpus, per CHUNKER_REVISION. When a change to chunking.py
# changes any chunk of any input, this test fails: bump CHUNKER_REVISION (so existing indexes are
# chunked again instead of mixing old and new chunks) and add the new digest under the new revision.
# (Revisions 1 and 2 were taken before the corpus gained its titled note.)
CHUNKER_GOLDEN = {
    "1": "9d752d4d4acf788d",
    "2": "2b221bcd87fcea40",
    "3": "887e991ae14aa3d7",
    "4": "137146c497f361e4",
    "5": "137146c497f361e4",
}  # 5: the input changed, not the chunker


def _golden_corpus_digest() -> str:
    import hashlib

    rng = random.Random(7)
    docs = ["\n".join(generated_doc(seed, sections=4)) for seed in range(1, 6)]
    docs.append("# Long\n" + " ".join(sentence(rng, 40, 60) for _ in range(30)) + "\nafter the long line\n")
    docs.append("```\n# not a heading\n```\n" + "-" * 300 + "\n| a | b |\n|---|---|\n" + "x" * 5000 + "\n")
    docs.append("Planning retreat\n\n" + "\n".join(sentence(rng, 10, 30) for _ in range(25)) + "\n")  # since revision 3: a title line
    docs.append(" ".join(sentence(random.Random(2), 40, 60) for _ in range(3)) + "\n\n\n")  # since revision 4: a long line, then blank lines
    h = hashlib.sha256()
    for doc in docs:
        for budget, overlap in BUDGETS:
            for c in chunk_md(doc, budget=budget, overlap=overlap):
                h.update(repr((c.index, c.text, c.heading, c.line_start, c.line_end, c.tokens)).encode())
    session = [Segment(f"**user**: {sentence(rng)}\n**assistant**: {sentence(rng, 30, 90)}", i + 1, i + 1) for i in range(20)]
    for c in chunk_segments("session", session, budget=64, overlap=16):
        h.update(repr((c.index, c.text, c.heading, c.line_start, c.line_end)).encode())
    return h.hexdigest()[:16]


def test_chunker_output_is_pinned_to_its_revision():
    from memory_pipeline.chunking import CHUNKER_REVISION

    digest = _golden_corpus_digest()
    assert CHUNKER_GOLDEN.get(CHUNKER_REVISION) == digest, (
        f"the chunker's output changed (digest {digest}): bump CHUNKER_REVISION in chunking.py and add the digest to CHUNKER_GOLDEN under the new revision"
    )


def test_chunker_revision_changes_the_fingerprint_not_the_chunk_ids(monkeypatch):
    from pathlib import Path

    from memory_pipeline import changes
    from memory_pipeline.changes import EmbeddingIdentity
    from memory_pipeline.settings import Settings

    settings = Settings(data_dir=Path("/d"), sources=())
    ident = EmbeddingIdentity(provider="local", model="m", dims=384, provider_key="local:m", max_input_tokens=256)
    fp, cid = changes.fingerprint(settings, ident), changes.chunk_id("s", "a.md", "L1-2", "h")
    monkeypatch.setattr(changes, "CHUNKER_REVISION", "next")
    assert changes.fingerprint(settings, ident) != fp  # every file is chunked again
    assert changes.chunk_id("s", "a.md", "L1-2", "h") == cid  # unchanged chunks keep their ids


# --- a note's title line ------------------------------------------------------------------


def _titled(title: str, n: int = 30) -> str:
    body = "\n".join(f"finding {i}: the assay showed a measurable change in the samples" for i in range(n))
    return f"{title}\n\n{body}\n"


@pytest.mark.parametrize("modality", ["markdown", "text"])
def test_a_notes_title_line_heads_the_chunks_below_it(modality):
    """A short first line followed by a blank line is the note's title: every chunk that no longer
    holds it carries it as its breadcrumb (and so in what is embedded), the first chunk holds it as text."""
    text = _titled("Vitamin D and bone density in older adults")
    n = text.count("\n")
    chunks = chunk_segments(modality, [Segment(text, 1, n)], budget=64, overlap=0)
    assert len(chunks) > 3
    assert chunks[0].heading == "" and chunks[0].text.startswith("Vitamin D and bone density")
    assert all(c.heading == "Vitamin D and bone density in older adults" for c in chunks[1:])
    assert all(c.embed_text.startswith("Vitamin D and bone density in older adults\nfinding") for c in chunks[1:])
    assert all(c.tokens <= 64 for c in chunks)


def test_a_title_line_is_the_root_of_the_heading_breadcrumb():
    body = "\n".join(f"decision {i}: we chose lancedb because it is embedded" for i in range(20))
    chunks = chunk_md(f"Project notes\n\n## Decisions\n{body}\n", budget=48)
    # Like a heading, a title is no chunk on its own: it stays with the section that follows.
    assert chunks[0].heading == "" and chunks[0].text.startswith("Project notes\n\n## Decisions\ndecision 0")
    assert {c.heading for c in chunks[1:]} == {"Project notes > Decisions"}


@pytest.mark.parametrize(
    "first",
    [
        "Vitamin D and bone density in older adults, with the first line running straight into the text",  # no blank line after it
        "# Already a heading",
        "---",  # front matter or a rule: no word
        "```",
        " ".join(["word"] * 60),  # a paragraph, not a title (over a breadcrumb's tokens)
    ],
)
def test_lines_that_are_not_a_title(first):
    text = first + "\n" + _titled("x").split("\n", 2)[2] if first.startswith("Vitamin") else _titled(first)
    chunks = chunk_md(text, budget=64)
    assert len(chunks) > 2
    headings = {c.heading for c in chunks[1:]}
    assert first not in headings
    assert headings <= {"", "Already a heading"}


def test_a_title_alone_or_in_a_later_segment_heads_nothing():
    assert [c.heading for c in chunk_md("Just a title\n\n")] == [""]
    body = _titled("Page two header")
    n = body.count("\n")
    # A segment that does not start the file (a later page, an excerpt): its first line is no title.
    chunks = chunk_segments("markdown", [Segment(body, 40, 40 + n - 1)], budget=64, overlap=0)
    assert {c.heading for c in chunks} == {""}
    # Nor in a session transcript or a media file's text.
    assert {c.heading for c in chunk_segments("session", [Segment(body, 1, n)], budget=64, overlap=0)} == {""}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(title=st.text(min_size=1, max_size=400), rest=st.text(max_size=600), budget=st.sampled_from([32, 64, 204]))
def test_any_first_line_chunks_within_budget(title, rest, budget):
    """Whatever the first line holds (a 300-character rule, control characters, a wall of CJK), the
    chunks stay within their budget and a title breadcrumb is never longer than a breadcrumb may be."""
    text = f"{title}\n\n{rest}\n"
    for c in chunk_md(text, budget=budget, overlap=budget // 4):
        assert c.tokens <= budget
        assert count_tokens(c.heading) <= breadcrumb_cap(budget)


def test_no_chunk_is_only_the_overlap_of_the_one_before():
    # A long line split in pieces, then blank lines: the blank lines once made a last chunk of the
    # carried overlap alone (its text already embedded and counted in the chunk before).
    doc = " ".join(sentence(random.Random(2), 40, 60) for _ in range(3)) + "\n\n\n"
    chunks = chunk_md(doc, budget=64, overlap=16)
    assert len(chunks) > 2
    for before, after in zip(chunks, chunks[1:]):
        assert not before.text.rstrip().endswith(after.text.strip())


@settings(max_examples=200, deadline=None)
@given(
    words=st.lists(st.sampled_from(["w4", "CK-2-x", "3", "alpha", "β", "word.", "x1y2", "(see", "it)"]), min_size=1, max_size=120),
    seps=st.lists(st.sampled_from([" ", "  ", "\t", " \t "]), min_size=1, max_size=3),
    max_tokens=st.integers(8, 40),  # every word fits alone (one over alone is cut by characters)
)
def test_a_long_line_is_cut_between_its_words(words, seps, max_tokens):
    """Pieces of a split line hold whole words: a cut inside ``w4`` (``w`` and ``4``) would index
    words the note does not have. The counts of words are not quite additive (``3  w4`` can be
    more tokens than ``3  `` and ``w4``): a piece that is over is cut again between its words."""
    from memory_pipeline.chunking import _split_text

    line = "".join(w + seps[i % len(seps)] for i, w in enumerate(words)).rstrip()
    pieces = _split_text(line, max_tokens)
    assert "".join(pieces) == line
    assert all(count_tokens(p) <= max_tokens for p in pieces)
    assert [w for p in pieces for w in p.split()] == line.split()
