"""Search results for people: text and media in separate sections.

A media file is shown once, at its best score, with what matched in it (the note,
an OCR line, a transcript span with its time range, a page) and where it lives.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from memory_pipeline.display import shown
from memory_pipeline.search import SearchResult, highlight

TEXT_TITLE = "— Text Results —"
MEDIA_TITLE = "— Media Results —"
_CONTEXTS_PER_FILE = 3


def _part(r: SearchResult) -> str:
    """What part of a media file matched, from its chunk heading (``name — part``)."""
    return r.heading.rsplit(" — ", 1)[-1] if " — " in r.heading else r.modality


def render_results(results: Sequence[SearchResult], marks: tuple[str, str] = ("**", "**")) -> str:
    """``marks`` wrap the matched terms of each snippet (bold escapes on a terminal, ``**`` when piped)."""

    def snippet(r: SearchResult) -> str:
        return highlight(r.snippet, r.highlights, before=marks[0], after=marks[1])

    text = [r for r in results if r.memory_type != "media"]
    media: dict[str, list[SearchResult]] = {}
    for r in results:
        if r.memory_type == "media":
            media.setdefault(r.path, []).append(r)
    lines: list[str] = []
    if text:
        lines.append(TEXT_TITLE)
        for i, r in enumerate(text, 1):
            where = f" › {r.heading}" if r.heading else ""
            day = f"  {r.date}" if r.date else ""
            lines.append(f"{i}. {shown(r.path)}:{r.snippet_locator or r.locator}  score {r.score:.3f}  [{r.modality}]{day}{where}")
            lines.append(f"   {snippet(r)}")
    if media:
        if lines:
            lines.append("")
        lines.append(MEDIA_TITLE)
        for i, (path, hits) in enumerate(media.items(), 1):
            best = hits[0]
            lines.append(f"{i}. {shown(os.path.basename(path))}  score {best.score:.3f}  {best.mime_type}")
            for r in hits[:_CONTEXTS_PER_FILE]:
                where = "" if r.locator in ("note", "ocr", "media", "exif") else f" [{r.locator}]"
                lines.append(f"   {_part(r)}{where}: {snippet(r)}")
            lines.append(f"   {shown(path)}")
    return "\n".join(lines)
