"""The HTTP server's settings (serve, bench): addresses, names, key, CORS origins, limits,
and serving over the ranks of `mlx.launch` (serve).

Part of the one resolver (`config.resolve` calls `server_config`); split out so config.py
stays about the engine. Comma-separated lists follow llama-server (`--host`, `--alias`, `--tags`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional
from urllib.parse import urlsplit

from .config_values import check_range, env_bool, env_count, flag_or_env
from .errors import ConfigError
from .flags import DistFlags, ServerFlags, TemplateFlags
from .models.chat_template import ChatTemplate, check_kwargs, one_line, probe, template_of

DEFAULT_MAX_BODY_BYTES = 8 << 20
DEFAULT_IMAGE_MAX_BYTES = 20 << 20  # --image-max-bytes: one image, decoded (the body's own cap comes first)
DEFAULT_IMAGE_MAX_COUNT = 8  # --image-max-count
MAX_SHUTDOWN_GRACE_S = 3600.0
LOOPBACK = "localhost"  # the --cors-origins keyword for the loopback origins (the default)
_PORT_WILDCARD = re.compile(r"^(https?://[^/:*]+|https?://\[[0-9a-fA-F:.]+\]):\*$")
DISTRIBUTED_MODES = ("auto", "tensor", "pipeline")
POOLINGS = ("mean", "cls", "last", "none")  # llama-server's --pooling (its "rank" is for rerankers)
MAX_THINKING_BUDGET = 1_000_000  # tokens; as the engine's max_tokens limit
REASONING_FORMATS = ("none", "deepseek", "auto")  # llama-server's (auto does what deepseek does here)
# What each launcher leaves in the environment of every rank (mlx.launch sets MLX_RANK), and
# the backend its variables name; the first match wins.
_LAUNCH_MARKERS = ("MLX_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
_BACKEND_MARKERS = (("MLX_IBV_DEVICES", "jaccl"), ("NCCL_HOST_IP", "nccl"), ("MLX_HOSTFILE", "ring"),
                    ("OMPI_COMM_WORLD_SIZE", "mpi"), ("PMI_SIZE", "mpi"))


@dataclass(frozen=True, slots=True)
class DistributedConfig:
    """Serving one model over the ranks of an `mlx.launch` (see docs/DISTRIBUTED.md)."""

    mode: str = "auto"  # auto: tensor where the model can shard, else pipeline
    backend: str = "any"  # named by the launcher's environment; "any" lets MLX pick
    timeout_s: float = 60.0  # one record (a decode step or a prefill piece) on every rank, at most


@dataclass(frozen=True, slots=True)
class ServerConfig:
    hosts: tuple[str, ...] = ("127.0.0.1",)
    port: int = 8080
    api_key: Optional[str] = None
    log_level: str = "info"
    model_aliases: tuple[str, ...] = ()  # the first is the id replies report
    model_tags: tuple[str, ...] = ()  # llama-server's --tags: informational, listed in /v1/models
    shutdown_grace_s: float = 10.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    image_max_bytes: int = DEFAULT_IMAGE_MAX_BYTES  # one image, decoded
    image_max_count: int = DEFAULT_IMAGE_MAX_COUNT  # images in one request
    allow_image_urls: bool = False  # --allow-image-urls: fetch http(s) image URLs (else a 400)
    spm_infill: bool = False  # --spm-infill: infill prompts suffix first (server/generation/fim.py)
    # Browser origins allowed beyond the loopback ones: "*", "scheme://host[:port]" or "scheme://host:*".
    cors_origins: tuple[str, ...] = ()
    webui: bool = True  # the chat page at / (server/webui); --no-webui turns it off
    # llama-server's endpoint switches; ours default on (theirs: metrics off, slots on).
    endpoint_metrics: bool = True
    endpoint_slots: bool = True
    chat_template: ChatTemplate = field(default_factory=ChatTemplate)  # --chat-template* (the model's: empty)
    reasoning_format: str = "auto"  # none: thinking stays in the answer; deepseek/auto: reasoning_content
    # -1: unrestricted; 0: thinking off (enable_thinking false); N: the end marker forced after N thinking tokens
    reasoning_budget: int = -1
    pooling: Optional[str] = None  # the embedding routes' --pooling; None: the model's, else last
    rerank: bool = False  # --rerank: the model must be a reranker (models/ranking.py)
    slot_save_path: Optional[str] = None  # --slot-save-path: the directory /slots/{id}?action=save|restore uses

    @property
    def host(self) -> str:
        """The first address (the one tests and single-address setups use)."""
        return self.hosts[0]

    @property
    def model_alias(self) -> Optional[str]:
        return self.model_aliases[0] if self.model_aliases else None

    def urls(self) -> list[str]:
        return [url_of(host, self.port) for host in self.hosts]


def url_of(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _csv(raw: str) -> tuple[str, ...]:
    """Comma-separated items, stripped, empties dropped, duplicates dropped (first kept)."""
    return tuple(dict.fromkeys(item.strip() for item in raw.split(",") if item.strip()))


def _list(value: Optional[str], label: str, what: str) -> tuple[str, ...]:
    if value is None:
        return ()
    items = _csv(value)
    if not items:
        raise ConfigError(f"{label} must name at least one {what} (got {value!r})", flag=label)
    return items


def check_origin(origin: str, label: str) -> str:
    """A browser origin as CORS compares it: "*", "localhost", scheme://host[:port] or scheme://host:*."""
    if origin in ("*", LOOPBACK) or _PORT_WILDCARD.match(origin):
        return origin
    parts = urlsplit(origin)
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        parts = None  # type: ignore[assignment]
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or parts.path \
            or parts.query or parts.fragment or parts.username:
        raise ConfigError(f"{label}: {origin!r} is not an origin; write scheme://host[:port] (no path), "
                          "scheme://host:* for any port, localhost, or *", flag=label)
    return origin


