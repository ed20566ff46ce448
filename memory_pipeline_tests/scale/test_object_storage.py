"""The data folder on object storage (issue 16): ``data_dir: s3://bucket/prefix``.

A real S3-compatible server (moto's server mode, on 127.0.0.1) stands in for the cloud. Every
command runs as a new process, configured as a user would: the bucket in the YAML, the endpoint
and keys in the standard AWS variables only. The table it builds equals a local run's; the
shared part (table, assets, pointer, run records) is in the bucket, and only this machine's part
(cache, instance, locks, the analytics file) is on local disk.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memory_pipeline_tests.conftest import write_config
from memory_pipeline_tests.helpers import remote_table_rows, run_cli, table_rows
from memory_pipeline_tests.services import s3_server

pytestmark = [pytest.mark.slow]

NOTES = {
    "notes/2026-03-02.md": "# Standup\n\nThe ingest worker moved to the shared bucket; Priya owns the migration.\n",
    "notes/2026-03-03.md": "# Retro\n\nThe planning retreat is held at the lighthouse in Portmeirion.\n",
    "notes/2026-03-04.md": "# Budget\n\nThe embedding budget for March is 40 dollars; the cache keeps it low.\n",
    "sessions/2026-03-05.jsonl": '{"role": "user", "content": "Where do the nightly backups go?"}\n'
    '{"role": "assistant", "content": "To the cold-storage bucket, every night at three."}\n',
}


def _write(mem: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = mem / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def _objects(env: dict, bucket: str) -> dict[str, bytes]:
    import boto3

    s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=env["AWS_REGION"],
                      aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])  # fmt: skip
    out = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            out[obj["Key"]] = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
    return out


def _store_on(env: dict, monkeypatch, tmp_path: Path, prefix: str):
    """The storage layer of ``data_dir: s3://memory/<prefix>``, the server's variables set in this process."""
    from memory_pipeline import storage
    from memory_pipeline.settings import settings_from_dict

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    settings = settings_from_dict(
        {"data_dir": f"s3://memory/{prefix}", "local_dir": str(tmp_path / "local"), "sources": [{"name": "mem", "path": "mem"}]}, base_dir=tmp_path
    )
    return storage.of(settings)


