"""A reranking body -> engine requests: one prefill-only request per document, its prompt the query
and the document as llama-server writes them (models/ranking.py), fitted to a slot. Blocking: runs
off the event loop."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from ...engine import Request as EngineRequest
from ...engine import SamplingParams
from ...errors import FieldError
from ...models import encode_text
from ...models.ranking import RankHead
from ..http.errors import APIError
from .schemas import RerankRequest

if TYPE_CHECKING:
    from ...models import LoadedModel
    from ..runtime import Runtime

MAX_DOCUMENTS = 1000  # Cohere's limit per request


@dataclass(frozen=True, slots=True)
class RankPlan:
    """The engine requests of one body, one per document, in order, and what the reply needs."""

    jobs: tuple[EngineRequest, ...]
    documents: tuple[str, ...]
    top_n: int
    tei: bool  # the body named `texts`: the reply is TEI's list

    @property
    def prompt_tokens(self) -> int:
        return sum(len(job.prompt_ids) for job in self.jobs)


def head_of(rt: "Runtime") -> RankHead:
    """The served model's classifier head; llama-server's 501 for a model that is no reranker."""
    head = rt.loaded.rank_head
    if head is None:
        raise APIError(501, f"This server does not support reranking: {rt.model_id} is not a reranking model "
                            "(a GGUF with pooling_type rank and a classifier head); serve one with `--rerank`",
                       code="not_supported_error")
    return head


def _documents(body: RerankRequest) -> tuple[list[str], str]:
    if body.documents is not None and body.texts is not None:
        raise FieldError("send the documents as `documents` or as `texts` (TEI's name), not both", param="texts")
    param = "texts" if body.texts is not None else "documents"
    items = body.texts if body.texts is not None else body.documents
    if not items:
        raise FieldError(f'"{param}" must be a non-empty array of strings', param=param)
    if len(items) > MAX_DOCUMENTS:
        raise FieldError(f"{param} has {len(items)} documents; at most {MAX_DOCUMENTS} per request", param=param)
    return [d if isinstance(d, str) else d.text for d in items], param


def _positive(value: Optional[int], param: str) -> None:
    if value is not None and value < 1:
        raise FieldError(f"{param} must be at least 1 (got {value})", param=param)


def _joined(loaded: "LoadedModel", head: RankHead, query: list[int], doc: list[int]) -> list[int]:
    """llama-server's pair without a template: [BOS] query [EOS] [SEP] document [EOS]."""
    eos = loaded.appended_eos  # the eos the vocabulary's add_eos_token appends
    ids = [loaded.bos_token_id] if loaded.add_bos and loaded.bos_token_id is not None else []
    ids += query + ([eos] if eos is not None else [])
    ids += [head.sep_token_id] if head.add_sep and head.sep_token_id is not None else []
    return ids + doc + ([eos] if eos is not None else [])


def _encode(loaded: "LoadedModel", text: str) -> list[int]:
    return list(encode_text(loaded.tokenizer, text, add_special_tokens=False))


def pair_ids(loaded: "LoadedModel", head: RankHead, query: str, doc: str, doc_limit: Optional[int] = None,
             keep_start: bool = True) -> list[int]:
    """The prompt of one (query, document) pair. Whole, it is tokenized as one text, as llama-server
    does; a document longer than `doc_limit` tokens is tokenized apart and cut (its start kept, or
    its end), the template's text around it tokenized on its own."""
    doc_ids = _encode(loaded, doc) if doc_limit is not None else None
    if doc_ids is None or len(doc_ids) <= doc_limit:
        if head.template is not None:
            return _encode(loaded, head.prompt(query, doc))
        return _joined(loaded, head, _encode(loaded, query), _encode(loaded, doc))
    doc_ids = doc_ids[:doc_limit] if keep_start else doc_ids[len(doc_ids) - doc_limit:]
    if head.template is None:
        return _joined(loaded, head, _encode(loaded, query), doc_ids)
    before, _, after = head.template.partition("{document}")
    return (_encode(loaded, before.replace("{query}", query)) + doc_ids
            + _encode(loaded, after.replace("{query}", query)))


def _fitted(rt: "Runtime", head: RankHead, query: str, doc: str, label: str, param: str, body: RerankRequest
            ) -> list[int]:
    fits = rt.prompt_limit.slot_context - 1  # what the engine admits
    keep_start = body.truncation_direction != "Left"
    ids = pair_ids(rt.loaded, head, query, doc, body.max_tokens_per_doc, keep_start)
    if len(ids) <= fits:
        return ids
    if not body.truncate:
        raise FieldError(f"{label} with the query is {len(ids)} tokens, but a slot's context holds {fits}; "
                         "shorten it, raise --ctx-size, or send max_tokens_per_doc or truncate", param=param)
    overhead = len(pair_ids(rt.loaded, head, query, "", 0))
    room = fits - overhead
    if room < 1:
        raise FieldError(f"the query alone is {overhead} tokens with the prompt around it, but a slot's context "
                         f"holds {fits}; shorten it or raise --ctx-size", param="query")
    while room >= 1:  # tokens at the cut can merge differently: step down until the pair fits
        ids = pair_ids(rt.loaded, head, query, doc, room, keep_start)
        if len(ids) <= fits:
            return ids
        room -= len(ids) - fits
    raise FieldError(f"{label} cannot be cut to fit a slot's context of {fits} tokens", param=param)


def plan(rt: "Runtime", body: RerankRequest) -> RankPlan:
    """One prefill-only engine request per document (pooling "rank": the head's outputs)."""
    head = head_of(rt)
    documents, param = _documents(body)
    if not body.query:
        raise FieldError("query must not be empty", param="query")
    _positive(body.top_n, "top_n")
    _positive(body.max_tokens_per_doc, "max_tokens_per_doc")
    if body.truncation_direction is not None and not body.truncate:
        raise FieldError("truncation_direction applies only with truncate: true", param="truncation_direction")
    base = f"rank-{uuid.uuid4().hex[:24]}"
    jobs = []
    for i, doc in enumerate(documents):
        label = f"{param}[{i}]"
        if not body.truncate and body.max_tokens_per_doc is None:
            rt.prompt_limit.check_chars(len(body.query) + len(doc), param)
        ids = _fitted(rt, head, body.query, doc, label, param, body)
        jobs.append(EngineRequest(f"{base}-{i}", tuple(ids), SamplingParams(max_tokens=1), cache_prompt=False,
                                  pooling="rank", whole_prompt=not rt.loaded.causal))
    top_n = len(documents) if body.top_n is None else min(body.top_n, len(documents))
    return RankPlan(tuple(jobs), tuple(documents), top_n, body.texts is not None)
