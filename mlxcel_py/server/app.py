"""The FastAPI app: `create_app` and the one route table, read top to bottom.

Every path appears once, so which route owns it never depends on an include order
(llama-server's `/completions` is its own /completion, not OpenAI's /v1/completions).
All state lives on `app.state.runtime` (runtime.py) and, with several models, on
`app.state.registry` (registry/: one Runtime per model); no module globals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

from fastapi import FastAPI
from pydantic import BaseModel

from .anthropic.routes import messages, messages_count_tokens
from .anthropic.schemas import CountTokensRequest, MessagesRequest
from .embeddings.routes import native_embedding, ollama_embed, ollama_embeddings, openai_embeddings
from .embeddings.schemas import EmbeddingRequest, NativeEmbeddingRequest, OllamaEmbeddingsRequest, OllamaEmbedRequest
from .rerank.routes import rerank
from .rerank.schemas import RerankRequest
from .http.auth import Gate
from .http.cors import Cors, cors_options
from .http.errors import CatchBugs, install_error_handlers
from .http.openapi import install_openapi
from .http.status import health, metrics, slots
from .llama.routes import (
    apply_template, completion, detokenize, infill, lora_adapters, props, set_lora_adapters, tokenize,
)
from .llama.slots import slot_action
from .llama.schemas import (
    ApplyTemplateRequest, DetokenizeRequest, InfillRequest, NativeCompletionRequest, TokenizeRequest,
)
from .ollama.routes import chat, generate, manage_models, ps, show, tags, version
from .ollama.schemas import OllamaChatRequest, OllamaGenerateRequest, OllamaShowRequest
from .openai.routes import chat_completions, completions, models
from .openai.schemas import ChatRequest, CompletionRequest
from .responses.routes import create_response, delete_response, retrieve_response
from .responses.schemas import ResponsesRequest
from .registry import ModelNameRequest, ModelRegistry, load_model_route, unload_model_route, while_loading
from .runtime import Runtime, serving
from .webui import WebUIDoor

if TYPE_CHECKING:
    from ..config import AppConfig
    from ..engine import EngineWorker
    from ..models import LoadedModel


@dataclass(frozen=True, slots=True)
class Route:
    """One path of the API. `body`: the JSON body the route parses itself (off the event loop,
    so FastAPI never sees it; /openapi.json publishes it). `alias`: kept out of /openapi.json."""

    method: str
    path: str
    endpoint: Callable[..., Any]
    body: Optional[type[BaseModel]] = None
    streams: bool = False  # with `stream: true` the reply is server-sent events (Ollama's: NDJSON)
    alias: bool = False
    refuses: bool = False  # may answer 501 with what to do instead (always, or until a flag enables it)


ROUTES: tuple[Route, ...] = (
    # OpenAI
    Route("POST", "/v1/chat/completions", chat_completions, ChatRequest, streams=True),
    Route("POST", "/chat/completions", chat_completions, alias=True),
    Route("POST", "/v1/completions", completions, CompletionRequest, streams=True),
    Route("POST", "/v1/embeddings", openai_embeddings, EmbeddingRequest),
    Route("GET", "/v1/models", models),
    Route("GET", "/models", models, alias=True),
    # OpenAI Responses (stateless, plus the recent responses kept in memory: responses/store.py)
    Route("POST", "/v1/responses", create_response, ResponsesRequest, streams=True),
    Route("POST", "/responses", create_response, alias=True),
    Route("GET", "/v1/responses/{response_id}", retrieve_response),
    Route("DELETE", "/v1/responses/{response_id}", delete_response),
    # llama-server's own; its /completions is /completion, as in llama-server
    Route("POST", "/completion", completion, NativeCompletionRequest, streams=True),
    Route("POST", "/completions", completion, alias=True),
    Route("POST", "/infill", infill, InfillRequest, streams=True),
    Route("GET", "/props", props),
    Route("GET", "/lora-adapters", lora_adapters),
    Route("POST", "/lora-adapters", set_lora_adapters),
    Route("POST", "/apply-template", apply_template, ApplyTemplateRequest),
    Route("POST", "/tokenize", tokenize, TokenizeRequest),
    Route("POST", "/detokenize", detokenize, DetokenizeRequest),
    Route("POST", "/embedding", native_embedding, NativeEmbeddingRequest),
    Route("POST", "/embeddings", native_embedding, alias=True),
    # llama-server's reranking (Jina's and Cohere's shapes, TEI's with `texts`); 501 unless a reranker is served
    Route("POST", "/v1/rerank", rerank, RerankRequest, refuses=True),
    Route("POST", "/rerank", rerank, alias=True),
    Route("POST", "/reranking", rerank, alias=True),
    Route("POST", "/v1/reranking", rerank, alias=True),
    Route("POST", "/v2/rerank", rerank, alias=True),
    # Anthropic's Messages API (its errors in Anthropic's shape: http/errors.py)
    Route("POST", "/v1/messages", messages, MessagesRequest, streams=True),
    Route("POST", "/v1/messages/count_tokens", messages_count_tokens, CountTokensRequest),
    # Ollama's native API (its errors in Ollama's shape; streams are NDJSON, by default)
    Route("POST", "/api/chat", chat, OllamaChatRequest, streams=True),
    Route("POST", "/api/generate", generate, OllamaGenerateRequest, streams=True),
    Route("GET", "/api/tags", tags),
    Route("POST", "/api/show", show, OllamaShowRequest),
    Route("GET", "/api/ps", ps),
    Route("GET", "/api/version", version),
    Route("POST", "/api/pull", manage_models, refuses=True),
    Route("POST", "/api/push", manage_models, refuses=True),
    Route("POST", "/api/create", manage_models, refuses=True),
    Route("POST", "/api/copy", manage_models, refuses=True),
    Route("DELETE", "/api/delete", manage_models, refuses=True),
    Route("POST", "/api/embed", ollama_embed, OllamaEmbedRequest),
    Route("POST", "/api/embeddings", ollama_embeddings, OllamaEmbeddingsRequest),
    # the server's own state, whatever the dialect
    Route("GET", "/health", health),
    Route("GET", "/v1/health", health, alias=True),
    Route("GET", "/metrics", metrics),
    Route("GET", "/slots", slots),
    # llama-server's router routes: several models (--models-dir, -m twice) loaded and unloaded on demand
    Route("POST", "/models/load", load_model_route, ModelNameRequest),
    Route("POST", "/models/unload", unload_model_route, ModelNameRequest),
    # llama-server's ?action=save|restore|erase; a 501 without --slot-save-path, as llama-server
    Route("POST", "/slots/{id_slot}", slot_action, refuses=True),
)


def create_app(
    worker: Optional["EngineWorker"], loaded: Optional["LoadedModel"], config: "AppConfig"
) -> FastAPI:
    """The app serving ROUTES. With worker/loaded None it starts in the loading state
    (/health answers 503, everything else 503) until `app.state.runtime.attach(...)`."""
    app = FastAPI(title="mlxcel-py", docs_url=None, redoc_url=None, openapi_url=None)
    state = Runtime(config)
    if worker is not None and loaded is not None:
        state.attach(worker, loaded)
    app.state.runtime = state
    app.state.registry = ModelRegistry(config, state) if config.router is not None else None
    install_error_handlers(app)
    streamed = {r.endpoint for r in ROUTES if r.streams}
    for route in ROUTES:
        # With several models a stream whose model must load first starts at once (registry/loading.py).
        endpoint = while_loading(route.endpoint) if route.endpoint in streamed and config.router else route.endpoint
        app.add_api_route(route.path, endpoint, methods=[route.method], include_in_schema=not route.alias)
    api_key = config.server.api_key if config.server else None
    bodies = {r.path: r.body for r in ROUTES if r.body is not None}
    install_openapi(app, api_key is not None, bodies, tuple(r.path for r in ROUTES if r.streams),
                    tuple(r.path for r in ROUTES if r.refuses))
    # The last added runs first: CORS (preflights, headers on every answer), bugs -> 500, the page, the gate.
    app.add_middleware(Gate, api_key=api_key, state=lambda: serving(app))
    if config.server is None or config.server.webui:
        app.add_middleware(WebUIDoor)  # the chat page, ahead of the gate: the page asks for the key itself
    app.add_middleware(CatchBugs)
    app.add_middleware(Cors, **cors_options(config.server.cors_origins if config.server else ()))
    return app
