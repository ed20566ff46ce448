"""Redaction of obvious secrets before text is stored or sent to an embedding API."""

from __future__ import annotations

import re

_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("private-key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S)),
    ("anthropic-key", re.compile(r"\bsk-ant-[A-Za-z0-9_\-]{20,}")),
    ("openai-key", re.compile(r"\bsk-(?:proj-|svcacct-)?[A-Za-z0-9_\-]{20,}")),
    ("github-token", re.compile(r"\b(?:ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{30,}|\bgithub_pat_[A-Za-z0-9_]{40,}")),
    ("aws-access-key", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("google-api-key", re.compile(r"\bAIza[0-9A-Za-z_\-]{35}(?![0-9A-Za-z_\-])")),
    ("slack-token", re.compile(r"\bxox[abposr]-[A-Za-z0-9\-]{10,}")),
    ("stripe-key", re.compile(r"\b[sr]k_(?:live|test)_[A-Za-z0-9]{20,}")),
    ("jwt", re.compile(r"\beyJ[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}\.[A-Za-z0-9_\-]{10,}")),
    ("bearer-token", re.compile(r"(?i)(?<=\bbearer )[A-Za-z0-9._\-~+/]{16,}=*")),
)
# key = value / "key": "value" where the key names a secret
_ASSIGNMENT = re.compile(
    r"""(?ix)
    (\b[\w.-]*(?:api[_-]?key|secret|password|passwd|access[_-]?token|auth[_-]?token)["']?\s*[:=]\s*["']?)
    ([^\s"',;]{8,})
    """
)


def redact(text: str) -> tuple[str, int]:
    """The text with secrets replaced by ``[REDACTED:kind]``, and how many were replaced."""
    count = 0
    for kind, pattern in _PATTERNS:
        # Keep the line count so locators (line ranges) stay true after redaction.
        text, n = pattern.subn(lambda m, k=kind: f"[REDACTED:{k}]" + "\n" * m.group(0).count("\n"), text)
        count += n

    def _assign(m: re.Match[str]) -> str:
        if m.group(2).startswith("[REDACTED"):
            return m.group(0)
        return f"{m.group(1)}[REDACTED:secret]"

    text, n = _ASSIGNMENT.subn(_assign, text)
    return text, count + n
