"""The IO manager: polars DataFrames between the assets, as partitioned Parquet under the data folder.

Every shard of an asset is one file, ``<data_dir>/assets/<asset>/<shard>.parquet``; the paths,
the atomic writes and the forgiving reads are :class:`~memory_pipeline.storage.DataStore`'s.

A run covers one shard or many (a range), so values are per shard whatever their number:

- an **input** is a mapping shard -> ``pl.DataFrame`` over the run's shards that reads a
  file when it is looked up and keeps nothing (:class:`~memory_pipeline.storage.LazyFrames`);
- an **output** is :class:`ShardFrames`, the ``(shard, frame)`` pairs a stage produces one
  shard at a time, or one piece of a shard at a time (consecutive pairs of one shard, see
  :data:`~memory_pipeline.storage.PIECE_ROWS`). The IO manager consumes it in order, writing
  each shard's pieces as the row groups of one file (atomically: it appears once whole) and
  dropping each before the stage makes the next, so memory holds one piece however large the
  shards and however many the run covers. What is only known once every shard is made (a stage's counts) comes as the
  ``ShardFrames``' metadata callback, called after the last shard and attached with
  ``add_output_metadata`` beside the standard keys (``dagster/row_count``,
  ``dagster/partition_row_count``, ``dagster/column_schema``, ``dagster/uri``). A plain
  mapping shard -> frame, or one frame for a one-shard run, is stored the same way.

The stage work done while a ``ShardFrames`` is consumed runs inside ``handle_output``: its
errors are reported by the wrapper the asset puts around the stream (``defs/assets.py``), so
they reach the run's collector and retry policy exactly as errors of the asset body do.
"""

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import dagster as dg
import pyarrow as pa

from memory_pipeline import storage
from memory_pipeline.defs.resources import MemoryConfigResource
from memory_pipeline.models import asset_schema

if TYPE_CHECKING:
    import polars as pl


def column_schema(schema: pa.Schema) -> dg.TableSchema:
    """An Arrow schema as Dagster's column schema (the UI's Columns tab)."""
    return dg.TableSchema(columns=[dg.TableColumn(f.name, str(f.type), constraints=dg.TableColumnConstraints(nullable=f.nullable)) for f in schema])


class ShardFrames:
    """An asset's output over a run's shards: ``(shard, frame)`` pairs made as they are consumed, once.

    ``metadata`` is called after the last pair: the producer's counts, known only then.
    """

    def __init__(self, frames: Iterable[tuple[str, "pl.DataFrame"]], metadata: Callable[[], Mapping[str, Any]] | None = None) -> None:
        self._frames = frames
        self._metadata = metadata
        self.consumed = False

    def __iter__(self) -> Iterator[tuple[str, "pl.DataFrame"]]:
        if self.consumed:
            raise RuntimeError("ShardFrames can be consumed only once")
        self.consumed = True
        yield from self._frames

    def metadata(self) -> Mapping[str, Any]:
        return self._metadata() if self._metadata is not None else {}


