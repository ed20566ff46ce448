#!/usr/bin/env python
"""Builds the labelled agent-memory evaluation set (BEIR format) in this folder.

    python data/eval/agent-memory/build.py      # writes corpus.jsonl, queries.jsonl, qrels/test.tsv

Hand-written answer documents (daily notes, session transcripts with speakers and dates,
long notes whose answer sits past the model's 256 word-pieces, a Chinese note) among
near-miss and filler notes made from templates with a fixed seed. Queries are hand-written,
each with a kind in its metadata:

* paraphrase  shares no content word with its answer (the vector leg must find it);
* exact       an id, error code, host or version string (the keyword leg must find it);
* keyword     names and specific terms;
* session     "when did I…", "what did X say about…" over transcripts;
* long        the answer is deep inside a long document;
* cjk         a Chinese query over a Chinese note;
* no-answer   nothing in the corpus answers it (not in the qrels; used for abstention).

The output is deterministic; the files are committed so the set is stable and reviewable.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
SEED = 20261130

# --- answer documents (hand-written) ---------------------------------------------------------

DOCS: dict[str, tuple[str, str]] = {
    "n-backup": ("2026-09-03 database notes", "Switched the nightly backups of the orders database from pg_dump to pgBackRest with WAL archiving. A full restore of the 380 GB cluster now completes in 12 minutes instead of 3 hours."),
    "n-coffee": ("2026-09-05", "Bought a Baratza Encore grinder for the office kitchen. Dial setting 14 works for the Aeropress; 22 for the French press."),
    "n-dentist": ("2026-09-07", "Appointment with Dr. Okafor moved to October 2nd at 8:30. Bring the insurance card; the crown on the lower left molar gets replaced."),
    "n-vpn": ("2026-09-09 ops", "The WireGuard tunnel to the Frankfurt office drops every 25 minutes because the NAT mapping expires. Fixed with PersistentKeepalive = 21 on the laptop peers."),
    "n-hiring": ("2026-09-11", "Interview loop for the staff data engineer: Leila runs the SQL exercise, Marco the system design, I do the values interview. Offer band approved up to 165k."),
    "n-garden": ("2026-09-13", "Planted garlic cloves (Music variety) in the raised bed, 15 cm apart, 5 cm deep. Mulch with straw after the first frost."),
    "n-kafka": ("2026-09-15 incident", "Consumer lag on the payments topic reached 2.1 million messages. Root cause: a rebalance storm because max.poll.interval.ms was 30 s while a batch took 45 s. Raised it to 300 s and lowered max.poll.records to 200."),
    "n-errcode": ("2026-09-17", "Checkout failures with ERR_PAYMENT_4471 come from the card vault timing out when the HSM pool is exhausted. Workaround: restart vault-proxy; real fix is a pool of 32 connections (ticket PAY-2291)."),
    "n-errcode-near": ("2026-09-18", "ERR_PAYMENT_4417 is a different beast: the issuer declined for suspected fraud. Nothing to fix on our side; the customer must call the bank."),
    "n-host": ("2026-09-19", "Moved the metrics stack to host mon-03.fra.internal (Prometheus 2.53, Grafana 11). Retention 45 days, 2 TB NVMe."),
    "n-version": ("2026-09-21", "Pinned the Python SDK to openai==1.47.0 because 1.48 changed the retry defaults and broke our backoff tests."),
    "n-birthday": ("2026-09-23", "Mia's birthday is on November 14. She wants the Lego botanical orchid set; order it before the 1st."),
    "n-car": ("2026-09-25", "Car service at the Volvo dealer: brake pads front, cabin filter, tyres rotated. 412 EUR. Next inspection due April 2027."),
    "n-rust": ("2026-09-27 learning", "Rust lifetimes finally clicked: a returned reference must outlive neither argument it may borrow from, so the signature ties them with the same lifetime parameter."),
    "n-okr": ("2026-09-29", "Q4 objective for the support team: the chatbot resolves 25 percent of tier-1 tickets without a human; median first response under 10 minutes."),
    "n-rent": ("2026-10-01", "Landlord agreed to keep the rent at 1,450 per month for another year if we sign before October 20. Signed the extension on the 3rd."),
    "n-flight": ("2026-10-04 travel", "Booked LH 1234 Munich to Lisbon on November 20, seat 14A, departs 07:05. Return TP 558 on the 24th."),
    "n-migraine": ("2026-10-06 health", "Headache diary: three attacks this month, all after nights under six hours of sleep. Ibuprofen 400 within the first hour works best."),
    "n-lancedb": ("2026-10-08", "Chose LanceDB over pgvector and Qdrant for the support chatbot: embedded, cheap, recall@10 of 0.97 at 210k vectors, p95 latency 18 ms."),
    "n-k8s": ("2026-10-10 platform", "Cluster upgrade to Kubernetes 1.31 done. The ingress-nginx controller needed the new admission webhook certificate; cert-manager issued it automatically."),
    "n-budget": ("2026-10-12", "Cloud spend in September: 18.4k USD, 9 percent over plan. Most of the overshoot is egress from the analytics bucket to BigQuery."),
    "n-piano": ("2026-10-14", "Piano lesson: practise the left hand of Chopin's Nocturne op. 9 no. 2 slowly, 60 bpm, and keep the wrist loose."),
    "n-sourdough": ("2026-10-16 kitchen", "Sourdough starter feeding schedule: 1:5:5 at 9 pm, bake the next morning at peak. Hydration 75 percent for the country loaf."),
    "n-security": ("2026-10-18", "Rotated the GitHub deploy keys for all 14 repositories after the laptop theft. Revoked the old SSH key fingerprint SHA256:9f2c...e41."),
    "n-review": ("2026-10-20", "Performance review with Hannah: strong on incident leadership, needs to delegate more. Agreed goal: two engineers run the on-call retro without me."),
    "n-moving": ("2026-10-22", "Movers booked for December 5; 38 boxes estimated. The piano needs a specialist carrier, quoted 380 EUR."),
    "n-latency": ("2026-10-24", "p99 latency of the search API jumped to 900 ms after enabling cross-encoder reranking. Limited reranking to the top 20 candidates: p99 back to 140 ms."),
    "n-zh": ("2026-10-26 数据库备份策略", "每日增量备份在凌晨三点开始，每周日做一次全量备份。备份保留三十天，每季度做一次恢复演练。负责人：Sven。"),
    "n-zh-2": ("2026-10-27 团队团建", "团建活动定在十一月八日，地点是湖边的农家乐。预算每人三百元，李娜负责订车。"),
    "n-accent": ("2026-10-28", "Dinner at Café Lumière with the Zürich team; Renée recommended the crème brûlée. Split the bill, 86 CHF each."),
    "n-tax": ("2026-10-30", "Tax return filed on October 29. Refund expected: 1,240 EUR. Home office deduction claimed for 180 days."),
    "n-ssl": ("2026-11-01 incident", "Stripe webhooks failed for two hours because the TLS certificate of hooks.shop.example had lapsed. Moved it to cert-manager with auto-renewal 30 days before expiry."),
    "n-gpu": ("2026-11-03", "Rented one H100 for 3 hours to fine-tune the intent classifier: 2 epochs, learning rate 2e-5, macro F1 went from 0.81 to 0.88."),
    "n-reading": ("2026-11-05", "Finished 'The Making of the Atomic Bomb'. Best chapter: the Chicago pile going critical in December 1942."),
    "n-runbook": ("2026-11-07", "Runbook for the disk-full alert on db-07: check pg_wal size first, then stale replication slots; drop a slot only after confirming the replica is gone."),
}

LONG_DOCS: dict[str, tuple[str, list[str], str]] = {
    # id: (title, filler topics before the answer, the answer paragraph)
    "l-postmortem": (
        "Postmortem: the October search outage",
        ["timeline of the pages and who was on call", "customer impact by region and the status page updates", "the dashboards we looked at first and why they misled us", "how the rollback was attempted twice"],
        "Root cause: the ANN index was rebuilt during peak traffic and the new partitions were trained on a 2 percent sample, so recall collapsed to 0.41. Action item AI-17: never retrain the vector index between 08:00 and 20:00, and check recall against exact search before swapping.",
    ),
    "l-offsite": (
        "Team offsite planning",
        ["travel options and the train tickets", "the agenda for the first morning", "dietary needs and the catering order", "the workshop on planning and estimates"],
        "Decision on the last day: the team adopts a four-day on-call rotation starting January, with a paid day off after each weekend shift, proposed by Priya.",
    ),
    "l-handbook": (
        "Engineering handbook: deployments",
        ["branch naming and pull request templates", "the review checklist for database migrations", "feature flags and their naming", "what to do when CI is red on main"],
        "Freeze: no production deploys on Fridays after 15:00 or during the last two weeks of December, unless the incident commander approves it in #deploys.",
    ),
    "l-research": (
        "Notes on retrieval papers",
        ["dense retrieval with dual encoders", "why BM25 stays strong on entity queries", "distillation from cross-encoders", "evaluation pitfalls with BEIR"],
        "Takeaway for our memory system: chunk long notes and score a document by its best chunk, because a 256 word-piece model silently drops everything after the prefix.",
    ),
}

SESSIONS: dict[str, tuple[str, list[tuple[str, str, str]]]] = {
    # id: (title, [(timestamp, speaker, message)])
    "s-deploy": ("Session 2026-10-14 deploy help", [
        ("2026-10-14 09:12", "user", "Deploying label-service v1.8.0 to staging and the pods never become Ready; the readiness probe returns 503."),
        ("2026-10-14 09:13", "assistant", "The app reports not ready when a dependency check fails. Did an environment variable change between 1.7 and 1.8?"),
        ("2026-10-14 09:14", "user", "Yes, we renamed CARRIER_TOKEN to CARRIER_API_TOKEN."),
        ("2026-10-14 09:16", "assistant", "Then the secret still provides the old name. Recreate the secret from the new env file and restart the rollout."),
    ]),
    "s-priya": ("Session 2026-10-21 planning with Priya", [
        ("2026-10-21 14:00", "user", "Priya thinks we should drop the Elasticsearch cluster entirely and move logs to Loki."),
        ("2026-10-21 14:02", "assistant", "Loki is cheaper for logs you only grep; it is weaker for full-text analytics. What queries does the team run most?"),
        ("2026-10-21 14:05", "user", "Mostly grep by request id. Priya also said the ES bill is 6k a month and nobody tunes the shards."),
        ("2026-10-21 14:07", "assistant", "Then Loki fits: index only the labels, keep 14 days hot, and archive to object storage."),
    ]),
    "s-marathon": ("Session 2026-10-25 training plan", [
        ("2026-10-25 07:30", "user", "I signed up for the Valencia marathon on December 6. Can you build a 6-week plan around three runs a week?"),
        ("2026-10-25 07:32", "assistant", "Week one: 8 km easy, 6 x 800 m intervals, 16 km long run. Build the long run by 3 km a week to 32 km, then taper."),
    ]),
    "s-tomas": ("Session 2026-11-02 support sync", [
        ("2026-11-02 10:15", "user", "Tomás complained that the chatbot answers refund questions with the old 14-day policy."),
        ("2026-11-02 10:16", "assistant", "The policy page changed to 30 days on October 1; the index still holds the old page. Re-index the help center and add the policy page to the nightly crawl."),
        ("2026-11-02 10:20", "user", "Tomás also wants a weekly report of the questions the bot could not answer."),
    ]),
    "s-rust": ("Session 2026-11-18 rust questions", [
        ("2026-11-18 16:40", "user", "Why does the borrow checker reject pushing to a vector while I hold a reference to its first element?"),
        ("2026-11-18 16:41", "assistant", "Pushing may reallocate the buffer, which would leave your reference dangling. Clone the element or finish using the reference before the push."),
    ]),
    "s-wedding": ("Session 2026-09-30 wedding toast", [
        ("2026-09-30 21:05", "user", "Help me write a toast for my sister Clara's wedding on October 11; keep it under two minutes and mention our canoe trip."),
        ("2026-09-30 21:07", "assistant", "Start with the canoe capsizing on the Dordogne, turn it into how Clara always steers back on course, and end by raising a glass to the couple."),
    ]),
}

# (query id, text, kind, {doc id: grade})
QUERIES: list[tuple[str, str, str, dict[str, int]]] = [
    # paraphrase: no content word in common with the answer
    ("q01", "how long does recovering the shop's purchase records take these days?", "paraphrase", {"n-backup": 2}),
    ("q02", "which notch suits a plunger pot when milling beans?", "paraphrase", {"n-coffee": 2}),
    ("q03", "when am I seeing the tooth doctor?", "paraphrase", {"n-dentist": 2}),
    ("q04", "why did the remote connection to Germany keep cutting out?", "paraphrase", {"n-vpn": 2}),
    ("q05", "what gift is my daughter hoping for?", "paraphrase", {"n-birthday": 2}),
    ("q06", "how much did maintenance on the automobile cost?", "paraphrase", {"n-car": 2}),
    ("q07", "what housing payment did the property owner accept?", "paraphrase", {"n-rent": 2}),
    ("q08", "what triggers my cranial pain?", "paraphrase", {"n-migraine": 2}),
    ("q09", "how do I keep the bread culture alive?", "paraphrase", {"n-sourdough": 2}),
    ("q10", "credentials replaced after a computer got stolen", "paraphrase", {"n-security": 2}),
    ("q11", "when is the relocation truck coming?", "paraphrase", {"n-moving": 2}),
    ("q12", "what money comes back from the government this year?", "paraphrase", {"n-tax": 2}),
    ("q13", "how much better did the purpose-detection network become after leasing an accelerator?", "paraphrase", {"n-gpu": 2}),
    # exact terms: ids, codes, hosts, versions
    ("q14", "ERR_PAYMENT_4471", "exact", {"n-errcode": 2}),
    ("q15", "ERR_PAYMENT_4417", "exact", {"n-errcode-near": 2}),
    ("q16", "PAY-2291", "exact", {"n-errcode": 2}),
    ("q17", "mon-03.fra.internal", "exact", {"n-host": 2}),
    ("q18", "openai==1.47.0", "exact", {"n-version": 2}),
    ("q19", "LH 1234", "exact", {"n-flight": 2}),
    ("q20", "max.poll.interval.ms", "exact", {"n-kafka": 2}),
    ("q21", "AI-17 action item", "exact", {"l-postmortem": 2}),
    ("q22", "db-07 disk full", "exact", {"n-runbook": 2}),
    ("q23", "CARRIER_API_TOKEN", "exact", {"s-deploy": 2}),
    # names and specific terms
    ("q24", "Baratza Encore", "keyword", {"n-coffee": 2}),
    ("q25", "pgBackRest WAL archiving", "keyword", {"n-backup": 2, "n-zh": 1}),
    ("q26", "why LanceDB instead of Qdrant", "keyword", {"n-lancedb": 2}),
    ("q27", "Chopin nocturne practice", "keyword", {"n-piano": 2}),
    ("q28", "Hannah performance review", "keyword", {"n-review": 2}),
    ("q29", "Stripe webhooks TLS certificate", "keyword", {"n-ssl": 2}),
    ("q30", "cross-encoder reranking latency", "keyword", {"n-latency": 2}),
    ("q31", "creme brulee Zurich", "keyword", {"n-accent": 2}),
    # conversational memory
    ("q32", "what did Priya say about Elasticsearch?", "session", {"s-priya": 2, "l-offsite": 0}),
    ("q33", "when did I sign up for the marathon?", "session", {"s-marathon": 2}),
    ("q34", "what did Tomás complain about?", "session", {"s-tomas": 2}),
    ("q35", "why were the label-service pods not ready?", "session", {"s-deploy": 2}),
    ("q36", "why can't I push to a vec while borrowing it", "session", {"s-rust": 2, "n-rust": 1}),
    ("q37", "toast for Clara's wedding", "session", {"s-wedding": 2}),
    # long documents: the answer is past the first 256 word-pieces
    ("q38", "which weekday afternoon are production releases forbidden?", "long", {"l-handbook": 2}),
    ("q39", "new on-call rotation with a day off after weekend shifts", "long", {"l-offsite": 2}),
    ("q40", "why did recall collapse when the vector index was retrained?", "long", {"l-postmortem": 2}),
    ("q41", "score a document by its best chunk", "long", {"l-research": 2}),
    # CJK
    ("q42", "数据库备份", "cjk", {"n-zh": 2}),
    ("q43", "团建预算", "cjk", {"n-zh-2": 2}),
    # no answer anywhere
    ("q44", "what is the capital of Australia?", "no-answer", {}),
    ("q45", "recipe for vegan lasagna", "no-answer", {}),
    ("q46", "how many moons does Jupiter have", "no-answer", {}),
    ("q47", "ERR_PAYMENT_9999", "no-answer", {}),
    ("q48", "when is my passport renewal appointment", "no-answer", {}),
    ("q49", "best hiking trails in Patagonia", "no-answer", {}),
    ("q50", "who won the 1998 world cup", "no-answer", {}),
]

# --- filler and near-miss notes (templates, fixed seed) ----------------------------------------

PEOPLE = ["Sven", "Leila", "Marco", "Hannah", "Priya", "Tomás", "Dana", "Kenji", "Amara", "Olek"]
PROJECTS = ["billing service", "mobile app", "data warehouse", "search API", "onboarding flow", "admin console", "label printer", "fraud model", "status page", "CI pipeline"]
ACTIVITIES = [
    "reviewed the pull request for {p} and asked for more tests",
    "paired with {n} on flaky integration tests in the {p}",
    "wrote the design doc for caching in the {p}",
    "triaged twelve bugs for the {p}; three are release blockers",
    "updated the dashboards for the {p} with error budgets",
    "met {n} to plan the next sprint of the {p}",
    "cleaned up feature flags left over in the {p}",
    "benchmarked the {p} after the dependency upgrade",
    "answered questions from the sales team about the {p}",
    "drafted the quarterly roadmap slide for the {p}",
]
PERSONAL = [
    "Went for a 5 km run along the river before work.",
    "Groceries: oat milk, lentils, spinach, lemons.",
    "Called mum; she is fine and asks about the holidays.",
    "Watched a documentary about deep sea creatures.",
    "Fixed the squeaky hinge on the bathroom door.",
    "Read two chapters of a novel on the train.",
    "Paid the electricity bill online.",
    "Repotted the monstera; it finally has new leaves.",
]
NEAR_MISS = [
    ("Payment errors overview", "ERR_PAYMENT codes are documented in the payments wiki; most are issuer-side. Ticket PAY-2219 tracks the wiki cleanup."),
    ("Kafka tuning ideas", "Consider compression lz4 for the events topic and check consumer group lag weekly."),
    ("Backups checklist", "Quarterly: verify that backups exist for every database and that the restore drill is on the calendar."),
    ("Vector database shortlist", "Candidates for embeddings storage: pgvector, Qdrant, Milvus, LanceDB. Decision pending benchmarks."),
    ("Flight ideas", "Maybe fly to Porto in spring; compare prices in January."),
    ("Certificates", "List of domains whose certificates are managed manually: none after the migration, hopefully."),
    ("Marathon training reading", "Articles about tapering and long runs saved for later."),
    ("Rust reading list", "The Rustonomicon chapter on ownership and the blog post on non-lexical lifetimes."),
    ("Grafana dashboards", "Dashboards to rebuild after the metrics migration: API latency, queue depth, error budget."),
    ("Dentist insurance", "The insurance covers two cleanings per year; crowns only at 60 percent."),
]


def filler_notes(rng: random.Random, n: int) -> dict[str, tuple[str, str]]:
    out = {}
    for i in range(n):
        month, day = 9 + (i * 7 // 28) % 3, (i * 7) % 28 + 1
        lines = []
        for _ in range(rng.randint(2, 4)):
            who = rng.choice(PEOPLE)
            lines.append(f"- {who} " + rng.choice(ACTIVITIES).format(p=rng.choice(PROJECTS), n=rng.choice(PEOPLE)) + ".")
        lines.append(rng.choice(PERSONAL))
        out[f"f-{i:03d}"] = (f"2026-{month:02d}-{day:02d} standup {i}", "\n".join(lines))
    return out


def long_text(rng: random.Random, topics: list[str], answer: str) -> str:
    paras = []
    for topic in topics:
        sentences = [f"This section covers {topic}."]
        for _ in range(6):
            who = rng.choice(PEOPLE)
            sentences.append(f"{who} " + rng.choice(ACTIVITIES).format(p=rng.choice(PROJECTS), n=rng.choice(PEOPLE)) + ".")
        paras.append(" ".join(sentences))
    paras.append(answer)
    return "\n\n".join(paras)


def build() -> dict[str, int]:
    rng = random.Random(SEED)
    corpus: dict[str, tuple[str, str]] = dict(DOCS)
    for doc_id, (title, topics, answer) in LONG_DOCS.items():
        corpus[doc_id] = (title, long_text(rng, topics, answer))
    for doc_id, (title, turns) in SESSIONS.items():
        corpus[doc_id] = (title, "\n".join(f"[{ts}] {who}: {msg}" for ts, who, msg in turns))
    for i, (title, text) in enumerate(NEAR_MISS):
        corpus[f"m-{i:02d}"] = (title, text)
    corpus.update(filler_notes(rng, 220 - len(corpus)))
    for _qid, _text, _kind, rels in QUERIES:
        assert all(d in corpus for d in rels), rels
    with open(HERE / "corpus.jsonl", "w", encoding="utf-8") as fh:
        for doc_id in sorted(corpus):
            title, text = corpus[doc_id]
            fh.write(json.dumps({"_id": doc_id, "title": title, "text": text}, ensure_ascii=False) + "\n")
    with open(HERE / "queries.jsonl", "w", encoding="utf-8") as fh:
        for qid, text, kind, _rels in QUERIES:
            fh.write(json.dumps({"_id": qid, "text": text, "metadata": {"kind": kind}}, ensure_ascii=False) + "\n")
    (HERE / "qrels").mkdir(exist_ok=True)
    with open(HERE / "qrels" / "test.tsv", "w", encoding="utf-8") as fh:
        fh.write("query-id\tcorpus-id\tscore\n")
        for qid, _text, _kind, rels in QUERIES:
            for doc_id, grade in sorted(rels.items()):
                fh.write(f"{qid}\t{doc_id}\t{grade}\n")
    return {"documents": len(corpus), "queries": len(QUERIES)}


if __name__ == "__main__":
    print(build())
