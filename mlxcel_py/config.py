"""The one resolver: command-line flags and the environment -> frozen config records.

Nothing below the CLI reads `os.environ` or sees a Typer object; it gets an `AppConfig`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field
from typing import Literal, Mapping, Optional

from .engine.chunking.fixed import PrefillChunkPolicy
from .engine.core.drafting import DraftConfig
from .engine.core.request import MAX_TOKENS_LIMIT, SamplingParams
from .config_chunk import (
    ResolvedChunk, _count_flag, _itl_budget, prefill_chunk_override, resolve_prefill_chunk_size,
)
from .config_values import check_range, choice, drafting_config, env_bool, flag_or_env
from .errors import ConfigError, RequestError
from .models.loader import CPU_WEIGHTS
from .serve_models import RouterConfig, models_config
from .serve_config import (
    DEFAULT_MAX_BODY_BYTES, DistributedConfig, ServerConfig, distributed_config, server_config, server_summary,
)

__all__ = ["DEFAULT_MAX_BODY_BYTES", "AppConfig", "DistributedConfig", "ResolvedChunk", "ServerConfig", "prefill_chunk_override",
           "resolve", "resolve_prefill_chunk_size", "startup_summary"]

log = logging.getLogger("mlxcel_py.config")

Command = Literal["serve", "run", "generate", "bench"]
MAX_PREFILL_CHUNK = 1_048_576
MAX_PARALLEL = 64
MAX_THREADS = 1024
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
KV_CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0")  # llama-server's --cache-type-k/-v names we store
DEFAULT_CACHE_RAM_MIB = 8192  # llama-server's --cache-ram default
NO_LIMIT = 1 << 62  # --cache-ram -1
_SERVER_COMMANDS = ("serve", "bench")
_SAMPLING_FLAGS = {
    "temperature": "--temp",
    "top_p": "--top-p",
    "top_k": "--top-k",
    "min_p": "--min-p",
    "repetition_penalty": "--repeat-penalty",
    "seed": "--seed",
    "max_tokens": "--max-tokens",
}
# llama-server's sampling defaults for serve/bench; run and generate are greedy.
_SERVER_SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repetition_penalty": 1.0}
_GREEDY_SAMPLING = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0}
_DEFAULT_MAX_TOKENS = {"serve": MAX_TOKENS_LIMIT, "bench": MAX_TOKENS_LIMIT, "run": 4096, "generate": 256}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    path: Optional[str] = None  # None = the embedded default model
    threads: Optional[int] = None  # CPU compute threads (decode kernels, OpenBLAS); None = every core
    cpu_weights: Optional[str] = None  # "native" (GGUF blocks) | "f32"; None: native on AVX2 (loader.default_cpu_weights)
    draft: Optional[str] = None  # --draft-model: speculative decoding's draft (same vocabulary)


@dataclass(frozen=True, slots=True)
class PromptCacheConfig:
    enabled: bool = True
    max_bytes: int = DEFAULT_CACHE_RAM_MIB << 20
    max_entries: int = 16
    min_prefix: int = 32


@dataclass(frozen=True, slots=True)
class EngineConfig:
    policy: PrefillChunkPolicy
    num_slots: int
    ctx_size: Optional[int]  # total KV tokens over all slots; None = each slot gets the model's max context
    max_queue: int = 64
    prompt_cache: PromptCacheConfig = field(default_factory=PromptCacheConfig)
    itl_budget_ms: Optional[int] = None  # choose the chunk per tick by time (engine/chunking/budget.py)
    drafting: DraftConfig = field(default_factory=DraftConfig)  # prompt lookup (--lookup-ngram); off by default
    context_shift: bool = False  # a full slot shifts its KV instead of ending the reply (--context-shift)
    kv_type_k: Optional[str] = None  # --cache-type-k (engine/runner/kv.py); None: the model's dtype
    kv_type_v: Optional[str] = None  # --cache-type-v


@dataclass(frozen=True, slots=True)
class AppConfig:
    command: str
    model: ModelSpec
    engine: EngineConfig
    sampling: SamplingParams  # defaults for requests that omit a field
    chunk: ResolvedChunk
    blas: str = "auto"  # "auto" | "off" | a library path (MLXCEL_BLAS)
    server: Optional[ServerConfig] = None
    distributed: Optional[DistributedConfig] = None  # None: one process, mx.distributed untouched
    router: Optional[RouterConfig] = None  # several models (serve_models.py); None: the one model


def _sampling(command: str, given: dict[str, object]) -> SamplingParams:
    if given["max_tokens"] is not None and given["max_tokens"] < 1:  # type: ignore[operator]
        raise ConfigError(f"--max-tokens must be at least 1 (got {given['max_tokens']})", flag="--max-tokens")
    values = dict(_SERVER_SAMPLING if command in _SERVER_COMMANDS else _GREEDY_SAMPLING)
    values["max_tokens"] = _DEFAULT_MAX_TOKENS[command]
    values.update({k: v for k, v in given.items() if v is not None})
    try:
        return SamplingParams(**values)  # type: ignore[arg-type]
    except RequestError as exc:  # the message starts with the field's name: say the flag instead
        flag = _SAMPLING_FLAGS.get(exc.param or "", exc.param)
        message = str(exc)
        if exc.param and flag and message.startswith(exc.param + " "):
            message = flag + message[len(exc.param) :]
        raise ConfigError(message, flag=flag) from None


def _engine(command: str, env: Mapping[str, str], chunk: ResolvedChunk, parallel: Optional[int],
            ctx_size: Optional[int], max_queue: Optional[int], cache: PromptCacheConfig,
            itl_budget_ms: Optional[int] = None) -> EngineConfig:
    serving = command in _SERVER_COMMANDS
    if not serving and parallel is not None and parallel > 1:
        raise ConfigError(f"--parallel applies to serve and bench; {command} uses one slot (got {parallel})",
                          flag="--parallel")
    parallel_label, ctx_label = "--parallel", "--ctx-size"
    if serving:  # llama-server's environment variables
        parallel, parallel_label = _count_flag(parallel, "--parallel", env, "LLAMA_ARG_N_PARALLEL")
        ctx_size, ctx_label = _count_flag(ctx_size, "--ctx-size", env, "LLAMA_ARG_CTX_SIZE")
    check_range(parallel_label, parallel, 1, MAX_PARALLEL)
    check_range(ctx_label, ctx_size, 64)
    check_range("--max-queue", max_queue, 1)
    chunk_label = "--prefill-chunk-size" if chunk.source == "default" else chunk.source
    check_range(chunk_label, chunk.explicit, 0, MAX_PREFILL_CHUNK)
    slots = (4 if parallel is None else parallel) if serving else 1
    queue = 64 if max_queue is None else max_queue
    return EngineConfig(PrefillChunkPolicy.resolve(chunk.explicit), slots, ctx_size, queue, cache, itl_budget_ms)


def _prompt_cache(enabled: bool, max_bytes, max_entries, min_prefix, env: Mapping[str, str],
                  cache_ram: Optional[int] = None) -> PromptCacheConfig:
    given = {"max_bytes": max_bytes, "max_entries": max_entries, "min_prefix": min_prefix}
    for name, value in given.items():
        check_range("--cache-" + name.replace("_", "-"), value, 0)
    ram, label = flag_or_env(cache_ram, "--cache-ram", env, "LLAMA_ARG_CACHE_RAM", parse=_mib)
    if ram is not None:
        if max_bytes is not None:
            raise ConfigError(f"{label} and --cache-max-bytes both cap the prompt cache; give one", flag=label)
        check_range(label, ram, -1)
        enabled = enabled and ram != 0  # llama-server's 0: the prompt cache is off
        given["max_bytes"] = NO_LIMIT if ram == -1 else ram << 20
    return PromptCacheConfig(enabled, **{k: v for k, v in given.items() if v is not None})


def _mib(raw: str, name: str) -> int:
    """--cache-ram's variable: MiB, or -1 for no limit."""
    text = raw.strip()
    if text.lstrip("-").isdigit() and text.count("-") <= 1 and not text.endswith("-"):
        return int(text)
    raise ConfigError(f"{name} must be an integer number of MiB (-1: no limit, 0: off) (got {raw!r})", flag=name)


