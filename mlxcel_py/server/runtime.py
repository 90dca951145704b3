"""The server's one state object, `Runtime` (on `app.state.runtime`; no module globals), and
the `runtime(request)` accessor every route uses: the worker and model once loaded, the
vocabulary and prompt limit they imply, metrics, and the draining/failed state."""

from __future__ import annotations

import contextlib
import functools
import logging
import gc
import hashlib
import time
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Optional, TypeVar

import anyio
import anyio.to_thread
from starlette.requests import Request

from .. import __version__
from ..config import DEFAULT_MAX_BODY_BYTES
from ..engine import EngineStats
from ..errors import ConfigError
from ..models.chat_template import ChatTemplate, one_line, probe
from ..tool_calls import ToolFormat, tool_format
from .generation.prompt import PromptLimit, max_token_chars
from .generation.reasoning import ReasoningMarkers, reasoning_markers
from .http.errors import APIError, unavailable
from .http.metrics import ServerMetrics
from .responses.store import ResponseStore

if TYPE_CHECKING:
    from ..config import AppConfig
    from ..engine import EngineWorker
    from ..models import LoadedModel

T = TypeVar("T")
log = logging.getLogger("mlxcel_py.server")
# Threads that parse, template and tokenize request bodies: the event loop never does.
PREPARE_THREADS = 4


class LiveSet(set):  # of Generation (generation/submit.py)
    """The open requests of one engine; `on_empty` (the registry's) runs when the last one ends."""

    on_empty: Optional[Callable[[], None]] = None

    def discard(self, item: Any) -> None:
        super().discard(item)
        if not self and self.on_empty is not None:
            self.on_empty()


class Runtime:
    """What routes need: the worker and model once loaded, metrics, and the serving state."""

    def __init__(self, config: "AppConfig"):
        self.config = config
        self.worker: Optional["EngineWorker"] = None
        self.loaded: Optional["LoadedModel"] = None
        self.metrics = ServerMetrics(self._stats, lambda: self.model_id)
        self.vocab_size = 0
        self.prompt_limit = PromptLimit(1, 1)
        self.tool_format: Optional[ToolFormat] = None
        # What prompts are rendered with: --chat-template*, else the model's own template.
        self.chat_template = config.server.chat_template if config.server else ChatTemplate()
        self.reasoning: Optional[ReasoningMarkers] = None  # the split --reasoning-format asks for, found at attach
        self.thinking_markers: Optional[ReasoningMarkers] = None  # the model's, whatever the format
        self.fingerprint = ""  # system_fingerprint: this build and this model
        self.max_body_bytes = config.server.max_body_bytes if config.server else DEFAULT_MAX_BODY_BYTES
        self.draining = False
        # POST /lora-adapters' scales, one per loaded adapter, for requests that do not name their own (None: the
        # loaded scales)
        self.lora_override: Optional[tuple[float, ...]] = None
        self.failure: Optional[str] = None  # why the engine can no longer serve (a lost distributed rank)
        self.started = int(time.time())
        self.live: LiveSet = LiveSet()  # submitted requests whose response is still open
        self.responses = ResponseStore()  # the Responses API's recent responses (previous_response_id, GET)
        self._limiter: Optional[anyio.CapacityLimiter] = None
        self.routed = False  # one of several models (server/registry): names are matched there
        self.keep_alive: Optional[float] = None  # the latest Ollama keep_alive (routed only); None: --keep-alive

    def _stats(self) -> "EngineStats":
        return self.worker.stats() if self.worker is not None else EngineStats()

    @property
    def ready(self) -> bool:
        """Loaded, and the engine's startup work (the ITL-budget calibration) is done."""
        return self.worker is not None and self.loaded is not None and self.worker.prepared

    @property
    def aliases(self) -> tuple[str, ...]:
        return self.config.server.model_aliases if self.config.server else ()

    @property
    def model_id(self) -> str:
        """The id replies report: the first --alias, else the model's name."""
        return self.aliases[0] if self.aliases else (self.loaded.name if self.loaded else "loading")

    def attach(self, worker: "EngineWorker", loaded: "LoadedModel") -> None:
        """Switch from loading to ready."""
        if self.config.server is not None and self.config.server.rerank and loaded.rank_head is None:
            raise ConfigError(f"--rerank: {loaded.name} is not a reranking model (a GGUF with pooling_type rank "
                              "and a classifier head, cls.output)", flag="--rerank")
        self.vocab_size = loaded.vocab_size
        slot_context = worker.stats().slot_context
        self.prompt_limit = PromptLimit(slot_context, max_token_chars(loaded.tokenizer, self.vocab_size))
        self._check_template(loaded)
        override = self.chat_template.source if self.chat_template.name is None else ""
        is_model = self.chat_template.name is None and self.chat_template.source is None
        self.tool_format = tool_format(loaded.tokenizer, None if is_model else override)  # how this model writes calls
        self.reasoning = self._find_reasoning(loaded)
        self.fingerprint = system_fingerprint(loaded)
        self.worker, self.loaded = worker, loaded
        # The model's objects live as long as the server: out of the collector's way, a request
        # that allocates a million objects does not pay for full collections over them (each
        # one holds the GIL, and with it the event loop, for a quarter of a second).
        gc.freeze()

    def detach(self) -> Optional["EngineWorker"]:
        """Back to the unloaded state (the registry unloads the model); the worker to stop."""
        worker, self.worker, self.loaded = self.worker, None, None
        self.tool_format = self.reasoning = self.thinking_markers = None
        return worker

    def _check_template(self, loaded: "LoadedModel") -> None:
        """A --chat-template is rendered once with the model's special tokens before serving."""
        template = self.chat_template
        if template.name is None and template.source is None:
            return
        try:
            probe(template, loaded.tokenizer)
        except Exception as exc:  # noqa: BLE001 - a template is user code: whatever it raises is the flag's fault
            raise ConfigError(f"{template.origin}: the chat template does not render with this model: "
                              f"{one_line(exc)}", flag=template.origin.split()[0]) from None

    def _find_reasoning(self, loaded: "LoadedModel") -> Optional[ReasoningMarkers]:
        template = self.chat_template
        text = template.source or getattr(loaded.tokenizer, "chat_template", None) or ""
        fmt = self.config.server.reasoning_format if self.config.server else "auto"
        self.thinking_markers = reasoning_markers(loaded.tokenizer, text if isinstance(text, str) else "",
                                                  template.name, "auto")
        markers = None if fmt == "none" else self.thinking_markers
        log.info("reasoning %s", f"{markers.start}...{markers.end} -> reasoning_content ({fmt})" if markers
                 else f"off (format {fmt}{'' if fmt == 'none' else '; the template opens no thinking block'})")
        return markers

    @property
    def thinks(self) -> bool:
        """Whether replies may think: a reasoning model whose thinking --reasoning-budget 0 did not turn off."""
        return self.reasoning is not None and (self.config.server is None or self.config.server.reasoning_budget != 0)

    @property
    def template_text(self) -> str:
        """The chat template in use as /props and /api/show report it: --chat-template's source or
        name, else the model's Jinja template ("" when it has none)."""
        chosen = self.chat_template
        text = chosen.source or chosen.name or getattr(self.loaded.tokenizer, "chat_template", None)
        return text if isinstance(text, str) else ""

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """Run blocking work (parsing, templating, tokenizing) on a bounded thread pool."""
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(PREPARE_THREADS)
        return await anyio.to_thread.run_sync(functools.partial(fn, *args), limiter=self._limiter)

    def cut_all(self, error: APIError) -> int:
        """End every open request from the server's side (the grace period is over)."""
        live = list(self.live)
        for gen in live:
            gen.cut(error)
        return len(live)

    def fail(self, message: str) -> None:
        """The engine is gone for good: /health and every request answer 503 from now on."""
        self.failure = message

    def gate_error(self) -> Optional[APIError]:
        if self.failure is not None:
            return unavailable(self.failure, "engine_error")
        if self.draining:
            return unavailable("the server is shutting down", "server_shutting_down")
        if not self.ready:
            return unavailable("the model is loading; retry shortly", "model_loading")
        return None

    def lora_scales(self) -> tuple[float, ...]:
        """The LoRA scales a request without its own runs at: POST /lora-adapters' else the loaded ones."""
        return self.lora_override or self.loaded.adapter_scales

    def check_model(self, name: Optional[str]) -> None:
        """Any name is accepted, like llama-server with one model: clients hard-code names, and
        replies report the served id. (Kept as the one place to route names when several are served.)"""


