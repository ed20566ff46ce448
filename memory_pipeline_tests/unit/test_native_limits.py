"""Native media requests within gemini-embedding-2's limits; what does not fit falls back to derived text, with a reason."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from memory_pipeline.chunking import _encoding
from memory_pipeline.models import Segment
from memory_pipeline.stages.media import NATIVE_MAX_TEXT_TOKENS, media_label, native_problem


def _about(text: str) -> list[Segment]:
    return [Segment(text, 0, 0, "", "media")]


def test_types_sizes_pages_and_lengths_over_the_model_limits_are_refused_with_the_reason():
    assert native_problem("image/jpeg", 1000, _about("Image a.jpg (JPEG, 10x10).")) == ""
    assert "image/gif is not a type" in native_problem("image/gif", 1000, _about("Image a.gif (GIF, 10x10)."))
    assert "over the model's 20 MiB" in native_problem("image/png", 16 * 2**20, [])
    assert native_problem("application/pdf", 1000, _about("PDF document a.pdf, 6 pages.")) == ""
    assert "7 pages, over the model's native limit of 6" in native_problem("application/pdf", 1000, _about("PDF document x, 2 pages.pdf, 7 pages."))
    assert native_problem("audio/mpeg", 1000, _about("Audio recording v.mp3 (audio/mpeg, 1:20 long).")) == ""
    assert "1:21 long" in native_problem("audio/mpeg", 1000, _about("Audio recording v.mp3 (audio/mpeg, 1:21 long)."))
    assert "1:00:00 long" in native_problem("audio/wav", 1000, _about("Audio recording v.wav (audio/wav, 1:00:00 long)."))


def test_the_label_keeps_name_note_and_description_first_and_stays_under_the_token_limit():
    enc = _encoding()  # cl100k, shipped offline
    count = lambda texts: [len(enc.encode_ordinary(t)) for t in texts]
    ocr = [Segment(f"line {i} " + "receipt total " * 40, i, i, "", "ocr") for i in range(1, 400)]
    segments = [Segment("Dinner with the Lisbon team", 0, 0, "", "note"), *_about("Image r.jpg (JPEG, 800x600)."), *ocr]
    label = media_label("media/r.jpg", segments, count)
    assert label.startswith("r.jpg\nDinner with the Lisbon team\nImage r.jpg (JPEG, 800x600).\nline 1 ")
    assert count([label])[0] <= NATIVE_MAX_TEXT_TOKENS
    assert count([label])[0] > NATIVE_MAX_TEXT_TOKENS * 0.9  # the room is used, not thrown away


@settings(max_examples=60, deadline=None)
@given(note=st.text(max_size=3000), derived=st.lists(st.text(max_size=2000), max_size=8), limit=st.integers(20, 3000))
def test_any_label_fits_its_budget(note, derived, limit):
    count = lambda texts: [len(t) for t in texts]  # one token per character: the hardest case
    segments = [Segment(note, 0, 0, "", "note"), *[Segment(d, 1, 1, "", "ocr") for d in derived]]
    label = media_label("a.png", segments, count, limit=limit)
    assert count([label])[0] <= limit
    if limit >= 40:
        assert label.startswith("a.png")
