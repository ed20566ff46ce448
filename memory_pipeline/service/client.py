"""`memory search` through a running server, on a light path: the config file read for its
``data_dir`` only, the server file, one HTTP request (stdlib), the answer printed as the server
rendered it. No settings model, no search, model or table imports: a fresh process costs tens
of milliseconds instead of seconds.

Returns None whenever the server does not answer 200 (no server file, the process is gone, the
server was started from another config file, connection refused, timeout, an error, a query file
that cannot be read): the caller then searches in-process, with the CLI's own messages and exit
codes.
"""

from __future__ import annotations

import http.client
import json
import os
import urllib.parse
import uuid
from pathlib import Path

CONNECT_TIMEOUT = 0.5
READ_TIMEOUT = 60.0
_KEYS = ("max_results", "min_score", "mode", "fusion", "source", "path", "modality", "since", "until", "mmr", "mmr_lambda")


def config_and_data_dir(config: str | None) -> tuple[Path, Path] | None:
    """The config file (as `memory` finds it) and the local folder that holds the server file
    (``data_dir``; with an ``s3://`` data_dir, ``local_dir`` or its default), read as plain YAML."""
    import yaml

    from memory_pipeline.storage import check_url, default_local_dir, is_url

    path = Path(config or os.environ.get("MEMORY_PIPELINE_CONFIG") or "memory_pipeline.yaml").expanduser()
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    data_dir = raw.get("data_dir", "data/index") if isinstance(raw, dict) else None
    if not isinstance(data_dir, str):
        return None
    path = path.resolve()
    if "://" in os.path.expandvars(data_dir):
        try:
            url = check_url(os.path.expandvars(data_dir)) if is_url(os.path.expandvars(data_dir)) else None
        except ValueError:
            url = None
        if url is None:
            return None  # the full CLI says what is wrong with it
        local = raw.get("local_dir")
        if isinstance(local, str) and local:
            return path, (path.parent / Path(os.path.expandvars(local)).expanduser()).resolve()
        return path, default_local_dir(url)
    return path, (path.parent / Path(data_dir).expanduser()).resolve()


def remote_search(args, *, bold: bool = False) -> dict | None:
    """``{"query", "results", "text"}`` from the server for this config, or None.

    A query by ``--image`` / ``--audio`` uploads the files to ``/api/memory/search/files``
    (``query`` is then the text searched: the words and the files' derived text).
    """
    server = _server(getattr(args, "config", None))
    if server is None:
        return None
    url, headers = server
    options = {k: getattr(args, k) for k in _KEYS if getattr(args, k, None) not in (None, [])}
    options |= {"types": [t for group in (args.type or []) for t in group], "recency_half_life_days": args.recency_half_life,
                "render": "terminal" if bold else "plain"}  # fmt: skip
    options = {k: v for k, v in options.items() if v is not None}
    files = [(kind, path) for kind, path in (("image", getattr(args, "image", None)), ("audio", getattr(args, "audio", None))) if path]
    if files:
        options |= {"query": args.query or "", "retrieval_mode": getattr(args, "retrieval_mode", None) or "auto"}
        body = _multipart(files, json.dumps(options, default=str))
        if body is None:
            return None  # a file that cannot be read: the in-process search says why
        content_type, payload = body
        answer = _post(url, "/api/memory/search/files", payload, headers | {"Content-Type": content_type})
    else:
        payload = json.dumps(options | {"query": args.query}, default=str).encode()
        answer = _post(url, "/api/memory/search", payload, headers | {"Content-Type": "application/json"})
    try:
        return {"query": answer["query"], "results": answer["results"], "text": answer.get("text") or ""} if answer is not None else None
    except (KeyError, TypeError):
        return None


def _server(config: str | None) -> tuple[urllib.parse.SplitResult, dict[str, str]] | None:
    """The address of the server for this config and the headers it needs, or None."""
    from memory_pipeline.service import serverfile
    from memory_pipeline.service.auth import TOKEN_ENV

    found = config_and_data_dir(config)
    if found is None:
        return None
    config_path, data_dir = found
    record = serverfile.read(data_dir)
    if record is None or os.path.realpath(record.get("config") or "") != str(config_path):
        return None
    headers = {}
    if record.get("token_required"):
        token = os.environ.get(TOKEN_ENV)
        if not token:
            return None
        headers["Authorization"] = f"Bearer {token}"
    return urllib.parse.urlsplit(record["url"]), headers


def _multipart(files: list[tuple[str, str]], options: str) -> tuple[str, bytes] | None:
    """``(content type, body)`` of a multipart form: the files as parts named by their kind, and ``options``."""
    boundary = f"memory-{uuid.uuid4().hex}"
    out = bytearray()
    for kind, path in files:
        try:
            with open(os.path.expanduser(path), "rb") as fh:
                data = fh.read()
        except OSError:
            return None
        name = os.path.basename(path).replace('"', "_").replace("\r", "_").replace("\n", "_")
        out += f'--{boundary}\r\nContent-Disposition: form-data; name="{kind}"; filename="{name}"\r\n'.encode()
        out += b"Content-Type: application/octet-stream\r\n\r\n" + data + b"\r\n"
    out += f'--{boundary}\r\nContent-Disposition: form-data; name="options"\r\n\r\n'.encode() + options.encode() + b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return f"multipart/form-data; boundary={boundary}", bytes(out)


def _post(url: urllib.parse.SplitResult, route: str, payload: bytes, headers: dict[str, str]) -> dict | None:
    """The JSON answer of a 200, else None (refused, gone, timed out, an error status)."""
    if not url.hostname:
        return None
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=CONNECT_TIMEOUT)
    try:
        conn.connect()
        if conn.sock is not None:
            conn.sock.settimeout(READ_TIMEOUT)
        conn.request("POST", route, body=payload, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()
    if resp.status != 200:
        return None
    try:
        answer = json.loads(data)
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None
