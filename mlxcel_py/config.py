"""The one resolver: command-line flags and the environment -> frozen config records.

Nothing below the CLI reads `os.environ` or sees a Typer object; it gets an `AppConfig`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Optional

from .engine.chunking.fixed import PrefillChunkPolicy
from .engine.core.drafting import DraftConfig
from .engine.core.request import MAX_TOKENS_LIMIT, SamplingParams
from .config_chunk import (
    ResolvedChunk, _count_flag, _itl_budget, prefill_chunk_override, resolve_prefill_chunk_size,
)
from .config_sampling import CHAIN_FLAGS, chain_flags, lora_specs
from .config_values import check_range, choice, drafting_config, env_bool, flag_or_env
from .errors import ConfigError, RequestError
from .flags import (
    KVFlags, ModelFlags, SamplingFlags, ServeCacheFlags, ServeFlags, ServeSlotFlags, TemplateFlags, build, values_of,
)
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
    mmproj: Optional[str] = None  # --mmproj: a llama.cpp projector file for the GGUF's images (serve)
    lora: tuple[tuple[str, float], ...] = ()  # --lora / --lora-scaled: (adapter, scale) for every request
    lora_fuse: bool = False  # --lora-fuse: merged into float32 weights


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
    # The command's flag record as parsed (flags.py): a consumer of a new flag reads its field here.
    flags: Any = None


def _sampling(command: str, flags: SamplingFlags) -> SamplingParams:
    given = {"temperature": flags.temp, "top_p": flags.top_p, "top_k": flags.top_k, "min_p": flags.min_p,
             "repetition_penalty": flags.repeat_penalty, "seed": flags.seed, "max_tokens": flags.max_tokens}
    if given["max_tokens"] is not None and given["max_tokens"] < 1:  # type: ignore[operator]
        raise ConfigError(f"--max-tokens must be at least 1 (got {given['max_tokens']})", flag="--max-tokens")
    values = dict(_SERVER_SAMPLING if command in _SERVER_COMMANDS else _GREEDY_SAMPLING)
    values["max_tokens"] = _DEFAULT_MAX_TOKENS[command]
    values.update({k: v for k, v in given.items() if v is not None})
    try:
        return SamplingParams(**values, chain=chain_flags(flags))  # type: ignore[arg-type]
    except RequestError as exc:  # the message starts with the field's name: say the flag instead
        flag = _SAMPLING_FLAGS.get(exc.param or "", CHAIN_FLAGS.get(exc.param or "", exc.param))
        message = str(exc)
        if exc.param and flag and message.startswith(exc.param + " "):
            message = flag + message[len(exc.param) :]
        raise ConfigError(message, flag=flag) from None


def _engine(command: str, env: Mapping[str, str], chunk: ResolvedChunk, slots: ServeSlotFlags,
            cache: PromptCacheConfig, itl_budget_ms: Optional[int]) -> EngineConfig:
    serving = command in _SERVER_COMMANDS
    parallel, ctx_size, max_queue = slots.parallel, slots.ctx_size, slots.max_queue
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
    num_slots = (4 if parallel is None else parallel) if serving else 1
    queue = 64 if max_queue is None else max_queue
    return EngineConfig(PrefillChunkPolicy.resolve(chunk.explicit), num_slots, ctx_size, queue, cache, itl_budget_ms)


def _prompt_cache(env: Mapping[str, str], flags: ServeCacheFlags) -> PromptCacheConfig:
    given = {"max_bytes": flags.cache_max_bytes, "max_entries": flags.cache_max_entries,
             "min_prefix": flags.cache_min_prefix}
    for name, value in given.items():
        check_range("--cache-" + name.replace("_", "-"), value, 0)
    enabled = flags.prompt_cache
    ram, label = flag_or_env(flags.cache_ram, "--cache-ram", env, "LLAMA_ARG_CACHE_RAM", parse=_mib)
    if ram is not None:
        if flags.cache_max_bytes is not None:
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


def _kv_types(env: Mapping[str, str], flags: KVFlags) -> tuple[Optional[str], ...]:
    """--cache-type-k / --cache-type-v (llama-server's names and variables); None keeps the model's dtype."""
    return tuple(choice(value, flag, env, name, KV_CACHE_TYPES, None) for value, flag, name in (
        (flags.cache_type_k, "--cache-type-k", "LLAMA_ARG_CACHE_TYPE_K"),
        (flags.cache_type_v, "--cache-type-v", "LLAMA_ARG_CACHE_TYPE_V")))


def resolve(command: Command, flags: Any = None, env: Optional[Mapping[str, str]] = None) -> AppConfig:
    """Merge a command's flag record (flags.py; None: nothing given) with the environment into one
    frozen AppConfig; raises ConfigError. A record of any command is read as a ServeFlags whose flags
    that command lacks are not given; the record itself rides along as `AppConfig.flags`."""
    if command not in _DEFAULT_MAX_TOKENS:
        raise ConfigError(f"unknown command {command!r}; expected one of {', '.join(_DEFAULT_MAX_TOKENS)}")
    env = os.environ if env is None else env
    given = ServeFlags() if flags is None else flags
    f = widen(given)
    specs = _model_specs(f.model.model)
    if specs and not specs[0].strip():
        raise ConfigError("--model must not be empty (omit it to use the embedded default model)", flag="--model")
    level = (f.log_level or "info").lower()
    if level not in LOG_LEVELS:
        raise ConfigError(f"--log-level must be one of {', '.join(LOG_LEVELS)} (got {f.log_level!r})",
                          flag="--log-level")
    alias = f.server.model_alias
    router, first = models_config(command, env, specs, f.router, alias)
    if router is None and first is not None and first.named and alias is None:
        alias = first.name  # -m NAME=SPEC with one model: NAME is the id replies report
    engine, chunk = _engine_config(command, env, f)
    sampling = _sampling(command, f.sampling)
    server = _server(command, env, f, level, alias)
    blas = (env.get("MLXCEL_BLAS") or "").strip() or "auto"
    dist = distributed_config(command, env, f.dist)
    model = _model_spec(env, f.model, first.spec if first is not None else None, router, dist,
                        serves=command in _SERVER_COMMANDS)
    if server is not None and server.rerank and router is not None:
        raise ConfigError("--rerank names one reranking model; with several models each reranking GGUF serves "
                          "/v1/rerank by itself (select it with the body's model)", flag="--rerank")
    return AppConfig(command, model, engine, sampling, chunk, blas, server, dist, router, given)


def widen(flags: Any) -> ServeFlags:
    """Any command's record (or a record with extra fields) as the ServeFlags resolve reads."""
    return flags if type(flags) is ServeFlags else build(ServeFlags, values_of(flags))


def _model_specs(model: Any) -> tuple[str, ...]:
    """serve's repeated -m (a sequence) or another command's one (a string), as a tuple."""
    if model is None:
        return ()
    return (model,) if isinstance(model, str) else tuple(model)


def _engine_config(command: str, env: Mapping[str, str], f: ServeFlags) -> tuple[EngineConfig, ResolvedChunk]:
    chunk = resolve_prefill_chunk_size(f.chunk.prefill_chunk_size, f.chunk.batch_size, env)
    cache = _prompt_cache(env, f.cache)
    budget = _itl_budget(f.chunk.itl_budget_ms, env, chunk)
    engine = _engine(command, env, chunk, f.engine, cache, budget)
    type_k, type_v = _kv_types(env, f.cache)
    engine = dataclasses.replace(engine, drafting=drafting_config(env, f.draft), kv_type_k=type_k, kv_type_v=type_v)
    shift, _ = flag_or_env(f.engine.context_shift, "--context-shift", env, "LLAMA_ARG_CONTEXT_SHIFT", parse=env_bool)
    return dataclasses.replace(engine, context_shift=bool(shift)), chunk


def _server(command: str, env: Mapping[str, str], f: ServeFlags, level: str,
            alias: Optional[str]) -> Optional[ServerConfig]:
    """serve's and bench's ServerConfig; for run and generate, an error for any server flag given."""
    server, template = f.server, f.template
    if command in _SERVER_COMMANDS:
        return server_config(env, dataclasses.replace(server, model_alias=alias), template, level)
    if server.slot_save_path is not None:
        raise ConfigError(f"--slot-save-path applies to serve, not {command}", flag="--slot-save-path")
    if server.pooling is not None:
        raise ConfigError(f"--pooling applies to serve, not {command}", flag="--pooling")
    if server.rerank:
        raise ConfigError(f"--rerank applies to serve, not {command}", flag="--rerank")
    if server.host is not None or server.port is not None or server.api_key is not None:
        raise ConfigError(f"--host, --port and --api-key apply to serve and bench, not {command}", flag="--host")
    if template != TemplateFlags():
        raise ConfigError(f"--chat-template* and --reasoning-* apply to serve, not {command}", flag="--chat-template")
    return None


def _model_spec(env: Mapping[str, str], flags: ModelFlags, path: Optional[str], router: Optional[RouterConfig],
                dist: Optional[DistributedConfig], serves: bool = True) -> ModelSpec:
    threads, threads_label = _count_flag(flags.threads, "--threads", env, "LLAMA_ARG_THREADS")
    check_range(threads_label, threads, 1, MAX_THREADS)
    weights = choice(flags.cpu_weights, "--cpu-weights", env, "MLXCEL_CPU_WEIGHTS", CPU_WEIGHTS, None)
    if router is not None and dist is not None:
        raise ConfigError("several models cannot be served over the ranks of mlx.launch (--distributed); "
                          "serve one model there", flag="--models-dir")
    draft = _draft_model(flags.draft_model, env, dist)
    if draft is not None and router is not None:
        raise ConfigError("--draft-model drafts for one model; it cannot be used with several models",
                          flag="--draft-model")
    mmproj, label = flag_or_env(getattr(flags, "mmproj", None), "--mmproj", env, "LLAMA_ARG_MMPROJ")
    if not serves:  # run and generate take no images: the variable is serve's, the flag theirs to refuse
        if getattr(flags, "mmproj", None) is not None:
            raise ConfigError("--mmproj applies to serve (images come in requests)", flag="--mmproj")
        mmproj = None
    if mmproj is not None and not mmproj.strip():
        raise ConfigError(f"{label} must not be empty", flag=label)
    if mmproj is not None and (router is not None or dist is not None):
        raise ConfigError(f"{label} goes with one model on one machine; it cannot be used with several models "
                          "or --distributed", flag=label)
    lora = lora_specs(getattr(flags, "lora", None), getattr(flags, "lora_scaled", None))
    if getattr(flags, "lora_init_without_apply", False):  # serve's: applied later (POST /lora-adapters)
        if not lora:
            raise ConfigError("--lora-init-without-apply needs --lora or --lora-scaled",
                              flag="--lora-init-without-apply")
        lora = tuple((path, 0.0) for path, _ in lora)
    if lora and (router is not None or dist is not None):
        raise ConfigError("--lora applies to one model on one machine; it cannot be used with several models or "
                          "--distributed", flag="--lora")
    fuse = bool(getattr(flags, "lora_fuse", False))
    if fuse and not lora:
        raise ConfigError("--lora-fuse needs --lora or --lora-scaled", flag="--lora-fuse")
    return ModelSpec(path, threads, weights, draft, mmproj, lora, fuse)


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
