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
