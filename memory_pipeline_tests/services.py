"""Real services for the scale-out tests, started here on 127.0.0.1 and stopped after.

- PostgreSQL 15 from Debian's ``postgresql`` package (``make`` installs it when missing): a
  throw-away cluster in a temporary folder, trust authentication on 127.0.0.1 only. PostgreSQL
  refuses to run as root, so as root the cluster belongs to the ``postgres`` user the package made.
- Redis 7 from Debian's ``redis-server``: no persistence, 127.0.0.1 only.
- An S3-compatible object store: moto's server mode (the ``moto[server]`` package), in memory,
  127.0.0.1 only, with one bucket made; it stands in for cloud object storage.

Each is a context manager yielding its URL; the process is stopped and its files removed after.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from memory_pipeline_tests.helpers import free_port


def _wait_for_port(port: int, proc: subprocess.Popen, what: str, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} in {timeout}s:\n{log.read_text()[-2000:]}")


def _stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def postgres_bin(name: str) -> str:
    """A PostgreSQL server program: on PATH, else Debian's versioned folder."""
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None)
    if found is None:
        raise RuntimeError(f"PostgreSQL's {name} is not installed (make installs Debian's postgresql: make system-packages)")
    return found


@contextlib.contextmanager
def postgres_server(db: str = "dagster", user: str = "dagster") -> Iterator[dict]:
    """A fresh PostgreSQL cluster on a free 127.0.0.1 port; yields {host, port, user, db, url}."""
    root = Path(tempfile.mkdtemp(prefix="memory-pg-"))
    data, log = root / "data", root / "postgres.log"
    as_root = os.geteuid() == 0
    runas: list[str] = ["runuser", "-u", "postgres", "--"] if as_root else []
    if as_root:
        shutil.chown(root, "postgres", "postgres")
    port = free_port()
    proc = None
    try:
        subprocess.run([*runas, postgres_bin("initdb"), "-D", str(data), "-A", "trust", "-U", user, "--no-sync"], check=True, capture_output=True, timeout=120)
        with log.open("w") as out:
            if as_root:
                shutil.chown(log, "postgres", "postgres")
            proc = subprocess.Popen(
                [*runas, postgres_bin("postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(port), "-k", str(root), "-c", "fsync=off", "-c", "max_connections=200"],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        _wait_for_port(port, proc, "postgres", log)
        deadline = time.monotonic() + 60
        while True:
            made = subprocess.run(
                [*runas, postgres_bin("createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", user, db], capture_output=True, text=True, timeout=60
            )
            if made.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"createdb failed: {made.stderr}")
            time.sleep(0.5)  # accepting connections before it accepts logins
        yield {"host": "127.0.0.1", "port": port, "user": user, "db": db, "url": f"postgresql://{user}@127.0.0.1:{port}/{db}"}
    finally:
        if proc is not None:
            # pg_ctl as the cluster's owner: a signal to runuser would not reach the server.
            subprocess.run([*runas, postgres_bin("pg_ctl"), "-D", str(data), "stop", "-m", "immediate", "-w"], capture_output=True, timeout=60)
            _stop(proc)
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def redis_server() -> Iterator[str]:
    """A Redis server without persistence on a free 127.0.0.1 port; yields its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (make installs Debian's redis-server: make system-packages)")
    root = Path(tempfile.mkdtemp(prefix="memory-redis-"))
    log = root / "redis.log"
    port = free_port()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(root)],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        _wait_for_port(port, proc, "redis-server", log)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        _stop(proc)
        shutil.rmtree(root, ignore_errors=True)


# Test-only credentials for the local object store (moto accepts any); never real ones.
S3_TEST_KEYS = {"AWS_ACCESS_KEY_ID": "memorytest", "AWS_SECRET_ACCESS_KEY": "memorytest-secret"}


@contextlib.contextmanager
def s3_server(bucket: str = "memory") -> Iterator[dict[str, str]]:
    """moto's S3 server on a free 127.0.0.1 port with ``bucket`` made; yields the AWS environment
    variables that point the AWS SDKs (and so this project) at it."""
    import sys

    root = Path(tempfile.mkdtemp(prefix="memory-s3-"))
    log = root / "moto.log"
    port = free_port()
    moto = Path(sys.executable).parent / "moto_server"
    with log.open("w") as out:
        proc = subprocess.Popen([str(moto), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    env = {
        **S3_TEST_KEYS,
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    try:
        _wait_for_port(port, proc, "moto_server", log)
        import boto3

        client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                              aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])  # fmt: skip
        client.create_bucket(Bucket=bucket)
        yield env
    finally:
        _stop(proc)
        shutil.rmtree(root, ignore_errors=True)
