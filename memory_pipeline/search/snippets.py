"""Snippets: the lines of a chunk that best show why it matched, with highlight spans."""

from __future__ import annotations

import re
from collections.abc import Sequence

from memory_pipeline.search.folding import fold, fold_with_map


def term_spans(folded: str, terms: Sequence[str]) -> list[tuple[int, int]]:
    """Merged ``[start, end)`` spans of ``terms`` in already folded text."""
    spans = []
    for t in set(terms):
        # ASCII terms match at a word start (a stem matches its longer forms); CJK anywhere.
        pattern = re.escape(t) + r"\w*" if t.isascii() else re.escape(t)
        prefix = r"(?<![^\W_])" if t.isascii() else ""
        spans.extend((m.start(), m.end()) for m in re.finditer(prefix + pattern, folded))
    spans.sort()
    merged: list[tuple[int, int]] = []
    for s, e in spans:
        if merged and s <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(e, merged[-1][1]))
        else:
            merged.append((s, e))
    return merged


def make_snippet(text: str, terms: Sequence[str], *, max_lines: int = 3, max_chars: int = 320) -> tuple[str, int, int, tuple[tuple[int, int], ...]]:
    """The best window of up to ``max_lines`` lines (most matched terms), with highlight spans.

    Returns (snippet, first line index, last line index within ``text``, spans).
    """
    lines = text.split("\n")
    nonblank = [i for i, ln in enumerate(lines) if ln.strip()]
    if not nonblank:
        return "", 0, 0, ()
    hits = []
    for ln in lines:
        folded = fold(ln)
        hits.append({t for t in terms if t in folded})
    best_start, best_score = nonblank[0], -1
    for i in nonblank:
        window = [j for j in range(i, min(i + max_lines, len(lines)))]
        found = set().union(*(hits[j] for j in window))
        score = len(found)
        if score > best_score:
            best_start, best_score = i, score
    chosen = [j for j in range(best_start, min(best_start + max_lines, len(lines))) if lines[j].strip()]
    first, last = chosen[0], chosen[-1]
    snippet = " ".join(lines[j].strip() for j in chosen)
    if first > nonblank[0]:
        snippet = "… " + snippet
    if last < nonblank[-1]:
        snippet += " …"
    if len(snippet) > max_chars:
        # Keep the first highlight in view.
        folded, origin = fold_with_map(snippet)
        spans = term_spans(folded, terms)
        start = max(0, origin[spans[0][0]] - max_chars // 4) if spans else 0
        end = start + max_chars - 2
        snippet = ("… " if start else "") + snippet[start:end].strip() + " …"
    folded, origin = fold_with_map(snippet)
    spans = tuple((origin[s], origin[e - 1] + 1) for s, e in term_spans(folded, terms))
    return snippet, first, last, spans


def highlight(snippet: str, spans: Sequence[tuple[int, int]], *, before: str = "**", after: str = "**") -> str:
    """The snippet with each span wrapped in ``before``/``after`` markers."""
    out, pos = [], 0
    for s, e in spans:
        out.append(snippet[pos:s])
        out.append(f"{before}{snippet[s:e]}{after}")
        pos = e
    out.append(snippet[pos:])
    return "".join(out)
