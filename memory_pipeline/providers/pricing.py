"""What embedding costs: list prices per million input tokens, for cost estimates.

USD per 1M input tokens, (live, batch), as published by each provider when this
table was written (OpenAI and Gemini batch: half price; Voyage batch: a third
off). They change: the numbers are estimates for reports, never invoices. A
model not listed gets no estimate (``None``) rather than a made-up one; providers
that run on the user's machine cost nothing per token.
"""

from __future__ import annotations

FREE_PROVIDERS = frozenset({"local", "ollama", "none", ""})

PRICES_PER_MILLION: dict[tuple[str, str], tuple[float, float]] = {
    ("openai", "text-embedding-3-small"): (0.02, 0.01),
    ("openai", "text-embedding-3-large"): (0.13, 0.065),
    ("openai", "text-embedding-ada-002"): (0.10, 0.05),
    ("gemini", "gemini-embedding-001"): (0.15, 0.075),
    ("gemini", "gemini-embedding-2-preview"): (0.15, 0.075),
    ("voyage", "voyage-4-large"): (0.12, 0.08),
    ("voyage", "voyage-4"): (0.06, 0.04),
    ("voyage", "voyage-4-lite"): (0.02, 0.0134),
    ("mistral", "mistral-embed"): (0.10, 0.10),
}


def prices(provider: str, model: str) -> tuple[float, float] | None:
    """(live, batch) USD per million tokens, or None when unknown."""
    if provider in FREE_PROVIDERS:
        return (0.0, 0.0)
    return PRICES_PER_MILLION.get((provider, model.removeprefix("models/")))


def usd_per_mtok(provider: str, model: str, *, batch: bool = False) -> float | None:
    p = prices(provider, model)
    return None if p is None else p[1 if batch else 0]


def estimate_usd(provider: str, model: str, tokens: int, *, batch: bool = False) -> float | None:
    price = usd_per_mtok(provider, model, batch=batch)
    return None if price is None else round(tokens * price / 1_000_000, 6)


def estimate(provider: str, model: str, *, batch_tokens: int, live_tokens: int) -> dict:
    """``estimated_cost_usd`` (batch tokens at the batch price, live at the live price) and
    ``live_cost_usd`` (every one of those tokens at the live price)."""
    p = prices(provider, model)
    if p is None:
        return {"estimated_cost_usd": None, "live_cost_usd": None, "saved_usd": None}
    live, batch = p
    cost = (batch_tokens * batch + live_tokens * live) / 1e6
    at_live = (batch_tokens + live_tokens) * live / 1e6
    return {"estimated_cost_usd": round(cost, 6), "live_cost_usd": round(at_live, 6), "saved_usd": round(at_live - cost, 6)}


def price_rows() -> list[dict]:
    """The price list as rows (for the analytics database)."""
    rows = [{"provider": p, "model": m, "usd_per_mtok": live, "batch_usd_per_mtok": batch} for (p, m), (live, batch) in PRICES_PER_MILLION.items()]
    return sorted(rows, key=lambda r: (r["provider"], r["model"]))
