"""Reading one setting: a flag over its environment variables, counts parsed, ranges checked.

Shared by config.py (the engine's settings) and serve_config.py (the server's); a bad value
is a `ConfigError` naming the flag or variable it came from.
"""

from __future__ import annotations

from typing import Callable, Mapping, Optional, TypeVar

from .engine.core.drafting import DraftConfig
from .errors import ConfigError
from .flags import DraftFlags

T = TypeVar("T")


def parse_count(raw: str) -> Optional[int]:
    """A non-negative decimal integer, surrounding whitespace allowed; None when it is not one."""
    text = raw.strip()
    return int(text) if text.isascii() and text.isdigit() else None


def env_count(raw: str, name: str) -> int:
    """`raw` from variable `name` as a non-negative integer; ConfigError naming it when it is not one."""
    value = parse_count(raw)
    if value is None:
        raise ConfigError(f"{name} must be a non-negative integer (got {raw!r})", flag=name)
    return value


_TRUE = ("1", "true", "on", "enabled", "yes")
_FALSE = ("0", "false", "off", "disabled", "no")


def env_bool(raw: str, name: str) -> bool:
    """`raw` from variable `name` as llama-server reads a switch (1/true/on/enabled, 0/false/off/disabled)."""
    text = raw.strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ConfigError(f"{name} must be one of {', '.join(_TRUE + _FALSE)} (got {raw!r})", flag=name)


def flag_or_env(value: Optional[T], flag: str, env: Mapping[str, str], *names: str,
                parse: Optional[Callable[[str, str], T]] = None) -> tuple[Optional[T], str]:
    """The flag's value, else the first set (non-blank) variable's, parsed by `parse(raw, name)`;
    with the label an error message should name (the flag when nothing was set)."""
    if value is not None:
        return value, flag
    for name in names:
        raw = env.get(name)
        if raw is not None and raw.strip():
            return (parse(raw, name) if parse is not None else raw), name  # type: ignore[return-value]
    return None, flag


def check_range(label: str, value: Optional[float], low: float, high: Optional[float] = None) -> None:
    """ConfigError naming `label` unless `value` (None: not given) is at least `low` and at most `high`."""
    if value is not None and (value < low or (high is not None and value > high)):
        bounds = f"at least {low}" if high is None else f"between {low} and {high}"
        raise ConfigError(f"{label} must be {bounds} (got {value})", flag=label)


MAX_DRAFT = 256


def drafting_config(env: Mapping[str, str], flags: DraftFlags) -> DraftConfig:
    """--lookup-ngram (MLXCEL_LOOKUP_NGRAM), --draft-max / --draft-min (llama-server's LLAMA_ARG_DRAFT_*)."""
    ngram, draft_max, draft_min = flags.lookup_ngram, flags.draft_max, flags.draft_min
    ngram, ngram_label = flag_or_env(ngram, "--lookup-ngram", env, "MLXCEL_LOOKUP_NGRAM", parse=env_count)
    draft_max, max_label = flag_or_env(draft_max, "--draft-max", env, "LLAMA_ARG_DRAFT_MAX", parse=env_count)
    draft_min, min_label = flag_or_env(draft_min, "--draft-min", env, "LLAMA_ARG_DRAFT_MIN", parse=env_count)
    check_range(ngram_label, ngram, 0, 64)
    check_range(max_label, draft_max, 1, MAX_DRAFT)
    check_range(min_label, draft_min, 0, MAX_DRAFT)
    config = DraftConfig(ngram or 0, 16 if draft_max is None else draft_max, draft_min or 0)
    if config.draft_min > config.draft_max:
        raise ConfigError(f"{min_label} {config.draft_min} exceeds {max_label} {config.draft_max}", flag=min_label)
    return config


def choice(value: Optional[str], flag: str, env: Mapping[str, str], name: str, choices: tuple[str, ...],
           default: Optional[str]) -> Optional[str]:
    """The flag's value, else variable `name`'s, else `default`; ConfigError naming the source unless in `choices`."""
    raw, label = flag_or_env(value, flag, env, name)
    if raw is None:
        return default
    text = raw.strip().lower()
    if text not in choices:
        raise ConfigError(f"{label} must be one of {', '.join(choices)} (got {raw!r})", flag=label)
    return text
