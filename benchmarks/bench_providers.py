"""Live-call throughput of a remote provider against its local fake, by concurrency and fault rate.

The fake (the OpenAI one, driven by the real ``openai`` SDK) answers each request after a
fixed service delay, like a remote API's latency; the benchmark embeds N texts and reports
texts per second, requests, retries and the most requests the server saw in flight. It shows
that ``remote.concurrency`` is what bounds (and buys) throughput, and what a 30 % transient
failure rate costs. Nothing is timed in the test suite; this is where the numbers come from.

    .venv/bin/python benchmarks/bench_providers.py --texts 2000 --out benchmarks/results-providers.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from memory_pipeline.providers.openai import OpenAIProvider  # noqa: E402
from memory_pipeline.settings import ResolvedRemote  # noqa: E402
from memory_pipeline_tests.fakes.openai_server import OpenAIFake  # noqa: E402


def run_case(texts: list[str], concurrency: int, batch_size: int, fault_rate: float, delay_s: float) -> dict:
    with OpenAIFake(timeout_s=1.0) as fake:
        fake.delay_s = delay_s
        if fault_rate:
            fake.fail_randomly(fault_rate, kinds=("429", "500", "truncated"), seed=11)
        remote = ResolvedRemote(
            base_url=fake.base_url, concurrency=concurrency, batch_size=batch_size, backoff_base_s=0.05, backoff_max_s=1.0,
            timeout_s=5.0, max_retries=12,
        )  # fmt: skip
        fake.retry_after = 0.05
        provider = OpenAIProvider("text-embedding-3-small", 256, remote, env={"OPENAI_API_KEY": fake.api_key})
        provider.embed_documents(texts[:2])  # import the SDK and open the connection, untimed
        fake.requests.clear()
        fake.max_in_flight = 0
        started = time.perf_counter()
        vecs = provider.embed_documents(texts)
        seconds = time.perf_counter() - started
        assert vecs.shape == (len(texts), 256)
        return {
            "concurrency": concurrency,
            "batch_size": batch_size,
            "fault_rate": fault_rate,
            "service_delay_s": delay_s,
            "texts": len(texts),
            "seconds": round(seconds, 3),
            "texts_per_s": round(len(texts) / seconds, 1),
            "requests": len(fake.requests),
            "faulted_requests": sum(1 for r in fake.requests if r.fault),
            "max_in_flight": fake.max_in_flight,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--delay-ms", type=float, default=100.0, help="the fake's service time per request")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results-providers.json"))
    args = parser.parse_args()
    texts = [f"note {i}: meeting about project {i % 37} and the {i % 11} open questions on topic {i % 5}" for i in range(args.texts)]
    cases = []
    for concurrency, fault in ((1, 0.0), (4, 0.0), (8, 0.0), (4, 0.3)):
        case = run_case(texts, concurrency, args.batch_size, fault, args.delay_ms / 1000)
        cases.append(case)
        print(
            f"concurrency {concurrency}, faults {fault:.0%}: {case['texts_per_s']:>8} texts/s, {case['requests']} requests "
            f"({case['faulted_requests']} faulted), max in flight {case['max_in_flight']}"
        )
    Path(args.out).write_text(json.dumps({"cases": cases}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