def system_fingerprint(loaded: "LoadedModel") -> str:
    """Stable for one build of mlxcel-py serving one model in one form (OpenAI's system_fingerprint)."""
    try:
        mlx_version = version("mlx")  # read from the package metadata: the server never imports MLX
    except PackageNotFoundError:
        mlx_version = "?"
    ident = "|".join((__version__, mlx_version, loaded.name, loaded.source, loaded.weights, loaded.description))
    return "fp_" + hashlib.sha256(ident.encode()).hexdigest()[:12]


def runtime(request: Request) -> Runtime:
    """The app's Runtime: what every route reads its state from (with several models, the first's;
    routes that serve a model get theirs from `routed`)."""
    return request.app.state.runtime


def serving(app: Any) -> Any:
    """What the Gate, /health and the shutdown read: the registry with several models, else the Runtime."""
    return app.state.registry or app.state.runtime


def model_field(raw: bytes, keys: tuple[str, ...] = ("model",)) -> Optional[str]:
    """The model a JSON body names (the first of `keys` set); None when it names none (blocking)."""
    from .http.body import json_object

    body = json_object(raw)
    return next((body[k] for k in keys if isinstance(body.get(k), str) and body[k]), None)


@contextlib.asynccontextmanager
async def routed(request: Request, raw: Optional[bytes] = None, keys: tuple[str, ...] = ("model",),
                 name: Optional[str] = None) -> AsyncIterator[Runtime]:
    """The Runtime of the model the request names (in its body `raw`, or `name`): with one model
    the one Runtime, whatever the name; with several the registry's, loaded first if it is not
    resident, and held (never unloaded) until the block ends."""
    registry = request.app.state.registry
    if registry is None:
        yield runtime(request)
        return
    if name is None and raw is not None:
        name = await registry.off_loop(model_field, raw, keys)
    rt = await registry.acquire(name)
    try:
        yield rt
    finally:
        registry.release(rt)