def test_every_command_works_on_an_s3_data_dir_and_equals_a_local_run(tmp_path: Path):
    _write(tmp_path / "mem", NOTES)
    reference = write_config(tmp_path / "reference.yaml", data_dir="reference")
    assert run_cli("index", "--config", str(reference)).returncode == 0
    cfg = write_config(tmp_path / "memory_pipeline.yaml", data_dir="s3://memory/team/agents", local_dir="local")
    with s3_server("memory") as env:
        first = run_cli("index", "--config", str(cfg), "--json", env=env)
        assert first.returncode == 0, first.stderr
        summary = json.loads(first.stdout)
        assert summary["chunks_total"] >= len(NOTES) and summary["errors"] == []

        # The shared part is in the bucket, under the prefix; nothing of it on local disk.
        objects = _objects(env, "memory")
        keys = sorted(objects)
        assert all(k.startswith("team/agents/") for k in keys), keys[:5]
        for wanted in ("assets/source_files/", "assets/memory_chunks/", "assets/memory_vectors/", "lancedb/memory_vectors.lance/", "runs/history.jsonl.d/"):
            assert any(k.startswith(f"team/agents/{wanted}") for k in keys), (wanted, keys[:20])
        assert "team/agents/runs/last_run.json" in objects and "team/agents/generations.json" in objects
        local = tmp_path / "local"
        assert not (local / "assets").exists() and not (local / "lancedb").exists()
        assert (local / "cache" / "embeddings.sqlite").is_file() and (local / "analytics.duckdb").is_file()
        # The keys came from the environment and went nowhere.
        secret = env["AWS_SECRET_ACCESS_KEY"].encode()
        assert not [k for k, body in objects.items() if secret in body]
        assert not [p for p in local.rglob("*") if p.is_file() and secret in p.read_bytes()]

        # The same table as a local run of the same folder.
        ours = remote_table_rows("s3://memory/team/agents/lancedb", env)
        assert ours == table_rows(tmp_path / "reference")

        found = run_cli("search", "where is the planning retreat", "--config", str(cfg), "--json", env=env)
        assert found.returncode == 0, found.stderr
        hits = json.loads(found.stdout)["results"]
        assert hits and hits[0]["path"].endswith("notes/2026-03-03.md")
        fts = run_cli("search", '"cold-storage bucket"', "--mode", "fts", "--config", str(cfg), "--json", env=env)
        assert fts.returncode == 0 and json.loads(fts.stdout)["results"][0]["path"].endswith("sessions/2026-03-05.jsonl"), fts.stdout + fts.stderr

        status = run_cli("status", "--config", str(cfg), "--json", env=env)
        assert status.returncode == 0, status.stderr
        assert "s3://memory/team/agents" in status.stdout
        analytics = run_cli("analytics", "--config", str(cfg), "--sql", "SELECT sum(files_indexed), sum(files_indexable) FROM coverage", "--json", env=env)
        assert analytics.returncode == 0, analytics.stderr
        assert str(len(NOTES)) in analytics.stdout
        runs = run_cli("analytics", "--config", str(cfg), "--sql", "SELECT count(*) AS n FROM runs", "--json", env=env)
        assert runs.returncode == 0 and '"n": 1' in runs.stdout.replace(" ", " "), runs.stdout + runs.stderr
        scan = run_cli("scan", "--config", str(cfg), env=env)
        assert scan.returncode == 0 and "Found 4 text files" in scan.stdout, scan.stdout + scan.stderr
        # eval builds its own throw-away index; with this config it ranks as with a local one.
        corpus, queries, qrels = tmp_path / "corpus.jsonl", tmp_path / "queries.jsonl", tmp_path / "qrels.tsv"
        corpus.write_text(
            "".join(
                json.dumps({"_id": d, "title": "", "text": t}) + "\n" for d, t in [("A", "alpha alpha alpha"), ("B", "alpha beta zeta eta"), ("C", "gamma")]
            )
        )
        queries.write_text("".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in [("q1", "alpha"), ("q2", "gamma")]))
        qrels.write_text("query-id\tcorpus-id\tscore\nq1\tA\t1\nq2\tC\t1\n")
        scores = []
        for config in (cfg, reference):
            ev = run_cli(
                "eval", "--config", str(config), "--corpus", str(corpus), "--queries", str(queries), "--qrels", str(qrels), "--mode", "fts", "--json", env=env
            )
            assert ev.returncode == 0, ev.stderr
            scores.append(json.loads(ev.stdout)["modes"]["fts"]["ndcg@10"])
        assert scores[0] == scores[1] == 1.0

        # Nothing changed: nothing embedded. A change and a deletion reach the bucket's table.
        again = run_cli("index", "--config", str(cfg), "--json", env=env)
        assert again.returncode == 0 and json.loads(again.stdout)["chunks_embedded"] == 0, again.stdout + again.stderr
        (tmp_path / "mem" / "notes/2026-03-04.md").write_text("# Budget\n\nThe embedding budget moved to the ops team in April.\n")
        (tmp_path / "mem" / "notes/2026-03-02.md").unlink()
        changed = run_cli("index", "--config", str(cfg), "--json", env=env)
        assert changed.returncode == 0, changed.stderr
        paths = {r["path"] for r in remote_table_rows("s3://memory/team/agents/lancedb", env)}
        assert "notes/2026-03-02.md" not in paths and "notes/2026-03-04.md" in paths
        moved = run_cli("search", "ops team in April", "--mode", "fts", "--config", str(cfg), "--json", env=env)
        assert json.loads(moved.stdout)["results"][0]["path"].endswith("notes/2026-03-04.md")
        runs = run_cli("analytics", "--config", str(cfg), "--sql", "SELECT count(*) AS n FROM runs", "--json", env=env)
        assert '"n": 3' in runs.stdout, runs.stdout + runs.stderr

        # A plain-http endpoint without AWS_ALLOW_HTTP: one clear line, exit 1, no traceback.
        refused = run_cli("index", "--config", str(cfg), env={**env, "AWS_ALLOW_HTTP": ""})
        assert refused.returncode == 1
        assert "AWS_ALLOW_HTTP" in refused.stderr and "Traceback" not in refused.stderr


