"""Session transcripts (JSONL): user and assistant message text, one segment per message.

Understands the common shapes agents write: ``{"role", "content"}`` records,
``{"type": "message", "message": {...}}`` envelopes, and content given as a string
or as a list of ``{"type": "text", "text": ...}`` parts. Tool calls, tool results
and system records are left out. Each segment keeps its JSONL line number, and
obvious secrets are redacted before anything is stored.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from memory_pipeline.errors import ExtractionError
from memory_pipeline.extraction.markdown import decode_utf8
from memory_pipeline.extraction.redact import redact
from memory_pipeline.models import Segment

_ROLES = {"user": "user", "human": "user", "assistant": "assistant", "ai": "assistant", "model": "assistant"}


def _content_text(content: Any) -> str:
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
    return ""


def _message(record: dict) -> tuple[str, str, str] | None:
    """(role, text, timestamp) of a user/assistant record, else None."""
    msg = record.get("message") if isinstance(record.get("message"), dict) else record
    role = msg.get("role") or record.get("role") or record.get("type")
    role = _ROLES.get(str(role).lower()) if role else None
    if role is None:
        return None
    text = _content_text(msg.get("content", msg.get("text", "")))
    timestamp = record.get("timestamp") or msg.get("timestamp") or record.get("created_at") or ""
    return role, text.strip(), _iso(timestamp)


def _iso(value: Any) -> str:
    """ISO text for a timestamp given as ISO text or epoch seconds / milliseconds."""
    if isinstance(value, bool) or value in (None, ""):
        return ""
    if isinstance(value, (int, float)):
        seconds = value / 1000 if value > 1e11 else value
        try:
            return datetime.fromtimestamp(seconds, tz=timezone.utc).isoformat()
        except (OverflowError, OSError, ValueError):
            return ""
    return str(value)


def extract_session(abs_path: str) -> list[Segment]:
    with open(abs_path, "rb") as fh:
        data = fh.read()
    text = decode_utf8(data, abs_path)
    segments: list[Segment] = []
    bad_lines = 0
    records = 0
    # Only "\n" ends a JSONL record: U+2028 and friends may appear raw inside JSON strings.
    for line_no, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            bad_lines += 1
            continue
        if not isinstance(record, dict):
            bad_lines += 1
            continue
        records += 1
        parsed = _message(record)
        if parsed is None:
            continue
        role, body, timestamp = parsed
        if not body:
            continue
        body, _ = redact(body)
        when = timestamp.replace("T", " ")[:16] if timestamp else ""
        label = f"[{when}] {role}:" if when else f"{role}:"
        segments.append(Segment(text=body, line_start=line_no, line_end=line_no, label=label))
    if records == 0 and bad_lines:
        raise ExtractionError(abs_path, f"not a JSONL transcript: none of its {bad_lines} lines is a JSON object")
    return segments
