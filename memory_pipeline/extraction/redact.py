"""Redaction of secrets before text is stored or sent to an embedding API.

``redact(text)`` replaces each secret *value* with ``[REDACTED:<kind>]`` and keeps what
a searcher needs around it: the key name (``AWS_SECRET_ACCESS_KEY=[REDACTED:secret]``),
a URL's user and host (``postgres://admin:[REDACTED:password]@db:5432/x``).

Guarantees, relied on by the extractors:

- Line numbers are locators, so every line break of the input survives (a private key
  block becomes one marker followed by the block's line breaks).
- Idempotent: markers are never matched again, and a line is re-scanned until nothing
  more is found, so ``redact(redact(x)[0])[0] == redact(x)[0]``.
- Never raises and stays linear on any ``str``: each line is scanned on its own, long
  lines in overlapping windows (``_WINDOW`` characters), so a regex that backtracks
  (ours or a plugin's) works on a bounded string.

Detectors, in order of precedence when two find the same text:

1. detect-secrets' shape plugins (``detect_secrets.plugins.*``): AWS, GitHub, GitLab,
   Slack, Stripe, Twilio, OpenAI (legacy), SendGrid, Discord, Telegram, npm, PyPI,
   Azure storage, Mailchimp, Artifactory, Square, IBM Cloud/COS, Cloudant, SoftLayer.
   Their regexes find where, their ``analyze_string`` confirms; ``analyze_line`` is
   not used: it reads the library's global settings singleton (and may attempt
   network verification). The plugins keep no state, so one shared instance each is
   safe across threads. Each runs only where its gate (below) passes, which keeps
   ordinary prose cheap (all plugins on every line would cost ~1.2 s/MB).
2. Our own token shapes, each where the plugins miss it (reasons beside each).
3. ``Authorization:`` / ``Bearer`` and ``Cookie:`` headers, URL credentials (and a
   random-looking token as a URL's user), signatures in a URL's query string (Azure
   SAS, presigned S3/GCS), passwords on command lines (``mysql -p``, ``curl -u``,
   ``docker login -p``, ``--token x``; ``.netrc`` and ``.pgpass`` lines, see
   ``_CLI``), and key/value assignments whose key names a secret (see
   ``_assignments``), our own code: the plugins' versions (BasicAuthDetector,
   KeywordDetector) are built for source files and go wrong on notes, as explained
   where ours are defined.

Private key blocks (PEM, PGP, PuTTY, and PEM encoded once more in base64) are found
in the whole text first, since they span lines or run past a window; so are a markdown
table's cells under a column whose header names a secret, and a YAML value on the line
below its key (see ``_redact_tables``, ``_redact_next_lines``). Extractors that split a
table's rows from its header (CSV, docx, HTML) redact such cells with ``redact_cell``.

Not used: the high-entropy string detectors. On prose they redact git SHAs, UUIDs,
hashes and ids that users search for. A random-looking value is only redacted where a
key, header or URL says it is a secret; ``looks_like_secret`` (one config value, not
prose) is the one place a random-looking run alone counts.
"""

from __future__ import annotations

import base64
import bisect
import functools
import importlib
import itertools
import logging
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

# Long lines are scanned in windows of this many characters, each overlapping the
# previous one by _OVERLAP, so a secret up to _OVERLAP characters long lies wholly in
# some window. Both bound what a backtracking regex can cost per window.
_WINDOW = 4096
_OVERLAP = 1024
# A found value is widened over adjacent token characters (a key longer than the
# plugin's fixed length keeps no visible tail), but never by more than this.
_EXTEND_MAX = 256
# A line is re-scanned after redaction until nothing more is found (idempotence);
# each pass only shrinks the unredacted text, and in practice one pass suffices.
_MAX_PASSES = 4

# Where a plugin's match has run past its token (npm's ".+" takes the rest of the line).
_TOKEN_END = re.compile(r"[\s\"'`;,<>\\|(){}\[\]]")
_MARKER = re.compile(r"\[REDACTED:[a-z0-9-]+\]")
_LINE_BREAKS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
_TOKEN_RUN = re.compile(r"[A-Za-z0-9_\-]*")


def _marker(kind: str) -> str:
    return f"[REDACTED:{kind}]"


# --- gates ------------------------------------------------------------------------------
#
# Each detector has a gate: cheap tests that pass for every line it could match (a
# superset). Before anything else the gates of all detectors run once over the whole
# text, marking the lines worth scanning; ordinary prose has none and costs nothing
# more. Within a scanned line, each detector runs only on windows its gate passes.
# Gate patterns are linear on any text (a fixed-length tail after a literal start).


@dataclass(frozen=True)
class _Gate:
    literals: tuple[str, ...] = ()  # any of these substrings
    lower_literals: tuple[str, ...] = ()  # ... or of these, in the lower-cased text
    pattern: re.Pattern[str] | None = None  # ... or a match of this
    lower_pattern: re.Pattern[str] | None = None  # ... or of this, in the lower-cased text
    requires: str = ""  # and, within a window, this substring too (not used to mark lines)

    def passes(self, text: str, low: str) -> bool:
        if self.requires and self.requires not in text:
            return False
        for needle in self.literals:
            if needle in text:
                return True
        for needle in self.lower_literals:
            if needle in low:
                return True
        return bool((self.pattern is not None and self.pattern.search(text)) or (self.lower_pattern is not None and self.lower_pattern.search(low)))


def _search_at(pattern: re.Pattern[str], text: str, at: int) -> int:
    m = pattern.search(text, at)
    return m.start() if m else -1


class _LineIndex:
    """Line starts of a text, to turn a position into a line number."""

    def __init__(self, lines: list[str]) -> None:
        self.starts = list(itertools.accumulate(map(len, lines), lambda total, n: total + n + 1, initial=0))

    def mark(self, find: Callable[[int], int], marked: set[int]) -> None:
        at = find(0)
        while at >= 0:
            i = bisect.bisect_right(self.starts, at) - 1
            marked.add(i)
            at = find(self.starts[i + 1]) if i + 1 < len(self.starts) - 1 else -1  # on to the next line


# Look-alikes of ":" and "=" (full-width and small forms, ratio, modifier colon) that
# CJK text and pasted documents use as the assignment.
_COLONS = "\uff1a\ufe13\ufe55\u2236\ua789"
_EQUALS = "\uff1d\ufe66"

# A keyword, an identifier's tail, list indexes, closing quotes, and an assignment (or a
# table's cell separator). Bounded and possessive ({0,80}+ never gives back), so linear
# on any text, long identifiers too.
_ASSIGNMENT_GATE = re.compile(
    r"""(?:pass|pwd|pw|psk|secret|token|key|credential|auth|contrase)[\w.\-]{0,80}+(?:\[[0-9]{1,6}\]){0,4}(?:\\?["'`]|[\]*)]){0,3}[ \t]{0,8}"""
    rf"""(?:[:=!|{_COLONS}{_EQUALS}]|[ \t](?:is|was)[ \t])"""
)


# The IBM, Cloudant and SoftLayer plugins want a keyword, an assignment (or spaces) and
# a value of 24+ token characters.
_LONG_VALUE_GATE = re.compile(r"""(?:key|pwd|pw|pass|token|secret)[\w.\-]{0,80}+["'\]]{0,2}[ \t]{0,8}(?:=>|:=|::|[:=]|[ \t])[ \t]{0,8}["']?[\w\-]{24}""")


# --- detect-secrets plugins --------------------------------------------------------------


@dataclass(frozen=True)
class _Plugin:
    target: str  # "module:Class" under detect_secrets.plugins, imported on first use
    kind: str
    gate: _Gate
    kind_of: Callable[[str], str] | None = None  # a kind that depends on the value found


_AWS_PREFIXES = ("A3T", "ABIA", "ACCA", "AKIA", "ASIA")
_PLUGINS: tuple[_Plugin, ...] = (
    _Plugin(
        "aws:AWSKeyDetector",
        "aws-access-key",
        _Gate(_AWS_PREFIXES, ("aws",)),
        kind_of=lambda v: "aws-access-key" if v.startswith(_AWS_PREFIXES) else "aws-secret-key",
    ),  # fmt: skip
    _Plugin("github_token:GitHubTokenDetector", "github-token", _Gate(("ghp_", "gho_", "ghu_", "ghs_", "ghr_"))),
    _Plugin(
        "gitlab_token:GitLabTokenDetector",
        "gitlab-token",
        _Gate(("glpat-", "gldt-", "glft-", "glsoat-", "glrt-", "GR1348941", "glcbt-", "glimt-", "glptt-", "glagent-", "gloas-")),
    ),  # fmt: skip
    # The plugin's regex backtracks over a run of "eyJ" without a dot (quadratic in the
    # window); a JWT always has a dot, so a window without one is skipped.
    _Plugin("jwt:JwtTokenDetector", "jwt", _Gate(("eyJ",), requires=".")),
    _Plugin(
        "slack:SlackDetector",
        "slack-token",
        _Gate(lower_literals=("xox", "hooks.slack.com")),
        kind_of=lambda v: "slack-webhook" if v.lower().startswith("https://") else "slack-token",
    ),  # fmt: skip
    _Plugin("stripe:StripeDetector", "stripe-key", _Gate(("k_live_",))),
    _Plugin("twilio:TwilioKeyDetector", "twilio-key", _Gate(pattern=re.compile(r"(?:AC|SK)[a-z0-9]{32}"))),
    _Plugin("openai:OpenAIDetector", "openai-key", _Gate(("T3BlbkFJ",))),
    _Plugin("sendgrid:SendGridDetector", "sendgrid-key", _Gate(pattern=re.compile(r"SG\.[\w-]{22}\."))),
    _Plugin("discord:DiscordBotTokenDetector", "discord-token", _Gate(pattern=re.compile(r"\.[\w-]{6}\.[\w-]{27}"))),
    _Plugin("telegram_token:TelegramBotTokenDetector", "telegram-token", _Gate(pattern=re.compile(r":[\w-]{35}"))),
    _Plugin("npm:NpmDetector", "npm-token", _Gate(("_authToken",))),
    _Plugin("pypi_token:PypiTokenDetector", "pypi-token", _Gate(("pypi-Ag",))),
    _Plugin("azure_storage_key:AzureStorageKeyDetector", "azure-storage-key", _Gate(("AccountKey=",))),
    _Plugin("mailchimp:MailchimpDetector", "mailchimp-key", _Gate(pattern=re.compile(r"-us\d"))),
    _Plugin("artifactory:ArtifactoryDetector", "artifactory-token", _Gate(("AKC",), pattern=re.compile(r"AP[\dA-F][a-zA-Z0-9]{8}"))),
    _Plugin("square_oauth:SquareOAuthDetector", "square-secret", _Gate(("sq0csp-",))),
    _Plugin("ibm_cloud_iam:IbmCloudIamDetector", "ibm-cloud-key", _Gate(lower_pattern=_LONG_VALUE_GATE)),
    _Plugin("ibm_cos_hmac:IbmCosHmacDetector", "ibm-cos-key", _Gate(lower_pattern=_LONG_VALUE_GATE)),
    _Plugin("cloudant:CloudantDetector", "cloudant-key", _Gate(lower_literals=("cloudant.com",), lower_pattern=_LONG_VALUE_GATE)),
    _Plugin("softlayer:SoftlayerDetector", "softlayer-key", _Gate(lower_literals=("softlayer.com",), lower_pattern=_LONG_VALUE_GATE)),
)