def _kv_types(env: Mapping[str, str], type_k: Optional[str], type_v: Optional[str]) -> tuple[Optional[str], ...]:
    """--cache-type-k / --cache-type-v (llama-server's names and variables); None keeps the model's dtype."""
    return tuple(choice(value, flag, env, name, KV_CACHE_TYPES, None) for value, flag, name in (
        (type_k, "--cache-type-k", "LLAMA_ARG_CACHE_TYPE_K"), (type_v, "--cache-type-v", "LLAMA_ARG_CACHE_TYPE_V")))


def resolve(
    command: Command,
    *,
    model: Optional[str] = None,
    prefill_chunk_size: Optional[int] = None,
    batch_size: Optional[int] = None,
    parallel: Optional[int] = None,
    ctx_size: Optional[int] = None,
    max_queue: Optional[int] = None,
    prompt_cache: bool = True,
    cache_max_bytes: Optional[int] = None,
    cache_max_entries: Optional[int] = None,
    cache_min_prefix: Optional[int] = None,
    temp: Optional[float] = None,
    top_p: Optional[float] = None,
    top_k: Optional[int] = None,
    min_p: Optional[float] = None,
    repeat_penalty: Optional[float] = None,
    seed: Optional[int] = None,
    max_tokens: Optional[int] = None,
    host: Optional[str] = None,
    port: Optional[int] = None,
    api_key: Optional[str] = None,
    log_level: Optional[str] = None,
    model_alias: Optional[str] = None,
    itl_budget_ms: Optional[int] = None,
    max_body_bytes: Optional[int] = None,
    shutdown_grace: Optional[float] = None,
    distributed: Optional[str] = None,
    distributed_timeout: Optional[float] = None,
    cors_origins: Optional[str] = None,
    no_webui: bool = False,
    metrics: Optional[bool] = None,
    slots: Optional[bool] = None,
    tags: Optional[str] = None,
    threads: Optional[int] = None,
    cpu_weights: Optional[str] = None,
    chat_template: Optional[str] = None,
    chat_template_file: Optional[str] = None,
    chat_template_kwargs: Optional[str] = None,
    reasoning_format: Optional[str] = None,
    reasoning_budget: Optional[int] = None,
    pooling: Optional[str] = None,
    lookup_ngram: Optional[int] = None,
    draft_max: Optional[int] = None,
    draft_min: Optional[int] = None,
    draft_model: Optional[str] = None,
    context_shift: Optional[bool] = None,
    extra_models: tuple[str, ...] = (),
    models_dir: Optional[str] = None,
    models_max: Optional[int] = None,
    models_memory: Optional[float] = None,
    keep_alive: Optional[str] = None,
    models_preload: Optional[str] = None,
    cache_type_k: Optional[str] = None,
    cache_type_v: Optional[str] = None,
    cache_ram: Optional[int] = None,
    slot_save_path: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
) -> AppConfig:
    """Merge flags (None = not given) with the environment into one frozen AppConfig; raises ConfigError."""
    if command not in _DEFAULT_MAX_TOKENS:
        raise ConfigError(f"unknown command {command!r}; expected one of {', '.join(_DEFAULT_MAX_TOKENS)}")
    env = os.environ if env is None else env
    if model is not None and not model.strip():
        raise ConfigError("--model must not be empty (omit it to use the embedded default model)", flag="--model")
    level = (log_level or "info").lower()
    if level not in LOG_LEVELS:
        raise ConfigError(f"--log-level must be one of {', '.join(LOG_LEVELS)} (got {log_level!r})", flag="--log-level")
    router, first = models_config(command, env, ((model,) if model is not None else ()) + tuple(extra_models),
                                  models_dir, models_max, models_memory, keep_alive, models_preload, model_alias)
    model = first.spec if first is not None else None
    if router is None and first is not None and first.named and model_alias is None:
        model_alias = first.name  # -m NAME=SPEC with one model: NAME is the id replies report
    chunk = resolve_prefill_chunk_size(prefill_chunk_size, batch_size, env)
    cache = _prompt_cache(prompt_cache, cache_max_bytes, cache_max_entries, cache_min_prefix, env, cache_ram)
    budget = _itl_budget(itl_budget_ms, env, chunk)
    engine = _engine(command, env, chunk, parallel, ctx_size, max_queue, cache, budget)
    type_k, type_v = _kv_types(env, cache_type_k, cache_type_v)
    engine = dataclasses.replace(engine, drafting=drafting_config(env, lookup_ngram, draft_max, draft_min),
                                 kv_type_k=type_k, kv_type_v=type_v)
    shift, _ = flag_or_env(context_shift, "--context-shift", env, "LLAMA_ARG_CONTEXT_SHIFT", parse=env_bool)
    engine = dataclasses.replace(engine, context_shift=bool(shift))
    given = {"temperature": temp, "top_p": top_p, "top_k": top_k, "min_p": min_p}
    given |= {"repetition_penalty": repeat_penalty, "seed": seed, "max_tokens": max_tokens}
    sampling = _sampling(command, given)
    server = None
    if command in _SERVER_COMMANDS:
        server = server_config(env, host=host, port=port, api_key=api_key, log_level=level, model_alias=model_alias,
                               max_body_bytes=max_body_bytes, shutdown_grace=shutdown_grace, cors_origins=cors_origins,
                               no_webui=no_webui, metrics=metrics, slots=slots, tags=tags,
                               chat_template=chat_template, chat_template_file=chat_template_file,
                               chat_template_kwargs=chat_template_kwargs, reasoning_format=reasoning_format,
                               reasoning_budget=reasoning_budget, pooling=pooling, slot_save_path=slot_save_path)
    elif slot_save_path is not None:
        raise ConfigError(f"--slot-save-path applies to serve, not {command}", flag="--slot-save-path")
    elif pooling is not None:
        raise ConfigError(f"--pooling applies to serve, not {command}", flag="--pooling")
    elif host is not None or port is not None or api_key is not None:
        raise ConfigError(f"--host, --port and --api-key apply to serve and bench, not {command}", flag="--host")
    elif (chat_template, chat_template_file, chat_template_kwargs, reasoning_format, reasoning_budget) != (None,) * 5:
        raise ConfigError(f"--chat-template* and --reasoning-* apply to serve, not {command}", flag="--chat-template")
    blas = (env.get("MLXCEL_BLAS") or "").strip() or "auto"
    dist = distributed_config(command, env, distributed, distributed_timeout)
    threads, threads_label = _count_flag(threads, "--threads", env, "LLAMA_ARG_THREADS")
    check_range(threads_label, threads, 1, MAX_THREADS)
    weights = choice(cpu_weights, "--cpu-weights", env, "MLXCEL_CPU_WEIGHTS", CPU_WEIGHTS, None)
    if router is not None and dist is not None:
        raise ConfigError("several models cannot be served over the ranks of mlx.launch (--distributed); "
                          "serve one model there", flag="--models-dir")
    draft = _draft_model(draft_model, env, dist)
    if draft is not None and router is not None:
        raise ConfigError("--draft-model drafts for one model; it cannot be used with several models",
                          flag="--draft-model")
    return AppConfig(command, ModelSpec(model, threads, weights, draft), engine, sampling, chunk, blas, server, dist,
                     router)


