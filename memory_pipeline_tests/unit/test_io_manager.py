"""The Parquet IO manager: polars frames per shard, through Dagster's own contexts and a real materialize."""

import weakref
from pathlib import Path

import dagster as dg
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memory_pipeline import storage
from memory_pipeline.defs.io_managers import PolarsParquetIOManager, ShardFrames
from memory_pipeline.defs.partitions import shard_partitions
from memory_pipeline.defs.resources import MemoryConfigResource
from memory_pipeline.models import CHUNKS_SCHEMA, MANIFEST_SCHEMA, SEGMENTS_SCHEMA, embeddings_schema, frame_of
from memory_pipeline.settings import load_settings
from memory_pipeline_tests.conftest import write_config
from memory_pipeline_tests.helpers import LOGGERS, memory_instance


def _rows(schema: pa.Schema, shard: str, n: int) -> list[dict]:
    return [{f.name: (f"{f.name}-{shard}-{i}" if pa.types.is_string(f.type) else i) for f in schema} for i in range(n)]


def _frame(schema: pa.Schema, shard: str, n: int) -> pl.DataFrame:
    return frame_of(_rows(schema, shard, n), schema)


@pytest.fixture
def setup(tmp_path: Path):
    (tmp_path / "mem").mkdir()
    config = write_config(tmp_path / "memory_pipeline.yaml")
    manager = PolarsParquetIOManager(memory_config=MemoryConfigResource(config_path=str(config)))
    return manager, storage.of(load_settings(config))


def _output(asset: str, shard: str) -> dg.OutputContext:
    return dg.build_output_context(asset_key=asset, partition_key=shard, asset_partitions_def=shard_partitions)


def _input(asset: str, *shards: str) -> dg.InputContext:
    if len(shards) == 1:
        return dg.build_input_context(asset_key=asset, partition_key=shards[0], asset_partitions_def=shard_partitions)
    return dg.build_input_context(asset_key=asset, asset_partition_key_range=dg.PartitionKeyRange(shards[0], shards[-1]), asset_partitions_def=shard_partitions)


def test_a_frame_round_trips_as_the_file_the_stages_always_wrote(setup):
    manager, data = setup
    frame = _frame(CHUNKS_SCHEMA, "03", 4)
    context = _output("memory_chunks", "03")
    manager.handle_output(context, frame)  # one frame for a one-shard run
    path = data.assets_dir / "memory_chunks" / "03.parquet"
    assert pq.read_schema(path).remove_metadata() == CHUNKS_SCHEMA  # Arrow's own string types, not polars' large ones
    meta = context.get_logged_metadata()
    assert meta["dagster/partition_row_count"].value == meta["dagster/row_count"].value == 4
    assert [c.name for c in meta["dagster/column_schema"].schema.columns] == CHUNKS_SCHEMA.names
    assert Path(meta["dagster/uri"].value) == data.assets_dir / "memory_chunks"

    loaded = manager.load_input(_input("memory_chunks", "03"))
    assert list(loaded) == ["03"] and len(loaded) == 1
    assert loaded["03"].equals(frame)


def test_embeddings_keep_their_fixed_width_vectors(setup):
    manager, data = setup
    frame = frame_of([{"content_hash": "h1", "vector": [0.5, 0.25, 0.0]}], embeddings_schema(3))
    manager.handle_output(_output("chunk_embeddings", "00"), {"00": frame})
    assert pq.read_schema(data.asset("chunk_embeddings", "00")).remove_metadata() == embeddings_schema(3)
    assert manager.load_input(_input("chunk_embeddings", "00"))["00"].equals(frame)


def test_a_missing_shard_reads_empty_and_a_damaged_one_is_set_aside(setup):
    manager, data = setup
    missing = manager.load_input(_input("source_files", "05"))["05"]
    assert missing.height == 0 and missing.columns == MANIFEST_SCHEMA.names
    assert manager.load_input(_input("chunk_embeddings", "05"))["05"].shape == (0, 0)  # its width is the run's model's

    path = data.asset("extracted_content", "07")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"PAR1 torn write")
    damaged = manager.load_input(_input("extracted_content", "07"))["07"]
    assert damaged.height == 0 and damaged.columns == SEGMENTS_SCHEMA.names
    assert not path.exists() and list(path.parent.glob("07.parquet.corrupt-*"))


