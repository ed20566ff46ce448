"""The server's address, in a file in the data folder, so `memory search` finds a running server.

``<data_dir>/server.json`` holds the URL, the pid and whether a token is needed; it is written
by one rename when the server is listening and removed when it stops (only by the process that
wrote it). A stale file (the process is gone, or nothing answers) is ignored by readers.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from memory_pipeline.storage import DataStore

NAME = "server.json"


def path_for(data_dir: Path) -> Path:
    return DataStore(Path(data_dir)).server_file


def write(data_dir: Path, url: str, *, token_required: bool, config: str) -> Path:
    target = path_for(data_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{NAME}.{os.getpid()}.tmp")
    record = {"url": url, "pid": os.getpid(), "token_required": token_required, "config": config, "started_at": time.time()}
    tmp.write_text(json.dumps(record))
    os.replace(tmp, target)
    return target


def remove(data_dir: Path) -> None:
    """Remove the file if this process wrote it (a newer server's file is left alone)."""
    current = read(data_dir, check_alive=False)
    if current and current.get("pid") == os.getpid():
        path_for(data_dir).unlink(missing_ok=True)


def read(data_dir: Path, *, check_alive: bool = True) -> dict | None:
    try:
        record = json.loads(path_for(data_dir).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("url"), str) or not isinstance(record.get("pid"), int):
        return None
    if check_alive:
        try:
            os.kill(record["pid"], 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # another user's process: alive
    return record


def serving_elsewhere(data_dir: Path) -> bool:
    """A live server answers searches on this data folder, and this process is neither it nor its
    own index worker (a child of it): a writer whose new rows that server's searches would pay for
    until they are folded into the indices (see ``VectorStore.ensure_fts``)."""
    record = read(data_dir)
    return record is not None and record["pid"] not in (os.getpid(), os.getppid())
