"""Document-level full-text scoring on a real index (issue 13): a document is ranked by BM25 over its
whole text (one document row per file), results point at the best chunk and its lines, and a table
written before the document column existed still searches and is upgraded by the next index run."""

from __future__ import annotations

from pathlib import Path

import pytest

from memory_pipeline import storage
from memory_pipeline.runner import run_index
from memory_pipeline.search import MemorySearcher, search
from memory_pipeline.settings import load_settings
from memory_pipeline.stores import generations
from memory_pipeline.stores.lance import DOC_FTS_COLUMN, VectorStore
from memory_pipeline_tests.conftest import write_config

pytestmark = pytest.mark.slow

FILLER = "Row {i} of the appendix lists inventory shelf {i} and its bin labels."


def _long_note() -> str:
    # Three query words, chunks apart; two of them share one line near the end (the best chunk).
    lines = ["# Warehouse", "", "The zebra forklift is parked at dock four."]
    lines += [FILLER.format(i=i) for i in range(60)]
    lines += ["The quokka crate came in on Tuesday."]
    lines += [FILLER.format(i=i) for i in range(60, 120)]
    lines += ["Walrus tape seals every quokka pallet at dock nine."]
    lines += [FILLER.format(i=i) for i in range(120, 140)]
    return "\n".join(lines) + "\n"


def _index(root: Path):
    mem = root / "mem"
    mem.mkdir(parents=True)
    (mem / "long.md").write_text(_long_note())
    (mem / "short.md").write_text("# Zoo\n\nA zebra visited; the zebra left.\n")
    for i, topic in enumerate(("coffee machine descaling", "printer toner order", "quarterly budget review")):
        (mem / f"other{i}.md").write_text(f"# Note {i}\n\nAbout the {topic}.\n")
    settings = load_settings(write_config(root / "memory_pipeline.yaml", provider="none", chunking={"tokens": 64, "overlap": 16}))
    run_index(settings)
    return settings


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    return _index(tmp_path_factory.mktemp("doc-level"))


def _table(settings):
    table = VectorStore(storage.of(settings).lancedb_uri, generations.current(settings)[0]).open()
    assert table is not None
    return table


def _check_ranking(settings) -> None:
    results = search("zebra quokka walrus", settings=settings, mode="fts", min_score=0.0)
    assert list(dict.fromkeys(Path(r.path).name for r in results)) == ["long.md", "short.md"]
    top = results[0]
    # The long note's best chunk: the line holding two of the three words, with its own lines.
    assert "walrus" in top.snippet.lower() and "quokka" in top.snippet.lower()
    line = _long_note().splitlines().index("Walrus tape seals every quokka pallet at dock nine.") + 1
    assert top.line_start <= line <= top.line_end
    assert top.line_end - top.line_start < 40  # a chunk, not the whole file


def test_the_long_file_ranks_by_its_whole_text_and_points_at_its_best_chunk(indexed):
    searcher = MemorySearcher(indexed)
    _, rows, docs = searcher._table_layout()
    assert docs == 5 and rows > 5  # one document text per file, the long file in many chunks
    table = _table(indexed)
    assert table.count_rows(f"{DOC_FTS_COLUMN} != ''") == 5
    assert {i.name for i in table.list_indices()} >= {"search_text_idx", f"{DOC_FTS_COLUMN}_idx"}
    _check_ranking(indexed)


def test_document_text_counts_the_chunk_overlap_once(indexed):
    table = _table(indexed)
    (text,) = table.search().where(f"path = 'long.md' AND {DOC_FTS_COLUMN} != ''").select([DOC_FTS_COLUMN]).to_arrow().column(DOC_FTS_COLUMN).to_pylist()
    assert text.count("Walrus tape seals") == 1 and text.count(FILLER.format(i=7)) == 1
    assert text.rstrip().endswith("long")  # the file name is searchable on the document row too


def test_a_table_written_before_the_document_column_searches_and_is_upgraded(tmp_path):
    settings = _index(tmp_path)
    table = _table(settings)
    table.drop_index(f"{DOC_FTS_COLUMN}_idx")
    table.drop_columns([DOC_FTS_COLUMN])
    assert DOC_FTS_COLUMN not in table.schema.names
    # Old layout: scored per chunk, no error, the same answer.
    assert MemorySearcher(settings)._table_layout()[2] == 0
    _check_ranking(settings)
    for query in ('"zebra forklift"', "zebr*", "zebra -walrus", "zebra OR walrus"):
        assert isinstance(search(query, settings=settings, mode="fts", min_score=0.0), list)
    # The next index run that writes adds the column and fills it from the table's own chunks
    # (so does the nightly maintenance, ``VectorStore.maintain``).
    (tmp_path / "mem" / "other2.md").write_text("# Note 2\n\nAbout the yearly budget review.\n")
    run_index(settings)
    table = _table(settings)
    assert table.count_rows(f"{DOC_FTS_COLUMN} != ''") == 5
    assert MemorySearcher(settings)._table_layout()[2] == 5
    _check_ranking(settings)


