"""The common base of the fake provider servers: threaded HTTP on 127.0.0.1, random port.

Each fake speaks one provider's real wire protocol (paths, auth header, request and
response bodies, error bodies) so the real SDK clients can be pointed at it. What it
adds for tests:

* deterministic vectors that carry meaning: a hashed bag of words (lower-cased,
  lightly stemmed words, each hashed to a signed coordinate), so the note that shares
  the query's words comes first;
* a record of every request (method, path, headers, parsed JSON body);
* fault injection: ``fail_next(...)`` queues faults for the next requests,
  ``fail_rate`` fails a seeded random share of requests transiently; a fault is one of
  ``429`` (with ``Retry-After``), ``500``, ``503``, ``timeout`` (the reply comes after
  ``timeout_s``), ``truncated`` (a cut JSON body), ``wrong_dims`` (vectors of another
  size), ``401``/``400``/``403`` (the provider's error body).

Usage::

    with OpenAIFake(api_key="sk-test") as fake:
        client = openai.OpenAI(api_key="sk-test", base_url=fake.base_url)
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

_WORD_RE = re.compile(r"[^\W_]+", re.UNICODE)
_STOP = frozenset(
    "a an and are as at be by did do does for from had has have how i in is it its me my of on or our the their "
    "there this to was we were what when where which who why will with you your".split()
)
TRANSIENT_FAULTS = ("429", "500", "503", "timeout", "truncated")


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 3 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def bag_of_words_vector(text: str, dims: int, extra_tokens: tuple[str, ...] = ()) -> list[float]:
    """A deterministic, meaningful vector: each content word hashed to a signed coordinate, L2-normalized."""
    vec = np.zeros(dims, dtype=np.float64)
    tokens = [_stem(w) for w in _WORD_RE.findall(text.lower()) if w not in _STOP] + list(extra_tokens)
    for tok in tokens:
        digest = hashlib.sha256(tok.encode()).digest()
        idx = int.from_bytes(digest[:4], "little") % dims
        vec[idx] += 1.0 if digest[4] & 1 else -1.0
    norm = np.linalg.norm(vec)
    if norm == 0:  # no content word: a fixed, non-zero vector
        vec[0] = 1.0
        norm = 1.0
    return (vec / norm).tolist()


@dataclass
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: object
    fault: str | None = None
    at: float = field(default_factory=time.monotonic)


@dataclass
class FaultPlan:
    queue: deque = field(default_factory=deque)
    rate: float = 0.0
    kinds: tuple[str, ...] = ("429", "500", "timeout", "truncated")
    rng: random.Random = field(default_factory=lambda: random.Random(1234))


_DEFAULT = object()


class FakeServer:
    """Base class: subclasses implement ``handle(method, path, headers, body) -> (status, headers, body)``.

    Class attributes: ``default_api_key`` (None: no auth), ``base_path`` (what the SDK's
    base URL adds to the root, e.g. ``/v1``). Auth is a bearer token unless overridden.
    """

    provider = "fake"
    default_api_key: str | None = "test-key"
    base_path = ""

    def __init__(self, *, api_key: str | None = _DEFAULT, dims: int = 256, retry_after: float = 0.2, timeout_s: float = 3.0) -> None:  # type: ignore[assignment]
        self.api_key = self.default_api_key if api_key is _DEFAULT else api_key
        self.dims = dims
        self.retry_after = retry_after
        self.timeout_s = timeout_s
        self.requests: list[Recorded] = []
        self.faults = FaultPlan()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.in_flight = 0
        self.max_in_flight = 0
        self.delay_s = 0.0  # added to every successful reply (to observe concurrency)

    # --- lifecycle ------------------------------------------------------------------

    def start(self) -> FakeServer:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body are separate writes on a kept-alive connection: with Nagle's
            # algorithm on, the body waits for the client's delayed ACK of the headers (40 ms a
            # response here, what a real provider's server does not add).
            disable_nagle_algorithm = True

            def log_message(self, *args):  # keep test output clean
                pass

            def _serve(self):
                fake._dispatch(self)

            do_GET = do_POST = do_DELETE = do_PUT = _serve

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"{self.provider}-fake", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "start() the fake first"
        return self._server.server_address[1]

    @property
    def root_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """What to give the SDK as its base URL."""
        return self.root_url + self.base_path

    # --- faults ---------------------------------------------------------------------

    def fail_next(self, *kinds: str) -> None:
        """Queue faults for the next requests, in order (e.g. ``fail_next("429", "500")``)."""
        with self._lock:
            self.faults.queue.extend(kinds)

    def fail_randomly(self, rate: float, kinds: tuple[str, ...] = ("429", "500", "timeout", "truncated"), seed: int = 1234) -> None:
        with self._lock:
            self.faults.rate = rate
            self.faults.kinds = kinds
            self.faults.rng = random.Random(seed)

    def _take_fault(self) -> str | None:
        with self._lock:
            if self.faults.queue:
                return self.faults.queue.popleft()
            if self.faults.rate and self.faults.rng.random() < self.faults.rate:
                return self.faults.rng.choice(self.faults.kinds)
        return None

    # --- the protocol -----------------------------------------------------------------

    def embed_requests(self) -> list[Recorded]:
        """Recorded requests that reached the embedding handler (not faulted)."""
        return [r for r in self.requests if r.fault is None and r.method == "POST"]

    def inputs(self, request: Recorded) -> list[str]:
        """The texts one request asked to embed (subclasses know their body shape)."""
        body = request.body if isinstance(request.body, dict) else {}
        value = body.get("input", [])
        return value if isinstance(value, list) else [value]

    def authorized(self, headers: dict[str, str]) -> bool:
        return bearer_ok(headers, self.api_key)

    def error_body(self, status: int, message: str) -> dict:
        raise NotImplementedError

    def handle(self, method: str, path: str, headers: dict[str, str], body: object, wrong_dims: bool) -> tuple[int, dict, object]:
        raise NotImplementedError

    def vector(self, text: str, dims: int | None = None, extra_tokens: tuple[str, ...] = ()) -> list[float]:
        return bag_of_words_vector(text, dims or self.dims, extra_tokens)

    def _dispatch(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length) if length else b""
        try:
            body: object = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        headers = {k.lower(): v for k, v in h.headers.items()}
        fault = self._take_fault() if h.command == "POST" else None
        rec = Recorded(h.command, h.path, headers, body, fault if fault not in ("wrong_dims",) else None)
        with self._lock:
            self.requests.append(rec)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if not self.authorized(headers):
                return self._send(h, 401, {}, self.error_body(401, "Incorrect API key provided"))
            if fault in ("429", "500", "503", "400", "401", "403"):
                status = int(fault)
                extra = {"Retry-After": f"{self.retry_after:g}"} if status == 429 else {}
                msg = {
                    429: "Rate limit reached for requests",
                    500: "The server had an error",
                    503: "Service unavailable",
                    400: "Invalid request",
                    401: "Incorrect API key provided",
                    403: "Permission denied",
                }[status]
                return self._send(h, status, extra, self.error_body(status, msg))
            if fault == "timeout":
                time.sleep(self.timeout_s)
                return self._send(h, 500, {}, self.error_body(500, "timed out upstream"))
            status, extra, payload = self.handle(h.command, h.path, headers, body, fault == "wrong_dims")
            if self.delay_s and status == 200:
                time.sleep(self.delay_s)
            if fault == "truncated" and status == 200:
                data = json.dumps(payload).encode()
                return self._send_raw(h, 200, extra, data[: max(1, len(data) // 2)])
            return self._send(h, status, extra, payload)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (its timeout): fine
            pass
        finally:
            with self._lock:
                self.in_flight -= 1

    def _send(self, h: BaseHTTPRequestHandler, status: int, headers: dict, payload: object) -> None:
        self._send_raw(h, status, headers, json.dumps(payload).encode())

    def _send_raw(self, h: BaseHTTPRequestHandler, status: int, headers: dict, data: bytes) -> None:
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(data)))
        for k, v in headers.items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(data)
        h.wfile.flush()


def bearer_ok(headers: dict[str, str], api_key: str | None) -> bool:
    if api_key is None:
        return True
    return headers.get("authorization") == f"Bearer {api_key}"