def test_shard_frames_are_written_one_at_a_time_and_freed(setup):
    """While the stage makes a shard's frame, the one before is written and no longer in memory;
    the shard before that is on disk (a shard's file is closed once its next shard's frame shows
    that it has no more pieces)."""
    manager, data = setup
    shards = ["00", "01", "02", "03"]
    made: list[weakref.ref] = []
    seen: list[tuple[str, bool, bool]] = []  # (shard, the file before the previous is on disk, the previous frame is gone)

    def make(shard: str) -> pl.DataFrame:
        frame = _frame(CHUNKS_SCHEMA, shard, 3)
        made.append(weakref.ref(frame))
        return frame

    def stage():
        for shard in shards:
            if made:
                before = shards[len(made) - 2] if len(made) >= 2 else None
                seen.append((shard, before is None or data.asset("memory_chunks", before).is_file(), made[-1]() is None))
            yield shard, make(shard)  # the stage keeps no reference to what it yielded

    frames = ShardFrames(stage(), metadata=lambda: {"frames_made": len(made)})
    context = dg.build_output_context(
        asset_key="memory_chunks", asset_partition_key_range=dg.PartitionKeyRange("00", "03"), asset_partitions_def=shard_partitions
    )
    manager.handle_output(context, frames)
    assert seen == [("01", True, True), ("02", True, True), ("03", True, True)]
    meta = context.get_logged_metadata()
    assert meta["frames_made"].value == 4  # the producer's own counts, known once it is consumed
    assert meta["dagster/partition_row_count"].value == 12
    assert frames.consumed
    with pytest.raises(RuntimeError):
        list(frames)  # a stage's output is produced once


def test_what_a_run_does_not_cover_is_refused(setup):
    manager, _ = setup
    with pytest.raises(dg.DagsterInvariantViolationError, match="does not cover"):
        manager.handle_output(_output("memory_chunks", "01"), {"02": _frame(CHUNKS_SCHEMA, "02", 1)})
    with pytest.raises(dg.DagsterInvariantViolationError, match="no frame for shards 01"):
        manager.handle_output(_output("memory_chunks", "01"), {})
    two = dg.build_output_context(asset_key="memory_chunks", asset_partition_key_range=dg.PartitionKeyRange("00", "01"), asset_partitions_def=shard_partitions)
    with pytest.raises(dg.DagsterInvariantViolationError, match="one frame for a run of 2 shards"):
        manager.handle_output(two, _frame(CHUNKS_SCHEMA, "00", 1))


def test_a_multi_shard_run_passes_lazy_mappings_between_real_assets(setup):
    manager, data = setup
    shards = ["00", "01", "02"]
    looked_up: list[str] = []

    @dg.asset(key="source_files", partitions_def=shard_partitions)
    def producer(context: dg.AssetExecutionContext):
        return ShardFrames(((s, _frame(MANIFEST_SCHEMA, s, int(s) + 1)) for s in context.partition_keys), metadata=lambda: {"files": 6})

    @dg.asset(key="extracted_content", partitions_def=shard_partitions, ins={"manifests": dg.AssetIn("source_files")})
    def consumer(context: dg.AssetExecutionContext, manifests: storage.LazyFrames):
        assert list(manifests) == list(context.partition_keys) == shards
        out = {}
        for shard in manifests:
            looked_up.append(shard)
            frame = manifests[shard]
            assert frame.height == int(shard) + 1 and frame["shard"][0] == f"shard-{shard}-0"
            out[shard] = frame_of(
                [{"doc_id": d, "seg_index": 0, "text": "t", "line_start": 1, "line_end": 1, "label": "", "kind": ""} for d in frame["doc_id"]], SEGMENTS_SCHEMA
            )
        return out  # a plain mapping shard -> frame is stored too

    with memory_instance() as instance:
        result = dg.materialize(
            [producer, consumer],
            instance=instance,
            resources={"io_manager": manager},
            tags={"dagster/asset_partition_range_start": "00", "dagster/asset_partition_range_end": "02"},
            run_config=LOGGERS,
        )
        assert result.success
        events = [e for e in result.get_asset_materialization_events() if e.asset_key == dg.AssetKey("source_files")]
        assert sorted(e.partition for e in events) == shards
        meta = events[0].event_specific_data.materialization.metadata
        assert meta["dagster/partition_row_count"].value == 6 and meta["dagster/row_count"].value == 6 and meta["files"].value == 6
    assert looked_up == shards
    for asset in ("source_files", "extracted_content"):
        assert [p.name for p in sorted((data.assets_dir / asset).glob("*.parquet"))] == ["00.parquet", "01.parquet", "02.parquet"]
    loaded = manager.load_input(_input("extracted_content", *shards))
    assert [loaded[s].height for s in loaded] == [1, 2, 3]


