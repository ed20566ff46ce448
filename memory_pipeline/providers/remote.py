"""What every remote embedding API shares: the live-call policy.

A provider module (openai, gemini, voyage, mistral, ollama) only says how to send one
request of texts and how to read its errors. This base does the rest, the same way for
all of them:

* requests are grouped up to the provider's limits (texts and tokens per request);
* at most ``concurrency`` requests are in flight (a thread pool of that size);
* a per-provider rate limiter (requests and tokens per minute, token buckets);
* retries with exponential backoff and full jitter on 429, 5xx, timeouts, connection
  errors, truncated bodies and resource-exhausted / rate-limit / tokens-per-day errors,
  waiting at least what ``Retry-After`` asks; 400, 401, 403, 404, 422 fail at once with
  the provider's own message;
* a text over the model's input limit is split at token boundaries, the pieces embedded
  and averaged (weighted by tokens): never sent too long, never silently truncated;
* vectors are checked for the expected dimension, sanitized (NaN/Inf → 0) and
  L2-normalized.

API keys are read from environment variables when the provider is built, kept on the
client only, and redacted from every error message this module raises.
"""

from __future__ import annotations

import email.utils
import os
import random
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from memory_pipeline.errors import ConfigError, ProviderError, ProviderUnavailable
from memory_pipeline.providers.base import normalize_vectors, stable_key
from memory_pipeline.settings import ResolvedRemote

RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})
_RETRYABLE_TEXT = re.compile(
    r"resource[ _-]?exhausted|rate[ _-]?limit|too many requests|tokens per (day|min)|quota|overloaded|unavailable|timed? ?out",
    re.IGNORECASE,
)
SPLIT_MARGIN = 0.9  # pieces of an over-long text stay this far under the limit (tokenizers differ)


@dataclass(frozen=True)
class ModelInfo:
    dims: int  # the default output size
    max_input_tokens: int
    dims_choices: tuple[int, ...] = ()  # sizes the API can return (empty: fixed)
    multimodal: bool = False


class RemoteCallError(Exception):
    """One failed request, as the provider module reports it to the retry loop."""

    def __init__(self, message: str, *, status: int | None = None, retry_after: float | None = None, retryable: bool | None = None):
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after
        self.retryable = is_retryable(status, message) if retryable is None else retryable


def is_retryable(status: int | None, message: str = "") -> bool:
    if status is None:  # no answer: connection error, timeout, unreadable body
        return True
    if status in RETRYABLE_STATUS:
        return True
    if status in (400, 401, 403, 404, 422):
        return False
    return bool(_RETRYABLE_TEXT.search(message or ""))


def parse_retry_after(headers) -> float | None:
    """Seconds to wait from ``retry-after-ms`` / ``Retry-After`` (seconds or an HTTP date)."""
    if headers is None:
        return None
    try:
        ms = headers.get("retry-after-ms")
        if ms:
            return max(float(ms) / 1000, 0.0)
        value = headers.get("retry-after")
    except Exception:  # noqa: BLE001 - odd header objects: no hint, plain backoff
        return None
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        when = email.utils.parsedate_to_datetime(value)
        return max(when.timestamp() - time.time(), 0.0) if when else None


