"""BERT's encoder in plain torch: the local model's torch runtime without importing transformers.

``transformers.AutoModel.from_pretrained`` spends its time importing, not loading: the BERT module
pulls in ``modeling_utils``, generation, ``torch.distributed.tensor`` and ``torch._dynamo``, 2.3 s
of a 2.4 s load of all-MiniLM-L6-v2 here (0.8 s importing ``transformers``, 1.5 s in
``from_pretrained``; the 90 MB of weights take milliseconds). An index run loads the model in the
background while it discovers and chunks files, and on two cores those imports hold the
interpreter the run's own threads need: with the torch runtime the first embedding of 1,000 notes
started 7.9 s into the run, with the model's load taking 5.2 s of it.

A BERT encoder is a dozen tensor operations per layer; :func:`encoder` builds one from the model
folder's ``config.json`` and ``model.safetensors`` (the same names as ``BertModel``'s state dict),
with torch's fused attention (``scaled_dot_product_attention``), as transformers' default SDPA
attention does. Its last hidden state equals ``BertModel``'s within float rounding (tested on
padded batches of every length). Anything else (another architecture, relative positions, another
activation, weights only in ``pytorch_model.bin``) returns None, and the caller loads the model
through transformers as before.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

_LAYER_KEYS = (
    "attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
    "attention.output.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm",
)  # fmt: skip


def supported(config: dict) -> bool:
    """Whether :func:`encoder` computes exactly what ``BertModel`` does for this ``config.json``."""
    return (
        config.get("model_type") == "bert"
        and config.get("hidden_act", "gelu") == "gelu"  # the exact (erf) GELU; "gelu_new" and others are not this
        and config.get("position_embedding_type", "absolute") == "absolute"
        and not config.get("is_decoder", False)
        and not config.get("add_cross_attention", False)
        and int(config.get("hidden_size", 0)) % max(int(config.get("num_attention_heads", 1)), 1) == 0
    )


def encoder(model_path: Path) -> Callable[[dict[str, np.ndarray]], np.ndarray] | None:
    """``forward(feeds) -> last hidden state`` (numpy in, numpy out, like the runtimes' sessions),
    or None where the folder holds anything but a plain BERT encoder in safetensors."""
    config_file, weights_file = model_path / "config.json", model_path / "model.safetensors"
    if not config_file.is_file() or not weights_file.is_file():
        return None
    config = json.loads(config_file.read_text())
    if not supported(config):
        return None
    import torch
    import torch.nn.functional as F  # noqa: N812 - torch's own convention
    from safetensors.torch import load_file

    state = load_file(str(weights_file))
    if any(k.startswith("bert.") for k in state):  # a checkpoint saved from a model with a head
        state = {k.removeprefix("bert."): v for k, v in state.items() if k.startswith("bert.")}
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    head_dim, eps, layers = hidden // heads, float(config.get("layer_norm_eps", 1e-12)), int(config["num_hidden_layers"])

    if any(t.dtype != torch.float32 for t in state.values() if t.is_floating_point()):
        return None  # half-precision weights: transformers runs them as stored, in half precision
    try:
        emb = {n: state[f"embeddings.{n}.weight"] for n in ("word_embeddings", "position_embeddings", "token_type_embeddings")}
        emb_norm = (state["embeddings.LayerNorm.weight"], state["embeddings.LayerNorm.bias"])
        blocks = [
            {key: (state[f"encoder.layer.{i}.{key}.weight"], state[f"encoder.layer.{i}.{key}.bias"]) for key in _LAYER_KEYS}
            for i in range(layers)
        ]  # fmt: skip
    except KeyError:
        return None  # not the layout BertModel saves: transformers loads it
    inner = int(config.get("intermediate_size", 4 * hidden))
    shapes = [
        emb["word_embeddings"].shape == (int(config.get("vocab_size", 0)), hidden),
        emb["position_embeddings"].shape == (int(config.get("max_position_embeddings", 0)), hidden),
        emb["token_type_embeddings"].shape == (int(config.get("type_vocab_size", 2)), hidden),
        all(b["attention.self.query"][0].shape == (hidden, hidden) and b["intermediate.dense"][0].shape == (inner, hidden) for b in blocks),
    ]
    if not all(shapes):
        return None  # weights that disagree with the config: transformers reports the mismatch
    state.clear()  # what is not used (the pooler) goes

    def attention(x: torch.Tensor, block: dict, bias: torch.Tensor | None) -> torch.Tensor:
        b, n, _ = x.shape

        def split(key: str) -> torch.Tensor:
            return F.linear(x, *block[key]).view(b, n, heads, head_dim).transpose(1, 2)

        q, k, v = split("attention.self.query"), split("attention.self.key"), split("attention.self.value")
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return context.transpose(1, 2).reshape(b, n, hidden)

    def forward(feeds: dict[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            ids = torch.from_numpy(feeds["input_ids"])
            mask = torch.from_numpy(feeds["attention_mask"])
            types = torch.from_numpy(feeds["token_type_ids"]) if "token_type_ids" in feeds else torch.zeros_like(ids)
            positions = torch.arange(ids.shape[1])
            x = emb["word_embeddings"][ids] + emb["position_embeddings"][positions] + emb["token_type_embeddings"][types]
            x = F.layer_norm(x, (hidden,), *emb_norm, eps=eps)
            # Padded keys get the lowest float added to their scores (BertModel's extended mask); none
            # when nothing in the pass is padded (the int8 path's texts run alone).
            bias = None if bool(mask.all()) else (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
            for block in blocks:
                x = F.layer_norm(
                    F.linear(attention(x, block, bias), *block["attention.output.dense"]) + x, (hidden,), *block["attention.output.LayerNorm"], eps=eps
                )
                inner = F.gelu(F.linear(x, *block["intermediate.dense"]))
                x = F.layer_norm(F.linear(inner, *block["output.dense"]) + x, (hidden,), *block["output.LayerNorm"], eps=eps)
            return x.numpy()

    return forward