def _switch(flag: bool, env: Mapping[str, str], name: str, *variables: str) -> bool:
    """A switch given as its flag, else its variables read as llama-server reads one."""
    if flag:
        return True
    value, _ = flag_or_env(None, name, env, *variables, parse=env_bool)
    return bool(value)


def _port(value: Optional[int], env: Mapping[str, str]) -> int:
    if value is not None:
        check_range("--port", value, 0, 65535)
        return value
    raw = (env.get("LLAMA_ARG_PORT") or "").strip()
    if not raw:
        return 8080
    port = env_count(raw, "LLAMA_ARG_PORT")
    check_range("LLAMA_ARG_PORT", port, 0, 65535)
    return port


def server_config(env: Mapping[str, str], flags: ServerFlags, template: TemplateFlags,
                  log_level: str = "info") -> ServerConfig:
    """The server's flags (None = not given) over the environment -> ServerConfig; raises ConfigError."""
    host_text, host_label = flag_or_env(flags.host, "--host", env, "LLAMA_ARG_HOST")
    hosts = _list(host_text, host_label, "address") or ("127.0.0.1",)
    alias_text, alias_label = flag_or_env(flags.model_alias, "--alias", env, "LLAMA_ARG_ALIAS")
    aliases = _list(alias_text, alias_label, "model name")
    tags_text, tags_label = flag_or_env(flags.tags, "--tags", env, "LLAMA_ARG_TAGS")
    cors_text, cors_label = flag_or_env(flags.cors_origins, "--cors-origins", env, "MLXCEL_CORS_ORIGINS",
                                         "LLAMA_ARG_CORS_ORIGINS")
    origins = tuple(check_origin(o, cors_label) for o in _list(cors_text, cors_label, "origin"))
    metrics, _ = flag_or_env(flags.metrics, "--metrics", env, "LLAMA_ARG_ENDPOINT_METRICS", parse=env_bool)
    slots, _ = flag_or_env(flags.slots, "--slots", env, "LLAMA_ARG_ENDPOINT_SLOTS", parse=env_bool)
    api_key = flags.api_key
    if api_key == "":
        raise ConfigError("--api-key must not be empty (omit it to disable authentication)", flag="--api-key")
    api_key = api_key if api_key is not None else env.get("MLXCEL_API_KEY") or None
    check_range("--max-body-bytes", flags.max_body_bytes, 1024)
    check_range("--image-max-bytes", flags.image_max_bytes, 1)
    check_range("--image-max-count", flags.image_max_count, 1, 1024)
    check_range("--shutdown-grace", flags.shutdown_grace, 0, MAX_SHUTDOWN_GRACE_S)
    fmt, budget = _reasoning(env, template.reasoning_format, template.reasoning_budget)
    chat = chat_template_config(env, template.chat_template, template.chat_template_file,
                                template.chat_template_kwargs, thinking=budget != 0)
    return ServerConfig(
        hosts=hosts, port=_port(flags.port, env), api_key=api_key, log_level=log_level, model_aliases=aliases,
        shutdown_grace_s=10.0 if flags.shutdown_grace is None else flags.shutdown_grace,
        max_body_bytes=DEFAULT_MAX_BODY_BYTES if flags.max_body_bytes is None else flags.max_body_bytes,
        image_max_bytes=DEFAULT_IMAGE_MAX_BYTES if flags.image_max_bytes is None else flags.image_max_bytes,
        image_max_count=DEFAULT_IMAGE_MAX_COUNT if flags.image_max_count is None else flags.image_max_count,
        allow_image_urls=_switch(flags.allow_image_urls, env, "--allow-image-urls", "MLXCEL_ALLOW_IMAGE_URLS"),
        spm_infill=_switch(flags.spm_infill, env, "--spm-infill", "LLAMA_ARG_SPM_INFILL"),
        cors_origins=origins,
        webui=not _switch(flags.no_webui, env, "--no-webui", "MLXCEL_NO_WEBUI", "LLAMA_ARG_NO_WEBUI"),
        endpoint_metrics=True if metrics is None else metrics,
        endpoint_slots=True if slots is None else slots,
        chat_template=chat, reasoning_format=fmt, reasoning_budget=budget,
        model_tags=_list(tags_text, tags_label, "tag"), pooling=_pooling(env, flags.pooling),
        rerank=_switch(flags.rerank, env, "--rerank", "LLAMA_ARG_RERANKING"),
        slot_save_path=_slot_save_path(flags.slot_save_path),
    )


