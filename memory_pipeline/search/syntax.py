"""Full-text query syntax: phrases, prefixes, OR, AND, NOT; parsed leniently, never an error.

Grammar (operators are upper-case words; lower-case ``or``/``and``/``not`` are plain words)::

    query  := item*
    item   := ["-" | "NOT"] atom (("OR" | "AND") ["-" | "NOT"] atom)*
    atom   := '"' words '"'     a phrase: the words adjacent, in this order (stems match)
            | word "*"          a prefix: any word starting with it (scann* finds ScaNN, scanning)
            | word              a word (a light stem: deploys finds deployment)

Meaning:

* plain words are *ranked*: a result needs at least one of them, more and rarer ones rank higher
  (BM25), as in any search engine;
* a phrase or a prefix is *required* (it is asked for explicitly); ``a AND b`` makes both sides
  required; ``a OR b`` makes one clause of which either may match (required when one of its
  members is a phrase or a prefix, or when it sits next to an AND);
* ``-word``, ``-"a phrase"``, ``NOT word`` exclude results holding it; a ``-`` before a digit or a
  sign is part of the text (``-5``, ``-$5``, ``E2f-1, -2, -3``), so a number is excluded with ``NOT 5``.

Odd input is read as literally as it can be: an unclosed quote runs to the end of the query, an
operator with nothing on one side is dropped, ``*`` or ``-`` alone are ignored, and anything that
holds no word at all parses to an empty query (no results, no error).

The vector leg of a hybrid search gets ``vector_text``: the positive words, phrases and prefix
stems without operators, quotes or excluded words; of the clauses it honours the excluded ones and
those an operator requires (``vector_clauses``): a quoted phrase alone is required of the full-text
leg, whose results hold it, while the vector leg may add results on meaning (their text score
counts the words they hold, not the phrase).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

from memory_pipeline.search.folding import STOP_WORDS, TERM_RE, fold, query_terms

_TOKEN_RE = re.compile(r'-?"[^"]*"?|[^\s"]+')
_OPS = {"OR", "AND", "NOT"}
_TRIM_RE = re.compile(r"^[\W_]+|[\W_]+$")


@dataclass(frozen=True)
class Term:
    """One atom: ``kind`` is ``word``, ``phrase`` or ``prefix``; ``words`` are folded."""

    kind: str
    words: tuple[str, ...]
    raw: str = ""  # a word's token as typed (ERR_PAYMENT_4471 stays whole for the full-text index)

    @property
    def text(self) -> str:
        return " ".join(self.words)

    def pattern(self) -> re.Pattern[str]:
        """A regex over folded text: each word at a word start, extended (stems and prefixes)."""
        stem = self.kind != "prefix"
        return re.compile(r"[\W_]+".join(r"(?<![^\W_])" + _stem(w, stem) if w.isascii() else w for w in self.words))

    def matches(self, folded: str) -> bool:
        return bool(self.pattern().search(folded))

    def sql_regex(self) -> str:
        """The same test as a case-insensitive Rust regex for LanceDB prefilters (accents not folded)."""
        stem = self.kind != "prefix"
        # Rust's regex has no look-behind: a word start is the text's start or a non-word character.
        parts = [_stem(w, stem) if w.isascii() else w for w in self.words]
        start = r"(^|[^\p{L}\p{N}])" if self.words[0].isascii() else ""
        return "(?i)" + start + r"[\W_]+".join(parts)


@dataclass(frozen=True)
class Clause:
    """Terms of which any may match; ``required`` or ``negated`` when the syntax says so."""

    terms: tuple[Term, ...]
    required: bool = False
    negated: bool = False
    # Required by an operator (an AND beside it, a prefix in it), not only because it quotes a
    # phrase: hybrid's vector leg honours these (``ParsedQuery.vector_clauses``).
    operator: bool = False

    def matches(self, folded: str) -> bool:
        return any(t.matches(folded) for t in self.terms)


@dataclass(frozen=True)
class ParsedQuery:
    """A query as the search legs use it."""

    raw: str
    clauses: tuple[Clause, ...]

    @cached_property
    def positive(self) -> tuple[Clause, ...]:
        return tuple(c for c in self.clauses if not c.negated)

    @cached_property
    def has_syntax(self) -> bool:
        """Whether anything beyond plain ranked words was asked for."""
        return any(c.required or c.negated or len(c.terms) != 1 or any(t.kind != "word" for t in c.terms) for c in self.clauses)

    @cached_property
    def words(self) -> tuple[str, ...]:
        """The positive plain words as typed (the BM25 terms), in order, stop words out, each once."""
        out: dict[str, None] = {}
        for c in self.positive:
            for t in c.terms:
                if t.kind == "word" and not (len(t.words) == 1 and t.words[0] in STOP_WORDS):
                    out[t.raw] = None
        if not out:  # a query of stop words only ("who are you") still searches them
            for c in self.positive:
                for t in c.terms:
                    if t.kind == "word":
                        out[t.raw] = None
        return tuple(out)

    @cached_property
    def alternatives(self) -> tuple[tuple[str, ...], ...]:
        """The BM25 term keys (a word as typed, a phrase as ``"its text"``) of each positive clause of
        several terms (``Horatio OR Priya``): the full-text leg counts such a clause once, as its
        best-weighted term, so a document holding either in full holds the whole clause."""
        words = set(self.words)
        groups: list[set[str]] = []
        for c in self.positive:
            keys = {t.raw if t.kind == "word" else '"' + t.text + '"' for t in c.terms if (t.kind == "word" and t.raw in words) or t.kind == "phrase"}
            if len(keys) < 2:
                continue
            # Clauses that share a term are one group (``a OR b b OR c``, a clause typed twice):
            # each term counted once, so the groups never take more than the terms' sum away.
            for g in [g for g in groups if g & keys]:
                keys |= g
                groups.remove(g)
            groups.append(keys)
        return tuple(tuple(sorted(g)) for g in groups)

    @cached_property
    def phrases(self) -> tuple[Term, ...]:
        return tuple(t for c in self.positive for t in c.terms if t.kind == "phrase")

    @cached_property
    def prefixes(self) -> tuple[Term, ...]:
        return tuple(t for c in self.positive for t in c.terms if t.kind == "prefix")

    @cached_property
    def vector_text(self) -> str:
        """What the vector leg embeds: the positive words and phrases, operators and quotes removed."""
        if not self.has_syntax:
            return self.raw.strip()
        return " ".join(t.text for c in self.positive for t in c.terms)

    @cached_property
    def highlight_terms(self) -> list[str]:
        """Folded, lightly stemmed words to highlight in snippets (``query_terms`` of the positive words)."""
        return query_terms(" ".join(t.text for c in self.positive for t in c.terms))

    @cached_property
    def vector_clauses(self) -> ParsedQuery:
        """The clauses a hybrid search's vector leg honours: the excluded ones, and those required
        by an operator (AND, a prefix ``scann*``). A quoted phrase alone is required of the
        full-text leg only: questions quote titles and sayings ("the book "Becoming Nicole"")
        that the note answering them may put in other words, and the vector leg ranks those
        by meaning (their text score counts the words they hold, not the phrase)."""
        kept = tuple(c for c in self.clauses if c.negated or c.operator or not c.required)
        return self if len(kept) == len(self.clauses) else ParsedQuery(raw=self.raw, clauses=kept)

    @cached_property
    def constrains(self) -> bool:
        """Whether the query has required or excluded clauses (else ``accepts`` is always true)."""
        return any(c.required or c.negated for c in self.clauses)

    def accepts(self, folded: str) -> bool:
        """Whether a (folded) text satisfies the required and excluded clauses."""
        for c in self.clauses:
            if c.negated and c.matches(folded):
                return False
            if c.required and not c.negated and not c.matches(folded):
                return False
        return True

    def sql_filter(self, column: str) -> str | None:
        """The required and excluded clauses as a LanceDB SQL prefilter on ``column``, or None."""
        parts = []
        for c in self.clauses:
            if not (c.required or c.negated):
                continue
            alts = " OR ".join(f"regexp_like({column}, {_sql_str(t.sql_regex())})" for t in c.terms)
            parts.append(f"NOT ({alts})" if c.negated else f"({alts})")
        return " AND ".join(parts) or None


def _sql_str(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _stem(word: str, stem: bool) -> str:
    # Words are letters and digits only (TERM_RE), so nothing needs escaping; the light stem is
    # the one of query_terms (deployment -> deployme, matching deployments).
    if stem and len(word) > 5:
        word = word[: max(4, len(word) - 2)]
    return word + r"\w*"


def _words(text: str) -> tuple[str, ...]:
    return tuple(TERM_RE.findall(fold(text)))


def parse_query(raw: str) -> ParsedQuery:
    """Parse ``raw`` by the grammar above; never raises."""
    items: list[tuple[str, object]] = []  # ("op", "OR"|"AND"|"NOT") or ("term", (Term, negated))
    for tok in _TOKEN_RE.findall(raw or ""):
        if tok in _OPS:
            items.append(("op", tok))
            continue
        negated = False
        # "-" excludes a word or a phrase: before a digit or a sign it is part of the text, a minus
        # ("-5 degrees", "-$5", "-½", "E2f-1, -2, -3": notes and questions write numbers so far
        # more often than anyone excludes one; NOT 5 does).
        if tok.startswith("-") and len(tok) > 1 and (tok[1].isalpha() or tok[1] in '"_'):
            negated, tok = True, tok[1:]
        if tok.startswith('"'):
            words = _words(tok.strip('"'))
            if not words:
                continue
            # A quoted single word is that word (its text is what the full-text query asks for).
            term = Term("phrase", words) if len(words) > 1 else Term("word", words, raw=" ".join(words))
        elif tok.endswith("*") and len(tok.rstrip("*")) > 0:
            words = _words(tok.rstrip("*"))
            if not words:
                continue
            # "foo-bar*": the last word is the prefix, the others a phrase before it.
            term = Term("prefix", words) if len(words) == 1 else Term("phrase", words)
            if len(words) > 1:
                items.append(("term", (term, negated)))
                continue
        else:
            words = _words(tok)
            if not words:
                continue
            # ERR_PAYMENT_4471, mon-03.fra.internal, state-of-the-art: one token, its words adjacent.
            term = Term("word", words, raw=_TRIM_RE.sub("", tok))
        items.append(("term", (term, negated)))
    clauses = _group(items)
    if not clauses and not any(kind == "term" for kind, _ in items):
        # Nothing but operators ("AND", "NOT OR"): the user meant the words.
        clauses = [Clause((Term("word", (w,), raw=w),)) for w in _words(raw or "")]
    return ParsedQuery(raw=raw or "", clauses=tuple(clauses))


def _group(items: list[tuple[str, object]]) -> list[Clause]:
    clauses: list[Clause] = []
    group: list[Term] = []
    group_required = False
    pending_not = False
    joiner: str | None = None  # the operator seen since the last term

    def close() -> None:
        nonlocal group, group_required
        if group:
            required = group_required or any(t.kind != "word" for t in group)
            operator = group_required or any(t.kind == "prefix" for t in group)
            clauses.append(Clause(tuple(group), required=required, operator=operator))
        group, group_required = [], False

    for kind, value in items:
        if kind == "op":
            if value == "NOT":
                pending_not = True
            else:
                joiner = str(value)
            continue
        term, negated = value  # pyright: ignore[reportGeneralTypeIssues] - a term item is (Term, bool)
        negated = negated or pending_not
        pending_not = False
        if negated:
            if joiner == "AND":
                group_required = True
            close()
            clauses.append(Clause((term,), negated=True))
            joiner = None
            continue
        if joiner == "OR" and group:
            group.append(term)
        elif joiner == "AND" and (group or clauses):
            if group:
                group_required = True
                close()
            group, group_required = [term], True
        else:
            close()
            group = [term]
        joiner = None
    close()
    return clauses
