"""The reranking body (what /openapi.json publishes): llama-server's fields, Jina's and Cohere's
(`documents`, `top_n`, `return_documents`, `max_tokens_per_doc`) and TEI's (`texts`, `return_text`,
`raw_scores`, `truncate`, `truncation_direction`). Closed: any other field is a 400 naming it."""

from __future__ import annotations

from typing import Literal, Optional, Union

from ..generation.schemas import ClosedBody


class TextDocument(ClosedBody):
    """A document as an object (Jina's and Cohere v1's form)."""

    text: str


Document = Union[str, TextDocument]


class RerankRequest(ClosedBody):
    """POST /rerank, /v1/rerank, /v2/rerank (and /reranking, /v1/reranking)."""

    query: str
    documents: Optional[list[Document]] = None
    texts: Optional[list[str]] = None  # TEI's name for the documents: the reply is TEI's list
    model: Optional[str] = None
    top_n: Optional[int] = None  # the best n, highest score first (default: every document)
    return_documents: Optional[bool] = None  # each result carries {"document": {"text"}} (Jina, Cohere)
    max_tokens_per_doc: Optional[int] = None  # Cohere: longer documents are cut to this many tokens
    return_text: Optional[bool] = None  # TEI: each result carries "text"
    raw_scores: Optional[bool] = None  # TEI: false squashes a single-logit head's score with a sigmoid
    truncate: Optional[bool] = None  # TEI: cut a document that does not fit a slot instead of refusing it
    truncation_direction: Optional[Literal["Right", "Left"]] = None  # TEI: which end of the document is cut
