"""Helpers shared by the Dagster and end-to-end tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lancedb
import pyarrow as pa

REPO = Path(__file__).resolve().parents[1]

# One line each, one topic each: the search tests' small memories (a query finds its topic).
SEARCH_TOPICS = [
    "the espresso machine needs descaling every month",
    "Priya moved the billing retry policy to exponential backoff",
    "the warehouse dashboard shows stale inventory counts",
    "Kenji profiled the queue consumer and found a slow regex",
    "we rolled back the TLS certificate rotation on the edge proxies",
    "the quarterly budget review moved to Thursday afternoon",
    "Marco fixed the flaky login test by waiting for the redirect",
    "the backup job now runs the schema migration check first",
    "alert rules for disk usage on the analytics cluster were tightened",
    "the team offsite will be held at the lake house in June",
]


def table_rows(data_dir: Path, columns=("chunk_id", "path", "text", "content_hash")) -> list[dict]:
    db = lancedb.connect(str(data_dir / "lancedb"))
    if "memory_vectors" not in db.list_tables().tables:
        return []
    table = db.open_table("memory_vectors").to_arrow().select(list(columns))
    return sorted(table.to_pylist(), key=lambda r: tuple(str(r[c]) for c in columns if c != "vector"))


def remote_table_rows(uri: str, env: dict, columns=("chunk_id", "path", "text", "content_hash")) -> list[dict]:
    """:func:`table_rows` of a table on object storage, reached with the AWS variables in ``env``."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        table = lancedb.connect(uri).open_table("memory_vectors").to_arrow().select(list(columns))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return sorted(table.to_pylist(), key=lambda r: tuple(str(r[c]) for c in columns if c != "vector"))


def _drop_file_read_override() -> None:  # pragma: no cover - runs in the child
    """Drop root's CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH so file permissions apply to it."""
    from memory_pipeline_tests.zygote import _drop_file_read_override as drop

    drop()


def memory_instance():
    """A Dagster instance in memory, for in-process runs that no other process reads.

    ``dg.instance_for_test()`` keeps the event log in SQLite files and opens an engine and
    commits a transaction per event: about two thirds of an in-process run of the sample (5.7 s
    against 2.6 s in memory, measured on this machine). Runs, events, asset and check records
    and sensor cursors behave the same; tests that need the files (another process reading the
    instance, a daemon) keep a real one.
    """
    import dagster as dg

    return dg.DagsterInstance.ephemeral()


def run_cli(
    *args: str,
    env: dict | None = None,
    cwd: Path | None = None,
    honor_permissions: bool = False,
    timeout: int = 600,
    kill_at: str | None = None,
    embed_slice: int | None = None,
    fresh: bool = False,
    inherit_env: bool = True,
):
    """Run `memory ...` as a new process; returns CompletedProcess.

    The process is forked from the tests' fork server (``zygote.py``: the heavy third-party
    imports done once) unless ``fresh`` asks for a new interpreter (a test about start-up) or
    ``env`` changes a variable read at import time; either way it is a process of its own with
    the given environment, directory, argv, output and exit status.
    ``honor_permissions``: when running as root, make the child subject to file
    permissions (so a chmod 000 file is really unreadable to it).
    ``kill_at``: the run kills itself with SIGKILL at this point (``stages.hooks.POINTS``),
    with vectors checkpointed every ``embed_slice`` chunks (see fault_cli.py).
    ``inherit_env=False``: ``env`` is the whole environment, not additions to this one's.
    """
    base = {**os.environ, "HF_HUB_OFFLINE": "1", "DAGSTER_DISABLE_TELEMETRY": "1"} if inherit_env else {}
    full_env = {**base, **(env or {})}
    module, argv = "memory_pipeline.cli", list(args)
    if kill_at is not None:
        module, argv = "memory_pipeline_tests.fault_cli", ["--kill-at", kill_at]
        if embed_slice is not None:
            argv += ["--embed-slice", str(embed_slice)]
        argv += ["--", *args]
    workdir = str(cwd or REPO)
    drop_privilege = honor_permissions and os.geteuid() == 0
    # Dropping root's file-read override works through the capability bounding set, which takes
    # effect at exec: a forked child without exec keeps it, so those calls get a new interpreter.
    if not fresh and not drop_privilege and _ZYGOTE.accepts(full_env):
        try:
            return _ZYGOTE.run(module, argv, full_env, workdir, timeout)
        except ConnectionError:
            _ZYGOTE.broken = True  # the server is gone: new interpreters from here on
    kwargs = {}
    if drop_privilege:
        kwargs["preexec_fn"] = _drop_file_read_override
    return subprocess.run(
        [sys.executable, "-m", module, *argv],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=workdir,
        timeout=timeout,
        **kwargs,
    )


