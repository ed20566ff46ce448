"""Provider batch APIs behind one small contract: submit, poll, results, cancel.

- OpenAI: requests written as JSONL (one ``/v1/embeddings`` request per chunk, the
  content hash as ``custom_id``), uploaded with ``purpose=batch``, a batch created
  with the 24 h window, polled, output and error files downloaded and parsed by
  ``custom_id``.
- Voyage: the same Files/Batches protocol (Voyage's is OpenAI-compatible and is
  driven with the ``openai`` SDK pointed at Voyage's base URL): lines are
  ``{"custom_id", "body": {"input": [...]}}``, model and ``input_type: document``
  go once in ``request_params``, the window is 12 h.
- Gemini: ``client.batches.create_embeddings`` with inline requests
  (``RETRIEVAL_DOCUMENT``), polled with ``client.batches.get``; inline responses
  come back in request order and are mapped back to their keys by position.

Errors from the SDKs are translated here into ``BatchApiError`` (chained), with the
API key scrubbed from every message. ``unavailable`` marks errors that say the
batch API itself cannot be used (404/405/501, "not available/supported/enabled"):
the failure policy disables batching at once for those.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from memory_pipeline.errors import ProviderError

TERMINAL = ("completed", "failed", "expired", "cancelled")

_UNAVAILABLE_RE = re.compile(
    r"batch\w*\b.*\b(not (available|supported|enabled|allowed)|unavailable|disabled)|"
    r"(not (available|supported|enabled)|unavailable)\b.*\bbatch",
    re.IGNORECASE,
)


class BatchApiError(ProviderError):
    """A batch API call failed; ``unavailable`` when the API itself is not usable for this account."""

    def __init__(self, message: str, *, provider: str, status: int | None = None, unavailable: bool = False) -> None:
        super().__init__(message, provider=provider, status=status)
        self.unavailable = unavailable


@dataclass(frozen=True)
class BatchLimits:
    """What one job may hold: requests, bytes of the request file/body, tokens per request."""

    max_requests: int
    max_bytes: int
    max_request_tokens: int


@dataclass(frozen=True)
class BatchRequest:
    key: str  # the content hash: unique within a job, maps results back
    text: str
    tokens: int


@dataclass(frozen=True)
class Submission:
    remote_id: str
    meta: dict = field(default_factory=dict)


@dataclass(frozen=True)
class JobStatus:
    state: str  # running | completed | failed | expired | cancelled
    remote_status: str
    error: str = ""
    meta: dict = field(default_factory=dict)
    completed: int | None = None
    failed: int | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


@dataclass
class JobResults:
    vectors: dict[str, list[float]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    tokens: int = 0  # as reported by the provider (0 when it does not say)


class BatchBackend(Protocol):
    provider: str
    limits: BatchLimits

    def request_bytes(self, request: BatchRequest) -> int: ...

    def submit(self, requests: Sequence[BatchRequest], label: str) -> Submission: ...

    def poll(self, remote_id: str, meta: dict) -> JobStatus: ...

    def results(self, remote_id: str, status: JobStatus, keys: Sequence[str]) -> JobResults: ...

    def cancel(self, remote_id: str, meta: dict) -> None: ...


def pack(requests: Sequence[BatchRequest], limits: BatchLimits, size_of) -> list[list[BatchRequest]]:
    """Pack requests into as few jobs as the limits allow (order kept; none is ever dropped)."""
    jobs: list[list[BatchRequest]] = []
    current: list[BatchRequest] = []
    current_bytes = 0
    for req in requests:
        if req.tokens > limits.max_request_tokens:
            raise ValueError(f"request {req.key} has {req.tokens} tokens, over the per-request limit {limits.max_request_tokens}")
        n = size_of(req)
        if current and (len(current) >= limits.max_requests or current_bytes + n > limits.max_bytes):
            jobs.append(current)
            current, current_bytes = [], 0
        current.append(req)
        current_bytes += n
    if current:
        jobs.append(current)
    return jobs


def _scrub(text: str, secret: str | None) -> str:
    text = str(text)
    if secret:
        text = text.replace(secret, "***")
    # Anything shaped like a bearer key, in case a server echoes one back.
    return re.sub(r"\b(sk|pa|AIza)[-_A-Za-z0-9]{12,}", "***", text)


# --- OpenAI and Voyage: the Files + Batches protocol --------------------------------------------


_OPENAI_STATES = {
    "validating": "running",
    "in_progress": "running",
    "finalizing": "running",
    "cancelling": "running",
    "completed": "completed",
    "failed": "failed",
    "expired": "expired",
    "cancelled": "cancelled",
}


class OpenAIBatchBackend:
    """OpenAI Batch API for ``/v1/embeddings`` through the official ``openai`` SDK."""

    provider = "openai"
    completion_window = "24h"
    # 50,000 requests (and embedding inputs) per batch; input files up to 200 MB.
    limits = BatchLimits(max_requests=50_000, max_bytes=190 * 1024 * 1024, max_request_tokens=8192)

    def __init__(self, client, model: str, *, dimensions: int | None = None, api_key: str | None = None, limits: BatchLimits | None = None) -> None:
        self.client = client
        self.model = model
        self.dimensions = dimensions
        self._secret = api_key
        if limits is not None:
            self.limits = limits

    # the request file

    def _line(self, req: BatchRequest) -> dict:
        body: dict = {"model": self.model, "input": req.text, "encoding_format": "float"}
        if self.dimensions:
            body["dimensions"] = self.dimensions
        return {"custom_id": req.key, "method": "POST", "url": "/v1/embeddings", "body": body}

    def request_bytes(self, request: BatchRequest) -> int:
        return len(json.dumps(self._line(request), ensure_ascii=False).encode()) + 1

    def _jsonl(self, requests: Sequence[BatchRequest]) -> bytes:
        return "".join(json.dumps(self._line(r), ensure_ascii=False) + "\n" for r in requests).encode()

    def _create_batch(self, file_id: str, label: str):
        return self.client.batches.create(
            input_file_id=file_id,
            endpoint="/v1/embeddings",
            completion_window=self.completion_window,
            metadata={"memory_pipeline_job": label},
        )

    # the contract

    def submit(self, requests: Sequence[BatchRequest], label: str) -> Submission:
        with self._errors("submit"):
            uploaded = self.client.files.create(file=(f"memory-{label}.jsonl", io.BytesIO(self._jsonl(requests)), "application/jsonl"), purpose="batch")
        with self._errors("create batch"):
            batch = self._create_batch(uploaded.id, label)
        return Submission(batch.id, {"input_file_id": uploaded.id})

    def poll(self, remote_id: str, meta: dict) -> JobStatus:
        with self._errors("poll"):
            batch = self.client.batches.retrieve(remote_id)
        errors = getattr(batch, "errors", None)
        messages = [f"{e.code}: {e.message}" for e in (errors.data or [])] if errors is not None else []
        counts = getattr(batch, "request_counts", None)
        return JobStatus(
            state=_OPENAI_STATES.get(batch.status, "running"),
            remote_status=batch.status,
            error=_scrub("; ".join(messages), self._secret),
            meta={"output_file_id": batch.output_file_id, "error_file_id": batch.error_file_id},
            completed=getattr(counts, "completed", None),
            failed=getattr(counts, "failed", None),
        )

    def results(self, remote_id: str, status: JobStatus, keys: Sequence[str]) -> JobResults:
        out = JobResults()
        for kind in ("output_file_id", "error_file_id"):
            file_id = status.meta.get(kind)
            if not file_id:
                continue
            with self._errors("download results"):
                text = self.client.files.content(file_id).text
            for n, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    self._parse_line(line, n, out)
        return out

    def cancel(self, remote_id: str, meta: dict) -> None:
        with self._errors("cancel"):
            self.client.batches.cancel(remote_id)

    def _parse_line(self, line: str, n: int, out: JobResults) -> None:
        try:
            rec = json.loads(line)
            key = rec["custom_id"]
        except (ValueError, KeyError, TypeError):
            return  # a line we cannot attribute: its request stays missing and is retried
        err = rec.get("error")
        resp = rec.get("response") or {}
        body = resp.get("body") if isinstance(resp, dict) else None
        if err:
            out.errors[key] = _scrub(f"{err.get('code', '')}: {err.get('message', '')}".strip(": "), self._secret)
            return
        if not isinstance(body, dict) or resp.get("status_code", 200) != 200:
            msg = (body or {}).get("error", {}) if isinstance(body, dict) else {}
            detail = msg.get("message", "") if isinstance(msg, dict) else str(msg)
            out.errors[key] = _scrub(f"HTTP {resp.get('status_code')}: {detail}", self._secret)
            return
        data = body.get("data") or []
        vec = data[0].get("embedding") if data and isinstance(data[0], dict) else None
        if not isinstance(vec, list) or not vec:
            out.errors[key] = f"line {n}: no embedding in the response"
            return
        out.vectors[key] = vec
        usage = body.get("usage") or {}
        out.tokens += int(usage.get("total_tokens") or usage.get("prompt_tokens") or 0)

    # error translation

    def _errors(self, what: str):
        return _OpenAIErrors(self.provider, what, self._secret)


class _OpenAIErrors:
    def __init__(self, provider: str, what: str, secret: str | None) -> None:
        self.provider, self.what, self.secret = provider, what, secret

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None:
            return False
        import openai

        if isinstance(exc, openai.APIStatusError):
            status = exc.status_code
            msg = _scrub(getattr(exc, "message", "") or str(exc), self.secret)
            unavailable = status in (404, 405, 501) and self.what != "poll" or bool(_UNAVAILABLE_RE.search(msg))
            raise BatchApiError(
                f"{self.provider} batch {self.what} failed (HTTP {status}): {msg}",
                provider=self.provider,
                status=status,
                unavailable=unavailable,
            ) from exc
        if isinstance(exc, (openai.APIError, ValueError)):
            raise BatchApiError(f"{self.provider} batch {self.what} failed: {_scrub(str(exc), self.secret)}", provider=self.provider) from exc
        return False


class VoyageBatchBackend(OpenAIBatchBackend):
    """Voyage AI's batch API (OpenAI-compatible Files/Batches; 12 h window; model set per batch)."""

    provider = "voyage"
    completion_window = "12h"
    # 100,000 inputs and 1 GB per batch file; voyage-4 models take 32k tokens per input.
    limits = BatchLimits(max_requests=100_000, max_bytes=950 * 1024 * 1024, max_request_tokens=32_000)

    def _line(self, req: BatchRequest) -> dict:
        return {"custom_id": req.key, "body": {"input": [req.text]}}

    def _create_batch(self, file_id: str, label: str):
        params: dict = {"model": self.model, "input_type": "document"}
        if self.dimensions:
            params["output_dimension"] = self.dimensions
        return self.client.batches.create(
            input_file_id=file_id,
            endpoint="/v1/embeddings",
            completion_window=self.completion_window,  # type: ignore[arg-type]  (Voyage's window, not OpenAI's)
            metadata={"memory_pipeline_job": label},
            extra_body={"request_params": params},
        )