def test_a_stage_reads_only_the_columns_it_asks_for_as_arrow(setup, monkeypatch):
    """``LazyFrames.table``: a shard's file as Arrow in a narrower schema, only those columns read
    from the file (the write stage needs 17 of the chunks' 19: not the text as embedded); a
    missing shard reads empty in that schema and a damaged one is set aside, as a frame's read."""
    manager, data = setup
    manager.handle_output(_output("memory_chunks", "03"), _frame(CHUNKS_SCHEMA, "03", 4))
    narrow = pa.schema([CHUNKS_SCHEMA.field("chunk_id"), CHUNKS_SCHEMA.field("text")])
    asked: list = []
    real = pq.read_table
    monkeypatch.setattr(pq, "read_table", lambda *a, **k: asked.append(k.get("columns")) or real(*a, **k))
    frames = manager.load_input(_input("memory_chunks", "03"))
    table = frames.table("03", narrow)
    assert table.schema == narrow and table.column("text").to_pylist() == [f"text-03-{i}" for i in range(4)]
    assert asked == [["chunk_id", "text"]]
    assert list(frames) == ["03"]
    with pytest.raises(KeyError):
        frames.table("05", narrow)  # not a shard of this run
    path = data.asset("memory_chunks", "03")
    path.unlink()
    assert frames.table("03", narrow).num_rows == 0 and frames.table("03", narrow).schema == narrow

    path.write_bytes(b"PAR1 torn write")
    assert frames.table("03", narrow).num_rows == 0 and list(path.parent.glob("03.parquet.corrupt-*"))


def test_a_shard_made_in_pieces_is_one_file_of_row_groups_that_appears_whole(setup):
    """Consecutive frames of one shard are its pieces: one Parquet file, a row group each, written
    as they come (each piece freed before the next is made) and renamed into place only once the
    last is in, so a reader sees the old file or the whole new one, never part. Read back a piece
    at a time (``LazyFrames.pieces``), or whole as before."""
    manager, data = setup
    manager.handle_output(_output("memory_chunks", "01"), _frame(CHUNKS_SCHEMA, "old", 2))
    made: list[weakref.ref] = []
    seen: list[tuple[int, bool]] = []  # (rows of the shard's file on disk while a piece is made, the piece before is gone)

    def make(name: str, n: int) -> pl.DataFrame:
        frame = _frame(CHUNKS_SCHEMA, name, n)
        made.append(weakref.ref(frame))
        return frame

    def stage():
        for shard, n in (("00", 3), ("01", 2), ("01", 4), ("01", 0), ("01", 1), ("02", 5)):
            if shard == "01":
                seen.append((pq.read_metadata(data.asset("memory_chunks", "01")).num_rows, not made or made[-1]() is None))
            yield shard, make(f"{shard}x{len(made)}", n)  # the stage keeps no reference to what it yielded

    context = dg.build_output_context(
        asset_key="memory_chunks", asset_partition_key_range=dg.PartitionKeyRange("00", "02"), asset_partitions_def=shard_partitions
    )
    manager.handle_output(context, ShardFrames(stage()))
    assert seen == [(2, True)] * 4  # the old file stood until the new one was whole
    assert context.get_logged_metadata()["dagster/partition_row_count"].value == 15
    path = data.asset("memory_chunks", "01")
    assert pq.ParquetFile(path).num_row_groups == 3  # the empty piece is no row group
    assert not list(path.parent.glob("*.tmp*"))
    frames = manager.load_input(_input("memory_chunks", "00", "01", "02"))
    narrow = pa.schema([CHUNKS_SCHEMA.field("chunk_id")])
    pieces = [t.column("chunk_id").to_pylist() for t in frames.pieces("01", narrow)]
    assert pieces == [[f"chunk_id-01x{k}-{i}" for i in range(n)] for k, n in ((1, 2), (2, 4), (4, 1))]
    assert frames["01"].height == 7 and frames.row_groups("01") == 3
    assert [t.num_rows for t in frames.pieces("00", narrow)] == [3] and frames.row_groups("00") == 1  # one piece: read whole
    assert data.row_groups("memory_chunks", "05") is None and [t.num_rows for t in data.read_pieces("memory_chunks", "05", narrow)] == [0]  # none: empty
    with pytest.raises(KeyError):
        frames.pieces("05", narrow)  # not a shard of this run


