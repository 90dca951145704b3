"""The embedding routes. Each input is its own prefill-only engine request, submitted together
(fanout's group), so embeddings share the scheduler with generation: chunked, with prompt
progress, aborted when the client leaves."""

from __future__ import annotations

import time
from typing import Optional, Sequence

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ...engine import Embedding
from ...engine import Request as EngineRequest
from ...errors import ConfigError, FieldError, RequestError
from ...serve_models import parse_keep_alive
from ..generation.fanout import GenerationGroup, collect_all, submit_all
from ..generation.submit import CLIENT_CLOSED
from ..http.body import parse_body, read_body
from ..runtime import Runtime, routed, runtime
from .prepare import EmbedPlan, input_ids, plan
from .schemas import EmbeddingRequest, NativeEmbeddingRequest, OllamaEmbeddingsRequest, OllamaEmbedRequest
from .vectors import encoded, normalize


async def pooled_vectors(request: Request, rt: Runtime, jobs: Sequence[EngineRequest], arrived: float, param: str
                         ) -> Optional[list]:
    """Every job's pooled vector, in order; None if the client left. The jobs are submitted in
    waves of half the waiting queue, so a big batch neither fills the queue nor is refused for it."""
    wave = max(1, rt.config.engine.max_queue // 2)
    out: list = []
    for start in range(0, len(jobs), wave):
        members = await submit_all(request, rt, jobs[start:start + wave], arrived, param)
        if members is None:
            return None
        replies = await collect_all(request.receive, GenerationGroup(members))
        if replies is None:
            return None
        out += [next(e.vector for e in r.events if isinstance(e, Embedding)) for r in replies]
    return out


async def _raw(request: Request, curl: bool = False) -> bytes:
    return await read_body(request, runtime(request).max_body_bytes, curl_without_origin=curl)


async def _body(rt: Runtime, raw: bytes, schema):
    body = await rt.off_loop(parse_body, raw, schema)
    rt.check_model(getattr(body, "model", None))
    if rt.routed and hasattr(body, "keep_alive"):  # Ollama's bodies, one of several models: honoured
        try:
            rt.keep_alive = None if body.keep_alive is None else parse_keep_alive(body.keep_alive, "keep_alive")
        except ConfigError as exc:
            raise FieldError(str(exc), param="keep_alive") from None
    return body


def _one_vector_each(job: EmbedPlan, route: str, advice: str = "") -> EmbedPlan:
    """`job`, unless its pooling is "none", whose one vector per token `route` cannot return."""
    if job.pooling == "none":
        raise RequestError(f"pooling 'none' gives one vector per token, which {route} cannot return{advice}",
                           code="invalid_pooling")
    return job


def _openai_plan(rt: Runtime, body: EmbeddingRequest) -> EmbedPlan:
    if body.dimensions is not None:
        raise FieldError("dimensions is not supported: this model's embeddings have one width", param="dimensions")
    return _one_vector_each(plan(rt, input_ids(body.input, rt, "input")), "/v1/embeddings",
                            "; use /embedding, or serve with --pooling mean|cls|last")


async def openai_embeddings(request: Request) -> Response:
    """OpenAI's embeddings: one L2-normalised vector per input, as float lists or base64."""
    arrived, raw = time.perf_counter(), await _raw(request)
    async with routed(request, raw) as rt:
        return await _openai_reply(request, rt, await _body(rt, raw, EmbeddingRequest), arrived)


async def _openai_reply(request: Request, rt: Runtime, body: EmbeddingRequest, arrived: float) -> Response:
    job = await rt.off_loop(_openai_plan, rt, body)
    vectors = await pooled_vectors(request, rt, job.jobs, arrived, "input")
    if vectors is None:
        return Response(status_code=CLIENT_CLOSED)
    fmt = body.encoding_format or "float"
    data = [{"object": "embedding", "index": i, "embedding": encoded(normalize(v, 2), fmt)}
            for i, v in enumerate(vectors)]
    n = job.prompt_tokens
    return JSONResponse({"object": "list", "data": data, "model": rt.model_id,
                         "usage": {"prompt_tokens": n, "total_tokens": n}})


def _native_plan(rt: Runtime, body: NativeEmbeddingRequest) -> EmbedPlan:
    value, param = (body.input, "input") if body.input is not None else (body.content, "content")
    if value is None:
        raise FieldError('"input" or "content" must be provided', param="input")
    return plan(rt, input_ids(value, rt, param))


async def native_embedding(request: Request) -> Response:
    """llama-server's /embedding: [{"index", "embedding": [[...]]}], one row per input (one per
    token with --pooling none), normalised by `embd_normalize` (default 2, L2)."""
    arrived, raw = time.perf_counter(), await _raw(request, curl=True)
    async with routed(request, raw) as rt:
        return await _native_reply(request, rt, await _body(rt, raw, NativeEmbeddingRequest), arrived)


async def _native_reply(request: Request, rt: Runtime, body: NativeEmbeddingRequest, arrived: float) -> Response:
    job = await rt.off_loop(_native_plan, rt, body)
    vectors = await pooled_vectors(request, rt, job.jobs, arrived, "input" if body.input is not None else "content")
    if vectors is None:
        return Response(status_code=CLIENT_CLOSED)
    norm = 2 if body.embd_normalize is None else body.embd_normalize
    rows = [normalize(v, norm).reshape(-1, v.shape[-1]).tolist() for v in vectors]
    return JSONResponse([{"index": i, "embedding": r} for i, r in enumerate(rows)])


def _ollama_plan(rt: Runtime, body: OllamaEmbedRequest) -> Optional[EmbedPlan]:
    if body.dimensions is not None:
        raise FieldError("dimensions is not supported: this model's embeddings have one width", param="dimensions")
    if body.options:
        raise FieldError(f"options {', '.join(sorted(body.options))} do not apply to embeddings", param="options")
    inputs = [body.input] if isinstance(body.input, str) else body.input
    inputs = [text for text in inputs if text]  # Ollama skips empty inputs
    if not inputs:
        return None
    job = plan(rt, input_ids(inputs, rt, "input", truncate=body.truncate is not False))
    return _one_vector_each(job, "/api/embed", "; serve with --pooling mean|cls|last")


async def ollama_embed(request: Request) -> Response:
    """Ollama's /api/embed: {"model", "embeddings": [[...]], durations, "prompt_eval_count"}, L2-normalised."""
    arrived, raw = time.perf_counter(), await _raw(request, curl=True)
    async with routed(request, raw) as rt:
        return await _ollama_reply(request, rt, await _body(rt, raw, OllamaEmbedRequest), arrived)


async def _ollama_reply(request: Request, rt: Runtime, body: OllamaEmbedRequest, arrived: float) -> Response:
    job = await rt.off_loop(_ollama_plan, rt, body)
    vectors = [] if job is None else await pooled_vectors(request, rt, job.jobs, arrived, "input")
    if vectors is None:
        return Response(status_code=CLIENT_CLOSED)
    return JSONResponse({
        "model": body.model or rt.model_id, "embeddings": [normalize(v, 2).tolist() for v in vectors],
        "total_duration": int((time.perf_counter() - arrived) * 1e9), "load_duration": 0,
        "prompt_eval_count": job.prompt_tokens if job is not None else 0,
    })


async def ollama_embeddings(request: Request) -> Response:
    """Ollama's older /api/embeddings: {"embedding": [...]} for one `prompt`, not normalised (as Ollama)."""
    arrived, raw = time.perf_counter(), await _raw(request, curl=True)
    async with routed(request, raw) as rt:
        return await _ollama_older_reply(request, rt, await _body(rt, raw, OllamaEmbeddingsRequest), arrived)


async def _ollama_older_reply(request: Request, rt: Runtime, body: OllamaEmbeddingsRequest, arrived: float
                              ) -> Response:
    if body.options:
        raise FieldError(f"options {', '.join(sorted(body.options))} do not apply to embeddings", param="options")
    if not body.prompt:
        return JSONResponse({"embedding": []})
    job = await rt.off_loop(lambda: plan(rt, input_ids(body.prompt, rt, "prompt", truncate=True)))
    job = _one_vector_each(job, "/api/embeddings")
    vectors = await pooled_vectors(request, rt, job.jobs, arrived, "prompt")
    if vectors is None:
        return Response(status_code=CLIENT_CLOSED)
    return JSONResponse({"embedding": vectors[0].astype(float).tolist()})
