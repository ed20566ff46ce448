"""What embedding costs: list prices per million input tokens, for cost estimates.

Prices are the providers' published list prices for live calls (USD per 1M input
tokens, as of 2026-11); batch APIs bill half at OpenAI, Gemini and Voyage. They
change: the numbers here are estimates for reports, never billing. A model not
listed has no estimate (``None``), rather than a made-up zero.
"""

from __future__ import annotations

# Providers that run on the user's machine cost nothing per token.
FREE_PROVIDERS = frozenset({"local", "ollama", "none", ""})

LIVE_USD_PER_MTOK: dict[tuple[str, str], float] = {
    ("openai", "text-embedding-3-small"): 0.02,
    ("openai", "text-embedding-3-large"): 0.13,
    ("openai", "text-embedding-ada-002"): 0.10,
    ("gemini", "gemini-embedding-001"): 0.15,
    ("gemini", "gemini-embedding-2-preview"): 0.20,
    ("voyage", "voyage-4-large"): 0.12,
    ("voyage", "voyage-4"): 0.06,
    ("voyage", "voyage-4-lite"): 0.02,
    ("mistral", "mistral-embed"): 0.10,
}
BATCH_DISCOUNT: dict[str, float] = {"openai": 0.5, "gemini": 0.5, "voyage": 0.5}


def usd_per_mtok(provider: str, model: str, *, batch: bool = False) -> float | None:
    """The list price per 1M tokens, or None when unknown."""
    if provider in FREE_PROVIDERS:
        return 0.0
    price = LIVE_USD_PER_MTOK.get((provider, model))
    if price is None:
        return None
    return price * BATCH_DISCOUNT.get(provider, 1.0) if batch else price


def estimate_usd(provider: str, model: str, tokens: int, *, batch: bool = False) -> float | None:
    price = usd_per_mtok(provider, model, batch=batch)
    return None if price is None else round(tokens * price / 1_000_000, 6)


def price_rows() -> list[dict]:
    """The price list as rows (for the analytics database)."""
    rows = [{"provider": p, "model": m, "usd_per_mtok": v, "batch_usd_per_mtok": usd_per_mtok(p, m, batch=True)} for (p, m), v in LIVE_USD_PER_MTOK.items()]
    return sorted(rows, key=lambda r: (r["provider"], r["model"]))
