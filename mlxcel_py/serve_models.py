"""Several models behind one server (serve): which models, named how, and how many stay resident.

Part of the one resolver (`config.resolve` calls `models_config`). With one model configured
there is no `RouterConfig` at all: the server behaves as it always has (any model name accepted).
Names follow llama-server's router (`--models-dir`, `--models-max`) and Ollama (`keep_alive`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

from .config_values import check_range, env_count, flag_or_env
from .errors import ConfigError
from .flags import RouterFlags

DEFAULT_MODELS_MAX = 4  # llama-server's --models-max
NEVER = -1.0  # --keep-alive -1: a model stays resident until the budget needs its room
_SPLIT_PART = re.compile(r"-(\d{5})-of-(\d{5})$")  # llama.cpp's split files: the first part names the model
_NAME = re.compile(r"^[A-Za-z0-9][\w.:-]*$")
_DURATION = re.compile(r"^(-?\d+(?:\.\d+)?)(ms|s|m|h)?$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


@dataclass(frozen=True, slots=True)
class ModelEntry:
    """One configured model: the name requests use, and what `load_model` loads (None: the default)."""

    name: str
    spec: Optional[str]
    named: bool = False  # named by -m NAME=SPEC (with one model, NAME is its --alias)


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """Several models: loaded on first use, unloaded least recently used past the limits."""

    entries: tuple[ModelEntry, ...]
    max_resident: int = DEFAULT_MODELS_MAX  # --models-max
    memory_bytes: Optional[int] = None  # --models-memory (GiB on the command line); None: no budget
    keep_alive_s: float = NEVER  # --keep-alive: unload after this long idle; -1 never
    preload: tuple[str, ...] = ()  # --models-preload: loaded at startup, in this order

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.entries)

    def describe(self) -> list[str]:
        """The startup log lines: one per model, then the limits."""
        memory = f"{self.memory_bytes / 2**30:g} GiB" if self.memory_bytes is not None else "no budget"
        keep = "never" if self.keep_alive_s < 0 else f"{self.keep_alive_s:g} s"
        lines = [f"model {e.name}: {e.spec or 'embedded SmolLM2-135M-Instruct'}" for e in self.entries]
        return lines + [f"models_max {self.max_resident} models_memory {memory} keep_alive {keep} "
                        f"preload {', '.join(self.preload) or 'none'}"]


def parse_keep_alive(raw: object, label: str) -> float:
    """Seconds from a number or a Go-style duration ("30s", "5m", "1h"); negative: never unload."""
    if isinstance(raw, bool):
        raise ConfigError(f"{label} must be seconds or a duration such as 5m (got {raw!r})", flag=label)
    if isinstance(raw, (int, float)):
        return NEVER if raw < 0 else float(raw)
    found = _DURATION.match(str(raw).strip())
    if found is None:
        raise ConfigError(f"{label} must be seconds or a duration such as 5m (got {raw!r})", flag=label)
    value = float(found.group(1)) * _UNITS[found.group(2)]
    return NEVER if value < 0 else value


def _named(item: str) -> ModelEntry:
    """`-m NAME=SPEC` or `-m SPEC` (named by its file or directory stem, a hub id as written)."""
    name, sep, spec = item.partition("=")
    if sep and name and "/" not in name and _NAME.match(name):
        if not spec.strip():
            raise ConfigError(f"--model {item!r}: nothing to load after {name}=", flag="--model")
        return ModelEntry(name, spec.strip(), named=True)
    return ModelEntry(_stem(item), item)


def _stem(spec: str) -> str:
    path = Path(spec).expanduser()
    if path.exists() or spec.lower().endswith(".gguf"):
        stem = path.stem if path.suffix.lower() == ".gguf" else path.name
        return _SPLIT_PART.sub("", stem)
    return spec  # a Hugging Face id: its name is the id


def scan_models_dir(folder: str, label: str) -> list[ModelEntry]:
    """Every .gguf file (a split model by its first part) and every mlx-lm directory in `folder`."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise ConfigError(f"{label}: {folder!r} is not a directory", flag=label)
    found = []
    for path in sorted(root.iterdir()):
        split = _SPLIT_PART.search(path.stem)
        if path.is_file() and path.suffix.lower() == ".gguf" and (split is None or split.group(1) == "00001"):
            found.append(ModelEntry(_SPLIT_PART.sub("", path.stem), str(path)))
        elif path.is_dir() and (path / "config.json").is_file():
            found.append(ModelEntry(path.name, str(path)))
    if not found:
        raise ConfigError(f"{label}: no .gguf file or mlx-lm model directory in {folder!r}", flag=label)
    return found