# --- Gemini: google-genai batches.create_embeddings --------------------------------------------


_GEMINI_STATES = {
    "JOB_STATE_SUCCEEDED": "completed",
    "JOB_STATE_FAILED": "failed",
    "JOB_STATE_EXPIRED": "expired",
    "JOB_STATE_CANCELLED": "cancelled",
}


class GeminiBatchBackend:
    """Gemini batch embedding (inline requests, task type RETRIEVAL_DOCUMENT) through ``google-genai``."""

    provider = "gemini"
    # Inline batch requests are limited to 20 MB per call; keep a margin for the JSON envelope.
    limits = BatchLimits(max_requests=10_000, max_bytes=16 * 1024 * 1024, max_request_tokens=2048)

    def __init__(self, client, model: str, *, dimensions: int | None = None, api_key: str | None = None, limits: BatchLimits | None = None) -> None:
        self.client = client
        self.model = model
        self.dimensions = dimensions
        self._secret = api_key
        if limits is not None:
            self.limits = limits

    def request_bytes(self, request: BatchRequest) -> int:
        return len(json.dumps(request.text, ensure_ascii=False).encode()) + 120

    def submit(self, requests: Sequence[BatchRequest], label: str) -> Submission:
        config: dict = {"task_type": "RETRIEVAL_DOCUMENT"}
        if self.dimensions:
            config["output_dimensionality"] = self.dimensions
        with self._errors("submit"):
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the SDK marks create_embeddings experimental
                job = self.client.batches.create_embeddings(
                    model=self.model,
                    src={"inlined_requests": {"contents": [r.text for r in requests], "config": config}},
                    config={"display_name": f"memory-{label}"},
                )
        if not job.name:
            raise BatchApiError("gemini batch submit returned no job name", provider=self.provider)
        return Submission(job.name, {})

    def _get(self, remote_id: str):
        with self._errors("poll"):
            return self.client.batches.get(name=remote_id)

    def poll(self, remote_id: str, meta: dict) -> JobStatus:
        job = self._get(remote_id)
        state = getattr(job.state, "value", job.state) or "JOB_STATE_UNSPECIFIED"
        err = getattr(job, "error", None)
        return JobStatus(
            state=_GEMINI_STATES.get(state, "running"),
            remote_status=state,
            error=_scrub(getattr(err, "message", "") or "", self._secret) if err else "",
        )

    def results(self, remote_id: str, status: JobStatus, keys: Sequence[str]) -> JobResults:
        out = JobResults()
        job = self._get(remote_id)
        dest = getattr(job, "dest", None)
        responses = list(getattr(dest, "inlined_embed_content_responses", None) or getattr(dest, "inlined_responses", None) or [])
        for i, item in enumerate(responses[: len(keys)]):
            key = keys[i]
            err = getattr(item, "error", None)
            resp = getattr(item, "response", None)
            emb = getattr(resp, "embedding", None) if resp is not None else None
            values = getattr(emb, "values", None) if emb is not None else None
            if err is not None and not values:
                out.errors[key] = _scrub(getattr(err, "message", "") or "request failed", self._secret)
            elif values:
                out.vectors[key] = list(values)
                out.tokens += int(getattr(resp, "token_count", 0) or 0)
            else:
                out.errors[key] = "no embedding in the response"
        return out

    def cancel(self, remote_id: str, meta: dict) -> None:
        with self._errors("cancel"):
            self.client.batches.cancel(name=remote_id)

    def _errors(self, what: str):
        return _GeminiErrors(what, self._secret)


class _GeminiErrors:
    def __init__(self, what: str, secret: str | None) -> None:
        self.what, self.secret = what, secret

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is None:
            return False
        from google.genai import errors as genai_errors

        if isinstance(exc, genai_errors.APIError):
            status = getattr(exc, "code", None)
            msg = _scrub(getattr(exc, "message", None) or str(exc), self.secret)
            unavailable = status in (404, 405, 501) and self.what != "poll" or bool(_UNAVAILABLE_RE.search(msg))
            raise BatchApiError(f"gemini batch {self.what} failed (HTTP {status}): {msg}", provider="gemini", status=status, unavailable=unavailable) from exc
        if isinstance(exc, (ValueError, OSError)) or type(exc).__module__.startswith(("httpx", "httpx2", "requests")):
            raise BatchApiError(f"gemini batch {self.what} failed: {_scrub(str(exc), self.secret)}", provider="gemini") from exc
        return False
