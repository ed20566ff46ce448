"""The providers' batch APIs, grown onto the live fakes (``OpenAIFake``, ``VoyageFake``, ``GeminiFake``).

Each class below serves its provider's live embedding endpoint exactly as the live
fake does (same bag-of-words vectors, same fault injection on POSTs) plus the batch
protocol, driven in the tests by the real SDKs:

- OpenAI: ``POST /v1/files`` (multipart, ``purpose=batch``), ``POST /v1/batches``
  (``/v1/embeddings``, 24 h window), ``GET /v1/batches/{id}``,
  ``POST /v1/batches/{id}/cancel``, ``GET /v1/files/{id}/content``;
- Voyage: the same paths, a 12 h window, model and ``input_type`` in ``request_params``
  and lines ``{"custom_id", "body": {"input": [...]}}``;
- Gemini: ``POST /{version}/models/{model}:asyncBatchEmbedContent`` (inline requests),
  ``GET /{version}/batches/{id}``, ``POST /{version}/batches/{id}:cancel``; results come
  back inline, in request order.

A batch moves validating → in_progress → finalizing → completed over
``polls_to_complete`` status reads. Batch faults, applied per batch in creation order
(``batch_faults``): ``expire`` (half the lines done, the rest ``batch_expired``; a
Gemini job expires with no output), ``fail`` (the whole batch fails), ``partial``
(every third line fails), ``unavailable`` (creating the batch answers 404 "Batch API is
not available"), ``hold`` (stays in progress while ``held`` is true).
"""

from __future__ import annotations

import json
import re
import threading
import time
from email.parser import BytesParser
from email.policy import default as email_policy

from memory_pipeline_tests.fakes.gemini_server import MODEL_DIMS as GEMINI_DIMS
from memory_pipeline_tests.fakes.gemini_server import GeminiFake
from memory_pipeline_tests.fakes.openai_server import MODEL_DIMS as OPENAI_DIMS
from memory_pipeline_tests.fakes.openai_server import OpenAIFake
from memory_pipeline_tests.fakes.voyage_server import MODEL_DIMS as VOYAGE_DIMS
from memory_pipeline_tests.fakes.voyage_server import VoyageFake

_STAGES = ("validating", "in_progress", "finalizing")
_DONE = ("completed", "failed", "expired", "cancelled")


def fake_tokens(text: str) -> int:
    return max(1, len(text.split()))


class BatchState:
    """Files, batches and batch faults; shared by the three protocol front-ends."""

    def _init_batches(self, polls_to_complete: int) -> None:
        self.polls_to_complete = polls_to_complete
        self.batch_faults: list[str] = []
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, dict] = {}
        self.held = False
        self._ids = 0
        self._batch_lock = threading.Lock()

    def next_id(self, prefix: str) -> str:
        with self._batch_lock:
            self._ids += 1
            return f"{prefix}{self._ids:06d}"

    def take_batch_fault(self) -> str:
        with self._batch_lock:
            return self.batch_faults.pop(0) if self.batch_faults else ""

    def batches_created(self) -> int:
        return len(self.batches)

    def count(self, method: str, pattern: str) -> int:
        return sum(1 for r in self.requests if r.method == method and re.fullmatch(pattern, r.path.split("?")[0]))

    def live_texts(self) -> list[str]:
        """Texts that reached the live embedding endpoint."""
        raise NotImplementedError

    def _send(self, h, status, headers, payload) -> None:  # file contents go out as they are
        if isinstance(payload, bytes):
            return self._send_raw(h, status, headers, payload)
        return super()._send(h, status, headers, payload)