@functools.cache
def _plugin_instance(target: str) -> Any:
    # Imported on first need: detect-secrets pulls in `requests` (~0.7 s), which a
    # config load or a note without any candidate line should not pay for.
    module, cls = target.split(":")
    shown = warnings.showwarning
    plugin = getattr(importlib.import_module(f"detect_secrets.plugins.{module}"), cls)
    if warnings.showwarning is not shown:
        # detect-secrets' logger set-up calls logging.captureWarnings(True) at import: every later
        # Python warning of the process would go to a logger without a handler, i.e. nowhere.
        logging.captureWarnings(False)
    return plugin()


def _plugin_spans(plugin: _Plugin, window: str) -> Iterator[tuple[int, int, str]]:
    """(start, end, value) of each secret the plugin finds in the window."""
    detector = _plugin_instance(plugin.target)
    # analyze_string yields values, not places, and for a regex with a group it yields
    # the group, which for some plugins is only the prefix (GitHub's "ghp"). So the
    # plugin's own regexes say where, and its analyze_string confirms (JWT checks the
    # token decodes).
    for regex in detector.denylist:
        for m in regex.finditer(window):
            group = next((g for g in range(1, (m.lastindex or 0) + 1) if len(m.group(g) or "") >= 8), 0)
            start = m.start(group)
            value = m.group(group)
            # Some matches carry delimiters (Artifactory), the key name (Azure's
            # "AccountKey=") or the rest of the line (npm's ".+").
            stripped = value.lstrip(" \t\"'=:")
            if stripped.startswith("AccountKey="):
                stripped = stripped[len("AccountKey=") :]
            start += len(value) - len(stripped)
            token = _TOKEN_END.split(stripped, maxsplit=1)[0]
            if len(token) >= 8 and any(True for _ in detector.analyze_string(m.group(0))):
                yield start, start + len(token), token


# --- own token shapes ---------------------------------------------------------------------


def _mixed(value: str) -> bool:
    """Random-looking: letters and digits, and a long unbroken alphanumeric run."""
    has_digit = any(c.isdigit() for c in value)
    has_alpha = any(c.isalpha() for c in value)
    longest = max((len(r) for r in re.findall(r"[A-Za-z0-9]+", value)), default=0)
    return has_digit and has_alpha and longest >= 12


@dataclass(frozen=True)
class _Shape:
    kind: str
    pattern: re.Pattern[str]
    needles: tuple[str, ...]  # the gate: literals, one of which every match holds
    check: Callable[[str], bool] | None = None  # a further test of the matched value

    @property
    def gate(self) -> _Gate:
        return _Gate(self.needles)


