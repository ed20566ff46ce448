"""Session transcripts (JSONL): user and assistant message text, one segment per message.

Understands the common shapes agents write: ``{"role", "content"}`` records,
``{"type": "message", "message": {...}}`` envelopes, and content given as a string
or as a list of ``{"type": "text", "text": ...}`` parts. Tool calls, tool results
and system records are left out. Each segment keeps its JSONL line number; secrets
are redacted by ``extract`` like every format's. Lines that are not JSON objects
(a record cut short while the agent was still writing, a stray log line) are
skipped and reported in the list's ``warning`` with their numbers.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from typing import Any

from memory_pipeline.errors import ExtractionError
from memory_pipeline.extraction.markdown import read_text
from memory_pipeline.extraction.media import MediaOptions, Segments
from memory_pipeline.models import Segment
from memory_pipeline.safeio import OpenedFile

# How many line numbers a warning lists before "…".
_LISTED_LINES = 10

_ROLES = {"user": "user", "human": "user", "assistant": "assistant", "ai": "assistant", "model": "assistant"}


def _content_text(content: Any) -> str | None:
    """The text of a message's content: a string, parts of text, or one part as an object
    (``{"type": "text", "text": ...}``); "" for none (None is an assistant's tool call: nothing to
    say). None for content that holds something but no text this reader knows (a number, an object
    without ``text``): reported, not dropped in silence."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
                value = part.get("text")
                if isinstance(value, str):
                    parts.append(value)
        return "\n".join(parts)
    if isinstance(content, dict) and isinstance(content.get("text"), str):
        return content["text"]
    return None


def _odd_text_parts(content: Any) -> bool:
    """Whether a list of parts holds a text part whose ``text`` is not a string (an object, a number):
    its other parts are indexed, and the line is reported, not dropped in silence."""
    return isinstance(content, list) and any(
        isinstance(part, dict)
        and part.get("type") in ("text", "input_text", "output_text")
        and part.get("text") is not None
        and not isinstance(part.get("text"), str)
        for part in content
    )


def _message(record: dict) -> tuple[str, str | None, str] | None:
    """(role, text, timestamp) of a user/assistant record, else None; text is None when the
    content holds no text this reader knows (see :func:`_content_text`)."""
    message = record.get("message")
    msg = message if isinstance(message, dict) else record
    role = msg.get("role") or record.get("role") or record.get("type")
    role = _ROLES.get(str(role).lower()) if role else None
    if role is None:
        return None
    text = _content_text(msg.get("content", msg.get("text")))
    timestamp = record.get("timestamp") or msg.get("timestamp") or record.get("created_at") or ""
    return role, None if text is None else text.strip(), _iso(timestamp)


def _iso(value: Any) -> str:
    """ISO text for a timestamp given as ISO text or epoch seconds / milliseconds."""
    if isinstance(value, bool) or value in (None, ""):
        return ""
    if isinstance(value, (int, float)):
        try:
            seconds = value / 1000 if value > 1e11 else value
            return datetime.fromtimestamp(seconds, tz=UTC).isoformat()
        except (OverflowError, OSError, ValueError):  # a number no clock reaches
            return ""
    if not isinstance(value, str):
        return ""  # an object or a list is no time
    text = value.strip()
    if text.isdigit() and len(text) <= 16:
        return _iso(int(text))  # epoch seconds or milliseconds written as a string
    iso = text.upper().removesuffix(" UTC").removesuffix("Z")
    try:
        datetime.fromisoformat(iso)
    except ValueError:
        return ""  # "99999-99-99T99:99" was shown as a time
    return text


def _lines_warning(numbers: list[int], what: str) -> str:
    listed = ", ".join(str(n) for n in numbers[:_LISTED_LINES]) + (", …" if len(numbers) > _LISTED_LINES else "")
    return f"{len(numbers)} line{'s are' if len(numbers) != 1 else ' is'} {what}: {listed}"


def session_segments(src: OpenedFile, options: MediaOptions) -> Segments:
    """One segment per user/assistant message, at most ``max_segments``; broken lines reported."""
    text, cut = read_text(src, options)
    segments = Segments()
    not_json: list[int] = []
    not_object: list[int] = []
    no_text: list[int] = []  # messages whose content is neither text nor parts of text
    odd_parts: list[int] = []  # messages with a text part whose text is not a string (the rest kept)
    records = 0
    capped = False
    # Only "\n" ends a JSONL record: U+2028 and friends may appear raw inside JSON strings.
    lines = text.split("\n")
    if cut and len(lines) > 1:
        lines.pop()  # the last line was cut by the read limit, not broken by the agent
    for line_no, line in enumerate(lines, start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):  # JSONDecodeError, a 5000-digit number, deep nesting
            not_json.append(line_no)
            continue
        if not isinstance(record, dict):
            not_object.append(line_no)
            continue
        records += 1
        parsed = _message(record)
        if parsed is None:
            continue
        role, body, timestamp = parsed
        if body is None:
            no_text.append(line_no)
        else:
            message = record.get("message")
            if _odd_text_parts((message if isinstance(message, dict) else record).get("content")):
                odd_parts.append(line_no)
        if not body:
            continue
        if len(segments) >= options.max_segments:
            capped = True
            segments.warn(f"indexed the messages of the first {line_no - 1} lines (max_segments={options.max_segments})")
            break
        when = timestamp.replace("T", " ")[:16] if timestamp else ""
        label = f"[{when}] {role}:" if when else f"{role}:"
        segments.append(Segment(text=body, line_start=line_no, line_end=line_no, label=label))
    if records == 0 and (not_json or not_object):
        raise ExtractionError(src.path, f"not a JSONL transcript: none of its {len(not_json) + len(not_object)} lines is a JSON object")
    if not_json:
        segments.warn(_lines_warning(not_json, "not valid JSON"))
    if not_object:
        segments.warn(_lines_warning(not_object, "JSON but not an object"))
    if no_text:
        segments.warn(_lines_warning(no_text, "messages whose content is not text"))
    if odd_parts:
        segments.warn(_lines_warning(odd_parts, "messages with a text part that is not a string (their other parts are indexed)"))
    if cut and not capped:
        segments.warn(f"indexed the first {options.max_chars * 4} bytes of {src.size} (max_chars={options.max_chars})")
    return segments


def extract_session(abs_path: str, root: str | os.PathLike[str] | None = None) -> list[Segment]:
    """A transcript's segments, through ``extract`` (opened contained, cleaned, redacted, capped)."""
    from memory_pipeline.extraction import extract

    return extract(abs_path, "session", root=root)
