"""Parquet assets: vectors are written plain (no dictionary page, no statistics), every other
column as before; the data reads back unchanged."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from memory_pipeline.models import CHUNKS_SCHEMA, embeddings_schema
from memory_pipeline.storage import parquet_options, write_parquet


def _encodings(path) -> dict[str, tuple[set[str], bool]]:
    meta = pq.ParquetFile(path).metadata
    out = {}
    for i in range(meta.num_columns):
        col = meta.row_group(0).column(i)
        out[col.path_in_schema.split(".")[0]] = (set(col.encodings), col.statistics is not None)
    return out


def test_vectors_plain_other_columns_dictionary(tmp_path):
    rng = np.random.default_rng(7)
    vectors = rng.random((300, 384), dtype=np.float32)
    table = pa.table(
        {
            "content_hash": [f"{i % 7:064x}" for i in range(300)],
            "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), 384),
        }
    ).cast(embeddings_schema(384))
    path = tmp_path / "e.parquet"
    write_parquet(table, path)
    enc = _encodings(path)
    assert "RLE_DICTIONARY" not in enc["vector"][0] and not enc["vector"][1]
    assert "RLE_DICTIONARY" in enc["content_hash"][0] and enc["content_hash"][1]
    back = pq.read_table(path)
    assert back.equals(table)
    np.testing.assert_array_equal(np.stack(back.column("vector").to_numpy(zero_copy_only=False)), vectors)


def test_options_by_type():
    schema = pa.schema(
        [
            ("a", pa.string()),
            ("v", pa.list_(pa.float32())),
            ("w", pa.large_list(pa.float64())),
            ("f", pa.list_(pa.float32(), 4)),
            ("ids", pa.list_(pa.string())),  # a list of strings is not a vector
            ("n", pa.int32()),
        ]
    )
    opts = parquet_options(schema)
    assert opts["use_dictionary"] == ["a", "ids", "n"] == opts["write_statistics"]
    assert "vector" not in parquet_options(CHUNKS_SCHEMA)["use_dictionary"]  # chunks have no vector column
    assert parquet_options(CHUNKS_SCHEMA)["use_dictionary"] == CHUNKS_SCHEMA.names


def test_only_vectors_and_empty(tmp_path):
    only = pa.table({"v": pa.array([[1.0, 2.0]], type=pa.list_(pa.float32(), 2))})
    write_parquet(only, tmp_path / "v.parquet")
    assert pq.read_table(tmp_path / "v.parquet").equals(only)
    write_parquet(pa.table({}), tmp_path / "e.parquet")
    assert pq.read_table(tmp_path / "e.parquet").num_rows == 0