def test_a_failure_between_pieces_leaves_the_old_file_and_no_litter(setup):
    manager, data = setup
    manager.handle_output(_output("memory_chunks", "01"), _frame(CHUNKS_SCHEMA, "old", 2))

    def stage():
        yield "01", _frame(CHUNKS_SCHEMA, "new", 3)
        raise RuntimeError("the stage failed between two pieces")

    with pytest.raises(RuntimeError, match="between two pieces"):
        manager.handle_output(_output("memory_chunks", "01"), ShardFrames(stage()))
    path = data.asset("memory_chunks", "01")
    assert pq.read_table(path).column("chunk_id").to_pylist() == ["chunk_id-old-0", "chunk_id-old-1"]
    assert sorted(p.name for p in path.parent.iterdir()) == ["01.parquet"]


def test_pieces_of_one_shard_must_come_together(setup):
    manager, _ = setup
    pairs = [("00", _frame(CHUNKS_SCHEMA, "a", 1)), ("01", _frame(CHUNKS_SCHEMA, "b", 1)), ("00", _frame(CHUNKS_SCHEMA, "c", 1))]
    context = dg.build_output_context(
        asset_key="memory_chunks", asset_partition_key_range=dg.PartitionKeyRange("00", "01"), asset_partitions_def=shard_partitions
    )
    with pytest.raises(dg.DagsterInvariantViolationError, match="pieces of shard 00 do not come one after another"):
        manager.handle_output(context, ShardFrames(iter(pairs)))


def test_a_file_damaged_inside_a_piece_is_set_aside_and_raised(setup):
    """Damage past the first piece: the pieces before it were read, so it is not read as an empty
    shard; it is moved aside (the next run makes it again) and the read fails with a clear error."""
    manager, data = setup
    data.write_pieces(iter([_frame(CHUNKS_SCHEMA, f"p{k}", 300).to_arrow() for k in range(3)]), "memory_chunks", "04")
    path = data.asset("memory_chunks", "04")
    second = pq.read_metadata(path).row_group(1)
    columns = [second.column(i) for i in range(second.num_columns)]
    low = min(c.dictionary_page_offset or c.data_page_offset for c in columns)
    high = max(c.data_page_offset + c.total_compressed_size for c in columns)
    raw = bytearray(path.read_bytes())
    raw[low:high] = b"\xff" * (high - low)  # the second piece's bytes, the footer intact
    path.write_bytes(bytes(raw))
    reader = data.read_pieces("memory_chunks", "04", CHUNKS_SCHEMA)
    with pytest.raises(OSError, match="is damaged"):
        for _ in reader:
            pass
    assert not path.exists() and list(path.parent.glob("04.parquet.corrupt-*"))
    assert [t.num_rows for t in data.read_pieces("memory_chunks", "04", CHUNKS_SCHEMA)] == [0]  # gone: the next run makes it again


def test_a_piece_of_more_rows_than_parquets_row_group_default_stays_one_piece(setup, monkeypatch):
    """A piece is one row group however long (pyarrow would cut a table of over 1,048,576 rows, and
    the readers' pieces must hold whole files)."""
    manager, data = setup
    calls: list = []
    real = pq.ParquetWriter.write_table
    monkeypatch.setattr(pq.ParquetWriter, "write_table", lambda self, table, *a, **k: calls.append(k.get("row_group_size")) or real(self, table, *a, **k))
    data.write_pieces(iter([_frame(CHUNKS_SCHEMA, "a", 7).to_arrow(), _frame(CHUNKS_SCHEMA, "b", 3).to_arrow()]), "memory_chunks", "05")
    assert calls == [7, 3] and pq.ParquetFile(data.asset("memory_chunks", "05")).num_row_groups == 2
