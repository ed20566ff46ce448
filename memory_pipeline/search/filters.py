"""SQL prefilters: which rows a search may return (source, type/modality, path glob, date range),
as one WHERE clause LanceDB applies before ranking; and what date a note is about.

A dated note has ``YYYY-MM-DD`` at the start of its file name (memory/2026-10-14.md,
2026-10-14-deploy.jsonl); its date is that one. Any other file is dated by its mtime.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from memory_pipeline.errors import ConfigError
from memory_pipeline.globs import glob_to_rust_regex

# --type values: a media modality, or "text" for notes and transcripts.
RESULT_TYPES = ("image", "audio", "video", "pdf", "document", "text")
_DATED_RE = re.compile(r"(?:^|/)(\d{4}-\d{2}-\d{2})[^/]*$")


@dataclass(frozen=True)
class SearchFilters:
    """Which rows may be returned; applied inside LanceDB before ranking (prefilter)."""

    source: str | None = None
    modality: tuple[str, ...] = ()
    path_glob: str | None = None
    since: date | None = None  # inclusive, on the note's date
    until: date | None = None  # inclusive
    types: tuple[str, ...] = ()  # --type: media modalities ("document" includes "pdf"), or "text" (notes and transcripts)

    def where(self) -> str | None:
        """The SQL WHERE clause for LanceDB, or None when nothing is filtered."""
        parts = []
        if self.types:
            bad = [t for t in self.types if t not in RESULT_TYPES]
            if bad:
                raise ConfigError(f"--type must be one of {', '.join(RESULT_TYPES)}, got {bad[0]!r}", key="type")
            # A document is any paged or office file: `--type document` includes PDFs.
            media = sorted({m for t in self.types if t != "text" for m in ((t, "pdf") if t == "document" else (t,))})
            either = [f"modality IN ({', '.join(sql_str(t) for t in media)})"] if media else []
            if "text" in self.types:
                either.append("memory_type = 'text'")
            parts.append(" OR ".join(either))
        if self.source:
            parts.append(f"source = {sql_str(self.source)}")
        if self.modality:
            parts.append(f"modality IN ({', '.join(sql_str(m) for m in self.modality)})")
        if self.path_glob:
            parts.append(f"regexp_like(path, {sql_str(glob_to_rust_regex(self.path_glob))})")
        if self.since or self.until:
            parts.append(date_range_sql(self.since, self.until))
        return " AND ".join(f"({p})" for p in parts) or None


def sql_str(value: str) -> str:
    """A SQL string literal (quotes doubled)."""
    return "'" + value.replace("'", "''") + "'"


def date_range_sql(since: date | None, until: date | None) -> str:
    """Dated notes by the date in their file name, other files by their mtime."""
    lo = since or date.min
    hi = until or date.max
    if lo > hi:
        raise ConfigError(f"the date range is empty: since {lo} is after until {hi}", key="since")
    dated = r"(^|/)\d{4}-\d{2}-\d{2}[^/]*$"
    in_range = "(^|/)(" + "|".join(date_range_regex(lo, hi)) + r")[^/]*$"
    mtime = []
    if since:
        mtime.append(f"created_at >= TIMESTAMP '{since.isoformat()} 00:00:00'")
    if until and until < date.max:  # the calendar's last day has no day after it: no upper bound
        mtime.append(f"created_at < TIMESTAMP '{(until + timedelta(days=1)).isoformat()} 00:00:00'")
    return f"(regexp_like(path, {sql_str(in_range)})) OR (NOT regexp_like(path, {sql_str(dated)}) AND {' AND '.join(mtime) or 'TRUE'})"


def date_range_regex(lo: date, hi: date) -> list[str]:
    """Regex alternatives matching exactly the ISO dates ``lo..hi`` (inclusive), compact for any
    range (open ends included): whole years, whole months and day runs as digit ranges."""
    if lo > hi:
        return []
    if lo.year == hi.year:
        out = []
        for month in range(lo.month, hi.month + 1):
            first = lo.day if month == lo.month else 1
            last = hi.day if month == hi.month else _month_days(lo.year, month)
            days = r"\d{2}" if (first, last) == (1, _month_days(lo.year, month)) else _alt(_digit_range(f"{first:02d}", f"{last:02d}"))
            out.append(f"{lo.year:04d}-{month:02d}-{days}")
        return out
    out = date_range_regex(lo, date(lo.year, 12, 31))
    if hi.year - lo.year > 1:
        out.append(_alt(_digit_range(f"{lo.year + 1:04d}", f"{hi.year - 1:04d}")) + r"-\d{2}-\d{2}")
    return out + date_range_regex(date(hi.year, 1, 1), hi)


def _month_days(year: int, month: int) -> int:
    return (date(year, 12, 31) if month == 12 else date(year, month + 1, 1) - timedelta(days=1)).day


def _alt(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else "(" + "|".join(parts) + ")"


def _digit_range(a: str, b: str) -> list[str]:
    """Regexes matching exactly the equal-width digit strings from ``a`` to ``b``."""
    if a == b:
        return [a]
    if len(a) == 1:
        return [f"[{a}-{b}]"]
    if a[0] == b[0]:
        return [a[0] + rest for rest in _digit_range(a[1:], b[1:])]
    width = len(a) - 1
    out = [a[0] + rest for rest in _digit_range(a[1:], "9" * width)]
    if int(b[0]) - int(a[0]) > 1:
        out.append(f"[{int(a[0]) + 1}-{int(b[0]) - 1}]" + r"\d" * width)
    return out + [b[0] + rest for rest in _digit_range("0" * width, b[1:])]


def file_name_date(path: str) -> date | None:
    """``YYYY-MM-DD`` at the start of the file name (a dated note), else None."""
    m = _DATED_RE.search(path)
    try:
        return date.fromisoformat(m.group(1)) if m else None
    except ValueError:
        return None


def note_date(path: str, created_at: datetime | None) -> date | None:
    """The date a note is about: from a dated file name, else the file's mtime."""
    return file_name_date(path) or (created_at.date() if created_at is not None else None)
