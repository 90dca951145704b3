"""A request's llama.cpp sampler chain settings (engine/runner/sampler_chain.py runs them): the samplers beyond
the plain path's top-k/top-p/min-p and temperature, and the chain's order. Data only, validated on
construction; errors name the field as llama-server's requests and flags spell it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...errors import RequestError

# llama-server's sampler names (and --sampling-seq's letters) -> ours; its default order (common/common.h).
NAMES = {"penalties": "penalties", "e": "penalties", "dry": "dry", "d": "dry", "top_n_sigma": "top_n_sigma",
         "s": "top_n_sigma", "top_k": "top_k", "k": "top_k", "typ_p": "typ_p", "typical_p": "typ_p",
         "typical": "typ_p", "y": "typ_p", "top_p": "top_p", "p": "top_p", "nucleus": "top_p", "min_p": "min_p",
         "m": "min_p", "xtc": "xtc", "x": "xtc", "temperature": "temperature", "temp": "temperature",
         "t": "temperature"}
DEFAULT_ORDER = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
DRY_BREAKERS = ("\n", ":", '"', "*")  # llama-server's default sequence breakers


def sampler_order(value, param: str = "samplers") -> tuple[str, ...]:
    """llama-server's `samplers`: a list of names, or a string of --sampling-seq letters (or names split by ;)."""
    if isinstance(value, str):
        parts = value.split(";") if ";" in value or value in NAMES and len(value) > 1 else list(value)
    elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        parts = list(value)
    else:
        raise RequestError(f"{param} must be a list of sampler names or a string of their letters (got {value!r})",
                           param=param)
    unknown = [p for p in parts if p.strip() not in NAMES]
    if unknown:
        raise RequestError(f"{param}: unknown sampler {unknown[0]!r} (known: {', '.join(DEFAULT_ORDER)}, or the "
                           "letters edskypmxt)", param=param)
    return tuple(NAMES[p.strip()] for p in parts)


@dataclass(frozen=True, slots=True)
class ChainParams:
    typical_p: float = 1.0
    min_keep: int = 0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    top_n_sigma: float = -1.0
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    order: tuple[str, ...] = ()  # llama-server's names, as the request or --samplers gave them; (): its default
    # DRY (engine/runner/dry.py): a logit processor before the chain
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1  # -1: a slot's context (resolved by the server into `dry_last_n`)
    dry_sequence_breakers: tuple[str, ...] = DRY_BREAKERS
    dry_last_n: int = 0  # the tokens DRY looks back over, resolved
    dry_breakers: tuple[tuple[int, tuple[int, ...]], ...] = ()  # the breakers as tokens (head, tail), resolved

    def __post_init__(self) -> None:
        for name, low, high in (("typical_p", 0.0, 1.0), ("xtc_probability", 0.0, 1.0), ("xtc_threshold", 0.0, 1.0),
                                ("top_n_sigma", -1e9, 1e9), ("dynatemp_range", 0.0, 100.0),
                                ("dynatemp_exponent", 0.0, 100.0), ("mirostat_tau", 0.0, 100.0),
                                ("mirostat_eta", 0.0, 10.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not low <= value <= high:
                bounds = "any finite number" if name == "top_n_sigma" else f"between {low:g} and {high:g}"
                raise RequestError(f"{name} must be {bounds} (got {value!r})", param=name)
        for name, low in (("dry_multiplier", 0.0), ("dry_base", 0.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not low <= value <= 100.0:
                raise RequestError(f"{name} must be between {low:g} and 100 (got {value!r})", param=name)
        for name, low in (("dry_allowed_length", 0), ("dry_penalty_last_n", -1), ("dry_last_n", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 1 << 24:
                raise RequestError(f"{name} must be an integer, at least {low} (got {value!r})", param=name)
        if not all(isinstance(b, str) for b in self.dry_sequence_breakers):
            raise RequestError("dry_sequence_breakers must be strings", param="dry_sequence_breakers")
        if self.mirostat not in (0, 1, 2) or isinstance(self.mirostat, bool):
            raise RequestError(f"mirostat must be 0 (off), 1 or 2 (got {self.mirostat!r})", param="mirostat")
        if isinstance(self.min_keep, bool) or not isinstance(self.min_keep, int) or not 0 <= self.min_keep <= 1024:
            raise RequestError(f"min_keep must be an integer between 0 and 1024 (got {self.min_keep!r})",
                               param="min_keep")
        if any(name not in DEFAULT_ORDER for name in self.order):
            raise RequestError(f"samplers: unknown sampler in {self.order!r}", param="samplers")

    @property
    def dry_on(self) -> bool:
        """DRY penalizes (llama.cpp's condition), over resolved history and breakers."""
        return self.dry_multiplier != 0.0 and self.dry_base >= 1.0 and self.dry_last_n != 0

    @property
    def active(self) -> bool:
        """Whether the chain samples: any of its samplers on, or an order given (even llama-server's default: then
        top-k, top-p and min-p act in that order, each on what the one before kept, as in llama.cpp)."""
        return (self.typical_p < 1.0 or self.xtc_probability > 0.0 or self.top_n_sigma > 0.0
                or self.dynatemp_range > 0.0 or self.mirostat != 0 or self.min_keep > 0 or bool(self.order))