def test_shared_files_on_s3_concurrent_updates_damage_and_outages(tmp_path: Path, monkeypatch):
    """The storage layer against the S3 server, in process: concurrent read-modify-writes of a
    shared JSON file lose nothing (conditional PUTs), a damaged Parquet object is set aside and
    read as empty, and an unreachable store is an error, never an empty table."""
    import threading

    import pyarrow as pa

    from memory_pipeline import storage
    from memory_pipeline.models import MANIFEST_SCHEMA

    with s3_server("memory") as env:
        data = _store_on(env, monkeypatch, tmp_path, "unit")

        # 8 writers x 5 increments, at once: every increment lands.
        def bump() -> None:
            for _ in range(5):
                data.update_json("counter.json", lambda state: state.__setitem__("n", state["n"] + 1), lambda: {"n": 0})

        threads = [threading.Thread(target=bump) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert data.read_json("counter.json") == {"n": 40}
        # A change that changes nothing writes nothing (the object keeps its version).
        import boto3

        s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=env["AWS_REGION"])
        etag = s3.head_object(Bucket="memory", Key="unit/counter.json")["ETag"]
        assert data.update_json("counter.json", lambda state: state["n"], lambda: {"n": 0}) == 40
        assert s3.head_object(Bucket="memory", Key="unit/counter.json")["ETag"] == etag

        # Parquet partitions: written, listed, counted; a damaged one is set aside and read as empty.
        rows = pa.Table.from_pylist([], schema=MANIFEST_SCHEMA)
        data.write(rows, "source_files", "00")
        assert data.partition_files("source_files") == ["memory/unit/assets/source_files/00.parquet"]
        s3.put_object(Bucket="memory", Key="unit/assets/source_files/01.parquet", Body=b"not parquet at all")
        assert data.read("source_files", "01", MANIFEST_SCHEMA).num_rows == 0
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="memory", Prefix="unit/assets/source_files/")["Contents"]]
        assert "unit/assets/source_files/01.parquet" not in keys and any(".corrupt-" in k for k in keys)
        assert data.partition_files("source_files") == ["memory/unit/assets/source_files/00.parquet"]

        # Ledgers on object storage: one object per line, read back in order.
        for i in range(25):
            data.append_line(storage.HISTORY, json.dumps({"i": i}))
        assert [json.loads(line)["i"] for line in data.read_lines(storage.HISTORY)] == list(range(25))

    # The server is gone: reading is an error, not an empty partition (which a stage would write back).
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    storage._object_store.cache_clear()
    storage._boto_client.cache_clear()
    with pytest.raises(OSError):
        data.read("source_files", "00", MANIFEST_SCHEMA)


