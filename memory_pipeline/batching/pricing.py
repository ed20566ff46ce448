"""Estimated embedding cost: what a run paid, against what the same tokens cost live.

List prices in USD per million input tokens, (live, batch), as published by each
provider when this table was written (OpenAI and Gemini batch: half price;
Voyage batch: a third off). They are estimates for the run report, not invoices;
an unknown model gets no estimate rather than a wrong one.
"""

from __future__ import annotations

PRICES_PER_MILLION: dict[tuple[str, str], tuple[float, float]] = {
    ("openai", "text-embedding-3-small"): (0.02, 0.01),
    ("openai", "text-embedding-3-large"): (0.13, 0.065),
    ("openai", "text-embedding-ada-002"): (0.10, 0.05),
    ("gemini", "gemini-embedding-001"): (0.15, 0.075),
    ("gemini", "gemini-embedding-2-preview"): (0.15, 0.075),
    ("voyage", "voyage-4-large"): (0.12, 0.08),
    ("voyage", "voyage-4"): (0.06, 0.04),
    ("voyage", "voyage-4-lite"): (0.02, 0.0134),
}


def prices(provider: str, model: str) -> tuple[float, float] | None:
    """(live, batch) USD per million tokens, or None when the model is not in the table."""
    return PRICES_PER_MILLION.get((provider, model.removeprefix("models/")))


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