def _slot_save_path(path: Optional[str]) -> Optional[str]:
    """--slot-save-path: an existing directory, as llama-server requires (it never creates one)."""
    if path is None:
        return None
    if not path.strip() or not Path(path).is_dir():
        raise ConfigError(f"--slot-save-path {path!r} is not a directory", flag="--slot-save-path")
    return str(Path(path).resolve())


def _pooling(env: Mapping[str, str], pooling: Optional[str]) -> Optional[str]:
    """--pooling (llama-server's name and variable); None when neither is given."""
    value, label = flag_or_env(pooling, "--pooling", env, "LLAMA_ARG_POOLING")
    if value is None or value == "":
        return None
    if value not in POOLINGS:
        raise ConfigError(f"{label} must be one of {', '.join(POOLINGS)} (got {value!r})", flag=label)
    return value


def _reasoning(env: Mapping[str, str], fmt: Optional[str], budget: Optional[int]) -> tuple[str, int]:
    """--reasoning-format and --reasoning-budget (llama-server's names and variables)."""
    fmt, label = flag_or_env(fmt, "--reasoning-format", env, "LLAMA_ARG_THINK")
    fmt = (fmt or "auto").strip().lower()
    if fmt not in REASONING_FORMATS:
        raise ConfigError(f"{label} must be one of {', '.join(REASONING_FORMATS)} (got {fmt!r})", flag=label)
    raw, budget_label = flag_or_env(None if budget is None else str(budget), "--reasoning-budget", env,
                                    "LLAMA_ARG_THINK_BUDGET")
    value = -1 if raw is None else int(raw) if raw.strip().lstrip("-").isdigit() else None
    if value is None or not -1 <= value <= MAX_THINKING_BUDGET:
        raise ConfigError(f"{budget_label} must be -1 (unrestricted), 0 (thinking off) or a number of thinking "
                          f"tokens up to {MAX_THINKING_BUDGET} (got {raw})", flag=budget_label)
    return fmt, value


def _template_kwargs(raw: Optional[str], label: str) -> dict:
    if raw is None:
        return {}
    try:
        return check_kwargs(json.loads(raw), label)
    except ValueError as exc:  # json.JSONDecodeError is a ValueError too
        raise ConfigError(f"{label}: {exc}" if isinstance(exc, json.JSONDecodeError) else str(exc), flag=label) from None


