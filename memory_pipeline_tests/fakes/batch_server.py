"""A local fake of the providers' batch APIs (and the live embedding calls they fall back to).

One HTTP server on 127.0.0.1 (random port) speaks three wire protocols, driven in
the tests by the real SDKs:

- OpenAI: ``POST /v1/files`` (multipart, purpose=batch), ``POST /v1/batches``,
  ``GET /v1/batches/{id}``, ``POST /v1/batches/{id}/cancel``,
  ``GET /v1/files/{id}/content``, and live ``POST /v1/embeddings``;
- Voyage: the same paths under ``/voyage/v1`` (12 h window, ``request_params``);
- Gemini: ``POST /{version}/models/{model}:asyncBatchEmbedContent``,
  ``GET /{version}/batches/{id}``, ``POST /{version}/batches/{id}:cancel``, and live
  ``POST /{version}/models/{model}:batchEmbedContents``.

A batch moves validating → in_progress → finalizing → completed over
``polls_to_complete`` polls. Fault injection, per batch in creation order
(``service.faults``): ``expire`` (half the lines done, the rest ``batch_expired``),
``fail`` (the whole batch fails), ``partial`` (every third line fails),
``unavailable`` (creating a batch answers 404 "Batch API is not available"),
``hold`` (stays in progress until ``service.release()``). Vectors are a hashed bag
of words, so retrieval over them is meaningful and the live and batch paths return
the same vector for the same text.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
import time
from email.parser import BytesParser
from email.policy import default as email_policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

API_KEY = "sk-fake-batch-0123456789abcdef"
GEMINI_KEY = "AIzaFakeBatchKey0123456789"
VOYAGE_KEY = "pa-fake-batch-0123456789abcdef"

_STAGES = ("validating", "in_progress", "finalizing")


def fake_vector(text: str, dims: int) -> list[float]:
    """Hashed bag of words: texts sharing words point the same way."""
    vec = [0.0] * dims
    for word in re.findall(r"\w+", text.lower()):
        h = hashlib.sha256(word.encode()).digest()
        vec[int.from_bytes(h[:4], "little") % dims] += 1.0 if h[4] & 1 else -1.0
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    return [v / norm for v in vec]


def fake_tokens(text: str) -> int:
    return max(1, len(re.findall(r"\w+|[^\w\s]", text)))


class BatchService:
    """The state behind the fake: files, batches, faults and a log of what was asked."""

    def __init__(self, dims: int = 64, polls_to_complete: int = 3) -> None:
        self.dims = dims
        self.polls_to_complete = polls_to_complete
        self.faults: list[str] = []  # applied to batches in creation order ("" = none)
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, dict] = {}
        self.log: list[tuple[str, str]] = []  # (method, path)
        self.live_inputs: list[str] = []
        self.held = False
        self.lock = threading.Lock()
        self._n = 0

    def next_id(self, prefix: str) -> str:
        with self.lock:
            self._n += 1
            return f"{prefix}{self._n:06d}"

    def release(self) -> None:
        self.held = False

    def count(self, method: str, pattern: str) -> int:
        return sum(1 for m, p in self.log if m == method and re.fullmatch(pattern, p))

    def batches_created(self) -> int:
        return len(self.batches)

    def take_fault(self) -> str:
        with self.lock:
            return self.faults.pop(0) if self.faults else ""


class _Handler(BaseHTTPRequestHandler):
    service: BatchService
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    # plumbing

    def _body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _send(self, status: int, obj=None, raw: bytes | None = None, ctype: str = "application/json") -> None:
        data = raw if raw is not None else json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _auth(self, path: str) -> bool:
        if self._is_gemini():
            ok = self.headers.get("x-goog-api-key") == GEMINI_KEY
        elif path.startswith("/voyage"):
            ok = self.headers.get("Authorization") == f"Bearer {VOYAGE_KEY}"
        else:
            ok = self.headers.get("Authorization") == f"Bearer {API_KEY}"
        if not ok:
            self._send(401, {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error", "code": "invalid_api_key"}})
        return ok

    def _is_gemini(self) -> bool:
        return "x-goog-api-key" in self.headers  # google-genai authenticates with this header

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def _route(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        body = self._body() if method == "POST" else b""
        self.service.log.append((method, path))
        if not self._auth(path):
            return
        try:
            if not self._is_gemini():
                return self._openai(method, path.removeprefix("/voyage"), body, voyage=path.startswith("/voyage"))
            return self._gemini(method, path, body)
        except Exception as err:  # a bug in the fake must be loud in the test, not a hang
            self._send(500, {"error": {"message": f"fake server error: {err!r}"}})

    # --- OpenAI / Voyage ----------------------------------------------------------------

    def _openai(self, method: str, path: str, body: bytes, *, voyage: bool) -> None:
        s = self.service
        if method == "POST" and path == "/v1/embeddings":
            req = json.loads(body)
            inputs = req["input"] if isinstance(req["input"], list) else [req["input"]]
            s.live_inputs.extend(inputs)
            dims = req.get("dimensions") or req.get("output_dimension") or s.dims
            data = [{"object": "embedding", "index": i, "embedding": fake_vector(t, dims)} for i, t in enumerate(inputs)]
            n = sum(fake_tokens(t) for t in inputs)
            return self._send(200, {"object": "list", "data": data, "model": req.get("model"), "usage": {"prompt_tokens": n, "total_tokens": n}})
        if method == "POST" and path == "/v1/files":
            msg = BytesParser(policy=email_policy).parsebytes(
                b"Content-Type: " + self.headers["Content-Type"].encode() + b"\r\n\r\n" + body
            )
            parts = {p.get_param("name", header="content-disposition"): p for p in msg.iter_parts()}
            if parts["purpose"].get_content().strip() != "batch":
                return self._send(400, {"error": {"message": "purpose must be batch"}})
            fid = s.next_id("file-")
            s.files[fid] = parts["file"].get_payload(decode=True)
            return self._send(200, {"id": fid, "object": "file", "bytes": len(s.files[fid]), "created_at": int(time.time()),
                                    "filename": parts["file"].get_filename(), "purpose": "batch", "status": "processed"})
        m = re.fullmatch(r"/v1/files/([\w-]+)/content", path)
        if method == "GET" and m:
            if m.group(1) not in s.files:
                return self._send(404, {"error": {"message": "No such file"}})
            return self._send(200, raw=s.files[m.group(1)], ctype="application/octet-stream")
        if method == "POST" and path == "/v1/batches":
            req = json.loads(body)
            fault = s.take_fault()
            if fault == "unavailable":
                return self._send(404, {"error": {"message": "The Batch API is not available for this project", "type": "invalid_request_error"}})
            window = "12h" if voyage else "24h"
            if req.get("completion_window") != window or req.get("endpoint") != "/v1/embeddings":
                return self._send(400, {"error": {"message": f"completion_window must be {window}, endpoint /v1/embeddings"}})
            if req["input_file_id"] not in s.files:
                return self._send(400, {"error": {"message": "input file not found"}})
            if voyage and not (req.get("request_params") or {}).get("model"):
                return self._send(400, {"error": {"message": "request_params.model is required"}})
            bid = s.next_id("batch_")
            lines = [json.loads(x) for x in s.files[req["input_file_id"]].decode().splitlines() if x.strip()]
            s.batches[bid] = {"id": bid, "lines": lines, "req": req, "fault": fault, "polls": 0, "voyage": voyage,
                              "status": "validating", "output_file_id": None, "error_file_id": None, "errors": None}
            return self._send(200, self._batch_obj(s.batches[bid]))
        m = re.fullmatch(r"/v1/batches/([\w-]+)(/cancel)?", path)
        if m:
            b = s.batches.get(m.group(1))
            if b is None:
                return self._send(404, {"error": {"message": "No such batch"}})
            if m.group(2) and method == "POST":
                if b["status"] not in ("completed", "failed", "expired", "cancelled"):
                    b["status"] = "cancelled"
                return self._send(200, self._batch_obj(b))
            if method == "GET":
                self._advance(b)
                return self._send(200, self._batch_obj(b))
        return self._send(404, {"error": {"message": f"unknown route {method} {path}"}})

    def _advance(self, b: dict) -> None:
        s = self.service
        if b["status"] in ("completed", "failed", "expired", "cancelled"):
            return
        b["polls"] += 1
        if b["fault"] == "hold" and s.held:
            b["status"] = "in_progress"
            return
        if b["polls"] < s.polls_to_complete:
            b["status"] = _STAGES[min(b["polls"], len(_STAGES) - 1)]
            return
        fault = b["fault"]
        if fault == "fail":
            b["status"] = "failed"
            b["errors"] = {"object": "list", "data": [{"code": "server_error", "message": "The batch failed to process", "line": None}]}
            return
        ok, bad = [], []
        for i, line in enumerate(b["lines"]):
            if fault == "partial" and i % 3 == 0:
                bad.append(self._line_error(line, 500, "server_error", "internal error embedding this input"))
            elif fault == "expire" and i >= len(b["lines"]) // 2:
                bad.append({"id": f"batch_req_{i}", "custom_id": line["custom_id"], "response": None,
                            "error": {"code": "batch_expired", "message": "This request could not be executed before the completion window expired."}})
            else:
                ok.append(self._line_ok(b, line, i))
        if ok:
            b["output_file_id"] = s.next_id("file-out-")
            s.files[b["output_file_id"]] = "".join(json.dumps(x) + "\n" for x in ok).encode()
        if bad:
            b["error_file_id"] = s.next_id("file-err-")
            s.files[b["error_file_id"]] = "".join(json.dumps(x) + "\n" for x in bad).encode()
        b["counts"] = {"total": len(b["lines"]), "completed": len(ok), "failed": len(bad)}
        b["status"] = "expired" if fault == "expire" else "completed"

    def _line_ok(self, b: dict, line: dict, i: int) -> dict:
        s = self.service
        if b["voyage"]:
            params = b["req"]["request_params"]
            texts = line["body"]["input"]
            dims = params.get("output_dimension") or s.dims
            model = params["model"]
        else:
            texts = [line["body"]["input"]]
            dims = line["body"].get("dimensions") or s.dims
            model = line["body"]["model"]
        n = sum(fake_tokens(t) for t in texts)
        data = [{"object": "embedding", "index": j, "embedding": fake_vector(t, dims)} for j, t in enumerate(texts)]
        return {"id": f"batch_req_{i}", "custom_id": line["custom_id"],
                "response": {"status_code": 200, "request_id": f"req_{i}",
                             "body": {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": n, "total_tokens": n}}},
                "error": None}

    @staticmethod
    def _line_error(line: dict, status: int, code: str, message: str) -> dict:
        return {"id": "batch_req_x", "custom_id": line["custom_id"],
                "response": {"status_code": status, "request_id": "req_x", "body": {"error": {"message": message, "type": code, "code": code}}},
                "error": None}

    @staticmethod
    def _batch_obj(b: dict) -> dict:
        counts = b.get("counts") or {"total": len(b["lines"]), "completed": 0, "failed": 0}
        return {"id": b["id"], "object": "batch", "endpoint": "/v1/embeddings", "errors": b["errors"],
                "input_file_id": b["req"]["input_file_id"], "completion_window": b["req"]["completion_window"],
                "status": b["status"], "output_file_id": b["output_file_id"], "error_file_id": b["error_file_id"],
                "created_at": int(time.time()), "request_counts": counts, "metadata": b["req"].get("metadata")}

    # --- Gemini ---------------------------------------------------------------------------

    def _gemini(self, method: str, path: str, body: bytes) -> None:
        s = self.service
        m = re.fullmatch(r"/(v1\w*)/models/([\w.-]+):(asyncBatchEmbedContent|batchEmbedContents)", path)
        if method == "POST" and m:
            req = json.loads(body)
            if m.group(3) == "batchEmbedContents":
                out = []
                for r in req["requests"]:
                    text = " ".join(p.get("text", "") for p in r["content"]["parts"])
                    s.live_inputs.append(text)
                    out.append({"values": fake_vector(text, r.get("outputDimensionality") or s.dims)})
                return self._send(200, {"embeddings": out})
            fault = s.take_fault()
            if fault == "unavailable":
                return self._send(404, {"error": {"code": 404, "message": "Batch API is not available for this model", "status": "NOT_FOUND"}})
            reqs = req["batch"]["inputConfig"]["requests"]["requests"]
            bid = f"batches/{s.next_id('gb')}"
            s.batches[bid] = {"name": bid, "model": f"models/{m.group(2)}", "reqs": reqs, "fault": fault, "polls": 0,
                              "state": "BATCH_STATE_PENDING", "output": None,
                              "display": req["batch"].get("displayName", "")}
            return self._send(200, self._gemini_obj(s.batches[bid]))
        m = re.fullmatch(r"/(v1\w*)/(batches/[\w-]+)(:cancel)?", path)
        if m:
            b = s.batches.get(m.group(2))
            if b is None:
                return self._send(404, {"error": {"code": 404, "message": "batch not found", "status": "NOT_FOUND"}})
            if m.group(3) and method == "POST":
                if not b["state"].endswith(("SUCCEEDED", "FAILED", "EXPIRED", "CANCELLED")):
                    b["state"] = "BATCH_STATE_CANCELLED"
                return self._send(200, {})
            if method == "GET":
                self._gemini_advance(b)
                return self._send(200, self._gemini_obj(b))
        return self._send(404, {"error": {"code": 404, "message": f"unknown route {method} {path}", "status": "NOT_FOUND"}})

    def _gemini_advance(self, b: dict) -> None:
        s = self.service
        if b["state"].endswith(("SUCCEEDED", "FAILED", "EXPIRED", "CANCELLED")):
            return
        b["polls"] += 1
        if b["fault"] == "hold" and s.held or b["polls"] < s.polls_to_complete:
            b["state"] = "BATCH_STATE_RUNNING"
            return
        if b["fault"] == "fail":
            b["state"] = "BATCH_STATE_FAILED"
            return
        if b["fault"] == "expire":
            b["state"] = "BATCH_STATE_EXPIRED"
            return
        responses = []
        for i, r in enumerate(b["reqs"]):
            text = " ".join(p.get("text", "") for p in r["request"]["content"]["parts"])
            if b["fault"] == "partial" and i % 3 == 0:
                responses.append({"error": {"code": 13, "message": "internal error embedding this input"}})
            else:
                dims = r["request"].get("outputDimensionality") or s.dims
                responses.append({"response": {"embedding": {"values": fake_vector(text, dims)}, "tokenCount": fake_tokens(text)}})
        b["output"] = {"inlinedResponses": {"inlinedResponses": responses}}
        b["state"] = "BATCH_STATE_SUCCEEDED"

    @staticmethod
    def _gemini_obj(b: dict) -> dict:
        meta = {"@type": "type.googleapis.com/google.ai.generativelanguage.v1main.EmbedContentBatch",
                "model": b["model"], "displayName": b["display"], "state": b["state"],
                "createTime": "2026-11-30T02:00:00Z", "updateTime": "2026-11-30T02:00:01Z"}
        if b["output"] is not None:
            meta["output"] = b["output"]
        return {"name": b["name"], "metadata": meta}


class FakeBatchServer:
    """``with FakeBatchServer() as fake: fake.url, fake.service``"""

    def __init__(self, dims: int = 64, polls_to_complete: int = 3) -> None:
        self.service = BatchService(dims=dims, polls_to_complete=polls_to_complete)
        handler = type("Handler", (_Handler,), {"service": self.service})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="fake-batch", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> FakeBatchServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
