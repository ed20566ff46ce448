"""A common word's hit list is cut at the pool size: a document found through a rare word that also
holds the common ones keeps their evidence (at the cut's score), so it is not outranked by documents
holding only the common words."""

from __future__ import annotations

from memory_pipeline.search.fulltext import TextLeg


def _row(cid: str, doc: str, text: str) -> dict:
    return {"chunk_id": cid, "doc_id": doc, "text": text}


def test_truncated_terms_are_credited_at_the_cut_to_chunks_that_hold_them():
    leg = TextLeg()
    common = [_row(f"c{i}", f"d{i}", "code word") for i in range(1, 4)]
    # "code" and "word" lists were cut (3 rows = the limit): their lowest scores are the floors.
    for term, score in (("code", 8.0), ("word", 8.5)):
        leg.presence[term] = lambda folded, t=term: t in folded.split()
        leg.add(term, [dict(r, _score=score) for r in common], score, floor=score)
    leg.presence["kestrel0zq"] = lambda folded: "kestrel0zq" in folded.split()
    leg.add("kestrel0zq", [dict(_row("c0", "d0", "code word kestrel0zq"), _score=12.0)], 12.0, floor=0.0)
    assert leg.coverage("d0") < leg.coverage("d1")  # before: the rare word's document looks worse

    leg.fill_truncated(lambda r: r["text"].lower())
    assert leg.doc_terms("d0") == {"kestrel0zq": 12.0, "code": 8.0, "word": 8.5}
    assert leg.strength("d0") == 1.0 and leg.coverage("d0") == 1.0
    assert leg.strength("d0") * leg.coverage("d0") > leg.strength("d1") * leg.coverage("d1")
    # A chunk without the word gets nothing for it.
    leg2 = TextLeg()
    leg2.presence["code"] = lambda folded: "code" in folded.split()
    leg2.add("code", [dict(_row("c1", "d1", "code"), _score=8.0)], 8.0, floor=8.0)
    leg2.presence["rare"] = lambda folded: "rare" in folded.split()
    leg2.add("rare", [dict(_row("c9", "d9", "rare only"), _score=11.0)], 11.0, floor=0.0)
    leg2.fill_truncated(lambda r: r["text"].lower())
    assert leg2.doc_terms("d9") == {"rare": 11.0}
