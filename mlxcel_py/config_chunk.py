"""The prefill chunk and the ITL budget, resolved from flags and the environment (config.py's part).

--prefill-chunk-size, -b/--batch-size (LLAMA_ARG_BATCH) and MLXCEL_PREFILL_CHUNK pin the chunk of
both policy states; --itl-budget-ms (MLXCEL_ITL_BUDGET_MS) chooses it per tick unless one does.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Mapping, Optional

from .config_values import check_range, env_count, flag_or_env, parse_count
from .errors import ConfigError

log = logging.getLogger("mlxcel_py.config")

MAX_ITL_BUDGET_MS = 600_000


def _chunk_from_env(raw: Optional[str]) -> Optional[int]:
    # Empty counts as unset (`MLXCEL_PREFILL_CHUNK= cmd` clears it), like the LLAMA_ARG_* variables.
    if raw is None or not raw.strip():
        return None
    value = parse_count(raw)
    if value is None:
        log.warning("ignoring MLXCEL_PREFILL_CHUNK=%r: expected a non-negative integer", raw)
    return value


_UNREAD = object()
_override: object = _UNREAD


def prefill_chunk_override() -> Optional[int]:
    """MLXCEL_PREFILL_CHUNK, read once per process; an unparseable value warns once and counts as unset."""
    global _override
    if _override is _UNREAD:
        _override = _chunk_from_env(os.environ.get("MLXCEL_PREFILL_CHUNK"))
    return _override  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class ResolvedChunk:
    """The explicit prefill chunk (None = the alone/contended policy) and where it came from."""

    explicit: Optional[int]
    conflict: bool = False
    source: str = "default"


def _count_flag(value: Optional[int], flag: str, env: Mapping[str, str], name: str) -> tuple[Optional[int], str]:
    """A count flag over its environment variable (llama-server's LLAMA_ARG_*)."""
    return flag_or_env(value, flag, env, name, parse=env_count)


def resolve_prefill_chunk_size(
    flag: Optional[int], batch_size: Optional[int], env: Mapping[str, str]
) -> ResolvedChunk:
    """--prefill-chunk-size, else --batch-size (or LLAMA_ARG_BATCH), else MLXCEL_PREFILL_CHUNK, else None."""
    for name, value in (("--prefill-chunk-size", flag), ("--batch-size", batch_size)):
        if value is not None and value < 0:
            raise ConfigError(f"{name} must be a non-negative integer (got {value})", flag=name)
    batch_size, batch_source = _count_flag(batch_size, "--batch-size", env, "LLAMA_ARG_BATCH")
    conflict = flag is not None and batch_size is not None and flag != batch_size
    if conflict:
        log.warning("--prefill-chunk-size %d and %s %d differ; using %d", flag, batch_source, batch_size, flag)
    if flag is not None:
        return ResolvedChunk(flag, conflict, "--prefill-chunk-size")
    if batch_size is not None:
        return ResolvedChunk(batch_size, False, batch_source)
    # A mapping other than the process environment (tests, embedding) is parsed as given.
    override = prefill_chunk_override() if env is os.environ else _chunk_from_env(env.get("MLXCEL_PREFILL_CHUNK"))
    return ResolvedChunk(override, False, "MLXCEL_PREFILL_CHUNK" if override is not None else "default")


def _itl_budget(flag: Optional[int], env: Mapping[str, str], chunk: ResolvedChunk) -> Optional[int]:
    """--itl-budget-ms, else MLXCEL_ITL_BUDGET_MS; an explicit chunk pins both states and wins."""
    value, label = _count_flag(flag, "--itl-budget-ms", env, "MLXCEL_ITL_BUDGET_MS")
    check_range(label, value, 1, MAX_ITL_BUDGET_MS)
    if value is None or chunk.explicit is None:
        return value
    log.warning("%s %d is ignored: %s pins the prefill chunk to %d", label, value, chunk.source, chunk.explicit)
    return None