class PolarsParquetIOManager(dg.ConfigurableIOManager):
    """polars DataFrames as one Parquet file per shard: ``<data_dir>/assets/<asset>/<shard>.parquet``.

    The data folder is the configuration's (``memory_config``). Stores :class:`ShardFrames`, a
    mapping shard -> frame, or a single frame for a one-shard run; loads a lazy mapping shard ->
    frame over the input's shards (a missing shard reads as an empty frame in the asset's schema,
    a damaged one is set aside and reads as empty).
    """

    memory_config: dg.ResourceDependency[MemoryConfigResource]

    def handle_output(self, context: dg.OutputContext, obj: Any) -> None:
        name = context.asset_key.path[-1]
        asset, suffix = storage.locate(name)
        shards = _shards(context)
        data = storage.of(self.memory_config.settings())
        schema = asset_schema(name)
        rows = 0
        written: set[str] = set()
        for shard, frames in _by_shard(_pairs(obj, shards, name)):
            if shard not in shards:
                raise dg.DagsterInvariantViolationError(f"{name}: a frame for shard {shard}, which this run does not cover ({', '.join(shards)})")
            if shard in written:
                raise dg.DagsterInvariantViolationError(f"{name}: the pieces of shard {shard} do not come one after another")
            kept: list[pa.Schema] = []

            def tables(frames=frames, shard=shard, kept=kept) -> Iterator[pa.Table]:
                # A shard's pieces, one file: only the piece being written is in memory while the stage makes the next.
                for frame in frames:
                    if not kept:
                        found = asset_schema(name, frame)
                        if found is None:
                            raise dg.DagsterInvariantViolationError(f"{name}: the frame for shard {shard} has no vector column")
                        kept.append(found)
                    yield frame.to_arrow().select(kept[0].names).cast(kept[0])
                    del frame

            rows += data.write_pieces(tables(), asset, shard, suffix)[1]
            schema = kept[0] if kept else schema
            written.add(shard)
        missing = [s for s in shards if s not in written]
        if missing:
            raise dg.DagsterInvariantViolationError(f"{name}: no frame for shards {', '.join(missing)} of this run")
        every = context.asset_partitions_def.get_partition_keys()
        total = rows if len(written) == len(every) else data.row_count(asset, every, suffix)
        meta: dict[str, Any] = {"dagster/row_count": dg.MetadataValue.int(total), "dagster/partition_row_count": dg.MetadataValue.int(rows)}
        if schema is not None:
            meta["dagster/column_schema"] = dg.MetadataValue.table_schema(column_schema(schema))
        meta["dagster/uri"] = dg.MetadataValue.path(data.asset_location(asset))  # the folder of <shard>.parquet files
        if isinstance(obj, ShardFrames):
            meta.update(obj.metadata())
        context.add_output_metadata(meta)

    def load_input(self, context: dg.InputContext) -> storage.LazyFrames:
        name = context.asset_key.path[-1]
        asset, suffix = storage.locate(name)
        data = storage.of(self.memory_config.settings())
        return data.frames(asset, _shards(context), asset_schema(name), suffix)


def _shards(context: dg.OutputContext | dg.InputContext) -> list[str]:
    """The shards of the output or input, in the partitions' own order (the order a stage works in)."""
    if not context.has_asset_partitions:
        raise dg.DagsterInvariantViolationError(f"{context.asset_key.to_user_string()}: the Parquet IO manager stores assets partitioned by shard")
    order = {k: i for i, k in enumerate(context.asset_partitions_def.get_partition_keys())}
    return sorted(context.asset_partition_keys, key=lambda k: order.get(k, len(order)))


def _by_shard(pairs: Iterable[tuple[str, "pl.DataFrame"]]) -> Iterator[tuple[str, Iterator["pl.DataFrame"]]]:
    """Consecutive pairs of one shard as ``(shard, its frames)``, each frame let go of before the
    next is asked for (``itertools.groupby`` keeps the last pair while the stage makes the next).
    Each shard's frames are consumed before the next shard is asked for."""
    it = iter(pairs)
    ahead: list[tuple[str, Any] | None] = [next(it, None)]
    while ahead[0] is not None:
        shard = ahead[0][0]

        def frames(shard: str = shard) -> Iterator["pl.DataFrame"]:
            while ahead[0] is not None and ahead[0][0] == shard:
                frame = ahead[0][1]
                ahead[0] = None
                yield frame
                del frame
                ahead[0] = next(it, None)

        yield shard, frames()


def _pairs(obj: Any, shards: list[str], name: str) -> Iterable[tuple[str, "pl.DataFrame"]]:
    import polars as pl

    if isinstance(obj, ShardFrames):
        return obj
    if isinstance(obj, Mapping):
        return obj.items()
    if isinstance(obj, pl.LazyFrame):
        obj = obj.collect()
    if isinstance(obj, pl.DataFrame):
        if len(shards) != 1:
            raise dg.DagsterInvariantViolationError(f"{name}: one frame for a run of {len(shards)} shards (give a mapping shard -> frame)")
        return [(shards[0], obj)]
    raise dg.DagsterInvariantViolationError(f"{name}: cannot store a {type(obj).__name__} (a polars DataFrame per shard is expected)")


__all__ = ["PolarsParquetIOManager", "ShardFrames", "column_schema"]
