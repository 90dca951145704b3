"""The reranking route, under llama-server's paths (/rerank, /reranking, /v1/rerank, /v1/reranking) and
Cohere's /v2/rerank. Each document is its own prefill-only engine request (as an embedding input:
batched with generation, chunked, aborted when the client leaves); its score is the classifier head's
first output, llama-server's `relevance_score`.

The reply is llama-server's (Jina's) shape, which Cohere's clients also read: {"id", "model", "object",
"usage", "results": [{"index", "relevance_score", "document"?}]}, best first, `top_n` of them. A body
that names `texts` is TEI's and gets TEI's list: [{"index", "score", "text"?}]."""

from __future__ import annotations

import time
import uuid

import numpy as np
from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ..embeddings.routes import pooled_vectors
from ..generation.submit import CLIENT_CLOSED
from ..http.body import parse_body, read_body
from ..runtime import Runtime, routed, runtime
from .prepare import RankPlan, head_of, plan
from .schemas import RerankRequest


def _scores(rt: Runtime, body: RerankRequest, vectors: list) -> list[float]:
    """Each document's score: the head's first output (TEI's raw_scores false: through a sigmoid
    when that output is a raw logit, as TEI does for a single-label head)."""
    scores = [float(v[0]) for v in vectors]
    if body.raw_scores is False and not head_of(rt).softmax:
        scores = [float(1.0 / (1.0 + np.exp(-s))) for s in scores]
    return scores


def _reply(rt: Runtime, body: RerankRequest, job: RankPlan, scores: list[float]) -> list | dict:
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[: job.top_n]  # stable: ties by index
    with_text = bool(body.return_documents or body.return_text)  # Jina's and Cohere's name, or TEI's
    if job.tei:
        return [{"index": i, "score": scores[i], **({"text": job.documents[i]} if with_text else {})} for i in order]
    results = [{"index": i, "relevance_score": scores[i],
                **({"document": {"text": job.documents[i]}} if with_text else {})} for i in order]
    n = job.prompt_tokens
    return {"id": f"rerank-{uuid.uuid4().hex[:24]}", "model": body.model or rt.model_id, "object": "list",
            "usage": {"prompt_tokens": n, "total_tokens": n}, "results": results}


async def rerank(request: Request) -> Response:
    """Score each document against the query with the served reranker; the best `top_n`, best first."""
    arrived = time.perf_counter()
    raw = await read_body(request, runtime(request).max_body_bytes, curl_without_origin=True)
    async with routed(request, raw) as rt:
        body = await rt.off_loop(parse_body, raw, RerankRequest)
        rt.check_model(body.model)
        job = await rt.off_loop(plan, rt, body)
        vectors = await pooled_vectors(request, rt, job.jobs, arrived, "texts" if job.tei else "documents")
        if vectors is None:
            return Response(status_code=CLIENT_CLOSED)
        return JSONResponse(_reply(rt, body, job, _scores(rt, body, vectors)))