class RateLimiter:
    """Token buckets for requests and tokens per minute; ``acquire`` blocks until both allow."""

    def __init__(
        self,
        requests_per_minute: int = 0,
        tokens_per_minute: int = 0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.rpm = requests_per_minute
        self.tpm = tokens_per_minute
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        now = clock()
        self._req = (float(requests_per_minute), now)
        self._tok = (float(tokens_per_minute), now)

    @staticmethod
    def _level(bucket: tuple[float, float], limit: int, now: float) -> float:
        level, at = bucket
        return min(float(limit), level + (now - at) * limit / 60.0)

    def acquire(self, tokens: int = 0) -> float:
        """Wait for one request of ``tokens``; returns the seconds waited."""
        if not self.rpm and not self.tpm:
            return 0.0
        waited = 0.0
        while True:
            with self._lock:
                now = self._clock()
                req = self._level(self._req, self.rpm, now) if self.rpm else 1.0
                # A request bigger than a whole minute's budget goes once the bucket is full.
                need_tok = min(tokens, self.tpm) if self.tpm else 0
                tok = self._level(self._tok, self.tpm, now) if self.tpm else 0.0
                if req >= 1.0 and (not self.tpm or tok >= need_tok):
                    if self.rpm:
                        self._req = (req - 1.0, now)
                    if self.tpm:
                        self._tok = (tok - tokens, now)
                    return waited
                wait_req = (1.0 - req) * 60.0 / self.rpm if self.rpm and req < 1.0 else 0.0
                wait_tok = (need_tok - tok) * 60.0 / self.tpm if self.tpm and tok < need_tok else 0.0
                pause = max(wait_req, wait_tok, 0.005)
            self._sleep(pause)
            waited += pause


def _cl100k():
    from memory_pipeline.chunking import _encoding

    return _encoding()


class RemoteProvider:
    """Base of the remote providers; subclasses set the class attributes and ``_send``."""

    name = "remote"
    env_keys: tuple[str, ...] = ()  # environment variables that may hold the API key, first wins
    key_required = True
    default_model = ""
    default_base_url = ""
    models: dict[str, ModelInfo] = {}
    fallback_info = ModelInfo(dims=0, max_input_tokens=2048)  # for a model we do not know
    max_texts_per_request = 96
    max_tokens_per_request = 100_000

    def __init__(self, model: str | None, dims: int | None, remote: ResolvedRemote, *, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.model = model or self.default_model
        self.remote = remote
        self.base_url = (remote.base_url or self.default_base_url).rstrip("/")
        self._key_env = next((k for k in self.env_keys if env.get(k)), None)
        self._api_key = env.get(self._key_env) if self._key_env else None
        if self.key_required and not self._api_key:
            raise MissingKey(self.name, self.env_keys)
        self.info = self.models.get(self.model, self.fallback_info)
        if dims is not None and self.info.dims_choices and dims not in self.info.dims_choices:
            raise ConfigError(
                f"{self.name} model {self.model} offers dims {', '.join(map(str, self.info.dims_choices))}, not {dims}",
                key="dims",
            )
        if dims is not None and self.info.dims and not self.info.dims_choices and dims != self.info.dims:
            raise ConfigError(f"{self.name} model {self.model} has {self.info.dims} dims; it cannot give {dims}", key="dims")
        self.requested_dims = dims
        self._dims = dims or self.info.dims or 0
        self._limiter = RateLimiter(remote.requests_per_minute, remote.tokens_per_minute)
        self._client: Any = None  # the provider's SDK or httpx client, opened on first use
        self._client_lock = threading.Lock()
        self.stats = {"requests": 0, "retries": 0, "split_texts": 0, "rate_limited_s": 0.0}
        self._stats_lock = threading.Lock()

    # --- identity -------------------------------------------------------------------

    supports_multimodal = False

    @property
    def dims(self) -> int:
        if not self._dims:
            # A model this module does not know (e.g. any Ollama model): ask it once.
            self._dims = int(self._embed_all(["dimension probe"], "query")[0].shape[-1])
        return self._dims

    @property
    def max_input_tokens(self) -> int:
        return self.info.max_input_tokens

    @property
    def provider_key(self) -> str:
        # The key's *identity* is the variable it comes from, never its value: rotating a key
        # keeps the vectors (and the cache) valid; pointing at another endpoint does not.
        return stable_key(self.name, self.base_url, self.model, self.dims, self._key_env or "")

    def describe(self) -> dict:
        """What `status` and `doctor` show: no secret, only where the key comes from."""
        return {
            "provider": self.name,
            "model": self.model,
            "dims": self._dims or None,
            "base_url": self.base_url,
            "key_from": self._key_env,
            "max_input_tokens": self.max_input_tokens,
        }

    # --- tokens ---------------------------------------------------------------------

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        enc = _cl100k()
        return [len(ids) for ids in enc.encode_ordinary_batch(list(texts))] if texts else []

    def _split_limit(self) -> int:
        return max(16, int(self.max_input_tokens * SPLIT_MARGIN))

    # --- the Protocol ---------------------------------------------------------------

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        return self._embed_all(list(texts), "document")

    def embed_query(self, text: str) -> np.ndarray:
        return self._embed_all([text], "query")[0]

    # --- the policy -----------------------------------------------------------------

    def _embed_all(self, texts: list[str], kind: str) -> np.ndarray:
        enc = _cl100k()
        limit = self._split_limit()
        pieces: list[str] = []
        owner: list[int] = []
        weights: list[int] = []
        for i, text in enumerate(texts):
            ids = enc.encode_ordinary(text or " ")
            if len(ids) <= limit:
                pieces.append(text if text.strip() else " ")
                owner.append(i)
                weights.append(max(len(ids), 1))
                continue
            with self._stats_lock:
                self.stats["split_texts"] += 1
            for start in range(0, len(ids), limit):
                part = ids[start : start + limit]
                pieces.append(enc.decode(part))
                owner.append(i)
                weights.append(len(part))
        groups = self._group(pieces, weights)
        timeout = self.remote.query_timeout_s if kind == "query" else self.remote.timeout_s
        if len(groups) == 1 or self.remote.concurrency <= 1:
            results = [self._call([pieces[i] for i in idx], kind, timeout, sum(weights[i] for i in idx)) for idx in groups]
        else:
            with ThreadPoolExecutor(max_workers=min(self.remote.concurrency, len(groups)), thread_name_prefix=f"{self.name}-embed") as pool:
                futures = [pool.submit(self._call, [pieces[i] for i in idx], kind, timeout, sum(weights[i] for i in idx)) for idx in groups]
                results = [fut.result() for fut in futures]
        piece_vecs = np.zeros((len(pieces), results[0].shape[1]), dtype=np.float32)
        for idx, vecs in zip(groups, results):
            piece_vecs[idx] = vecs
        if len(pieces) == len(texts):
            return normalize_vectors(piece_vecs)
        out = np.zeros((len(texts), piece_vecs.shape[1]), dtype=np.float32)
        np.add.at(out, np.asarray(owner), piece_vecs * np.asarray(weights, dtype=np.float32)[:, None])
        return normalize_vectors(out)

    def _group(self, pieces: list[str], weights: list[int]) -> list[list[int]]:
        cap = self.remote.batch_size or self.max_texts_per_request
        cap = min(cap, self.max_texts_per_request)
        groups: list[list[int]] = []
        cur: list[int] = []
        cur_tokens = 0
        for i, w in enumerate(weights):
            if cur and (len(cur) >= cap or cur_tokens + w > self.max_tokens_per_request):
                groups.append(cur)
                cur, cur_tokens = [], 0
            cur.append(i)
            cur_tokens += w
        if cur:
            groups.append(cur)
        return groups

    def _call(self, texts: list, kind: str, timeout: float, tokens: int) -> np.ndarray:
        """One request with the retry policy; returns sanitized (not yet normalized) vectors.

        ``texts`` is what the provider's ``_send`` takes: strings, or gemini's media items.
        """
        attempts = self.remote.max_retries + 1 if kind == "document" else min(self.remote.max_retries, 2) + 1
        last: RemoteCallError | None = None
        for attempt in range(attempts):
            waited = self._limiter.acquire(tokens)
            with self._stats_lock:
                self.stats["requests"] += 1
                self.stats["rate_limited_s"] += waited
            try:
                vectors = self._send(texts, kind, timeout)
                return self._check(vectors, len(texts))
            except RemoteCallError as err:
                last = err
                if not err.retryable:
                    raise self._error(err) from None
                if attempt == attempts - 1:
                    break
                with self._stats_lock:
                    self.stats["retries"] += 1
                time.sleep(self._backoff(attempt, err.retry_after))
        assert last is not None
        raise self._error(last, exhausted=attempts) from None

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        cap = self.remote.backoff_max_s
        delay = random.uniform(0, min(cap, self.remote.backoff_base_s * 2**attempt))  # full jitter
        if retry_after is not None:
            delay = max(delay, min(retry_after, cap))
        return delay

    def _check(self, vectors, n: int) -> np.ndarray:
        try:
            arr = np.asarray(vectors, dtype=np.float32)
        except (ValueError, TypeError) as err:
            raise RemoteCallError(f"unreadable vectors in the response: {err}", status=None, retryable=True) from None
        if arr.ndim != 2 or arr.shape[0] != n:
            raise RemoteCallError(f"the response has {arr.shape[0] if arr.ndim else 0} vectors for {n} inputs", retryable=True)
        want = self._dims or arr.shape[1]
        if arr.shape[1] != want:
            # A model answering with another size would corrupt the table: not retried, reported.
            raise RemoteCallError(f"the response has vectors of {arr.shape[1]} dims, expected {want} (model {self.model})", status=None, retryable=False)
        return np.nan_to_num(arr, nan=0.0, posinf=0.0, neginf=0.0)

    def _error(self, err: RemoteCallError, exhausted: int = 0) -> ProviderError:
        message = self.redact(str(err))
        if exhausted:
            message = f"{message} (gave up after {exhausted} attempts)"
        hint = ""
        if err.status in (401, 403):
            hint = f"check the API key in {self._key_env or ' / '.join(self.env_keys)}"
        elif err.status == 404:
            hint = f"check model ({self.model}) and remote.base_url ({self.base_url})"
        return ProviderError(f"{self.name}: {message}", provider=self.name, status=err.status, hint=hint)

    def redact(self, text: str) -> str:
        if self._api_key and self._api_key in text:
            text = text.replace(self._api_key, "[REDACTED]")
        return text

    # --- what a provider module implements ---------------------------------------------

    def _send(self, texts: list[str], kind: str, timeout: float) -> list:
        """Send one request; return one vector per text, or raise RemoteCallError."""
        raise NotImplementedError

    def release(self) -> None:
        """Close the HTTP client; the next request opens a new one."""
        self.close()

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None and hasattr(client, "close"):
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing is best effort
                pass


class MissingKey(ProviderUnavailable):
    """No API key in the environment: the one reason ``auto`` moves on to the next provider."""

    def __init__(self, provider: str, env_keys: Sequence[str]) -> None:
        names = " or ".join(env_keys)
        super().__init__(f"{provider}: no API key ({names} is not set)", provider=provider, hint=f"export {env_keys[0]}=…")
        self.env_keys = tuple(env_keys)


def http_client(timeout: float):
    """An httpx client for the providers that speak their HTTP API directly."""
    import httpx2

    return httpx2.Client(timeout=timeout, follow_redirects=False)


def post_json(provider: RemoteProvider, url: str, payload: dict, headers: dict, timeout: float) -> dict:
    """POST JSON with httpx, translating every failure into RemoteCallError (key never in the message)."""
    import httpx2

    with provider._client_lock:
        if provider._client is None:
            provider._client = http_client(timeout)
        client = provider._client
    try:
        resp = client.post(url, json=payload, headers=headers, timeout=timeout)
    except httpx2.TimeoutException as err:
        raise RemoteCallError(f"request timed out after {timeout:g}s", status=None) from err
    except httpx2.HTTPError as err:
        raise RemoteCallError(f"cannot reach {url}: {type(err).__name__}", status=None) from err
    if resp.status_code >= 400:
        raise RemoteCallError(f"HTTP {resp.status_code}: {error_message(resp)}", status=resp.status_code, retry_after=parse_retry_after(resp.headers))
    try:
        return resp.json()
    except ValueError as err:
        raise RemoteCallError("the response body is not valid JSON (truncated?)", status=None) from err


def openai_shaped_vectors(body: dict) -> list:
    """The vectors of an OpenAI-shaped reply (``{"data": [{"index", "embedding"}]}``), in input order."""
    try:
        return [d["embedding"] for d in sorted(body["data"], key=lambda d: d["index"])]
    except (KeyError, TypeError) as err:
        raise RemoteCallError(f"unexpected response shape: missing {err}") from None


def error_message(resp) -> str:
    """The provider's own message from an error body (OpenAI, Google, Voyage, Mistral, Ollama shapes)."""
    try:
        body = resp.json()
    except ValueError:
        return (resp.text or "").strip()[:300] or resp.reason_phrase
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        for key in ("detail", "message"):
            if isinstance(body.get(key), str):
                return body[key]
    return str(body)[:300]