def test_a_partition_replaced_while_it_is_read_is_read_whole(tmp_path: Path, monkeypatch):
    """Another machine's run rewrites a partition while this one reads it (a backfill's runs read
    every shard's manifest for the coverage check): each read is one version, whole, and nothing
    is set aside. pyarrow's input stream (size first, then that many bytes) read 18 % of such
    reads as a mix of both versions, and the good new object was then moved aside as damaged: its
    shard's rows became orphans and three runs of a backfill failed their check in CI.
    Also: a read takes the schema's columns like a local read, and a damaged object reads empty."""
    import threading

    import pyarrow as pa

    from memory_pipeline import storage
    from memory_pipeline.models import CHUNKS_SCHEMA, MANIFEST_SCHEMA

    def manifest(n: int) -> pa.Table:
        rows = [{"doc_id": f"mem:notes/{i:05d}.md", "source": "mem", "path": f"notes/{i:05d}.md", "status": "ok"} for i in range(n)]
        return pa.Table.from_pylist(rows, schema=pa.schema([MANIFEST_SCHEMA.field(c) for c in ("doc_id", "source", "path", "status")]))

    with s3_server("memory") as env:
        data = _store_on(env, monkeypatch, tmp_path, "race")
        versions = [manifest(3), manifest(4000)]  # sizes far apart: a mixed read cannot parse
        data.write(versions[0], "source_files", "00")
        stop = threading.Event()

        def rewrite() -> None:
            i = 1
            while not stop.is_set():
                data.write(versions[i % 2], "source_files", "00")
                i += 1

        writer = threading.Thread(target=rewrite)
        writer.start()
        try:
            counts = [data.read("source_files", "00", MANIFEST_SCHEMA).num_rows for _ in range(300)]
        finally:
            stop.set()
            writer.join()
        assert set(counts) <= {3, 4000} and len(set(counts)) == 2, sorted(set(counts))
        import boto3

        s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=env["AWS_REGION"])
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="memory", Prefix="race/assets/source_files/")["Contents"]]
        assert keys == ["race/assets/source_files/00.parquet"]  # nothing set aside

        # The schema's columns the object has, the others filled; without a schema, all of them.
        chunks = pa.Table.from_pylist([{"chunk_id": f"c{i}", "tokens": i} for i in range(3)], schema=CHUNKS_SCHEMA)
        data.write(chunks, "memory_chunks", "04")
        narrow = pa.schema([CHUNKS_SCHEMA.field("chunk_id"), CHUNKS_SCHEMA.field("tokens"), pa.field("added_later", pa.string())])
        table = data.read("memory_chunks", "04", narrow)
        assert table.schema == narrow and table.column("tokens").to_pylist() == [0, 1, 2]
        assert table.column("added_later").to_pylist() == ["", "", ""]
        assert data.read("memory_chunks", "04", None).num_columns == len(CHUNKS_SCHEMA)
        # A damaged object (the same bytes on every read) is set aside and reads empty.
        s3.put_object(Bucket="memory", Key="race/assets/memory_chunks/04.parquet", Body=b"PAR1 torn write")
        assert data.read("memory_chunks", "04", narrow).num_rows == 0
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="memory", Prefix="race/assets/memory_chunks/")["Contents"]]
        assert keys and all(".corrupt-" in k for k in keys), keys
        # A damaged object that another writer replaces with a good one while it is being set aside
        # (after the version check, before the delete): the delete is conditional on the damaged
        # version, so the good one stays, and is what the read returns.
        s3.put_object(Bucket="memory", Key="race/assets/source_files/01.parquet", Body=b"PAR1 torn write")
        client: Any = storage._s3_client()  # a boto3 client: one method replaced below
        head = client.head_object

        def head_then_replace(**kwargs):
            got = head(**kwargs)
            data.write(versions[0], "source_files", "01")
            return got

        client.head_object = head_then_replace
        try:
            assert data.read("source_files", "01", MANIFEST_SCHEMA).num_rows == 3
        finally:
            del client.head_object  # the client's own method again
        assert data.read("source_files", "01", MANIFEST_SCHEMA).num_rows == 3
        # A client that cannot be made (a profile that does not exist) is an OSError, which the
        # callers turn into one line, never a botocore traceback.
        monkeypatch.setenv("AWS_PROFILE", "no-such-profile")
        with pytest.raises(OSError, match="cannot make an S3 client"):
            data.read_text("generations.json")
        monkeypatch.delenv("AWS_PROFILE")


def test_a_partition_in_pieces_on_s3_is_one_object_that_appears_whole(tmp_path: Path, monkeypatch):
    """A stage's pieces of a shard (``write_pieces``) on object storage: one object, a row group
    each, PUT once whole (a failure between pieces leaves the old object); read back a piece at a
    time from one GET, a one-piece object whole, a missing one empty."""
    import pyarrow as pa

    from memory_pipeline.models import CHUNKS_SCHEMA

    narrow = pa.schema([CHUNKS_SCHEMA.field("chunk_id"), CHUNKS_SCHEMA.field("text")])

    def piece(name: str, n: int) -> pa.Table:
        return pa.Table.from_pylist([{"chunk_id": f"{name}-{i}", "text": f"text {name} {i}"} for i in range(n)], schema=narrow)

    with s3_server("memory") as env:
        data = _store_on(env, monkeypatch, tmp_path, "pieces")
        data.write(piece("old", 2), "memory_chunks", "01")

        def failing():
            yield piece("new", 3)
            raise RuntimeError("the stage failed between two pieces")

        with pytest.raises(RuntimeError, match="between two pieces"):
            data.write_pieces(failing(), "memory_chunks", "01")
        assert data.read("memory_chunks", "01", narrow).column("chunk_id").to_pylist() == ["old-0", "old-1"]

        location, rows = data.write_pieces(iter([piece("a", 3), piece("b", 0), piece("c", 2)]), "memory_chunks", "01")
        assert location == "s3://memory/pieces/assets/memory_chunks/01.parquet" and rows == 5
        got = [t.column("chunk_id").to_pylist() for t in data.read_pieces("memory_chunks", "01", narrow)]
        assert got == [["a-0", "a-1", "a-2"], ["c-0", "c-1"]]
        assert data.read("memory_chunks", "01", narrow).num_rows == 5
        assert data.row_groups("memory_chunks", "01") is None  # not counted remotely: a reader that lines pieces up reads whole
        data.write_pieces(iter([piece("one", 4)]), "memory_chunks", "02")
        assert [t.num_rows for t in data.read_pieces("memory_chunks", "02", narrow)] == [4]
        assert [t.num_rows for t in data.read_pieces("memory_chunks", "03", narrow)] == [0]
        assert sorted(k.rsplit("/", 1)[-1] for k in _objects(env, "memory") if "/memory_chunks/" in k) == ["01.parquet", "02.parquet"]


