"""`memory store` never copies an outside file in through a link, never writes through a link
out of the source folder, and leaves nothing behind when the file cannot be indexed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memory_pipeline_tests.conftest import write_config
from memory_pipeline_tests.helpers import run_cli

pytestmark = pytest.mark.slow


@pytest.fixture
def memory(tmp_path: Path) -> tuple[Path, Path, Path]:
    mem = tmp_path / "mem"
    mem.mkdir()
    (mem / "a.md").write_text("# a\nalpha bravo\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text("# outside\nthe outside marker zebra-quasar-1729\n")
    return tmp_path, mem, write_config(tmp_path / "memory_pipeline.yaml")


def _refused(proc, fragment: str) -> None:
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stderr.startswith("[ERROR]") and fragment in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout


def test_an_in_root_link_to_an_outside_file_is_refused(memory):
    tmp, mem, cfg = memory
    os.symlink(tmp / "outside" / "secret.md", mem / "link.md")
    _refused(run_cli("store", "--config", str(cfg), "--file", str(mem / "link.md")), "leads outside the source folder")
    assert not (mem / "media").exists()
    assert not any("zebra-quasar" in p.read_text() for p in mem.rglob("*.md") if p.is_file() and not p.is_symlink())


def test_a_media_folder_that_links_outside_is_never_written(memory):
    tmp, mem, cfg = memory
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, mem / "media")
    photo = tmp / "receipt.md"
    photo.write_text("# receipt\nAcme Corp 12.50\n")
    _refused(run_cli("store", "--config", str(cfg), "--file", str(photo)), "leads outside the source folder")
    assert list(elsewhere.iterdir()) == []


def test_a_failed_store_leaves_no_copy_behind(memory):
    tmp, mem, cfg = memory
    bad = tmp / "latin1.md"
    bad.write_bytes("# Caf\xe9\nna\xefve\n".encode("latin-1"))
    proc = run_cli("store", "--config", str(cfg), "--file", str(bad), "--note", "a note about it")
    _refused(proc, "could not be indexed")
    assert not (mem / "media" / "latin1.md").exists()
    assert not (mem / "media" / "latin1.md.note.md").exists()