class _FilesAndBatches(BatchState):
    """The OpenAI-shaped Files + Batches protocol (OpenAI and Voyage)."""

    window = "24h"
    voyage = False

    def handle(self, method, path, headers, body, wrong_dims):
        path = path.split("?", 1)[0]
        if method == "POST" and path == "/v1/files":
            raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            msg = BytesParser(policy=email_policy).parsebytes(b"Content-Type: " + headers["content-type"].encode() + b"\r\n\r\n" + raw)
            parts = {p.get_param("name", header="content-disposition"): p for p in msg.iter_parts()}
            if parts.get("purpose") is None or parts["purpose"].get_content().strip() != "batch":
                return 400, {}, self.error_body(400, "purpose must be batch")
            fid = self.next_id("file-")
            self.files[fid] = parts["file"].get_payload(decode=True)
            return (
                200,
                {},
                {
                    "id": fid,
                    "object": "file",
                    "bytes": len(self.files[fid]),
                    "created_at": int(time.time()),
                    "filename": parts["file"].get_filename(),
                    "purpose": "batch",
                    "status": "processed",
                },
            )
        m = re.fullmatch(r"/v1/files/([\w-]+)/content", path)
        if method == "GET" and m:
            if m.group(1) not in self.files:
                return 404, {}, self.error_body(404, "No such file")
            return 200, {}, self.files[m.group(1)]
        if method == "POST" and path == "/v1/batches":
            return self._create(body)
        m = re.fullmatch(r"/v1/batches/([\w-]+)(/cancel)?", path)
        if m:
            b = self.batches.get(m.group(1))
            if b is None:
                return 404, {}, self.error_body(404, "No such batch")
            if m.group(2) and method == "POST":
                if b["status"] not in _DONE:
                    b["status"] = "cancelled"
                return 200, {}, self._batch_obj(b)
            if method == "GET":
                self._advance(b)
                return 200, {}, self._batch_obj(b)
        return super().handle(method, path, headers, body, wrong_dims)

    def _create(self, req):
        fault = self.take_batch_fault()
        if fault == "unavailable":
            return 404, {}, self.error_body(404, "The Batch API is not available for this project")
        if req.get("completion_window") != self.window or req.get("endpoint") != "/v1/embeddings":
            return 400, {}, self.error_body(400, f"completion_window must be {self.window} and endpoint /v1/embeddings")
        if req.get("input_file_id") not in self.files:
            return 400, {}, self.error_body(400, "input file not found")
        if self.voyage and not (req.get("request_params") or {}).get("model"):
            return 400, {}, self.error_body(400, "request_params.model is required")
        bid = self.next_id("batch_")
        lines = [json.loads(x) for x in self.files[req["input_file_id"]].decode().splitlines() if x.strip()]
        self.batches[bid] = {
            "id": bid,
            "lines": lines,
            "req": req,
            "fault": fault,
            "polls": 0,
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "errors": None,
            "counts": None,
        }
        return 200, {}, self._batch_obj(self.batches[bid])

    def _advance(self, b: dict) -> None:
        if b["status"] in _DONE:
            return
        b["polls"] += 1
        if b["fault"] == "hold" and self.held or b["polls"] < self.polls_to_complete:
            b["status"] = "in_progress" if b["fault"] == "hold" else _STAGES[min(b["polls"], len(_STAGES) - 1)]
            return
        if b["fault"] == "fail":
            b["status"] = "failed"
            b["errors"] = {"object": "list", "data": [{"code": "server_error", "message": "The batch failed to process", "line": None}]}
            return
        ok, bad = [], []
        for i, line in enumerate(b["lines"]):
            if b["fault"] == "partial" and i % 3 == 0:
                bad.append(
                    {
                        "id": f"batch_req_{i}",
                        "custom_id": line["custom_id"],
                        "error": None,
                        "response": {"status_code": 500, "request_id": f"req_{i}", "body": self.error_body(500, "internal error embedding this input")},
                    }
                )
            elif b["fault"] == "expire" and i >= len(b["lines"]) // 2:
                bad.append(
                    {
                        "id": f"batch_req_{i}",
                        "custom_id": line["custom_id"],
                        "response": None,
                        "error": {"code": "batch_expired", "message": "This request could not be executed before the completion window expired."},
                    }
                )
            else:
                ok.append(self._line_ok(b, line, i))
        for kind, rows in (("output_file_id", ok), ("error_file_id", bad)):
            if rows:
                b[kind] = self.next_id("file-")
                self.files[b[kind]] = "".join(json.dumps(x) + "\n" for x in rows).encode()
        b["counts"] = {"total": len(b["lines"]), "completed": len(ok), "failed": len(bad)}
        b["status"] = "expired" if b["fault"] == "expire" else "completed"

    def _line_ok(self, b: dict, line: dict, i: int) -> dict:
        model, texts, dims = self._line_request(b, line)
        data = [{"object": "embedding", "index": j, "embedding": self.vector(t, dims)} for j, t in enumerate(texts)]
        n = sum(fake_tokens(t) for t in texts)
        return {
            "id": f"batch_req_{i}",
            "custom_id": line["custom_id"],
            "error": None,
            "response": {
                "status_code": 200,
                "request_id": f"req_{i}",
                "body": {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": n, "total_tokens": n}},
            },
        }

    def _batch_obj(self, b: dict) -> dict:
        counts = b["counts"] or {"total": len(b["lines"]), "completed": 0, "failed": 0}
        return {
            "id": b["id"],
            "object": "batch",
            "endpoint": "/v1/embeddings",
            "errors": b["errors"],
            "input_file_id": b["req"]["input_file_id"],
            "completion_window": b["req"]["completion_window"],
            "status": b["status"],
            "output_file_id": b["output_file_id"],
            "error_file_id": b["error_file_id"],
            "created_at": int(time.time()),
            "request_counts": counts,
            "metadata": b["req"].get("metadata"),
        }


class OpenAIBatchFake(_FilesAndBatches, OpenAIFake):
    """OpenAI live embeddings plus the Batch API."""

    def __init__(self, *, polls_to_complete: int = 3, **kwargs) -> None:
        super().__init__(**kwargs)
        self._init_batches(polls_to_complete)

    def _line_request(self, b, line):
        body = line["body"]
        if line.get("url") != "/v1/embeddings" or line.get("method") != "POST":
            raise ValueError("batch lines must POST /v1/embeddings")
        return body["model"], [body["input"]], body.get("dimensions") or OPENAI_DIMS.get(body["model"], self.dims)

    def live_texts(self) -> list[str]:
        out = []
        for r in self.embed_requests():
            if r.path.startswith("/v1/embeddings") and isinstance(r.body, dict):
                out += r.body["input"] if isinstance(r.body["input"], list) else [r.body["input"]]
        return out


class VoyageBatchFake(_FilesAndBatches, VoyageFake):
    """Voyage live embeddings plus its batch API (12 h window, ``request_params``)."""

    window = "12h"
    voyage = True

    def __init__(self, *, polls_to_complete: int = 3, **kwargs) -> None:
        super().__init__(**kwargs)
        self._init_batches(polls_to_complete)

    def _line_request(self, b, line):
        params = b["req"]["request_params"]
        if params.get("input_type") != "document":
            raise ValueError("batch input_type must be document")
        return params["model"], line["body"]["input"], params.get("output_dimension") or VOYAGE_DIMS.get(params["model"], self.dims)

    def live_texts(self) -> list[str]:
        return [t for r in self.embed_requests() if r.path.startswith("/v1/embeddings") and isinstance(r.body, dict) for t in r.body["input"]]


class GeminiBatchFake(BatchState, GeminiFake):
    """Gemini live embeddings plus ``asyncBatchEmbedContent`` batch jobs."""

    def __init__(self, *, polls_to_complete: int = 3, **kwargs) -> None:
        super().__init__(**kwargs)
        self._init_batches(polls_to_complete)

    def handle(self, method, path, headers, body, wrong_dims):
        path = path.split("?", 1)[0]
        m = re.fullmatch(r"/(v1\w*)/models/([\w.-]+):asyncBatchEmbedContent", path)
        if method == "POST" and m:
            fault = self.take_batch_fault()
            if fault == "unavailable":
                return 404, {}, self.error_body(404, "Batch API is not available for this model")
            reqs = body["batch"]["inputConfig"]["requests"]["requests"]
            if any(r["request"].get("taskType") != "RETRIEVAL_DOCUMENT" for r in reqs):
                return 400, {}, self.error_body(400, "taskType must be RETRIEVAL_DOCUMENT")
            name = f"batches/{self.next_id('gb')}"
            self.batches[name] = {
                "name": name,
                "model": m.group(2),
                "reqs": reqs,
                "fault": fault,
                "polls": 0,
                "state": "BATCH_STATE_PENDING",
                "output": None,
                "display": body["batch"].get("displayName", ""),
            }
            return 200, {}, self._job_obj(self.batches[name])
        m = re.fullmatch(r"/(v1\w*)/(batches/[\w-]+)(:cancel)?", path)
        if m:
            b = self.batches.get(m.group(2))
            if b is None:
                return 404, {}, self.error_body(404, "batch not found")
            if m.group(3) and method == "POST":
                if not b["state"].endswith(("SUCCEEDED", "FAILED", "EXPIRED", "CANCELLED")):
                    b["state"] = "BATCH_STATE_CANCELLED"
                return 200, {}, {}
            if method == "GET":
                self._advance(b)
                return 200, {}, self._job_obj(b)
        return super().handle(method, path, headers, body, wrong_dims)

    def _advance(self, b: dict) -> None:
        if b["state"].endswith(("SUCCEEDED", "FAILED", "EXPIRED", "CANCELLED")):
            return
        b["polls"] += 1
        if b["fault"] == "hold" and self.held or b["polls"] < self.polls_to_complete:
            b["state"] = "BATCH_STATE_RUNNING"
            return
        if b["fault"] in ("fail", "expire"):
            b["state"] = "BATCH_STATE_FAILED" if b["fault"] == "fail" else "BATCH_STATE_EXPIRED"
            return
        responses = []
        for i, r in enumerate(b["reqs"]):
            if b["fault"] == "partial" and i % 3 == 0:
                responses.append({"error": {"code": 13, "message": "internal error embedding this input"}})
                continue
            values, err = self._embed_one(b["model"], {**r["request"], "model": f"models/{b['model']}"}, False)
            text = " ".join(p.get("text", "") for p in r["request"]["content"]["parts"])
            responses.append(
                {"error": {"code": 3, "message": err}} if values is None else {"response": {"embedding": {"values": values}, "tokenCount": fake_tokens(text)}}
            )
        b["output"] = {"inlinedResponses": {"inlinedResponses": responses}}
        b["state"] = "BATCH_STATE_SUCCEEDED"

    @staticmethod
    def _job_obj(b: dict) -> dict:
        meta = {
            "@type": "type.googleapis.com/google.ai.generativelanguage.v1main.EmbedContentBatch",
            "model": f"models/{b['model']}",
            "displayName": b["display"],
            "state": b["state"],
            "createTime": "2026-11-30T02:00:00Z",
            "updateTime": "2026-11-30T02:00:01Z",
        }
        if b["output"] is not None:
            meta["output"] = b["output"]
        return {"name": b["name"], "metadata": meta}

    def live_texts(self) -> list[str]:
        out = []
        for r in self.embed_requests():
            if ":batchEmbedContents" in r.path or ":embedContent" in r.path:
                reqs = r.body.get("requests") if ":batch" in r.path else [r.body]
                out += [" ".join(p.get("text", "") for p in q["content"]["parts"]) for q in reqs]
        return out


__all__ = ["OpenAIBatchFake", "VoyageBatchFake", "GeminiBatchFake", "GEMINI_DIMS"]
