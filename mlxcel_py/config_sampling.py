"""llama.cpp's sampler flags (llama-server's names) -> the default ChainParams every request starts from
(engine/core/chain_params.py), and its --lora / --lora-scaled lists -> (adapter, scale) pairs. A bad value is a
ConfigError naming the flag."""

from __future__ import annotations

import dataclasses
from typing import Any

from .engine.core.chain_params import ChainParams, sampler_order
from .errors import ConfigError, RequestError

# ChainParams field -> (the flag record's field, the flag)
FLAGS = {
    "typical_p": ("typical", "--typical"), "mirostat": ("mirostat", "--mirostat"),
    "mirostat_eta": ("mirostat_lr", "--mirostat-lr"), "mirostat_tau": ("mirostat_ent", "--mirostat-ent"),
    "dynatemp_range": ("dynatemp_range", "--dynatemp-range"), "dynatemp_exponent": ("dynatemp_exp", "--dynatemp-exp"),
    "xtc_probability": ("xtc_probability", "--xtc-probability"), "xtc_threshold": ("xtc_threshold", "--xtc-threshold"),
    "top_n_sigma": ("top_nsigma", "--top-nsigma"), "min_keep": ("min_keep", "--min-keep"),
}
CHAIN_FLAGS = {field: flag for field, (_, flag) in FLAGS.items()} | {"samplers": "--samplers"}


def chain_flags(flags: Any) -> ChainParams:
    """The sampler-chain flags of a SamplingFlags record (--samplers or --sampling-seq for the order)."""
    values = {field: value for field, (name, _) in FLAGS.items() if (value := getattr(flags, name, None)) is not None}
    names, letters = getattr(flags, "samplers", None), getattr(flags, "sampling_seq", None)
    if names is not None and letters is not None:
        raise ConfigError("--samplers and --sampling-seq both give the sampler order; give one", flag="--samplers")
    try:
        if names is not None:
            values["order"] = sampler_order(names.split(";"), "--samplers")
        elif letters is not None:
            values["order"] = sampler_order(list(letters), "--sampling-seq")
        return dataclasses.replace(ChainParams(), **values)
    except RequestError as exc:
        flag = CHAIN_FLAGS.get(exc.param or "", exc.param)
        message = str(exc)
        if exc.param in CHAIN_FLAGS and message.startswith(exc.param + " "):
            message = flag + message[len(exc.param):]
        raise ConfigError(message, flag=flag) from None


def lora_specs(plain, scaled) -> tuple[tuple[str, float], ...]:
    """--lora FILE[,FILE...] (scale 1) and --lora-scaled FILE:SCALE[,...], each repeatable, in the order given."""
    out = [(path.strip(), 1.0) for value in plain or () for path in value.split(",") if path.strip()]
    for value in scaled or ():
        for item in value.split(","):
            path, sep, scale = item.strip().rpartition(":")
            try:
                out.append((path, float(scale)))
            except ValueError:
                sep = ""
            if not sep or not path:
                raise ConfigError(f"--lora-scaled takes FILE:SCALE (got {item!r})", flag="--lora-scaled")
    return tuple(out)