class _ForkServer:
    """The client of ``zygote.py``, started on first use in each test process, stopped at exit."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.path = ""
        self.env: dict[str, str] = {}
        self.baseline: dict[str, str] | None = None
        self.broken = False

    def accepts(self, env: dict) -> bool:
        if self.broken or os.environ.get("MEMORY_TESTS_NO_FORK_SERVER"):
            return False
        if self.proc is None:
            self._start()
            if self.broken:
                return False
        from memory_pipeline_tests.zygote import IMPORT_TIME_PREFIXES

        # PYTHONPATH is set on sys.path by the child itself (zygote._set_python_path).
        keys = {k for k in {*env, *self.env} if k.startswith(IMPORT_TIME_PREFIXES) and k != "PYTHONPATH"}
        return all(env.get(k) == self.env.get(k) for k in keys)

    def start_env(self) -> dict[str, str]:
        """The environment of the session, not of the test that happens to start the server: a
        variable that test patched would otherwise differ from every later test's."""
        base = os.environ if self.baseline is None else self.baseline
        return {**base, "HF_HUB_OFFLINE": "1", "DAGSTER_DISABLE_TELEMETRY": "1"}

    def _start(self) -> None:
        import atexit
        import tempfile

        folder = tempfile.mkdtemp(prefix="memory-zygote-")
        self.path = os.path.join(folder, "socket")
        self.env = self.start_env()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "memory_pipeline_tests.zygote", self.path],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            env=self.env,
            cwd=str(REPO),
            text=True,
        )
        atexit.register(self._stop, folder)
        ready = self.proc.stdout.readline() if self.proc.stdout else ""
        if ready.strip() != "ready":
            self.broken = True

    def _stop(self, folder: str) -> None:
        import shutil

        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(folder, ignore_errors=True)

    def run(self, module: str, argv: list[str], env: dict, cwd: str, timeout: float):
        import socket
        import tempfile

        request = json.dumps({"module": module, "argv": argv, "env": env, "cwd": cwd})
        command = [sys.executable, "-m", module, *argv]
        with (
            open(os.devnull, "rb") as stdin,
            tempfile.TemporaryFile() as out,
            tempfile.TemporaryFile() as err,
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn,
        ):
            try:
                conn.connect(self.path)
            except OSError as err:
                raise ConnectionError(str(err)) from err
            socket.send_fds(conn, [request.encode() + b"\n"], [stdin.fileno(), out.fileno(), err.fileno()])
            reader = conn.makefile("r")
            pid = int(reader.readline())
            conn.settimeout(timeout)
            try:
                line = reader.readline()
            except TimeoutError:
                _kill(pid)
                raise subprocess.TimeoutExpired(command, timeout) from None
            if not line.strip():
                raise ConnectionError("the fork server went away")
            returncode = int(line)
            out.seek(0)
            err.seek(0)
            stdout, stderr = _text(out.read()), _text(err.read())
        return subprocess.CompletedProcess(command, returncode, stdout, stderr)


def _text(data: bytes) -> str:
    """Output decoded as ``subprocess.run(..., text=True)`` decodes it (universal newlines)."""
    import locale

    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


def _kill(pid: int) -> None:
    import signal

    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


_ZYGOTE = _ForkServer()


def run_json(*args: str, **kwargs) -> dict:
    proc = run_cli(*args, **kwargs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def default_sigint() -> None:  # pragma: no cover - runs in the child
    """A ``preexec_fn`` for servers that stop by passing SIGINT on to their children (dagster dev):
    a test run started in the background inherits SIGINT ignored, and they would outlive SIGTERM."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop_group(proc: subprocess.Popen, timeout: float = 60) -> None:
    """Stop a server started with ``start_new_session=True``: SIGTERM to its process group, then
    SIGKILL when it is not gone within ``timeout`` seconds."""
    import signal

    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def graphql(port: int, query: str) -> dict:
    """One query against the Dagster webserver's GraphQL endpoint on 127.0.0.1."""
    import urllib.request

    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


LOGGERS = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}


def materialize(config: Path, instance, **kwargs):
    """Every asset in-process, for the config at ``config``."""
    import dagster as dg

    from memory_pipeline.defs.assets import index_assets
    from memory_pipeline.defs.resources import index_resources

    return dg.materialize(
        index_assets,
        instance=instance,
        resources=index_resources(str(config)),
        run_config=LOGGERS,
        **kwargs,
    )


def partition_metadata(result, asset: str) -> dict[str | None, dict]:
    """The metadata values of each of ``asset``'s materializations in ``result``, by partition."""
    out: dict[str | None, dict] = {}
    for event in result.get_asset_materialization_events():
        mat = event.event_specific_data.materialization
        if mat.asset_key.to_user_string() == asset:
            out[mat.partition] = {k: getattr(v, "value", v) for k, v in mat.metadata.items()}
    if not out:
        raise AssertionError(f"{asset} not materialized")
    return out


def per_partition_keys(asset: str) -> set[str]:
    """The metadata keys whose values are a partition's own numbers (the run's are their sum)."""
    from memory_pipeline import stages
    from memory_pipeline.stages.shards import additive

    counts = {
        "source_files": stages.DiscoverCounts(),
        "extracted_content": stages.ExtractCounts(),
        "memory_chunks": stages.ChunkCounts(),
        "memory_vectors": stages.WriteStats(),
    }
    keys = {"dagster/partition_row_count"}
    if asset in counts:
        keys |= set(additive(counts[asset]))
    if asset == "chunk_embeddings":
        keys |= {"chunks", "unique", "cached", "embedded", "tokens_total"}
    return keys - {"table_rows"}


def asset_metadata(result, asset: str) -> dict:
    """The metadata of ``asset`` for the whole run: a partition's own numbers summed over the run's
    partitions (:func:`per_partition_keys`), every other value as the first materialization has it."""
    parts = list(partition_metadata(result, asset).values())
    meta = dict(parts[0])
    if len(parts) > 1:
        summed = per_partition_keys(asset) & set(meta)
        for key in summed:
            meta[key] = sum(p[key] for p in parts)
        # The run's numbers, named as the run's on each partition (``defs.assets.run_level``).
        for key in [k for k in meta if k.startswith("run_")]:
            if key.removeprefix("run_") not in summed:
                meta[key.removeprefix("run_")] = meta[key]
    return meta


def empty_column(dtype: pa.DataType, n: int) -> list:
    """``n`` empty values of ``dtype`` for a test row's columns that do not matter: "" for strings,
    0 for integers, 0.0 for floats, null for anything else."""
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return [""] * n
    if pa.types.is_integer(dtype):
        return [0] * n
    if pa.types.is_floating(dtype):
        return [0.0] * n
    return [None] * n
