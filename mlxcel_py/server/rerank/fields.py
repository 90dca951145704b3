"""What the reranking route does with each field of its body (docs/RERANK.md's table, checked by
tests/test_rerank.py): every declared field is honoured; any other is a 400 naming it."""

from __future__ import annotations

FIELDS: dict[str, dict[str, str]] = {
    "/v1/rerank": dict.fromkeys(("query", "documents", "texts", "model", "top_n", "return_documents", "return_text",
                                 "max_tokens_per_doc", "truncate", "truncation_direction", "raw_scores"), "honoured"),
}