def _read_template(path: str, label: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{label}: cannot read {path!r}: {getattr(exc, 'strerror', None) or exc}", flag=label) from None


def chat_template_config(env: Mapping[str, str], value: Optional[str], path: Optional[str],
                         kwargs: Optional[str], thinking: bool = True) -> ChatTemplate:
    """--chat-template NAME|JINJA or --chat-template-file PATH, with --chat-template-kwargs JSON
    (llama-server's variables) and, without `thinking` (--reasoning-budget 0), enable_thinking
    false: checked by rendering one user turn; raises ConfigError."""
    value, label = flag_or_env(value, "--chat-template", env, "LLAMA_ARG_CHAT_TEMPLATE")
    path, path_label = flag_or_env(path, "--chat-template-file", env, "LLAMA_ARG_CHAT_TEMPLATE_FILE")
    raw, kwargs_label = flag_or_env(kwargs, "--chat-template-kwargs", env, "LLAMA_CHAT_TEMPLATE_KWARGS")
    defaults = _template_kwargs(raw, kwargs_label)
    if not thinking:
        if defaults.get("enable_thinking", False) is not False:
            raise ConfigError(f"--reasoning-budget 0 turns thinking off, but {kwargs_label} sets enable_thinking",
                              flag="--reasoning-budget")
        defaults["enable_thinking"] = False
    if value is not None and path is not None:
        raise ConfigError(f"{label} and {path_label} both choose the chat template; give one", flag=label)
    if value is not None and not value.strip():
        raise ConfigError(f"{label} must not be empty (omit it to use the model's template)", flag=label)
    if path is not None:  # a file is Jinja, whatever it says
        template = ChatTemplate(source=_read_template(path, path_label), defaults=defaults, origin=f"{path_label} {path}")
        label = path_label
    elif value is not None:
        template = template_of(value, label, defaults)
    else:
        return ChatTemplate(defaults=defaults)
    try:
        probe(template)
    except Exception as exc:  # noqa: BLE001 - a template is user code: whatever it raises is the flag's fault
        raise ConfigError(f"{template.origin}: the chat template does not render: {one_line(exc)}", flag=label) from None
    return template


def server_summary(server: ServerConfig) -> list[str]:
    """The startup log lines of the server settings."""
    auth = "api key required" if server.api_key else "no api key"
    cors = ", ".join(("loopback origins",) + tuple(o for o in server.cors_origins if o != LOOPBACK))
    return [
        f"server {', '.join(server.urls())} ({auth}, max_body_bytes={server.max_body_bytes}, "
        f"shutdown_grace={server.shutdown_grace_s:g} s, webui {'on' if server.webui else 'off'})",
        f"cors {cors}",
        f"endpoints /metrics {'on' if server.endpoint_metrics else 'off'}, "
        f"/slots {'on' if server.endpoint_slots else 'off'}, "
        f"slot save/restore {server.slot_save_path or 'off (--slot-save-path)'}",
    ]


def distributed_config(command: str, env: Mapping[str, str], flags: DistFlags) -> Optional[DistributedConfig]:
    """Set when `--distributed` is given or a launcher started this process; else None."""
    mode, timeout = flags.distributed, flags.distributed_timeout
    given = mode is not None or timeout is not None
    if given and command != "serve":
        raise ConfigError(f"--distributed applies to serve, not {command}", flag="--distributed")
    # Other commands under a launcher run as today, one independent process per rank.
    if command != "serve" or not (given or any(name in env for name in _LAUNCH_MARKERS)):
        return None
    chosen = (mode or "auto").strip().lower()
    if chosen not in DISTRIBUTED_MODES:
        raise ConfigError(f"--distributed must be one of {', '.join(DISTRIBUTED_MODES)} (got {mode!r})",
                          flag="--distributed")
    check_range("--distributed-timeout", timeout, 1.0)
    backend = next((name for marker, name in _BACKEND_MARKERS if marker in env), "any")
    return DistributedConfig(chosen, backend, 60.0 if timeout is None else float(timeout))