def _draft_model(flag: Optional[str], env: Mapping[str, str], dist: Optional[DistributedConfig]) -> Optional[str]:
    """--draft-model / -md (llama-server's LLAMA_ARG_MODEL_DRAFT); not beside --distributed."""
    value, label = flag_or_env(flag, "--draft-model", env, "LLAMA_ARG_MODEL_DRAFT")
    if value is not None and not value.strip():
        raise ConfigError(f"{label} must not be empty", flag=label)
    if value is not None and dist is not None:
        raise ConfigError(f"{label} cannot be used with --distributed: the ranks do not verify drafts", flag=label)
    return value


def startup_summary(cfg: AppConfig) -> list[str]:
    """The startup log lines describing the resolved configuration."""
    eng, s = cfg.engine, cfg.sampling
    source = f" via {cfg.chunk.source}" if cfg.chunk.explicit is not None else ""
    ctx = "model max per slot" if eng.ctx_size is None else f"{eng.ctx_size} total"
    cache = eng.prompt_cache
    lines = [
        f"model {cfg.model.path or 'embedded SmolLM2-135M-Instruct'}",
        f"threads {cfg.model.threads or 'every core'}",
        f"cpu_weights {cfg.model.cpu_weights or 'auto'}",
        f"slots {eng.num_slots} ctx_size {ctx} max_queue {eng.max_queue}",
        f"prefill_chunk_size {eng.policy.describe()}{source}",
        f"itl_budget_ms {eng.itl_budget_ms if eng.itl_budget_ms is not None else 'off'}",
        f"lookup_ngram {eng.drafting.ngram or 'off'} draft_model {cfg.model.draft or 'none'} "
        f"draft_max {eng.drafting.draft_max} draft_min {eng.drafting.draft_min}",
        f"context_shift {'on' if eng.context_shift else 'off'}",
        f"prompt_cache {'on' if cache.enabled else 'off'} "
        f"max_bytes={'no limit' if cache.max_bytes >= NO_LIMIT else cache.max_bytes} "
        f"max_entries={cache.max_entries} min_prefix={cache.min_prefix}",
        f"cache_type_k {eng.kv_type_k or 'the model dtype'} cache_type_v {eng.kv_type_v or 'the model dtype'}",
        f"sampling temp={s.temperature} top_p={s.top_p} top_k={s.top_k} min_p={s.min_p} "
        f"repeat_penalty={s.repetition_penalty} seed={s.seed} max_tokens={s.max_tokens}",
        f"blas {cfg.blas}",
    ]
    if cfg.distributed is not None:
        d = cfg.distributed
        lines.append(f"distributed {d.mode} backend={d.backend} timeout={d.timeout_s:g}s")
    if cfg.router is not None:
        lines[:1] = cfg.router.describe()
    if cfg.server is not None:
        srv = cfg.server
        reasoning = f"reasoning_format {srv.reasoning_format} reasoning_budget {srv.reasoning_budget}"
        pooling = f"pooling {srv.pooling or 'from the model (else last)'}"
        lines += [srv.chat_template.describe(), reasoning, pooling, *server_summary(srv)]
    return lines