def _memory(value: Optional[float], env: Mapping[str, str]) -> Optional[int]:
    raw, label = flag_or_env(None if value is None else str(value), "--models-memory", env, "MLXCEL_MODELS_MEMORY")
    if raw is None:
        return None
    try:
        gib = float(raw)
    except ValueError:
        raise ConfigError(f"{label} must be a number of GiB (got {raw!r})", flag=label) from None
    check_range(label, gib, 0.001)
    return int(gib * 2**30)


def _entries(models: tuple[str, ...], folder: Optional[str], folder_label: str) -> tuple[ModelEntry, ...]:
    if any(not m.strip() for m in models):
        raise ConfigError("--model must not be empty (omit it to use the embedded default model)", flag="--model")
    entries = [_named(m) for m in models] + (scan_models_dir(folder, folder_label) if folder else [])
    seen: dict[str, ModelEntry] = {}
    for entry in entries:
        if entry.name in seen:
            raise ConfigError(f"two models are named {entry.name!r} ({seen[entry.name].spec} and {entry.spec}); "
                              "name one with -m NAME=SPEC", flag="--model")
        seen[entry.name] = entry
    return tuple(entries)


def models_config(command: str, env: Mapping[str, str], models: tuple[str, ...], flags: RouterFlags,
                  alias: Optional[str]) -> tuple[Optional[RouterConfig], Optional[ModelEntry]]:
    """(the router config, None for one model; the first model, whose spec is ModelSpec.path)."""
    models_max, models_memory, keep_alive = flags.models_max, flags.models_memory, flags.keep_alive
    preload = flags.models_preload
    folder, folder_label = flag_or_env(flags.models_dir, "--models-dir", env, "LLAMA_ARG_MODELS_DIR")
    given = (models_max, models_memory, keep_alive, preload)
    if command != "serve":
        if folder is not None or len(models) > 1 or given != (None,) * 4:
            raise ConfigError(f"several models (--models-*, --keep-alive, -m twice) apply to serve, not {command}",
                              flag="--models-dir")
        return None, ModelEntry(models[0], models[0]) if models else None
    entries = _entries(models, folder, folder_label)
    if len(entries) <= 1:
        _refuse_single(given)
        return None, entries[0] if entries else None
    if alias is not None:
        raise ConfigError("--alias names the one model served; with several, name each with -m NAME=SPEC",
                          flag="--alias")
    count, count_label = flag_or_env(models_max, "--models-max", env, "LLAMA_ARG_MODELS_MAX", parse=env_count)
    check_range(count_label, count, 1, 64)
    names = tuple(e.name for e in entries)
    chosen = tuple(dict.fromkeys(p.strip() for p in (preload or "").split(",") if p.strip()))
    unknown = [p for p in chosen if p not in names]
    if unknown:
        raise ConfigError(f"--models-preload: no model named {unknown[0]!r}; the models are {', '.join(names)}",
                          flag="--models-preload")
    keep_raw, keep_label = flag_or_env(keep_alive, "--keep-alive", env, "MLXCEL_KEEP_ALIVE")
    keep = NEVER if keep_raw is None else parse_keep_alive(keep_raw, keep_label)
    return RouterConfig(entries, DEFAULT_MODELS_MAX if count is None else count, _memory(models_memory, env),
                        keep, chosen), entries[0]


def _refuse_single(given: tuple) -> None:
    """With one model the limits have nothing to act on: a 1-line error rather than an ignored flag."""
    flags = ("--models-max", "--models-memory", "--keep-alive", "--models-preload")
    for flag, value in zip(flags, given):
        if value is not None:
            raise ConfigError(f"{flag} applies when several models are configured (-m twice or --models-dir); "
                              "one model stays loaded for the server's lifetime", flag=flag)
