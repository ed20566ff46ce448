"""The `memory` command as a user runs it: outputs, JSON shapes, exit codes, messages."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from memory_pipeline_tests.conftest import SAMPLE, TEXT_ONLY, write_config
from memory_pipeline_tests.helpers import run_cli, run_json

pytestmark = pytest.mark.slow
INDEX_KEYS = {
    "files_seen", "files_changed", "files_deleted", "chunks_total", "chunks_embedded",
    "chunks_cached", "rows_written", "rows_deleted", "errors",
}  # fmt: skip


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    shutil.copytree(SAMPLE, root / "mem", ignore=TEXT_ONLY)
    cfg = write_config(root / "memory_pipeline.yaml")
    proc = run_cli("index", "--config", str(cfg))
    assert proc.returncode == 0, proc.stderr
    return root, cfg, proc


def test_index_prints_summary_and_progress(indexed):
    _, _, proc = indexed
    assert "Indexed 17 files: 17 changed" in proc.stdout
    assert "embed:" in proc.stderr and "chunks" in proc.stderr and "ETA" in proc.stderr


def test_index_json_shape(indexed):
    _, cfg, _ = indexed
    out = run_json("index", "--config", str(cfg), "--json")
    assert INDEX_KEYS <= set(out)
    assert out["files_seen"] == 17 and out["files_changed"] == 0 and out["errors"] == []


def test_quiet_index_prints_nothing(indexed):
    _, cfg, _ = indexed
    proc = run_cli("index", "--config", str(cfg), "--quiet")
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == ""


def test_search_json_for_agents(indexed):
    _, cfg, _ = indexed
    out = run_json("search", "Stripe callbacks failing because a certificate lapsed", "--config", str(cfg), "--json")
    first = out["results"][0]
    assert {"path", "source", "locator", "score", "snippet", "modality", "mime_type"} <= set(first)
    assert first["path"].endswith("memory/2026-10-06.md") and first["locator"].startswith("L")
    assert 0 < first["score"] <= 1 and first["mime_type"] == "text/markdown"


def test_search_session_locator_names_jsonl_lines(indexed):
    _, cfg, _ = indexed
    out = run_json("search", "readiness probe failed: HTTP probe failed with statuscode: 503", "--config", str(cfg), "--json")
    first = out["results"][0]
    assert first["path"].endswith("2026-10-14-deploy-help.jsonl") and first["modality"] == "session"
    assert first["locator"].startswith("jsonl:")
    lines = Path(first["path"]).read_text().splitlines()
    start, end = (int(x) for x in first["locator"].split(":")[1].split("-"))
    window = "\n".join(lines[start - 1 : end])
    assert "readiness probe failed" in window


def test_search_text_output_and_max_results(indexed):
    _, cfg, _ = indexed
    proc = run_cli("search", "sourdough starter", "--config", str(cfg), "--max-results", "2")
    assert proc.returncode == 0
    assert "— Text Results —" in proc.stdout and "2026-10-11.md:L" in proc.stdout
    assert "3. " not in proc.stdout


def test_search_abstains(indexed):
    _, cfg, _ = indexed
    out = run_json("search", "what is the capital of australia", "--config", str(cfg), "--json")
    assert out["results"] == []
    proc = run_cli("search", "what is the capital of australia", "--config", str(cfg))
    assert "No relevant memories" in proc.stdout


def test_status_reports_provider_table_sources_cache_last_run(indexed):
    _, cfg, _ = indexed
    out = run_json("status", "--config", str(cfg), "--json")
    assert out["provider"] == "local" and out["model"] == "all-MiniLM-L6-v2" and out["dims"] == 384
    assert out["table"]["rows"] > 0 and out["table"]["dims"] == 384
    assert out["sources"]["mem"]["indexed_files"] == 17
    assert out["cache"]["entries"] >= out["table"]["rows"] - 5
    assert out["last_run"]["files_seen"] == 17
    assert out["data_dir"] == str((cfg.parent / "index").resolve()) and "local_dir" not in out
    human = run_cli("status", "--config", str(cfg))
    assert "provider: local / all-MiniLM-L6-v2" in human.stdout and f"data:     {(cfg.parent / 'index').resolve()}" in human.stdout


def test_scan_verbose_lists_files(indexed):
    _, cfg, _ = indexed
    proc = run_cli("scan", "--config", str(cfg), "--verbose")
    assert proc.returncode == 0
    assert "text/markdown" in proc.stdout and "application/x-ndjson" in proc.stdout
    assert proc.stdout.rstrip().endswith("Found 17 text files, 0 media files")


def test_config_from_environment_variable(indexed):
    root, cfg, _ = indexed
    out = run_json("status", "--json", env={"MEMORY_PIPELINE_CONFIG": str(cfg)}, cwd=root.parent)
    assert out["config"] == str(cfg)


@pytest.mark.parametrize(
    "content, fragment",
    [
        ("sources: []\n", "'sources' must be a non-empty list"),
        ("sources:\n  - {name: m, path: mem}\nchunking: {tokens: 10}\n", "chunking.tokens"),
        ("sources:\n  - {name: m, path: mem}\nprovider: openai\napi_key: sk-abc123abc123abc123\n", "secret"),
        ("sources:\n  - {name: m, path: mem}\nbogus: 1\n", "unknown setting 'bogus'"),
        ("sources:\n  - {name: m, path: mem}\nlocal: {runtime: torch, quantize: int8}\n", "int8 needs local.runtime onnx or openvino"),
        ("sources:\n  - {name: m, path: mem}\nlocal: {runtime: tensorrt}\n", "local.runtime"),
        ("sources: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_config_exits_1_with_one_line(tmp_path: Path, content: str, fragment: str):
    cfg = tmp_path / "memory_pipeline.yaml"
    cfg.write_text(content)
    proc = run_cli("index", "--config", str(cfg))
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("[ERROR]") and fragment in lines[0], proc.stderr
    assert "sk-abc123" not in proc.stderr


def test_missing_config_exits_1(tmp_path: Path):
    proc = run_cli("status", cwd=tmp_path)
    assert proc.returncode == 1 and "config file not found" in proc.stderr and "MEMORY_PIPELINE_CONFIG" in proc.stderr


def test_usage_error_exits_2():
    assert run_cli("index", "--no-such-flag").returncode == 2


def test_model_change_builds_a_new_generation(tmp_path: Path):
    shutil.copytree(SAMPLE / "memory", tmp_path / "mem")
    cfg = write_config(tmp_path / "memory_pipeline.yaml", provider="none")
    assert run_json("index", "--config", str(cfg), "--json")["mode"] == "fts-only"
    write_config(cfg, provider="local")
    out = run_json("index", "--config", str(cfg), "--json")
    assert out["dims"] == 384 and out["table_rows"] > 0
    assert out["generation"] == "switched" and out["table"] == "memory_vectors__g2"
    hits = run_json("search", "sourdough starter feeding", "--config", str(cfg), "--json", "--mode", "vector")
    assert hits["results"]


def test_a_run_after_a_rollback_builds_the_whole_generation(tmp_path: Path):
    """Roll back from a new model's generation, change one note, and index with that model again: the
    records said every file was indexed for it (in the generation rolled back from), so the new
    generation was complete after the one changed file and became current with one file of 14."""
    shutil.copytree(SAMPLE / "memory", tmp_path / "mem")
    # Two identities that chunk alike (the int8 model and the fp32 one): the table of either holds
    # the same rows per file, so the check of the rows could not tell the records were of another table.
    cfg = write_config(tmp_path / "memory_pipeline.yaml", provider="local")
    run_json("index", "--config", str(cfg), "--json")
    write_config(cfg, provider="local", local={"quantize": "none"})
    first = run_json("index", "--config", str(cfg), "--json")
    assert first["generation"] == "switched"
    back = run_cli("generations", "rollback", "--config", str(cfg))
    assert back.returncode == 0, back.stderr
    # The records are of the generation rolled back from: no verdict on the table against them.
    assert "mismatch" not in run_json("status", "--config", str(cfg), "--json")["table"]
    assert run_cli("doctor", "--config", str(cfg)).returncode == 0
    note = next((tmp_path / "mem").glob("2026-*.md"))
    note.write_text(note.read_text() + "\nOne more line about the sourdough starter.\n")
    again = run_json("index", "--config", str(cfg), "--json")
    assert again["generation"] == "switched" and again["table_rows"] == first["table_rows"], again
    assert again["table"] not in ("memory_vectors", "memory_vectors__g2"), again  # a new generation, whole
    hits = run_json("search", "sourdough starter feeding", "--config", str(cfg), "--json", "--mode", "vector")["results"]
    assert hits


def test_analytics_summary_and_sql(indexed):
    _, cfg, _ = indexed
    out = run_json("analytics", "--config", str(cfg), "--json")
    by_modality = {r["modality"]: r for r in out["coverage"]}
    assert by_modality["markdown"]["files_indexed"] == 14 and by_modality["session"]["files_indexed"] == 3
    assert all(r["coverage"] == 1.0 for r in out["coverage"])
    rows = run_json("analytics", "--config", str(cfg), "--json", "--sql", "SELECT count(*) AS n FROM vector_rows")["rows"]
    assert rows[0]["n"] > 40
    human = run_cli("analytics", "--config", str(cfg))
    assert human.returncode == 0 and "coverage" in human.stdout and "no problems" in human.stdout
    bad = run_cli("analytics", "--config", str(cfg), "--sql", "SELECT nope FROM nowhere")
    assert bad.returncode == 1 and bad.stderr.startswith("[ERROR] query failed")


def test_blocking_check_failure_exits_1_and_force_repairs(tmp_path: Path):
    import lancedb

    shutil.copytree(SAMPLE / "memory", tmp_path / "mem")
    cfg = write_config(tmp_path / "memory_pipeline.yaml")
    run_json("index", "--config", str(cfg), "--json")
    table = lancedb.connect(str(tmp_path / "index" / "lancedb")).open_table("memory_vectors")
    row = {k: v for k, v in table.search().limit(1).to_list()[0].items() if not k.startswith("_")}
    table.add([row])  # a duplicated chunk id
    note = tmp_path / "mem" / "2026-10-11.md"
    note.write_text(note.read_text() + "\nOne more line.\n")
    proc = run_cli("index", "--config", str(cfg), "--quiet")
    assert proc.returncode == 1 and "index_coverage_no_duplicates_check" in proc.stderr
    fixed = run_json("index", "--config", str(cfg), "--json", "--force")
    assert fixed["coverage"] == 1.0 and fixed["chunks_embedded"] <= 2
    fresh = lancedb.connect(str(tmp_path / "index" / "lancedb")).open_table("memory_vectors")
    assert fresh.count_rows() == fixed["table_rows"]
    ids = fresh.search().select(["chunk_id"]).limit(fresh.count_rows()).to_arrow().column("chunk_id").to_pylist()
    assert len(ids) == len(set(ids))
