"""What Ollama's model routes say about the one served model: /api/tags, /api/show, /api/ps.

Ollama's `details` (family, parameter size, quantization) are read from the loader's one-line
description ("llama 135M, gguf Q8_0 -> ..."); what it does not say is left empty.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from ...errors import ModelLoadError
from ...models import default_model_path

if TYPE_CHECKING:
    from ..runtime import Runtime

_GGUF = re.compile(r"^(?P<family>[\w.-]+) (?P<size>\S+), gguf (?P<quant>\w+)")
# The served model never unloads: Ollama's "expires" is as far as its clients can parse.
NEVER = "9999-12-31T23:59:59Z"


def details(rt: "Runtime") -> dict:
    """Ollama's `details` of the served model."""
    loaded = rt.loaded
    found = _GGUF.match(loaded.description)
    family = found["family"] if found else loaded.description.split(",")[0].split(" ")[0]
    return {"parent_model": "", "format": loaded.source, "family": family, "families": [family],
            "parameter_size": found["size"] if found else "",
            "quantization_level": found["quant"] if found else loaded.weights}


def _weights_path(rt: "Runtime") -> Optional[Path]:
    try:
        path = Path(rt.config.model.path) if rt.config.model.path else Path(default_model_path())
    except ModelLoadError:
        return None
    return path if path.exists() else None  # a Hugging Face id, for one, is not a path


def _size(path: Optional[Path]) -> int:
    if path is None:
        return 0
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _modified_at(rt: "Runtime", path: Optional[Path]) -> str:
    stamp = path.stat().st_mtime if path is not None else rt.started
    return datetime.fromtimestamp(stamp, timezone.utc).isoformat().replace("+00:00", "Z")


def names(rt: "Runtime") -> tuple[str, ...]:
    """Every name the model answers to in listings: the --alias names, else its own."""
    return rt.aliases or (rt.model_id,)


def _entry(rt: "Runtime", name: str) -> dict:
    path = _weights_path(rt)
    digest = hashlib.sha256(rt.fingerprint.encode()).hexdigest()
    return {"name": name, "model": name, "modified_at": _modified_at(rt, path), "size": _size(path),
            "digest": digest, "details": details(rt)}


def _unloaded_entry(rt: "Runtime", name: str) -> dict:
    """A configured model that is not resident: what its files tell (details once loaded)."""
    path = _weights_path(rt)
    digest = hashlib.sha256(f"{name}|{path}".encode()).hexdigest()
    fmt = "gguf" if path is not None and path.suffix.lower() == ".gguf" else "mlx"
    return {"name": name, "model": name, "modified_at": _modified_at(rt, path), "size": _size(path),
            "digest": digest, "details": {"parent_model": "", "format": fmt, "family": "", "families": [],
                                          "parameter_size": "", "quantization_level": ""}}


def tags_many(registry) -> dict:
    """GET /api/tags with several models: every configured one, with its state."""
    out = []
    for hosted in registry.hosted.values():
        rt = hosted.runtime
        entry = _entry(rt, hosted.name) if rt.loaded is not None else _unloaded_entry(rt, hosted.name)
        out.append({**entry, "state": hosted.describe()})
    return {"models": out}


def ps_many(registry) -> dict:
    """GET /api/ps with several models: the resident ones, with when their keep-alive unloads them."""
    out = []
    for hosted in registry.hosted.values():
        rt = hosted.runtime
        if rt.loaded is None or rt.worker is None:
            continue
        entry = ps_json(rt)["models"][0]
        expires = NEVER if hosted.expires_at is None else datetime.fromtimestamp(
            hosted.expires_at, timezone.utc).isoformat().replace("+00:00", "Z")
        out.append({**entry, "name": hosted.name, "model": hosted.name, "expires_at": expires,
                    "size": hosted.memory})
    return {"models": out}


def tags_json(rt: "Runtime") -> dict:
    """GET /api/tags: the served model under each of its names."""
    return {"models": [_entry(rt, name) for name in names(rt)]}


def ps_json(rt: "Runtime") -> dict:
    """GET /api/ps: the served model, loaded for the server's lifetime."""
    entry = _entry(rt, rt.model_id)
    del entry["modified_at"]
    on_cpu = rt.loaded.weights in ("dense-float32", "gguf-blocks", "mlx-blocks")  # the CPU fast path's weights
    return {"models": [{**entry, "expires_at": NEVER, "size_vram": 0 if on_cpu else entry["size"],
                        "context_length": rt.worker.stats().slot_context}]}


def _parameters(rt: "Runtime") -> str:
    s = rt.config.sampling
    values = {"temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p,
              "repeat_penalty": s.repetition_penalty}
    return "\n".join(f"{name:<15}{value}" for name, value in values.items() if value is not None)


def show_json(rt: "Runtime") -> dict:
    """POST /api/show: details, model_info, the chat template (Jinja, not Ollama's Go templates),
    the server's sampling defaults as `parameters`, and capabilities."""
    info = details(rt)
    path = _weights_path(rt)
    model_info = {"general.architecture": info["family"], "general.basename": rt.loaded.name,
                  f"{info['family']}.context_length": rt.loaded.context_length}
    return {
        "modelfile": f"# served by mlxcel-py: models are chosen with --model\nFROM {path or rt.loaded.name}\n",
        "parameters": _parameters(rt), "template": rt.template_text,
        "details": info, "model_info": model_info,
        "capabilities": ["completion", "tools"] + (["vision"] if rt.loaded.vision is not None else []),
        "modified_at": _modified_at(rt, path), "license": "",
    }