def test_any_bytes_in_a_partition_object_read_as_a_table_or_set_aside(tmp_path: Path, monkeypatch):
    """Hostile bytes where a partition object should be (arbitrary bytes, a valid file cut short or
    with a byte flipped): the read returns the table or an empty one, and an object that did not
    parse is set aside; it never raises and never leaves the bad object in place."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from memory_pipeline import storage
    from memory_pipeline.models import MANIFEST_SCHEMA

    rows = pa.Table.from_pylist([{"doc_id": f"mem:n/{i}.md", "source": "mem", "path": f"n/{i}.md", "status": "ok"} for i in range(20)])
    buf = io.BytesIO()
    pq.write_table(rows, buf)
    valid = buf.getvalue()
    hostile = st.one_of(
        st.binary(max_size=2048),
        st.integers(0, len(valid) - 1).map(lambda n: valid[:n]),
        st.tuples(st.integers(0, len(valid) - 1), st.integers(1, 255)).map(lambda t: valid[: t[0]] + bytes([valid[t[0]] ^ t[1]]) + valid[t[0] + 1 :]),
    )
    with s3_server("memory") as env:
        data = _store_on(env, monkeypatch, tmp_path, "fuzz")
        import boto3

        s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=env["AWS_REGION"])
        key = "fuzz/assets/source_files/00.parquet"

        @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
        @given(body=hostile)
        def read(body: bytes) -> None:
            s3.put_object(Bucket="memory", Key=key, Body=body)
            table = data.read("source_files", "00", MANIFEST_SCHEMA)
            assert table.schema == MANIFEST_SCHEMA
            left = [o["Key"] for o in s3.list_objects_v2(Bucket="memory", Prefix="fuzz/assets/source_files/").get("Contents", [])]
            try:  # what a local read of the same bytes makes of them
                readable = storage.conform(storage._read_columns(pa.BufferReader(body), MANIFEST_SCHEMA), MANIFEST_SCHEMA)
            except Exception:  # noqa: BLE001 - any failure to parse is "damaged"
                readable = None
            if readable is None:
                assert table.num_rows == 0 and key not in left and any(".corrupt-" in k for k in left)
            else:
                assert table.equals(readable) and key in left  # whole enough to read: kept
            for k in left:
                s3.delete_object(Bucket="memory", Key=k)

        read()


def test_a_missing_bucket_is_one_clear_error_for_every_command(tmp_path: Path):
    _write(tmp_path / "mem", {"notes/a.md": "# A\n\nhello object storage\n"})
    cfg = write_config(tmp_path / "memory_pipeline.yaml", data_dir="s3://no-such-bucket/agents", local_dir="local")
    with s3_server("memory") as env:
        for args in (["index"], ["search", "hello"], ["status"], ["doctor"]):
            proc = run_cli(*args, "--config", str(cfg), env=env)
            assert proc.returncode == 1, (args, proc.stdout, proc.stderr)
            err = proc.stderr.strip()
            assert "the bucket no-such-bucket does not exist" in err and "create the bucket" in err, (args, err)
            assert "Traceback" not in err and "a bug" not in err and len(err.splitlines()) == 1, (args, err)


def _count(proc) -> int:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [row] = json.loads(proc.stdout)["rows"]
    return int(next(iter(row.values())))


def test_analytics_on_another_machine_reads_the_buckets_state_and_store_faults_are_one_line(tmp_path: Path):
    """Each machine's analytics database is its own (under its ``local_dir``), the bucket is everyone's:
    `memory analytics` answers from the bucket as it is now, on a machine that never indexed and
    after another machine's run, and a store it cannot reach is an error, not an old answer. A store
    without credentials, or gone mid-run, is one line that names the cause, never "a bug", and an
    endpoint's password is never printed."""
    import os
    import socket

    _write(tmp_path / "mem", NOTES)
    here = write_config(tmp_path / "here.yaml", data_dir="s3://memory/team", local_dir="local_here")
    there = write_config(tmp_path / "there.yaml", data_dir="s3://memory/team", local_dir="local_there")
    files_sql = ["--sql", "SELECT sum(files_indexed) AS n FROM coverage", "--json"]
    runs_sql = ["--sql", "SELECT count(*) AS n FROM runs", "--json"]
    with s3_server("memory") as env:
        assert run_cli("index", "--config", str(here), env=env).returncode == 0
        # A machine that never indexed: its analytics is built from the bucket (it told the user to
        # run `memory index`, which found nothing to do and built nothing).
        assert not (tmp_path / "local_there" / "analytics.duckdb").exists()
        assert _count(run_cli("analytics", "--config", str(there), *files_sql, env=env)) == len(NOTES)
        # That machine indexes a new note; the first machine's analytics sees it and that run.
        _write(tmp_path / "mem", {"notes/2026-03-06.md": "# Wombats\n\nThe wombat conference is in Hobart.\n"})
        assert run_cli("index", "--config", str(there), env=env).returncode == 0
        assert _count(run_cli("analytics", "--config", str(here), *files_sql, env=env)) == len(NOTES) + 1
        assert _count(run_cli("analytics", "--config", str(here), *runs_sql, env=env)) == 2

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            dead = f"http://127.0.0.1:{sock.getsockname()[1]}"  # nothing listens there
        faults = {
            "store down": ({**env, "AWS_ENDPOINT_URL": dead}, "cannot reach the bucket memory"),
            "password in the endpoint": ({**env, "AWS_ENDPOINT_URL": dead.replace("//", "//admin:hunter2@")}, "cannot reach the bucket memory"),
        }
        for what, (fault_env, said) in faults.items():
            for args in (["analytics", *files_sql], ["status"], ["index"]):
                proc = run_cli(*args, "--config", str(here), env=fault_env)
                err = proc.stderr.strip()
                # `--json` prints its one failure object (the same line as stderr's, never the password).
                out = json.loads(proc.stdout) if "--json" in args else None
                assert proc.returncode == 1 and (proc.stdout.strip() == "" if out is None else out["ok"] is False), (what, args, proc.stdout, err)
                assert "hunter2" not in proc.stdout
                assert said in err and "Traceback" not in err and "a bug" not in err and len(err.splitlines()) == 1, (what, args, err)
                assert "hunter2" not in err, (what, args, err)

        # No credentials anywhere (no keys, no profile files): the bucket check may pass (moto lets an
        # anonymous request list it), the first signed read cannot.
        bare = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        bare |= {k: v for k, v in env.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
        bare |= {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_CONFIG_FILE": str(tmp_path / "none"), "HF_HUB_OFFLINE": "1"}
        for args in (["index"], ["index", "--json"], ["status"], ["analytics"]):
            proc = run_cli(*args, "--config", str(here), env=bare, inherit_env=False)
            err = proc.stderr.strip()
            out = json.loads(proc.stdout) if args[-1] == "--json" else None
            assert proc.returncode == 1, (args, proc.stdout, err)
            text = out["error"] if out else err
            assert "credentials" in text.lower() and "unexpected error" not in text and "a bug" not in text, (args, text)
            assert "Traceback" not in err, (args, err)


def test_ledgers_on_object_storage_are_compacted_without_losing_or_repeating_a_line(tmp_path: Path, monkeypatch):
    """Writers merge loose line objects into segments (and segments into one) while others append
    and read: every read is in order, holds no line twice and every line appended before it began."""
    import threading

    import boto3

    from memory_pipeline import storage
    from memory_pipeline.settings import settings_from_dict

    monkeypatch.setattr(storage, "LEDGER_COMPACT_AT", 5)
    with s3_server("memory") as env:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        storage._object_store.cache_clear()
        settings = settings_from_dict(
            {"data_dir": "s3://memory/ledger", "local_dir": str(tmp_path / "local"), "sources": [{"name": "mem", "path": "mem"}]}, base_dir=tmp_path
        )
        data = storage.of(settings)
        s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name=env["AWS_REGION"])
        lock = threading.Lock()
        appended: list[str] = []
        problems: list[str] = []
        stop = threading.Event()

        def writer(w: int) -> None:
            for i in range(25):
                line = json.dumps({"w": w, "i": i})
                data.append_line(storage.HISTORY, line)
                with lock:
                    appended.append(line)

        def reader() -> None:
            while not stop.is_set():
                with lock:
                    before = set(appended)
                lines = data.read_lines(storage.HISTORY)
                if len(lines) != len(set(lines)):
                    problems.append(f"a line read twice ({len(lines)} lines, {len(set(lines))} distinct)")
                if missing := before - set(lines):
                    problems.append(f"{len(missing)} lines appended before the read are missing")
                per_writer: dict[int, list[int]] = {}
                for line in lines:
                    row = json.loads(line)
                    per_writer.setdefault(row["w"], []).append(row["i"])
                if any(seq != sorted(seq) for seq in per_writer.values()):
                    problems.append("a writer's lines out of order")

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
        readers = [threading.Thread(target=reader) for _ in range(2)]
        for t in [*threads, *readers]:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        for t in readers:
            t.join()
        assert problems == [], problems[:5]
        final = data.read_lines(storage.HISTORY)
        assert sorted(final) == sorted(appended) and len(final) == 75
        keys = [
            o["Key"]
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket="memory", Prefix="ledger/runs/history.jsonl.d/")
            for o in page.get("Contents", [])
            if not o["Key"].endswith("/")
        ]
        # 75 lines in far fewer objects: fewer than 5 loose lines and a few segments are left.
        assert len(keys) < 15, len(keys)
        assert any(k.endswith(".seg.jsonl") for k in keys)
        # The stamp (what analytics compares to know a ledger changed) counts the objects.
        stamp = data.ledger_stamp(storage.HISTORY)
        assert stamp.startswith(f"{storage.HISTORY} {len(keys)} "), (stamp, keys)


