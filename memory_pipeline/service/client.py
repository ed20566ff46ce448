"""`memory search` through a running server, on a light path: the config file read for its
``data_dir`` only, the server file, one HTTP request (stdlib), the answer printed as the server
rendered it. No settings model, no search, model or table imports: a fresh process costs tens
of milliseconds instead of seconds.

Returns None whenever the server does not answer 200 (no server file, the process is gone, the
server was started from another config file, connection refused, timeout, an error): the caller
then searches in-process, with the CLI's own messages.
"""

from __future__ import annotations

import http.client
import json
import os
import urllib.parse
from pathlib import Path

CONNECT_TIMEOUT = 0.5
READ_TIMEOUT = 60.0
_KEYS = ("max_results", "min_score", "mode", "fusion", "source", "path", "modality", "since", "until", "mmr", "mmr_lambda")


def config_and_data_dir(config: str | None) -> tuple[Path, Path] | None:
    """The config file (as `memory` finds it) and its ``data_dir``, read as plain YAML."""
    import yaml

    path = Path(config or os.environ.get("MEMORY_PIPELINE_CONFIG") or "memory_pipeline.yaml").expanduser()
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    data_dir = raw.get("data_dir", "data/index") if isinstance(raw, dict) else None
    if not isinstance(data_dir, str) or "://" in data_dir:
        return None
    path = path.resolve()
    return path, (path.parent / Path(data_dir).expanduser()).resolve()


def remote_search(args, *, bold: bool = False) -> dict | None:
    """``{"results": [...], "text": rendered}`` from the server for this config, or None."""
    from memory_pipeline.service import serverfile
    from memory_pipeline.service.auth import TOKEN_ENV

    found = config_and_data_dir(getattr(args, "config", None))
    if found is None:
        return None
    config, data_dir = found
    record = serverfile.read(data_dir)
    if record is None or os.path.realpath(record.get("config") or "") != str(config):
        return None
    body = {k: getattr(args, k) for k in _KEYS if getattr(args, k, None) not in (None, [])}
    body |= {"query": args.query, "types": [t for group in (args.type or []) for t in group], "recency_half_life_days": args.recency_half_life,
             "render": "terminal" if bold else "plain"}  # fmt: skip
    headers = {"Content-Type": "application/json"}
    if record.get("token_required"):
        token = os.environ.get(TOKEN_ENV)
        if not token:
            return None
        headers["Authorization"] = f"Bearer {token}"
    url = urllib.parse.urlsplit(record["url"])
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=CONNECT_TIMEOUT)
    try:
        conn.connect()
        conn.sock.settimeout(READ_TIMEOUT)
        payload = {k: v for k, v in body.items() if v is not None}
        conn.request("POST", "/api/memory/search", body=json.dumps(payload, default=str).encode(), headers=headers)
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
        return {"results": answer["results"], "text": answer.get("text") or ""}
    except (ValueError, KeyError, TypeError):
        return None