_SHAPES: tuple[_Shape, ...] = (
    # Anthropic and Google keys: no detect-secrets plugin exists for them.
    _Shape("anthropic-key", re.compile(r"sk-ant-[A-Za-z0-9_\-]{20,}"), ("sk-ant-",)),
    _Shape("google-api-key", re.compile(r"AIza[0-9A-Za-z_\-]{35}"), ("AIza",)),
    _Shape("google-oauth-secret", re.compile(r"GOCSPX-[A-Za-z0-9_\-]{20,}"), ("GOCSPX-",)),
    _Shape("google-oauth-token", re.compile(r"ya29\.[0-9A-Za-z_\-]{20,}"), ("ya29.",)),
    # OpenAIDetector only knows legacy keys carrying "T3BlbkFJ"; project, service-account
    # and admin keys (sk-proj-, sk-svcacct-, sk-admin-) do not carry it. The value must
    # look random, so prose like "sk-learn-compatible-transformers" stays.
    _Shape("openai-key", re.compile(r"(?<![A-Za-z0-9_\-])sk-[A-Za-z0-9_\-]{20,}"), ("sk-",), _mixed),
    # GitHubTokenDetector covers ghp_/gho_/ghu_/ghs_/ghr_ but not fine-grained tokens.
    _Shape("github-token", re.compile(r"github_pat_[A-Za-z0-9_]{40,}"), ("github_pat_",)),
    # NpmDetector only finds tokens on an .npmrc "_authToken=" line.
    _Shape("npm-token", re.compile(r"(?<![A-Za-z0-9])npm_[A-Za-z0-9]{36}"), ("npm_",)),
    # PypiTokenDetector wants 70+ characters after the prefix; shorter ones exist.
    _Shape("pypi-token", re.compile(r"pypi-AgE[A-Za-z0-9_\-]{40,}"), ("pypi-AgE",)),
    # StripeDetector only knows live keys; test-mode and webhook secrets still open an account.
    _Shape("stripe-key", re.compile(r"(?<![A-Za-z0-9])(?:[sr]k_test_[A-Za-z0-9]{20,}|whsec_[A-Za-z0-9]{24,})"), ("k_test_", "whsec_")),
    # Slack app-level and config tokens (xapp-, xoxe.) fall outside SlackDetector's xox?- shape.
    _Shape("slack-token", re.compile(r"xapp-\d-[A-Za-z0-9\-]{20,}|xoxe\.xox[a-z]-[A-Za-z0-9\-]{20,}"), ("xapp-", "xoxe.")),
    # ArtifactoryDetector wants whitespace or a quote on both sides, so a key before a
    # comma or semicolon (a sentence, a CSV row) is missed.
    _Shape("artifactory-token", re.compile(r"(?<![A-Za-z0-9])AKCp[A-Za-z0-9]{60,}"), ("AKCp",)),
    # Hugging Face, DigitalOcean, Shopify, Databricks: common in agent notes, no plugin.
    _Shape("huggingface-token", re.compile(r"(?<![A-Za-z0-9_])hf_[A-Za-z0-9]{30,}"), ("hf_",)),
    _Shape("digitalocean-token", re.compile(r"do[opr]_v1_[a-f0-9]{64}"), ("_v1_",)),
    _Shape("shopify-token", re.compile(r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}"), ("shp",)),
    _Shape("databricks-token", re.compile(r"dapi[a-f0-9]{32}"), ("dapi",)),
    # More prefixed tokens without a plugin, frequent in agent notes (prefixes and lengths
    # as the issuers document them; a short prefix also needs a random-looking value).
    _Shape("vault-token", re.compile(r"(?<![A-Za-z0-9_.\-])hv[sbr]\.[A-Za-z0-9_\-]{24,}"), ("hvs.", "hvb.", "hvr."), _mixed),
    _Shape("grafana-token", re.compile(r"glsa_[A-Za-z0-9]{32}_[A-Fa-f0-9]{8}|glc_[A-Za-z0-9+/]{32,}={0,2}"), ("glsa_", "glc_")),
    _Shape("linear-key", re.compile(r"lin_api_[A-Za-z0-9]{40}"), ("lin_api_",)),
    _Shape("postman-key", re.compile(r"PMAK-[a-fA-F0-9]{24}-[a-fA-F0-9]{34}"), ("PMAK-",)),
    _Shape("age-secret-key", re.compile(r"AGE-SECRET-KEY-1[QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L]{58}"), ("AGE-SECRET-KEY-1",)),
    _Shape("doppler-token", re.compile(r"dp\.(?:st|sa|ct|scim|audit|pt)\.(?:[a-z0-9_\-]{2,35}\.)?[A-Za-z0-9]{40,44}"), ("dp.",)),
    _Shape("supabase-key", re.compile(r"sb_secret_[A-Za-z0-9_\-]{20,}"), ("sb_secret_",)),
    _Shape("discord-webhook", re.compile(r"discord(?:app)?\.com/api/webhooks/\d{17,20}/[A-Za-z0-9_\-]{60,}"), ("/api/webhooks/",)),
    # base64 of '{"auths":': a Docker config (a Kubernetes .dockerconfigjson) holding registry passwords.
    _Shape("docker-auth", re.compile(r"eyJhdXRocyI6[A-Za-z0-9+/]{16,}={0,2}"), ("eyJhdXRocyI6",)),
    _Shape("xai-key", re.compile(r"(?<![A-Za-z0-9_\-])xai-[A-Za-z0-9]{70,}"), ("xai-",)),
    _Shape("groq-key", re.compile(r"(?<![A-Za-z0-9_\-])gsk_[A-Za-z0-9]{48,}"), ("gsk_",)),
    _Shape("replicate-token", re.compile(r"(?<![A-Za-z0-9_\-])r8_[A-Za-z0-9]{37}(?![A-Za-z0-9])"), ("r8_",), _mixed),
    _Shape("perplexity-key", re.compile(r"pplx-[A-Za-z0-9]{48}"), ("pplx-",)),
    _Shape("langsmith-key", re.compile(r"lsv2_(?:pt|sk)_[a-f0-9]{32}_[a-f0-9]{10}"), ("lsv2_",)),
    _Shape("pinecone-key", re.compile(r"pcsk_[A-Za-z0-9_]{40,}"), ("pcsk_",)),
    _Shape("docker-hub-token", re.compile(r"dckr_pat_[A-Za-z0-9_\-]{27,}"), ("dckr_pat_",)),
    _Shape("tailscale-key", re.compile(r"tskey-[a-z]+-[A-Za-z0-9]{6,}-[A-Za-z0-9]{20,}"), ("tskey-",)),
    _Shape("notion-token", re.compile(r"ntn_[0-9]{11}[A-Za-z0-9]{35}"), ("ntn_",)),
    _Shape("sentry-token", re.compile(r"sntry[su]_[A-Za-z0-9+/=_]{40,}"), ("sntrys_", "sntryu_")),
)

# "Bearer <token>" anywhere, and the value of an Authorization header (Basic, Token,
# Digest or bare). No plugin covers either. A bare "bearer" needs a random-looking
# token, so prose ("bearer authentication") stays.
_BEARER = re.compile(r"(?i)(?<![A-Za-z])bearer[ \t]+([A-Za-z0-9._~+/\-]{8,}=*)")
_AUTH_HEADER = re.compile(r"""(?i)authorization\\?["']?[ \t]*[:=][ \t]*\\?["']?(?:(?:basic|token|digest|apikey|bearer)[ \t]+)?([A-Za-z0-9._~+/\-]{8,}=*)""")

# URL credentials: scheme://[user]:password@host. Own pattern: BasicAuthDetector needs a
# user (misses redis://:pw@host), stops at sub-delimiters a password may hold (!$&*+,;=)
# and returns only the password, which cannot be placed back in the line when short.
# The password runs to the last "@" of the authority; user and host stay visible.
_URL_CREDENTIALS = re.compile(r"""(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]{0,30}://[^\s:/?#@\[\]"'<>\\]*:([^\s/?#"'<>\\]+)@(?=[A-Za-z0-9\[])""")
# A token as the whole user part (https://<token>@github.com, a Sentry DSN's key): a user
# name does not look random, so only a random-looking one (_mixed) of 20+ characters.
_URL_TOKEN_USER = re.compile(r"""(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]{0,30}://([A-Za-z0-9._~%\-]{20,256}+)@(?=[A-Za-z0-9\[])""")
# Signatures in a query string: an Azure SAS "sig=", a presigned S3/GCS URL's
# X-Amz-Signature/X-Goog-Signature. Whoever has the URL has the access it grants.
_QUERY_SIGNATURE = re.compile(r"""(?i)[?&;](?:sig|signature|x-amz-signature|x-goog-signature)=([^\s&#"'<>\\;,]{8,512})""")
# A Cookie / Set-Cookie header ("Copy as cURL" from a browser): each random-looking value
# of 8+ characters is a session or an id; the cookie names and Set-Cookie attributes stay.
_COOKIE_HEADER = re.compile(r"""(?i)(?<![\w-])(?:set-)?cookie\\?["']?[ \t]*:[ \t]*""")
_COOKIE_PAIR = re.compile(r"""[ \t]*([^\s=;"'\\]{1,128})=([^\s;"'\\]{0,4096}+)[ \t]*(?:;|(?=[\s"'\\]|$))""")
_COOKIE_ATTRIBUTES = frozenset({"path", "domain", "expires", "max-age", "samesite", "priority", "version", "comment"})


# --- key/value assignments ----------------------------------------------------------------
#
# Own code in place of KeywordDetector. That plugin picks its regexes by file extension
# (analyze_line), and none of them suits notes: the config-file set takes the whole rest
# of the line as the value ("Reset your password: see the wiki" -> "see the wiki"),
# matches inside words ("secretary: Ana"), knows no "token", and reports only the first
# hit per regex, without a position. Its keyword list is the starting vocabulary here.
#
# A key is an identifier (letters, digits, _ . -) that holds a keyword; it is split into
# words (snake, kebab, dotted, camelCase) and counts when a word, or two adjacent words
# joined, is a secret word, and no word marks it as metadata (password_file, max_tokens).

# An identifier of at most 64 characters holding a keyword (without leading or trailing
# "." and "-"), list indexes (a flattened JSON list: "passwords[0]", "api_keys[2]"), then
# the assignment: closing quotes, brackets or markdown emphasis, the operator (or a look-
# alike of ":" or "="; or "|", a table's next cell), emphasis again. The lookbehind starts
# it at an identifier's start and the bounds keep it linear on long runs of letters.
_KEYED_IDENT = re.compile(
    r"""(?<![\w.\-])[.\-]{0,8}(?P<ident>[\w.\-]{0,64}?(?:pass|pwd|pw|psk|secret|token|key|credential|auth|contrase)(?:[\w.\-]{0,64}\w)?)[.\-]{0,8}(?![\w.\-])"""
    r"""(?:\[[0-9]{1,6}\]){0,4}(?:\\?["'`]|[\]*_)]){0,3}[ \t]{0,8}"""
    rf"""(?P<sep>:=|=>|={{1,3}}|!==?|::|:(?![/\\]{{2}})|[{_COLONS}{_EQUALS}]|\|(?!\|)|[ \t](?:is|was)[ \t])[ \t]{{0,8}}(?:[*_]{{1,3}}[ \t]{{0,4}})?""",
    re.I,
)
# A version as a package pin or a manifest gives it: 0.14.0, ^3.3, >=2.0.1rc1, v1.2.3-beta.
_VERSION = re.compile(r"[~^<>=!v]{0,3}[0-9]{1,6}(?:\.[0-9]{1,6}){1,4}(?:[-.+]?[A-Za-z0-9]{1,12}){0,2}")
_PREV_WORD = re.compile(r"(?<![\w.\-])([A-Za-z]{2,20})[ \t]$")
_WORDS = re.compile(r"[A-ZÑ]?[a-zñ]+|[A-ZÑ]+(?![a-zñ])|[0-9]+")

_PASSWORD_WORDS = frozenset({"password", "passwd", "pwd", "passphrase", "passcode", "psk", "contraseña", "contrasena"})
_SECRET_WORDS = _PASSWORD_WORDS | frozenset({"secret", "token", "credential", "credentials", "apikey", "privatekey"})
# Secret only in a code-like key (auth: on a docker config line, DB_PASS=), since as
# prose words they label ordinary things ("Pass: the salt", "Auth: Google").
_WEAK_WORDS = frozenset({"pass", "pw", "auth"})
_KEY_PAIRS = frozenset(
    {
        "apikey", "authkey", "accesskey", "privatekey", "secretkey", "servicekey", "accountkey", "clientkey",
        "masterkey", "signingkey", "encryptionkey", "dbkey", "databasekey", "appkey", "sessionkey", "dbpass",
        "databasepass", "keypass", "userpass", "authtoken",
    }
)  # fmt: skip
_METADATA_WORDS = frozenset(
    {
        "type", "types", "count", "counts", "length", "len", "size", "limit", "limits", "max", "min", "policy",
        "policies", "hint", "hints", "file", "files", "path", "paths", "dir", "name", "names", "url", "uri", "urls",
        "endpoint", "endpoints", "ttl", "expiry", "expires", "expiration", "expire", "expired", "timeout", "env",
        "var", "field", "fields", "header", "prompt", "reset", "required", "enabled", "enable", "disabled", "rotation",
        "version", "ref", "arn", "budget", "budgets", "usage", "tokens", "encoding", "format",
        "regex", "pattern", "mode", "method", "scheme", "provider", "source", "location", "label", "description",
        "placeholder", "example", "strength", "changed", "updated", "created", "age", "last", "santa", "sauce",
        "ingredient", "rotate", "question", "questions", "input", "stdin", "change", "forgot",
    }
)  # fmt: skip
# Metadata only as the last word: password_manager, secrets_vault name where secrets are
# kept, while VAULT_TOKEN, storePassword, trust_store_password are secrets.
_CONTAINER_WORDS = frozenset({"vault", "manager", "store"})
# A secret word glued to a prefix in a code-like key: PGPASSWORD, REDISPASSWORD, CLIENTSECRET.
# Not "token": names of things end in it (tiktoken, TIKTOKEN_ENCODING=cl100k_base).
_SECRET_SUFFIXES = ("password", "passwd", "passphrase", "secret")
# A list of secrets (a JSON list flattened to "passwords[0]: x", "api_keys: [...]") is
# keyed by the plural. Not "tokens": it counts things (max_tokens, "tokens: 512").
_SINGULAR = {
    "passwords": "password", "passwds": "passwd", "passphrases": "passphrase", "passcodes": "passcode",
    "secrets": "secret", "keys": "key", "apikeys": "apikey",
}  # fmt: skip

# The value: quoted (CSV-doubled, JSON-escaped, plain, single, backtick) or a bare word.
# A bare word stops at , ; & | < > and quotes, which end it in CSV rows, query strings
# and markup far more often than they belong to a password. A value is read up to
# _VALUE_MAX characters (a quoted one may be cut there, its closing quote further on);
# a value found and cut is then taken to its end (_VALUE_REST), so a long one (a
# kubeconfig's client-key-data, an access token) keeps no visible tail.
_VALUE_MAX = 512
_VALUE = re.compile(
    r"""""(?P<v0>[^"\r\n]{1,512}+)(?:""|(?=[^"\r\n]))|\\"(?P<v1>[^"\\\r\n]{1,512}+)(?:\\"|(?=[^"\\\r\n]))"""
    r"""|"(?P<v2>[^"\r\n]{1,512}+)(?:"|(?=[^"\r\n]))|'(?P<v3>[^'\r\n]{1,512}+)(?:'|(?=[^'\r\n]))"""
    r"""|`(?P<v4>[^`\r\n]{1,512}+)(?:`|(?=[^`\r\n]))|(?P<v5>[^\s"'`,;\\<>&|]{1,512})"""
)
_VALUE_REST = {
    "v0": re.compile(r'[^"\r\n]*+'),
    "v1": re.compile(r'[^"\\\r\n]*+'),
    "v2": re.compile(r'[^"\r\n]*+'),
    "v3": re.compile(r"[^'\r\n]*+"),
    "v4": re.compile(r"[^`\r\n]*+"),
    "v5": re.compile(r"""[^\s"'`,;\\<>&|]*+"""),
}
# No nested quantifiers in these two: they run on text of any shape.
_LINE_START = re.compile(r"""[ \t\-*+>#0-9.)"'{\[,(\\$]*(?:(?:export|set|setx)[ \t]+)?[ \t"'{\[]*""", re.I)
_LINE_END = re.compile(r"""[ \t.,;:!)\]}]*(?:$|\\n|\\r)""")
_NOT_A_SECRET = re.compile(
    r"""(?ix)
    \[REDACTED:                  # already redacted
    | \$?\{\{ | <[^>]*>$ | \[[^\]]*\]$ | \.\.\.$ | …$  # templates, <placeholder>, [placeholder]
    | your[_\-]?(?:[a-z]+[_\-]?)?(?:password|passwd|pass|pw|token|key|secret)$  # yourpassword, your-api-key
    | [*xX.\-_#•]+$              # masked: ****, xxxx
    | (?:none|null|nil|true|false|yes|no|on|off|undefined|required|optional|string|str|bytes|int|redacted|hidden|empty
       |set|unset|tbd|todo|n/a|na|secret|password|token|see|here|below|above|the|a|an|is|to|of|and|or|in|for|from)$
    | (?:https?|file)://           # a URL (its credentials are the URL detector's)
    | (?-i:[A-Z][A-Z0-9]*_[A-Z0-9_]+$)  # the name of an environment variable
    | process\.env | os\.environ | env\.
    """
)
# What a URL's password may be without being one: a marker, a reference, a placeholder.
_URL_PLACEHOLDER = re.compile(r"\[REDACTED:|[$%]\{?[A-Za-z_(]|\{\{|<[^>]*>$|[*xX.]+$")

# References, paths and calls are not the secret, but a password may hold a "(" or start
# with "$", "%" or "/" (generated ones often do), so each counts only in its own shape:
# - a reference: ${...}, $(...), %(name)s and %NAME% always; a bare $NAME only when NAME is
#   named like a variable (DB_PASSWORD, redis_password, dbPassword): a name mixing upper
#   case, lower case and digits ($DollarLEAK77x) is a password that starts with "$", and
#   "%Tr0ub4dor9" (no closing "%") is no Windows variable;
# - a path: ./ ../ ~/ C:\ , or "/" with a second segment (/run/secrets/db) or a plain word
#   (/tmp); "/Abc123xyz9" is one segment that looks like a password;
# - a call: name( whose value ends inside its arguments (cut at a quote: os.getenv("X"),
#   with the ")" later on the line) or at its closing ")" (get_password(), f(x).strip(),
#   f(x)[0]); "Xk9(ParenLEAK2z" never closes and "AbC(12)dEf34gHi56" goes on after the
#   ")", so both are passwords. A value starting with "(" is a parenthetical note.
_BARE_VAR = re.compile(r"[$%]([A-Za-z_][A-Za-z0-9_]{0,127}+)(?![A-Za-z0-9_])")
_CALL = re.compile(r"[A-Za-z_][\w.]{0,127}+\(")
_WINDOWS_PATH = re.compile(r"[A-Za-z]:\\")


def _reference(value: str) -> bool:
    if value.startswith(("${", "$(", "%(")):
        return True
    var = _BARE_VAR.match(value)
    if var is None:
        return False
    if value[0] == "%":
        return value.startswith("%", var.end())
    name = var.group(1)
    return not (any(c.isdigit() for c in name) and any(c.isupper() for c in name) and any(c.islower() for c in name))


def _path(value: str) -> bool:
    if value.startswith(("./", "../", "~/")) or _WINDOWS_PATH.match(value):
        return True
    if not value.startswith("/"):
        return False
    first = value[1:].split("/", 1)
    return (len(first) > 1 and first[1] != "") or not _strong(first[0])


def _call(value: str, after: str) -> bool:
    if value.startswith("("):
        return True
    call = _CALL.match(value)
    if call is None:
        return False
    args = value[call.end() :]
    if ")" not in args:
        return ")" in after
    rest = args[args.rfind(")") + 1 :]
    return rest == "" or rest[0] in ".["


def _not_a_secret(value: str, after: str = "") -> bool:
    """A placeholder, reference, path or call rather than the secret (``after``: the line after the value)."""
    return _NOT_A_SECRET.match(value) is not None or _reference(value) or _path(value) or _call(value, after)


def _key_words(ident: str) -> list[str]:
    return [w.lower() for w in _WORDS.findall(ident)]


@functools.lru_cache(maxsize=4096)
def _key_kind(ident: str, quoted: bool) -> tuple[str | None, bool]:
    """The kind of secret a key names ('password', 'token', 'api-key', 'secret') or None, and whether it is code-like."""
    code_like = _code_like(ident, quoted)
    return _secret_key_kind(ident, code_like), code_like


def _secret_key_kind(ident: str, code_like: bool) -> str | None:
    words = [_SINGULAR.get(w, w) for w in _key_words(ident)]
    if not words or any(w in _METADATA_WORDS for w in words) or words[-1] in _CONTAINER_WORDS:
        return None
    found: set[str] = set()
    for i, word in enumerate(words):
        if word in _SECRET_WORDS or (code_like and word in _WEAK_WORDS):
            found.add(word)
        elif code_like:
            found.update(s for s in _SECRET_SUFFIXES if word.endswith(s))
        if word in _KEY_PAIRS:  # written as one word: apikey, ACCOUNTKEY
            found.add(word)
        if i + 1 < len(words) and word + words[i + 1] in _KEY_PAIRS:
            found.add(word + words[i + 1])
    if not found:
        return None
    if found & (_PASSWORD_WORDS | {"pass", "pw", "dbpass", "databasepass", "keypass", "userpass"}):
        return "password"
    if found & {"token", "authtoken"}:
        return "token"
    if found & {"apikey"}:
        return "api-key"
    return "secret"


def _code_like(ident: str, quoted: bool) -> bool:
    # A key written as code (quoted, snake/kebab/dotted, camelCase, ALL CAPS) is an
    # assignment; a plain capitalised word before a colon may be prose.
    return quoted or any(c in ident for c in "_-.") or bool(re.search(r"[a-z][A-Z]", ident)) or (len(ident) > 2 and ident.isupper())


def _strong(value: str) -> bool:
    """A value that looks like a password rather than a word: letters and digits, or mixed case and symbols."""
    if len(value) < 6:
        return False
    digit = any(c.isdigit() for c in value)
    alpha = any(c.isalpha() for c in value)
    upper = any(c.isupper() for c in value)
    lower = any(c.islower() for c in value)
    symbol = any(not c.isalnum() for c in value)
    return (digit and alpha) or (len(value) >= 10 and upper and lower and (symbol or digit)) or (len(value) >= 24 and upper and lower)


def _assignments(window_: _Window) -> _Found:
    """Spans of values assigned to secret-named keys: ``DB_PASSWORD=x``, ``"api_key": "x"``, ``password: x``."""
    window = window_.text
    taken = 0  # a key inside a value already found is part of that value
    for hit in _KEYED_IDENT.finditer(window):
        if hit.start() < taken:
            continue
        start, end = hit.span("ident")
        ident = window[start:end]
        if window.endswith("://", 0, start):
            continue  # a URL's user name ("https://x-access-token:..."): its password is the URL detector's
        kind, code_like = _key_kind(ident, start > 0 and window[start - 1] in "\"'`")
        # A plain key may follow a word it belongs to: "API key: x" names a secret that
        # "key: x" does not, and "Wifi password: x" is a line of its own ("The secret: x" is not).
        key_start = start
        by_pair = False  # the key names a secret only with the word before it ("API key")
        after_word = start > 1 and window[start - 1] in " \t" and not any(c in ident for c in "_-.")
        prev = _PREV_WORD.search(window, max(0, start - 24), start) if after_word else None
        if prev is not None and (pair := _key_kind(f"{prev.group(1)} {ident}", False)[0]) is not None:
            by_pair = kind is None
            kind = kind or pair
            if pair == "password" and prev.group(1).lower() not in ("the", "a", "an"):
                key_start = prev.start(1)
        if kind is None:
            continue
        if window.startswith(("[REDACTED:", '"[REDACTED:'), hit.end()):
            continue  # already redacted: the common case on a second pass
        sep = hit.group("sep").strip()
        sep = ":" if sep in _COLONS else "=" if sep in _EQUALS else sep
        if sep == "|":
            span = _next_cell_value(window, key_start, hit.end(), kind)
            if span is not None:
                taken = span[1]
                yield span[0], span[1], kind
            continue
        found = _VALUE.match(window, hit.end())
        if found is None:
            continue
        group = found.lastgroup or "v5"
        raw = found.group(group)
        quoted = group != "v5"
        # An unquoted value ends a sentence or a bracket more often than it holds one.
        value = raw.strip() if quoted else raw.rstrip(".,:!?)]}")
        v_start = found.start(group) + raw.find(value)
        v_end = v_start + len(value)
        if not value or _not_a_secret(value, window[v_end:]):
            continue
        if sep in ("is", "was"):
            # Prose: "the password is expired" is not a password, "is Fjord4Llama" and
            # 'the wifi password is "sunshine"' (quoted) are.
            ok = " " not in value and (_strong(value) or (quoted and kind == "password" and len(value) >= 4))
        elif sep not in (":", "::"):
            ok = len(value) >= 3 and (quoted or " " not in value)
        elif quoted:
            # A quoted value after a password key is the password, spaces and all
            # ('password: "correct horse battery staple"'); after another key, a phrase
            # in quotes is more often a label, unless the key is code ("api_key": "...").
            ok = len(value) >= 3 and (code_like or " " not in value or kind == "password")
        else:
            # A plain word after "Key:" is a password only on a line of its own
            # ("password: sunshine"), not in a sentence ("Reset your password: see below").
            own_line = (
                window_.starts_line and key_start <= 64 and _LINE_START.fullmatch(window, 0, key_start) is not None
                and (_LINE_END.match(window, v_end) is not None if window_.ends_line else False)
            )  # fmt: skip
            ok = len(value) >= 3 and (code_like or _strong(value) or own_line)
            if ok and by_pair and kind != "password" and not own_line:
                ok = _mixed(value)  # in a sentence, a key looks random: "Access key: AKIA-style id, see IAM" is prose
        if ok and kind != "password" and value.isdigit() and len(value) < 8:
            ok = False  # a count, a port, a year: not a token
        if ok and kind != "password" and _VERSION.fullmatch(value):
            ok = False  # a version pin: tiktoken==0.14.0, "secretstorage": "^3.3" (a package, not a token)
        if ok:
            if len(raw) == _VALUE_MAX and (rest := _VALUE_REST[group].match(window, found.end(group))) is not None:
                v_end = rest.end()
            taken = v_end
            yield v_start, v_end, kind


_CELL = re.compile(r"[^|\r\n]{1,512}+")


def _next_cell_value(window: str, key_start: int, at: int, kind: str) -> tuple[int, int] | None:
    """The span of the cell after a table cell that is a secret's key ("| password | x |"), when it holds the secret.

    Only a whole cell is a key (not "cat token | jq"). The row may be a table's header
    ("| password | notes |"), so a value must look like a secret: for a password a word
    like a password (_strong) or a quoted value, spaces and all; for a key or token a
    random-looking run (_mixed).
    """
    lo = max(0, key_start - 64)
    head = window[lo:key_start].rstrip(" \t*_`")
    if not (head.endswith("|") or (not head and lo == 0)):
        return None
    cell = _CELL.match(window, at)
    if cell is None:
        return None
    raw = cell.group(0)
    value = raw.strip().strip("*_")
    quoted = len(value) >= 2 and value[0] in "\"'`" and value[-1] == value[0]
    if quoted:
        value = value[1:-1].strip()
    if len(value) < 3 or _not_a_secret(value):
        return None
    words = value.split()
    if kind == "password":
        ok = quoted or any(_strong(w) for w in words)
    else:
        ok = len(words) == 1 and _mixed(value)
    if not ok:
        return None
    start = cell.start() + raw.find(value)
    return start, start + len(value)


# --- scanning -----------------------------------------------------------------------------


class _Span(NamedTuple):
    start: int
    end: int
    rank: int  # lower wins when spans overlap
    kind: str


def _widen(line: str, start: int, end: int) -> tuple[int, int]:
    tail = _TOKEN_RUN.match(line, end, min(len(line), end + _EXTEND_MAX))
    head = _TOKEN_RUN.match(line[max(0, start - _EXTEND_MAX) : start][::-1])
    return start - (head.end() if head else 0), (tail.end() if tail else end)


class _Window(NamedTuple):
    """A line, or a window of a long one."""

    text: str
    low: str  # text.lower()
    starts_line: bool
    ends_line: bool


_Found = Iterator[tuple[int, int, str]]  # (start, end, kind) within the window


@dataclass(frozen=True)
class _Detector:
    gate: _Gate
    find: Callable[[_Window], _Found]
    widen: bool  # a token: widen the span over adjacent token characters


def _plugin_finder(plugin: _Plugin) -> Callable[[_Window], _Found]:
    def find(window: _Window) -> _Found:
        for start, end, value in _plugin_spans(plugin, window.text):
            yield start, end, plugin.kind_of(value) if plugin.kind_of else plugin.kind

    return find


def _shape_finder(shape: _Shape) -> Callable[[_Window], _Found]:
    def find(window: _Window) -> _Found:
        for m in shape.pattern.finditer(window.text):
            if shape.check is None or shape.check(m.group(0)):
                yield m.start(), m.end(), shape.kind

    return find


def _find_headers(window: _Window) -> _Found:
    for m in _AUTH_HEADER.finditer(window.text):
        yield m.start(1), m.end(1), "token"
    for m in _BEARER.finditer(window.text):
        if _mixed(m.group(1)) or _strong(m.group(1)):
            yield m.start(1), m.end(1), "token"


def _find_url_credentials(window: _Window) -> _Found:
    for m in _URL_CREDENTIALS.finditer(window.text):
        if not _URL_PLACEHOLDER.match(m.group(1)):
            yield m.start(1), m.end(1), "password"
    for m in _URL_TOKEN_USER.finditer(window.text):
        if _mixed(m.group(1)):
            yield m.start(1), m.end(1), "token"


def _random_looking(value: str) -> bool:
    """A session id or signature rather than a word: _mixed, or a long run of mixed case."""
    return _mixed(value) or (len(value) >= 20 and any(c.isupper() for c in value) and any(c.islower() for c in value))


def _find_query_signatures(window: _Window) -> _Found:
    # Docs write "?signature=required", "&sig={signature}", "?signature=HMAC-SHA256": a
    # signature is random-looking.
    for m in _QUERY_SIGNATURE.finditer(window.text):
        if _random_looking(m.group(1)):
            yield m.start(1), m.end(1), "signature"


def _find_cookies(window: _Window) -> _Found:
    at = 0  # each pair is read once, though a header's pairs may run over the next header
    for m in _COOKIE_HEADER.finditer(window.text):
        if m.start() < at:
            continue
        at = m.end()
        while (pair := _COOKIE_PAIR.match(window.text, at)) is not None and pair.end() > at:
            # A session is random-looking; "theme=dark", "consent=accepted",
            # "timezone=Europe/Berlin" and an analytics id ("_ga=GA1.2.123.456") are not.
            if len(pair.group(2)) >= 8 and pair.group(1).lower() not in _COOKIE_ATTRIBUTES and _random_looking(pair.group(2)):
                yield pair.start(2), pair.end(2), "token"
            at = pair.end()


# --- passwords on command lines ---------------------------------------------------------------
#
# Flags that take a password, per command: "mysql -pSecret", "sshpass -p x",
# "docker login -p x", "curl -u user:pass", and ".netrc" lines ("machine h login u
# password p"). A flag counts only after its command on the line (docker run -p 8080:80
# is a port). Where each command first occurs is searched once per window, then its
# flags from there: linear. A pattern starting "^" reads a line (a window that starts one).

_CLI_VALUE = r"""(?P<q>['"]?)(?P<v>[^\s'"`;|&<>\\]{1,256}+)(?P=q)"""


@dataclass(frozen=True)
class _Cli:
    gate: _Gate  # passes for every line holding the command
    command: re.Pattern[str]  # searched in the lower-cased window ("^": matched, on a window starting a line)
    flag: re.Pattern[str]  # from where the command starts; the value is group "v"
    check: Callable[[str], bool] | None = None  # a further test of the value


def _cli(gate: _Gate, command: str, flag: str, check: Callable[[str], bool] | None = None) -> _Cli:
    return _Cli(gate, re.compile(command), re.compile(flag.replace("VAL", _CLI_VALUE)), check)


def _words(*words: str) -> _Gate:
    return _Gate(lower_literals=words)


# Gates that are patterns start with a literal (a fast search): every line of ordinary
# prose passes through them.
_LOGIN_TOOLS = ("docker", "podman", "nerdctl", "buildah", "skopeo", "oras", "crane", "registry", "az", "acr")
_CLI_LOGIN_GATE = _Gate(lower_pattern=re.compile("login(?:" + "|".join(rf"(?<={t}[ \t]login)" for t in _LOGIN_TOOLS) + ")"))

_CLI: tuple[_Cli, ...] = (
    _cli(_words("mysql", "mariadb"), r"(?<![\w-])(?:mysql(?:dump|admin|import|show|check|pump|sh)?|mariadb(?:-dump|-admin)?)(?![\w-])", r"(?<!\S)-pVAL"),
    _cli(_words("sshpass"), r"(?<![\w-])sshpass(?![\w-])", r"(?<!\S)-p[ \t]*VAL"),
    _cli(
        _CLI_LOGIN_GATE,
        r"(?<![\w-])(?:docker|podman|nerdctl|buildah|skopeo|oras|crane|helm[ \t]+registry|az(?:[ \t]+acr)?)[ \t]login(?![\w-])",
        r"(?<!\S)(?:-p|--password)(?:[ \t]+|=)(?!-)VAL",
    ),  # fmt: skip
    _cli(_words("mongo"), r"(?<![\w-])mongo(?:sh|dump|restore|export|import|stat|top)?(?![\w-])", r"(?<!\S)(?:-p|--password)(?:[ \t]+|=)(?!-)VAL"),
    _cli(_words("redis-cli"), r"(?<![\w-])redis-cli(?![\w-])", r"(?<!\S)(?:-a|--pass)[ \t]+(?!-)VAL"),
    _cli(_words("ldap"), r"(?<![\w-])ldap(?:search|modify|add|delete|whoami|passwd|compare|modrdn|exop)(?![\w-])", r"(?<!\S)-w[ \t]+(?!-)VAL"),
    _cli(_words("sqlcmd"), r"(?<![\w-])sqlcmd(?![\w-])", r"(?<!\S)-P[ \t]*(?!-)VAL"),
    _cli(
        _words("curl"),
        r"(?<![\w-])curl(?![\w-])",
        r"(?<!\S)(?:-[uU]|--user|--proxy-user)(?:[ \t]+|=)?(?P<q>['\"]?)[^\s:'\"]{0,128}+:(?P<v>[^\s'\"`;|&<>\\]{1,256}+)(?P=q)",
    ),
    _cli(
        _words("smb", "rpcclient", "cifs"),
        r"(?<![\w-])(?:smbclient|smbmap|smbget|smbcacls|rpcclient|mount\.cifs)(?![\w-])",
        r"(?<!\S)(?:-U|--user(?:name)?)(?:[ \t]+|=)?(?P<q>['\"]?)[^\s%'\"]{1,128}+%(?P<v>[^\s'\"`;|&<>\\]{1,256}+)(?P=q)",
    ),  # fmt: skip
    _cli(_words("plink", "pscp"), r"(?<![\w-])(?:plink|pscp)(?:\.exe)?(?![\w-])", r"(?<!\S)-pw[ \t]+VAL"),
    _cli(_words("freerdp"), r"freerdp", r"(?<!\S)/p:VAL"),
    _cli(_words("htpasswd"), r"(?<![\w-])htpasswd(?![\w-])", r"(?<!\S)-(?=[a-zA-Z]{0,4}b)[a-zA-Z]{1,5}+[ \t]+\S{1,256}+[ \t]+\S{1,128}+[ \t]+VAL"),
    _cli(_words("openssl"), r"(?<![\w-])openssl(?![\w-])", r"(?<!\S)-pass(?:in|out)?[ \t]+pass:VAL"),
    _cli(_words("nmcli"), r"(?<![\w-])nmcli(?![\w-])", r"(?<![\w-])(?:password|wifi-sec\.psk)[ \t]+VAL"),
    # .netrc: "machine <host> login <user> password <pw>" (or "default ..."), on one line.
    _cli(
        _Gate(pattern=re.compile(r"login[ \t]+\S{1,253}+[ \t]+password[ \t]")),
        r"^[ \t]*(?:machine[ \t]+[^\s,;:]{1,253}+|default)[ \t]+login[ \t]",
        r"(?<![\w-])password[ \t]+VAL",
    ),  # fmt: skip
    # ... or one keyword a line ("  password <pw>"): then the value must look like a password.
    _cli(_Gate(pattern=re.compile(r"(?m)password[ \t]+\S{1,256}+[ \t]*$")), r"^[ \t]*password[ \t]", r"^[ \t]*password[ \t]+VAL[ \t]*$", _strong),
    # .pgpass: "host:port:database:user:password", a line of its own. Database and user hold
    # no "/" and the password no unescaped ":" (.pgpass writes "\:"), so a log line
    # ("app.log:2026:05:01:ERROR:x") or a route ("localhost:8080:/api/v1:GET:200") is no entry.
    _cli(
        _Gate(pattern=re.compile(r":(?:\d{2,5}|\*):[^\s:]{1,128}+:[^\s:]{1,128}+:")),
        r"^[ \t]*(?=[^:\s]{0,253}[A-Za-z.*])[A-Za-z0-9.*\-]{1,253}+:(?:\d{2,5}|\*):[^\s:/]{1,128}+:[^\s:/]{1,128}+:",
        r"^[ \t]*[^:\s]{1,253}+:[^:\s]{1,5}+:[^\s:/]{1,128}+:[^\s:/]{1,128}+:(?P<v>(?:[^\s:\\]|\\[:\\]){1,256}+)[ \t]*$",
    ),  # fmt: skip
)
# Any long flag naming a secret, with a space: "--token x", "--api-key x". The value must
# look like a password (_strong): "psql --password mydb" prompts, mydb is a database.
_LONG_FLAG = re.compile(r"(?<![\w-])--(?!no-)(?P<ident>[A-Za-z][\w.\-]{0,64}+)[ \t]+(?!-)" + _CLI_VALUE)
_LONG_FLAG_GATE = re.compile(r"--(?=[a-z])[\w.\-]{0,64}?(?:pass|pwd|psk|secret|token|key|credential|auth)")


# The commands gated by words share one detector (each detector costs every scanned line
# a gate test); those gated by a pattern have one each.
_CLI_BY_WORD = tuple(c for c in _CLI if c.gate.lower_literals)
_CLI_BY_PATTERN = tuple(c for c in _CLI if not c.gate.lower_literals)


def _cli_finder(clis: tuple[_Cli, ...]) -> Callable[[_Window], _Found]:
    return lambda window: _find_cli_passwords(clis, window)


def _find_cli_passwords(clis: tuple[_Cli, ...], window: _Window) -> _Found:
    for cli in clis:
        line = cli.command.pattern.startswith("^")
        if (line and not window.starts_line) or not cli.gate.passes(window.text, window.low):
            continue
        command = cli.command.match(window.low) if line else cli.command.search(window.low)
        if command is None:
            continue
        for m in cli.flag.finditer(window.text, min(command.start(), len(window.text))):
            value = m.group("v")
            if not _not_a_secret(value, window.text[m.end("v") :]) and (cli.check is None or cli.check(value)):
                yield m.start("v"), m.end("v"), "password"


def _find_long_flags(window: _Window) -> _Found:
    for m in _LONG_FLAG.finditer(window.text):
        kind = _key_kind(m.group("ident"), False)[0]
        value = m.group("v")
        if kind is not None and _key_words(m.group("ident"))[-1] != "id" and _strong(value) and not _not_a_secret(value, window.text[m.end("v") :]):
            yield m.start("v"), m.end("v"), kind


# In order of precedence: where two find overlapping text, the first one's kind is kept.
_DETECTORS: tuple[_Detector, ...] = (
    *(_Detector(p.gate, _plugin_finder(p), True) for p in _PLUGINS),
    *(_Detector(s.gate, _shape_finder(s), True) for s in _SHAPES),
    _Detector(_Gate(lower_literals=("bearer", "authorization")), _find_headers, False),
    _Detector(_Gate(pattern=re.compile(r"://[^\s/?#@]*:[^\s/?#]*@|://[A-Za-z0-9._~%\-]{20,}@")), _find_url_credentials, False),
    _Detector(_Gate(lower_literals=("sig=", "signature=")), _find_query_signatures, False),
    _Detector(_Gate(lower_literals=("cookie",)), _find_cookies, False),
    _Detector(_Gate(lower_literals=tuple(n for c in _CLI_BY_WORD for n in c.gate.lower_literals)), _cli_finder(_CLI_BY_WORD), False),
    *(_Detector(c.gate, _cli_finder((c,)), False) for c in _CLI_BY_PATTERN),
    _Detector(_Gate(lower_pattern=_LONG_FLAG_GATE), _find_long_flags, False),
    _Detector(_Gate(lower_pattern=_ASSIGNMENT_GATE), _assignments, False),
)
# Each literal and pattern of all the gates, once, for marking the lines to scan.
_GATE_LITERALS = tuple(dict.fromkeys(n for d in _DETECTORS for n in d.gate.literals))
_GATE_LOWER_LITERALS = tuple(dict.fromkeys(n for d in _DETECTORS for n in d.gate.lower_literals))
_GATE_PATTERNS = tuple(dict.fromkeys(d.gate.pattern for d in _DETECTORS if d.gate.pattern is not None))
_GATE_LOWER_PATTERNS = tuple(dict.fromkeys(d.gate.lower_pattern for d in _DETECTORS if d.gate.lower_pattern is not None))


def _scan(line: str, offset: int, window: _Window) -> Iterator[_Span]:
    for rank, detector in enumerate(_DETECTORS):
        if not detector.gate.passes(window.text, window.low):
            continue
        for start, end, kind in detector.find(window):
            start, end = start + offset, end + offset
            if detector.widen:
                start, end = _widen(line, start, end)
            yield _Span(start, end, rank, kind)


def _windows(line: str) -> Iterator[tuple[int, _Window]]:
    if len(line) <= _WINDOW:
        yield 0, _Window(line, line.lower(), True, True)
        return
    step = _WINDOW - _OVERLAP
    for at in range(0, len(line) - _OVERLAP, step):
        text = line[at : at + _WINDOW]
        yield at, _Window(text, text.lower(), at == 0, at + _WINDOW >= len(line))


def _overlaps_marker(span: _Span, marker_starts: list[int], marker_ends: list[int]) -> bool:
    # Markers are sorted and disjoint: only the last one starting before the span's end can overlap it.
    i = bisect.bisect_left(marker_starts, span.end) - 1
    return i >= 0 and marker_ends[i] > span.start


def _redact_line(line: str) -> tuple[str, int]:
    spans = [s for at, window in _windows(line) for s in _scan(line, at, window)]
    if not spans:
        return line, 0
    if "[REDACTED:" in line:
        # A marker is never part of a secret: drop what overlaps one (idempotence).
        markers = [m.span() for m in _MARKER.finditer(line)]
        starts, ends = [m[0] for m in markers], [m[1] for m in markers]
        spans = [s for s in spans if not _overlaps_marker(s, starts, ends)]
    spans.sort(key=lambda s: (s.start, -s.end))
    merged: list[_Span] = []
    for span in spans:
        if merged and span.start < merged[-1].end:
            last = merged[-1]
            best = last if last.rank <= span.rank else span
            merged[-1] = _Span(last.start, max(last.end, span.end), best.rank, best.kind)
        else:
            merged.append(span)
    out: list[str] = []
    at = 0
    for span in merged:
        out.append(line[at : span.start])
        out.append(_marker(span.kind))
        out.extend(c for c in line[span.start : span.end] if c in _LINE_BREAKS)
        at = span.end
    out.append(line[at:])
    return "".join(out), len(merged)


# --- private key blocks (whole text) ------------------------------------------------------
#
# Own code: PrivateKeyDetector flags the BEGIN line only (it scans line by line), while
# the secret is the body below it, and a pasted key often lacks its END line. The block
# runs from BEGIN over the body (base64 lines and PEM/PGP headers) through END if
# present, or to where the body stops (a line of prose, or the end of the text). The
# body may be split by real line breaks, escaped "\n" (a JSON string) or spaces (text
# with whitespace collapsed, as XML and OCR render it).

_PEM_BEGIN = re.compile(
    r"-{3,5}[ \t]?BEGIN[ \t]+(?:[A-Z0-9]+[ \t]+){0,4}PRIVATE[ \t]+KEY(?:[ \t]+BLOCK)?[ \t]?-{3,5}|Private-Lines:[ \t]*\d+", re.I
)  # dashes bounded: linear on a run of them, and one marker never takes the next one's
_PEM_END = re.compile(r"-{3,5}[ \t]?END[ \t]+[A-Z0-9 \t]{0,40}-{3,5}", re.I)
_PEM_SEP = re.compile(r"(?:[ \t]|\r\n|\n|\r|\\r\\n|\\n|\\r)+")
_PEM_HEADER = re.compile(r"(?:Proc-Type|DEK-Info|Comment|Version|Hash|Charset|Private-MAC|Encryption):[^\n\r\\]{0,200}", re.I)
_PEM_B64 = re.compile(r"[A-Za-z0-9+/=]+")
_PEM_TOKEN_ENDS = frozenset(";,.)\"'<|")  # what may follow the last body word in a CSV row, a sentence, markup
# Fast path over the bulk of a body (the same rules as _pem_block_end's loop, one regex
# call for a whole run instead of a few per word): whole lines of base64, and words that
# look encoded followed by a separator. Possessive, so linear on any text.
_NL = r"(?:\r\n|\n|\r|\\r\\n|\\n|\\r)"
_PEM_RUN = re.compile(
    rf"""(?:[ \t]*{_NL}[ \t]*[A-Za-z0-9+/=]++[ \t]*+(?={_NL}|-{{3,5}}[ \t]?END|$)"""
    rf"""|(?:[ \t]|{_NL})++(?:[A-Za-z0-9+/=]{{20,}}+|[A-Za-z]*+[0-9+/=][A-Za-z0-9+/=]*+)(?=[ \t\r\n\\;,.)"'<|]|-{{3,5}}[ \t]?END|$))++""",
    re.I,
)


def _is_body_token(token: str, whole_line: bool) -> bool:
    # A whole line of base64 is body; a space-separated word must look encoded, so the
    # prose after a key that lost its line breaks is kept.
    return whole_line or len(token) >= 20 or any(c.isdigit() or c in "+/=" for c in token)


def _has_break(sep: str) -> bool:
    # A real line break, or an escaped one ("\\n" inside a JSON string).
    return any(c in sep for c in "\n\r") or "\\n" in sep or "\\r" in sep


def _pem_block_end(text: str, pos: int) -> int:
    """Where the key block whose BEGIN marker ends at ``pos`` ends (``pos`` when it has no body)."""
    end = pos
    while end < len(text):
        run = _PEM_RUN.match(text, end)
        if run is not None and run.end() > end:
            end = run.end()
            continue
        sep = _PEM_SEP.match(text, end)
        at = sep.end() if sep else end
        closing = _PEM_END.match(text, at)
        if sep is None and closing is None:
            return end  # body lines and words are separated; "KEY-----abc" is not a body
        if closing:
            return closing.end() if end > pos else pos
        header = _PEM_HEADER.match(text, at)
        if header:
            end = header.end()
            continue
        token = _PEM_B64.match(text, at)
        if token is None:
            return end
        after = _PEM_SEP.match(text, token.end())
        next_at = after.end() if after else token.end()
        if after is None and next_at < len(text) and text[next_at] not in _PEM_TOKEN_ENDS and not _PEM_END.match(text, next_at):
            return end  # the word goes on with other characters: prose or an identifier, not body
        newline_before = sep is not None and _has_break(sep.group(0))
        newline_after = next_at >= len(text) or (after is not None and _has_break(after.group(0))) or _PEM_END.match(text, next_at) is not None
        if not _is_body_token(token.group(0), newline_before and newline_after):
            return end
        end = token.end()
    return end


def _pem_begins(text: str, low: str) -> Iterator[re.Match[str]]:
    # The case-insensitive BEGIN pattern is slow to search for (~0.1 s/MB), so it is
    # only tried around each "private" of the lower-cased text.
    if len(low) != len(text):
        yield from _PEM_BEGIN.finditer(text)
        return
    done = 0
    at = low.find("private")
    while at >= 0:
        near = low.startswith("private-lines", at) or low.find("begin", max(done, at - 64), at) >= 0
        for m in _PEM_BEGIN.finditer(text, max(done, at - 64), at + 64) if near else ():
            if m.start() <= at < m.end():
                yield m
                done = m.end()
                break
        at = low.find("private", max(at + 1, done))


def _redact_private_keys(text: str, low: str) -> tuple[str, int]:
    out: list[str] = []
    at = 0
    count = 0
    for m in _pem_begins(text, low):
        if m.start() < at:
            continue
        end = _pem_block_end(text, m.end())
        if end == m.end():
            continue  # a BEGIN line alone (quoted in prose): nothing secret to remove
        out.append(text[at : m.start()])
        out.append(_marker("private-key"))
        out.extend(c for c in text[m.start() : end] if c in _LINE_BREAKS)
        at = end
        count += 1
    out.append(text[at:])
    return "".join(out), count


# A private key block, base64-encoded once more ("LS0tLS1CRUdJTi" is "-----BEGIN"): a
# Kubernetes Secret's tls.key, a kubeconfig's client-key-data, "base64 key.pem" output.
# Searched in the whole text like the blocks above: a key runs to 3 KB on one line, and
# "base64" wraps it at 76 characters (the wrapped lines follow while the previous one is
# full). Decoded, its first line must name a private key.
_B64_PEM = re.compile(r"LS0tLS1CRUdJTi[A-Za-z0-9+/]*+=*+")
_B64_PEM_LINE = re.compile(r"(?:\r\n|\n|\r|\\n)[ \t]*+[A-Za-z0-9+/]++=*+(?=[ \t]*+(?:\r|\n|\\n|$))")


def _redact_encoded_private_keys(text: str) -> tuple[str, int]:
    out: list[str] = []
    at = 0
    count = 0
    start = text.find("LS0tLS1CRUdJTi")
    while start >= 0:
        m = _B64_PEM.match(text, start)
        if m is None:  # cannot be: the pattern starts with the literal found here
            break
        head = m.group(0)[:80]
        try:
            named = b"PRIVATE KEY" in base64.b64decode(head[: len(head) // 4 * 4])
        except ValueError:
            named = False
        end = m.end()
        if named:
            line_length = end - start
            while line_length >= 60 and (wrapped := _B64_PEM_LINE.match(text, end)) is not None:
                line_length = len(wrapped.group(0).lstrip("\r\n\\n \t"))
                end = wrapped.end()
            out.append(text[at:start])
            out.append(_marker("private-key"))
            out.extend(c for c in text[start:end] if c in _LINE_BREAKS)
            at = end
            count += 1
        start = text.find("LS0tLS1CRUdJTi", end)
    out.append(text[at:])
    return "".join(out), count


# --- tables and values on the next line (whole text) ------------------------------------------
#
# Two shapes where the key is on another line than its value, so the line scan cannot
# see them: a table's column (the header names it, the rows below hold the values) and a
# YAML key whose value starts on the next line ("password:" then an indented value, or
# a block scalar "password: |" / ">"). Both are found once in the whole text, by
# possessive patterns (linear), and rewrite the lines before the line scan.


def column_kind(header: str) -> str | None:
    """The kind of secret a table column holds, by its header cell ("Password", "login_password", "API Key"), or None."""
    header = header.strip().strip("*_`\"'").strip()
    if not header or len(header) > 64:
        return None
    return _key_kind(header, False)[0]


def table_header_kinds(cells: list[str]) -> list[str | None]:
    """Per column of a table's header row, the kind of secret its cells hold (None: not a secret).

    A row that reads as key and value ("password | Sup3rS3cret9", a two-column table of
    settings) is no header: its columns name nothing (the line scan reads that row).
    """
    kinds = [column_kind(c) for c in cells]
    for i, kind in enumerate(kinds[:-1]):
        if kind is not None and _strong(cells[i + 1].strip()) and column_kind(cells[i + 1]) is None:
            return [None] * len(kinds)
    return kinds


def redact_cell(kind: str | None, cell: str) -> str:
    """A table cell under a column of that kind: the marker where it holds a secret, else the cell unchanged.

    A cell under a password column is the password whole, spaces and all ("correct horse
    battery staple"): a table that says which column holds passwords is taken at its word,
    so a policy table's "12 characters" under "Password" is hidden too (a leak is worse).
    Under a key, token or secret column,
    a random-looking run (_mixed): such columns also list names ("DB password", "Stripe").
    Empty cells, placeholders and references stay.
    """
    value = cell.strip()
    if kind is None or not value or value.startswith("[REDACTED:") or _not_a_secret(value):
        return cell
    if kind == "password" or (" " not in value and _mixed(value)):
        return cell[: len(cell) - len(cell.lstrip())] + _marker(kind) + cell[len(cell.rstrip()) :]
    return cell


# A markdown table's delimiter row ("|---|:--:|", "--- | ---"): it follows the header.
_TABLE_DELIM = re.compile(r"(?m)^[ \t]*+\|?[ \t]*+:?-++:?[ \t]*+(?:\|[ \t]*+:?-++:?[ \t]*+)*+\|?[ \t]*+\r?$")


def _cell_spans(line: str) -> list[tuple[int, int]]:
    """Where each cell of a markdown table row is (outer pipes dropped; "\\|" does not split)."""
    spans: list[tuple[int, int]] = []
    start = len(line) - len(line.lstrip())
    end = len(line.rstrip())
    if line.startswith("|", start):
        start += 1
    if end > start and line[end - 1] == "|" and line[end - 2 : end] != "\\|":
        end -= 1
    at = start
    for i in range(start, end):
        if line[i] == "|" and (i == 0 or line[i - 1] != "\\"):
            spans.append((at, i))
            at = i + 1
    spans.append((at, end))
    return spans


def _redact_tables(text: str, lines: list[str], starts: list[int]) -> int:
    """Cells under a secret-naming column of markdown tables, replaced in ``lines``; how many."""
    count = 0
    done = 0  # the first line not yet read as a table's row
    for delim in _TABLE_DELIM.finditer(text):
        i = bisect.bisect_right(starts, delim.start()) - 1
        if i < 1 or i <= done or "|" not in lines[i - 1]:
            continue
        header = lines[i - 1]
        kinds = table_header_kinds([header[a:b] for a, b in _cell_spans(header)])
        done = i
        if not any(kinds):
            continue
        j = i + 1
        while j < len(lines) and "|" in lines[j]:
            row = lines[j]
            out: list[str] = []
            at = 0
            for (a, b), kind in zip(_cell_spans(row), kinds):
                cell = redact_cell(kind, row[a:b])
                if cell != row[a:b]:
                    out.append(row[at:a])
                    out.append(cell)
                    at = b
                    count += 1
            if out:
                lines[j] = "".join(out) + row[at:]
            j += 1
        done = j - 1
    return count


# "key:" ending its line, or "key: |" / "key: >-" (a block scalar), in YAML or front matter.
_NEXT_LINE_KEY = re.compile(
    r"""(?m)^(?P<indent>[ \t]*+(?:-[ \t]++)?)["']?(?P<ident>[A-Za-z_][\w.\-]{0,63}+)(?:\[[0-9]{1,6}\]){0,4}["']?[ \t]*+"""
    rf"""[:{_COLONS}][ \t]*+(?P<block>[|>][+\-]?[0-9]?[+\-]?)?[ \t]*+(?:\#[^\n]*+)?\r?$"""
)
_MAPPING_LINE = re.compile(r"""[ \t]*+(?:-[ \t]++)?["']?[\w.\-]{1,64}+["']?[ \t]*+:(?:[ \t]|$)""")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def _redact_span(lines: list[str], j: int, start: int, end: int, kind: str) -> None:
    lines[j] = lines[j][:start] + _marker(kind) + lines[j][end:]


def _redact_next_lines(text: str, lines: list[str], starts: list[int]) -> int:
    """Values of secret keys that start on the next, more indented line(s); replaced in ``lines``; how many."""
    count = 0
    for m in _NEXT_LINE_KEY.finditer(text):
        kind = _key_kind(m.group("ident"), False)[0]
        if kind is None:
            continue
        i = bisect.bisect_right(starts, m.start()) - 1
        key_indent = len(m.group("indent"))
        j = i + 1
        if m.group("block"):
            # A block scalar: every following line indented deeper (and blank lines among
            # them) is the value, whatever it says.
            found = False
            while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > key_indent):
                content = lines[j].strip()
                if content and not content.startswith("[REDACTED:"):
                    at = _indent(lines[j])
                    _redact_span(lines, j, at, at + len(lines[j][at:].rstrip()), kind)
                    found = True
                j += 1
            count += found
            continue
        if j >= len(lines) or _indent(lines[j]) <= key_indent or not lines[j].strip():
            continue  # the value is not below the key: a heading, a label, an empty value
        if _MAPPING_LINE.match(lines[j]) or lines[j].lstrip().startswith("#"):
            continue  # a nested mapping (its own keys are scanned line by line) or a comment
        item_indent = _indent(lines[j])
        while j < len(lines) and _indent(lines[j]) == item_indent and lines[j].strip():
            line = lines[j]
            at = item_indent
            item = line.startswith("-", at) and line[at + 1 : at + 2] in (" ", "\t", "")
            if item:
                at += 1 + _indent(line[at + 1 :])
            value = line[at:].rstrip()
            end = at + len(value)
            if value[:1] in "\"'" and len(value) >= 2 and value[-1] == value[0]:
                at, end, value, quoted = at + 1, end - 1, value[1:-1], True
            else:
                quoted = False
            words = value.split()
            if kind == "password":
                # Below "password:" a word (YAML's plain scalar) or a quoted value is the password;
                # a sentence there ("Ask Maria at the front desk") is a note about it, unless
                # quoted, and a list of one-word items names tools ("- Bitwarden") unless an item
                # looks like a password ("- hunter22").
                ok = len(value) >= 3 and (quoted or (len(words) == 1 and (not item or _strong(value))))
            else:
                ok = len(words) == 1 and (_strong(value) or _mixed(value))
            if ok and not value.startswith("[REDACTED:") and not _not_a_secret(value.strip()):
                _redact_span(lines, j, at, end, kind)
                count += 1
            if not item:
                break  # a plain scalar's first line; a list goes on item by item
            j += 1
    return count


# --- public API ---------------------------------------------------------------------------


def redact(text: str) -> tuple[str, int]:
    """The text with secrets replaced by ``[REDACTED:kind]``, and how many were replaced."""
    if not text:
        return text, 0
    low = text.lower()
    text, count = _redact_private_keys(text, low)
    if "LS0tLS1CRUdJTi" in text:
        text, encoded = _redact_encoded_private_keys(text)
        count += encoded
    if count:
        low = text.lower()
    lines = text.split("\n")
    scan = _lines_to_scan(text, low, lines)
    if "|" in text or ":" in text or any(c in text for c in _COLONS):
        starts = _LineIndex(lines).starts
        if "|" in text:
            count += _redact_tables(text, lines, starts)
        count += _redact_next_lines(text, lines, starts)
    for i in sorted(scan):
        line = lines[i]
        for _ in range(_MAX_PASSES):
            line, n = _redact_line(line)
            if n == 0:
                break
            count += n
            lines[i] = line
    return "\n".join(lines), count


def _lines_to_scan(text: str, low: str, lines: list[str]) -> set[int]:
    """The lines where some detector's gate passes (each literal and pattern searched once)."""
    index = _LineIndex(lines)
    # Lower-casing can change a line's length (U+0130 becomes two characters), never its line count.
    low_index = index if len(low) == len(text) else _LineIndex(low.split("\n"))
    marked: set[int] = set()
    for needle in _GATE_LITERALS:
        index.mark(lambda at, n=needle: text.find(n, at), marked)
    for needle in _GATE_LOWER_LITERALS:
        low_index.mark(lambda at, n=needle: low.find(n, at), marked)
    for pattern in _GATE_PATTERNS:
        index.mark(lambda at, p=pattern: _search_at(p, text, at), marked)
    for pattern in _GATE_LOWER_PATTERNS:
        low_index.mark(lambda at, p=pattern: _search_at(p, low, at), marked)
    return marked


_RANDOM_RUN = re.compile(r"[A-Za-z0-9]{20,}")


def looks_like_secret(value: str) -> bool:
    """Whether one value (a config field, say) is, or holds, an API key, token, password or private key.

    Beyond what ``redact`` finds, an unbroken run of 20+ letters and digits mixing upper
    case, lower case and digits counts: model names, paths and hashes do not look like
    that, keys without a known prefix (Mistral, Voyage) do. This is for single values;
    on prose it would also hit ids and hashes.
    """
    if not isinstance(value, str) or not value.strip():
        return False
    if redact(value)[1]:
        return True
    for run in _RANDOM_RUN.findall(value):
        if any(c.isupper() for c in run) and any(c.islower() for c in run) and sum(c.isdigit() for c in run) >= 2:
            return True
    return False
