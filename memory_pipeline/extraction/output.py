"""What every extractor's output goes through, once, whatever the format: clean, redact, cap.

- Control characters: C0 controls other than tab and newline, DEL, and C1 controls
  other than NEL are removed (they can drive a terminal that shows a search hit, and
  a NUL breaks tools downstream); a form feed, vertical tab or separator character
  becomes a space (it separates words); a carriage return becomes a newline. Neither
  removing nor the space moves a line, so line locators stay true.
- Secrets: ``redact`` runs over every segment's text and label (notes, OCR of images
  and keyframes, transcripts, PDF pages, documents, messages).
- Caps: at most ``max_segments`` segments and ``max_chars`` characters per file. A file
  over a cap is indexed in part, and the list's ``warning`` says what was left out;
  it is never failed for being large, since its first part is still worth finding.
"""

from __future__ import annotations

import re
from dataclasses import replace

from memory_pipeline.errors import ExtractionError
from memory_pipeline.extraction.media import MediaOptions, Segments
from memory_pipeline.extraction.redact import redact
from memory_pipeline.models import Segment

# C0 except \t \n (\r is handled first) and the separators below, DEL, C1 except NEL (U+0085, a line
# separator in text).
_CONTROL = re.compile("[\x00-\x08\x0e-\x1b\x7f\x80-\x84\x86-\x9f]")
# Vertical tab, form feed and the information separators (FS, GS, RS, US) separate text: each becomes
# a space (not a line break, so line numbers stay the file's). Removed, "page two<FF>still two" was
# indexed as "twostill".
_SEPARATOR = re.compile("[\x0b\x0c\x1c-\x1f]")
_LABEL_SPACE = re.compile(r"\s+")


# Lone UTF-16 surrogates: no character, and not encodable as UTF-8 (Arrow, LanceDB and every file
# refuse them). Only a JSON escape (``"\ud800"``) or a decoder's ``surrogateescape`` makes them.
_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> tuple[str, int]:
    """The text without control characters (newlines kept; a form feed, vertical tab or separator
    character a space) and with each lone surrogate replaced by U+FFFD, and how many characters
    were removed or replaced (the spaces are not counted: nothing was lost)."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    text, replaced = _SURROGATE.subn("\ufffd", text)
    text, removed = _CONTROL.subn("", text)
    text = _SEPARATOR.sub(" ", text)
    return text, removed + replaced


def clean_and_redact(text: str) -> str:
    """Text read back for a user as the index holds it (``memory_get``, an asset's derived text):
    cleaned, then redacted, as :func:`finish` does for every extracted segment."""
    return redact(clean_text(text)[0])[0]


def surrogates(text: str) -> int:
    """How many lone surrogates ``text`` holds (what :func:`clean_text` replaces)."""
    return len(_SURROGATE.findall(text))


def clean_label(label: str) -> str:
    """A label is one line: control characters removed, any run of whitespace one space."""
    return _LABEL_SPACE.sub(" ", clean_text(label)[0]).strip()


def cap_segments(segments: list[Segment], options: MediaOptions) -> Segments:
    """At most ``max_segments`` segments and ``max_chars`` characters; the warning says what was cut."""
    out = Segments()
    out.warning = getattr(segments, "warning", "")
    chars = 0
    for seg in segments:
        if len(out) >= options.max_segments:
            out.warn(f"indexed the first {len(out)} of {len(segments)} segments (max_segments={options.max_segments})")
            break
        room = options.max_chars - chars
        if len(seg.text) > room:
            if room > 0:
                out.append(_truncated(seg, room))
            left = len(segments) - len(out)
            message = f"indexed the first {options.max_chars} characters (max_chars={options.max_chars})"
            out.warn(f"{message}; {left} later segment(s) left out" if left else message)
            break
        out.append(seg)
        chars += len(seg.text)
    return out


def _truncated(seg: Segment, room: int) -> Segment:
    """The first ``room`` characters of a segment, at a line end where there is one."""
    cut = seg.text.rfind("\n", 0, room)
    text = seg.text[: cut + 1] if cut > 0 else seg.text[:room]
    if seg.kind == "":  # a text file's segment: its locator is lines, which now end earlier
        return replace(seg, text=text, line_end=seg.line_start + max(text.count("\n") - text.endswith("\n"), 0))
    return replace(seg, text=text)


def finish(segments: list[Segment], options: MediaOptions, note: list[Segment] | None = None) -> Segments:
    """The one place every extracted segment (and a media file's note) is cleaned, redacted and capped."""
    out = Segments()
    out.warning = getattr(segments, "warning", "")
    invalid = 0
    for seg in [*(note or []), *segments]:
        invalid += surrogates(seg.text) + surrogates(seg.label)
        text, _ = clean_text(seg.text)
        if not text.strip():
            continue
        try:
            text, _ = redact(text)
            label = redact(clean_label(seg.label))[0] if seg.label else ""
        except Exception as err:  # fail closed: text that could not be redacted is never stored
            raise ExtractionError("", f"secret redaction failed ({type(err).__name__}: {err}); not indexed") from err
        out.append(replace(seg, text=text, label=label) if (text, label) != (seg.text, seg.label) else seg)
    if invalid:
        out.warn(f"replaced {invalid} invalid character(s) (unpaired UTF-16 surrogates, as in a JSON \\ud800 escape) with U+FFFD")
    return cap_segments(out, options)