def test_a_bucket_that_refuses_deletes_stops_merging_its_ledgers(tmp_path: Path, monkeypatch):
    """Without s3:DeleteObject a merge cannot remove what it merged: the first refusal leaves a
    marker, later appends merge nothing more, and every line still reads once, in order."""
    from memory_pipeline import storage
    from memory_pipeline.settings import settings_from_dict

    monkeypatch.setattr(storage, "LEDGER_COMPACT_AT", 4)
    real = storage.object_store

    class NoDeletes:
        def __init__(self, fs) -> None:
            self._fs = fs

        def delete_file(self, path: str) -> None:
            raise PermissionError(f"AWS Error ACCESS_DENIED during DeleteObject operation: {path}")

        def __getattr__(self, name: str):
            return getattr(self._fs, name)

    with s3_server("memory") as env:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        storage._object_store.cache_clear()
        monkeypatch.setattr(storage, "object_store", lambda: NoDeletes(real()))
        settings = settings_from_dict(
            {"data_dir": "s3://memory/nodelete", "local_dir": str(tmp_path / "local"), "sources": [{"name": "mem", "path": "mem"}]}, base_dir=tmp_path
        )
        data = storage.of(settings)
        for i in range(20):
            data.append_line(storage.USAGE, json.dumps({"i": i}))
        assert [json.loads(line)["i"] for line in data.read_lines(storage.USAGE)] == list(range(20))
        from pyarrow import fs as pafs

        names = [i.base_name for i in real().get_file_info(pafs.FileSelector("memory/nodelete/runs/embedding_usage.jsonl.d"))]
        assert "no-compaction" in names
        assert sum(n.endswith(".seg.jsonl") for n in names) == 1  # one merge tried, none after the refusal
        assert sum(n.endswith(".json") for n in names) == 20


