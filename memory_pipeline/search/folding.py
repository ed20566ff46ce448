"""Text folding and tokenising: how a query and a chunk are compared word by word.

Folding lower-cases and strips accents (Tomás → tomas); query terms drop stop words, are
lightly stemmed, and split CJK runs into character bigrams; identifier terms are the digit
runs of tokens that name one thing exactly (ERR_PAYMENT_4471, PAY-2291, 1.47.0).
"""

from __future__ import annotations

import re
import unicodedata

STOP_WORDS = frozenset(
    "a an and are as at be by did do does for from had has have how i in is it its me my of on or "
    "our the their there this to was we were what when where which who why will with you your "
    "about am been can could he her him his if into just not she so than that them then they us would".split()
)
TERM_RE = re.compile(r"[^\W_]+", re.UNICODE)
_CJK_RE = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")


def fold(text: str) -> str:
    """Lower-cased, accents removed (NFKD, combining marks dropped)."""
    if text.isascii():
        return text.lower()
    return "".join(c for c in unicodedata.normalize("NFKD", text.lower()) if not unicodedata.combining(c))


def fold_with_map(text: str) -> tuple[str, list[int]]:
    """The folded text and, for each folded character, the index of its original character."""
    if text.isascii():  # one character each, in place (a snippet of a long chunk: 2 ms a result char by char)
        return text.lower(), list(range(len(text)))
    chars: list[str] = []
    origin: list[int] = []
    for i, ch in enumerate(text):
        if ch.isascii():
            chars.append(ch.lower())
            origin.append(i)
            continue
        for f in fold(ch):
            chars.append(f)
            origin.append(i)
    return "".join(chars), origin


def query_terms(query: str) -> list[str]:
    """Content terms of a query, folded; a light stem so plural/verb forms still match.

    CJK runs (no spaces between words) become character bigrams, so 团建预算 is matched
    by a note holding 团建 and 预算 apart.
    """
    terms = []
    for term in TERM_RE.findall(fold(query)):
        if term in STOP_WORDS:
            continue
        if _CJK_RE.search(term):
            terms.extend([term] if len(term) < 2 else [term[i : i + 2] for i in range(len(term) - 1)])
            continue
        terms.append(term[: max(4, len(term) - 2)] if term.isascii() and len(term) > 5 else term)
    return terms


def identifier_terms(query: str) -> list[str]:
    """The parts of a query that name one thing exactly: tokens holding a digit (codes,
    ids, versions, hosts: ERR_PAYMENT_4471, PAY-2291, db-07, 1.47.0), as their digit runs."""
    out = []
    for token in query.split():
        if any(ch.isdigit() for ch in token):
            out.extend(run for run in re.findall(r"\d+", token) if len(run) >= 2)
    return out


def term_coverage(terms: list[str], text: str) -> float:
    """The share of ``terms`` found in ``text`` (folded first)."""
    if not terms:
        return 0.0
    folded = fold(text)
    return sum(1 for t in terms if t in folded) / len(terms)
