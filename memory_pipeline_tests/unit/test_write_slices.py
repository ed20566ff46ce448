"""The write stage builds and commits a shard's rows a slice of whole files at a time.

A shard holds a sixteenth of the folder, so building its rows at once made the run's memory grow
with the folder (at 1M chunks, ~900 -> ~1,580 MB at each shard's write). Slices bound it: at most
``SLICE_FILES`` files and ``SLICE_ROWS`` rows (one file alone may have more: a file's rows are
never split between commits, so a search sees a file's old rows or its new ones, never a mix).
"""

from __future__ import annotations

from collections import Counter

import lancedb
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from memory_pipeline.stages import write as write_mod
from memory_pipeline.stages.write import doc_slices
from memory_pipeline_tests.helpers import table_rows
from memory_pipeline_tests.unit.test_stages import _run, memory  # noqa: F401 - the fixture

files = st.lists(st.tuples(st.sampled_from("abcdefghij"), st.integers(0, 6)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(rows=files, extra=st.lists(st.sampled_from("abcdefghijklm"), max_size=8), max_files=st.integers(1, 5), max_rows=st.integers(1, 12))
def test_slices_cover_every_file_once_never_split_one_and_hold_their_bounds(rows, extra, max_files, max_rows):
    """Any chunk table (a file's rows anywhere in it) and any files asked for, rows or not."""
    chunks = pa.table({"doc_id": [d for d, _ in rows], "n": list(range(len(rows)))})
    asked = [d for d, _ in rows] + extra
    slices = list(doc_slices(chunks, asked, max_files=max_files, max_rows=max_rows))
    assert [d for docs, _ in slices for d in docs] == sorted(set(asked))
    for docs, part in slices:
        assert 1 <= len(docs) <= max_files
        # Each file's rows, all of them, in the table's order.
        assert part.column("n").to_pylist() == [i for i, (d, _) in enumerate(rows) if d in docs]
        if len(docs) > 1:
            assert part.num_rows <= max_rows
    assert list(doc_slices(chunks, [], max_files=max_files, max_rows=max_rows)) == []


def test_a_sliced_write_holds_the_same_table_and_builds_no_more_than_a_slice_at_once(memory, monkeypatch):  # noqa: F811
    """Slices of one file: the same rows as the table written by one slice per shard, each row
    built once, no build larger than a slice; a change, a delete and a forced run too."""
    mem, settings, embedder, ident = memory
    for i in range(6):
        (mem / "notes" / f"n{i}.md").write_text(f"# Note {i}\n\n" + "\n\n".join(f"Part {j} of note {i} about the garden." for j in range(4)) + "\n")
    _run(settings, embedder, ident)
    whole = sorted(table_rows(settings.data_dir, columns=("chunk_id", "path", "text", "content_hash")), key=lambda r: r["chunk_id"])
    shards = {r["path"]: r["shard"] for r in table_rows(settings.data_dir, columns=("path", "shard"))}
    assert max(Counter(shards.values()).values()) >= 2  # a shard with several files: one build per shard would show

    built: list[int] = []
    real = write_mod.table_rows
    monkeypatch.setattr(write_mod, "table_rows", lambda chunks, *a, **k: built.append(chunks.num_rows) or real(chunks, *a, **k))
    monkeypatch.setattr(write_mod, "doc_slices", lambda c, d, **k: doc_slices(c, d, max_files=1, max_rows=1))
    table = lancedb.connect(settings.lancedb_uri).open_table("memory_vectors")
    first_new = int(table.version) + 1
    forced = _run(settings, embedder, ident, force=True)
    # A forced run built in one-file slices still replaces a shard in two commits back to back:
    # no version in between holds part of a shard (only the moment between delete and add, none).
    full = Counter(shards.values())
    per_file_rows = Counter(r["path"] for r in whole)
    full_rows = {s: sum(per_file_rows[p] for p, sh in shards.items() if sh == s) for s in full}
    table.checkout_latest()
    for version in range(first_new, int(table.version) + 1):
        table.checkout(version)
        held = Counter(table.to_arrow().column("shard").to_pylist())
        assert all(held.get(s, 0) in (0, n) for s, n in full_rows.items()), (version, held)
    assert sorted(table_rows(settings.data_dir, columns=("chunk_id", "path", "text", "content_hash")), key=lambda r: r["chunk_id"]) == whole
    per_file = {}
    for r in whole:
        per_file[r["path"]] = per_file.get(r["path"], 0) + 1
    assert sorted(n for n in built if n) == sorted(per_file.values())  # one file per build, each once
    assert forced.write.rows_written == len(whole) and forced.write.table_rows == len(whole)

    built.clear()
    (mem / "notes" / "n0.md").write_text("# Note 0\n\nRewritten: the garden is now a pond.\n")
    (mem / "notes" / "n1.md").unlink()
    run = _run(settings, embedder, ident)
    assert run.write.files_replaced == 1 and run.write.files_deleted == 1
    assert max(built) == 1  # the changed file's one chunk; the deleted file's commit builds no rows
    rows = table_rows(settings.data_dir, columns=("chunk_id", "path", "text", "content_hash"))
    assert {r["path"] for r in rows} == {r["path"] for r in whole} - {"notes/n1.md"}
    n0 = [r["text"] for r in rows if r["path"] == "notes/n0.md"]
    assert len(n0) == 1 and "pond" in n0[0] and not any("Part 0 of note 0" in t for t in n0)


def test_each_row_names_its_file_on_disk(memory):  # noqa: F811
    """``original_file_path`` is the source's root joined with the file's path, nested folders
    included, as pathlib would join them (the stage joins strings, see ``table_rows``)."""
    mem, settings, embedder, ident = memory
    nested = mem / "notes" / "2026" / "12" / "day one.md"
    nested.parent.mkdir(parents=True)
    nested.write_text("# Day one\n\nA walk by the river.\n")
    (mem / "notes" / "top.md").write_text("# Top\n\nA note at the top.\n")
    _run(settings, embedder, ident)
    roots = {s.name: s.path for s in settings.sources}
    rows = table_rows(settings.data_dir, columns=("source", "path", "original_file_path"))
    assert {r["path"] for r in rows} >= {"notes/2026/12/day one.md", "notes/top.md"}
    for r in rows:
        assert r["original_file_path"] == str(roots[r["source"]] / r["path"])
    assert str(nested) in {r["original_file_path"] for r in rows}