def test_a_missing_bucket_or_profile_fails_a_step_at_once_and_an_outage_retries_it(monkeypatch):
    """Trying again cannot mend a bucket that does not exist, a denied request or a profile that
    does not exist, so a step that retries transient store errors (2 s each) fails at once on
    them, also when another error wraps them; a store that does not answer is retried."""
    import dagster as dg

    from memory_pipeline import storage
    from memory_pipeline.defs.assets import _reported
    from memory_pipeline.errors import ObjectStoreError, StoreError
    from memory_pipeline.stages.report import RunResults

    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with s3_server("memory") as env:
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        assert storage.get_object("memory/nothing-here") is None
        with pytest.raises(ObjectStoreError) as missing:
            storage.get_object("no-such-bucket/assets/source_files/01.parquet")
        monkeypatch.setenv("AWS_PROFILE", "no-such-profile")
        with pytest.raises(ObjectStoreError) as no_profile:
            storage.get_object("memory/nothing-here")
        monkeypatch.delenv("AWS_PROFILE")
    with pytest.raises(ObjectStoreError) as down:  # the server is gone: connection refused
        storage.get_object("memory/nothing-here")
    assert missing.value.permanent and "NoSuchBucket" in str(missing.value), str(missing.value)
    assert no_profile.value.permanent and "no-such-profile" in str(no_profile.value), str(no_profile.value)
    assert not down.value.permanent, str(down.value)
    # Wrapped, as the generation pointer's reader and the table wrap them, and as pyarrow's and
    # LanceDB's clients word a denial (their messages, verbatim in form).
    wrapped = []
    for cause in (
        missing.value,
        down.value,
        OSError("When getting information for bucket 'memory': AWS Error ACCESS_DENIED during HeadBucket operation: No response body."),
        OSError("When reading information for key 'a' in bucket 'memory': AWS Error NETWORK_CONNECTION during HeadObject operation: curlCode: 7"),
        OSError("Generic S3 error: Error performing put request: Client error with status 403 Forbidden: <Code>AccessDenied</Code>"),
        OSError("Generic S3 error: Error performing put request: Server error with status 503 Service Unavailable: SlowDown"),
    ):
        try:
            raise StoreError("cannot read the generation pointer s3://memory/team/generations.json") from cause
        except StoreError as err:
            wrapped.append(err)
    cases = [(missing.value, False), (no_profile.value, False), (down.value, True)]
    cases += [(wrapped[0], False), (wrapped[1], True), (wrapped[2], False), (wrapped[3], True), (wrapped[4], False), (wrapped[5], True)]
    for err, retried in cases:
        results = RunResults()
        with pytest.raises(dg.RetryRequested if retried else StoreError), _reported(results, retry_transient=True):
            raise err
        assert results.error is err