def test_syntax_keeps_working_at_document_level(indexed):
    def names(query: str) -> list[str]:
        return list(dict.fromkeys(Path(r.path).name for r in search(query, settings=indexed, mode="fts", min_score=0.0)))

    assert names('"zebra forklift"') == ["long.md"]
    assert set(names("zebra -walrus")) == {"long.md", "short.md"}  # long.md's chunks without walrus still answer
    assert set(names("zebra OR descaling")) == {"long.md", "short.md", "other0.md"}
    assert names("quokka AND walrus") == ["long.md"]  # required clauses hold in the chunk shown
    assert set(names("zebr*")) == {"long.md", "short.md"}


def test_an_index_run_with_nothing_changed_upgrades_an_old_table(tmp_path):
    """A table without document texts is not "settled": the next `memory index`, even with no file
    changed, runs the write stage, which fills them in place (no file is embedded again); a table
    whose upgrade was cut short (a first chunk row still without one) is finished the same way."""
    settings = _index(tmp_path)
    assert run_index(settings)["skipped_run"] is True
    table = _table(settings)
    table.drop_index(f"{DOC_FTS_COLUMN}_idx")
    table.drop_columns([DOC_FTS_COLUMN])
    summary = run_index(settings)
    assert summary["skipped_run"] is False and summary["errors"] == []
    assert _table(settings).count_rows(f"{DOC_FTS_COLUMN} != ''") == 5
    assert MemorySearcher(settings)._table_layout()[2] == 5
    _check_ranking(settings)
    assert run_index(settings)["skipped_run"] is True  # settled again
    # Half-way through an upgrade: one file's document text missing.
    _table(settings).update(where="path = 'long.md' AND chunk_index = 0", values={DOC_FTS_COLUMN: None})
    assert MemorySearcher(settings)._table_layout()[2] == 0  # scored per chunk meanwhile
    assert run_index(settings)["skipped_run"] is False
    assert _table(settings).count_rows(f"{DOC_FTS_COLUMN} != ''") == 5
    _check_ranking(settings)


def test_a_word_asked_again_costs_no_query_until_the_table_changes(tmp_path, monkeypatch):
    """A long-lived searcher keeps each word's best whole-document score (``TermWeights``): the
    same query again sends no per-word query and ranks the same; after a commit the weights are
    measured again on the new version (a table too large for ``TextIndex``, which needs no query at all)."""
    import memory_pipeline.search.fulltext as fulltext
    import memory_pipeline.search.searcher as searcher_mod

    monkeypatch.setattr(searcher_mod, "TEXT_INDEX_MAX_ROWS", 0)

    settings = _index(tmp_path)
    searcher = MemorySearcher(settings)
    per_word: list[str] = []
    real = fulltext.fts_batch

    def counting(table, queries):
        # the per-word best-score queries are the leg's only limit-1 queries
        per_word.extend(str(getattr(q.query, "terms", q.query)) for q in queries if q.limit == 1)
        return real(table, queries)

    monkeypatch.setattr(fulltext, "fts_batch", counting)
    opts = searcher.options(mode="fts", min_score=0.0)
    first = [(r.path, r.score) for r in searcher.search("zebra quokka walrus", opts)]
    assert len(per_word) == 3
    again = [(r.path, r.score) for r in searcher.search("walrus zebra quokka", opts)]
    assert len(per_word) == 3 and again == first  # no query, the same answer
    searcher.search("zebra budget", opts)
    assert len(per_word) == 4  # only the new word
    # A new table version: every weight is measured again, and the answer follows the new rows.
    (settings.sources[0].path / "zebra.md").write_text("# Zebra\n\nzebra zebra zebra quokka walrus\n")
    run_index(settings)
    searcher.table.checkout_latest()
    after = [r.path for r in searcher.search("zebra quokka walrus", opts)]
    assert len(per_word) == 7 and Path(after[0]).name == "zebra.md"