def test_a_damaged_object_the_store_refuses_to_move_is_read_as_empty_and_said_to_stay(tmp_path: Path, monkeypatch, caplog):
    """A bucket that refuses the copy (no s3:PutObject on the aside key, say): the damaged
    partition still reads as empty, so its work is made again, and the warning says it was left
    where it is; it said "moved aside" when nothing had moved."""
    import logging

    from botocore.exceptions import ClientError

    from memory_pipeline import storage
    from memory_pipeline.models import MANIFEST_SCHEMA

    with s3_server("memory") as env:
        data = _store_on(env, monkeypatch, tmp_path, "stuck")
        client = storage._s3_client()
        key = "stuck/assets/source_files/00.parquet"
        client.put_object(Bucket="memory", Key=key, Body=b"not parquet")

        def refused(**kwargs):
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "Access Denied"}}, "CopyObject")

        client.copy_object = refused
        try:
            with caplog.at_level(logging.WARNING, logger="memory_pipeline"):
                table = data.read("source_files", "00", MANIFEST_SCHEMA)
        finally:
            del client.copy_object  # the client's own method again
        assert table.num_rows == 0 and table.schema == MANIFEST_SCHEMA
        said = " ".join(r.getMessage() for r in caplog.records)
        assert "could not set aside" in said and "left where it is" in said and "moved aside" not in said, said
        assert client.get_object(Bucket="memory", Key=key)["Body"].read() == b"not parquet"  # still there
