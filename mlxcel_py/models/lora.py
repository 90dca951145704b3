"""LoRA adapters loaded with the model (--lora, --lora-scaled, as llama-server): mlx-lm adapter directories
(`adapter_config.json` + `adapters.safetensors`, as `mlx_lm.lora` writes them) and llama.cpp GGUF LoRA files
(`general.type` adapter, as `convert_lora_to_gguf.py` writes them). Each adapted module's output gains
scale * (x A) B beside the base product, never merged into the base weights (a quantized base keeps its
numbers). A request runs with the loaded scales, or with its own (llama-server's per-request `lora`): the runner
sets each forward's rows' scales on the LoraState every adapted module reads, so one batch mixes them.

mlx-lm's scale is its config's `lora_parameters.scale` (as its LoRALinear); llama.cpp's is alpha / rank when
the file names an alpha (as its graph builds it), times the scale the flag gives."""

from __future__ import annotations

import dataclasses
import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..errors import ModelLoadError


@dataclass(frozen=True, slots=True)
class Adapter:
    """A loaded adapter, as GET /lora-adapters lists it."""

    id: int
    path: str
    scale: float
    kind: str  # "mlx" | "gguf"
    modules: int  # modules it adapts
    fused: bool = False  # merged into the weights (--lora-fuse): its scale is fixed


class LoraState:
    """The adapters' scales for the forward running now: per row ((rows, adapters), set by the runner around a
    forward) or, outside one, the loaded scales."""

    def __init__(self, scales: tuple[float, ...]):
        self.scales = scales
        self.rows: Optional[mx.array] = None
        self.rows_np: Optional[np.ndarray] = None  # the same for the CPU decode step's products

    @contextmanager
    def using(self, rows: list[tuple[float, ...]]) -> Iterator[None]:
        self.rows_np = np.asarray(rows, dtype=np.float32)
        self.rows = mx.array(self.rows_np)
        try:
            yield
        finally:
            self.rows = self.rows_np = None


class LoraProduct:
    """A CPU decode step's product (models/cpu/native.Product: the base over the file's blocks) with the adapters'
    low-rank additions in numpy, each over its module's columns of the product (q/k/v in qkv, gate/up)."""

    def __init__(self, base: Any, deltas: tuple, state: LoraState):
        self.base, self.deltas, self._state = base, deltas, state

    def __call__(self, x: np.ndarray, threads: int) -> np.ndarray:
        y = self.base(x, threads)
        rows = self._state.rows_np
        for lo, hi, a, b, own, index in self.deltas:
            if rows is None:
                scale: Any = np.float32(own * self._state.scales[index])
            else:  # a scale a row; a row's positions (a verify span, a prompt piece) follow it
                scale = np.repeat(own * rows[:, index], x.shape[0] // rows.shape[0])[:, None]
            y[:, lo:hi] += scale * ((x @ a) @ b)
        return y


def lora_products(decoder: Any, model: Any, state: LoraState) -> bool:
    """Put the adapted modules' additions into a per-product CPU decode step (NativeDecoder); False when the
    step is no such thing (the caller then decodes through mlx-lm)."""
    from .cpu.arch import projections
    from .cpu.native import NativeDecoder

    if type(decoder) is not NativeDecoder:
        return False
    args = model.args
    dim = decoder.head_dim
    widths = {3: (decoder.heads * dim, decoder.kv_heads * dim, decoder.kv_heads * dim),
              2: (args.intermediate_size, args.intermediate_size)}
    for i, layer in enumerate(model.model.layers):
        w, updates = decoder._layers[i], {}
        for field, modules in zip(("qkv", "o", "gate_up", "down"), projections(layer)):
            spans, lo = widths.get(len(modules), (None,)), 0
            deltas = []
            for module, width in zip(modules, spans):
                hi = None if width is None else lo + width
                for a, b, own, index in getattr(module, "deltas", ()):
                    deltas.append((lo, hi, np.asarray(a, np.float32), np.asarray(b, np.float32), own, index))
                lo = hi if hi is not None else lo
            if deltas:
                updates[field] = LoraProduct(getattr(w, field), tuple(deltas), state)
        if updates:
            decoder._layers[i] = dataclasses.replace(w, **updates)
    return True


class LoraLinear(nn.Module):
    """A module with low-rank additions: base(x) + sum over adapters of scale * (x @ a) @ b."""

    def __init__(self, base: Any, state: LoraState):
        super().__init__()
        self.base = base
        self.deltas: list[tuple[mx.array, mx.array, float, int]] = []  # a, b, the file's scale, adapter index
        self._state = state

    def __call__(self, x: mx.array) -> mx.array:
        y = self.base(x)
        rows = self._state.rows
        for a, b, own, index in self.deltas:
            z = (x @ a.astype(x.dtype)) @ b.astype(x.dtype)
            if rows is None:
                scale = own * self._state.scales[index]
            else:  # one scale a row: (rows, 1, ..., 1)
                scale = (own * rows[:, index]).reshape(-1, *([1] * (z.ndim - 1)))
            y = y + (scale * z).astype(y.dtype)
        return y


def apply_adapters(model: Any, specs: tuple[tuple[str, float], ...]) -> tuple[tuple[Adapter, ...], LoraState]:
    """Wrap the modules each adapter names; the adapters as listed (their ids in the order given) and the
    state their scales are read from."""
    adapters = []
    state = LoraState(tuple(float(scale) for _, scale in specs))
    for i, (path, scale) in enumerate(specs):
        source = Path(path).expanduser()
        pairs, kind = (_gguf(source, model) if source.is_file() else _mlx(source))
        for name, (a, b, own) in pairs.items():
            module = _module(model, name, source.name)
            if not isinstance(module, LoraLinear):
                module = _wrap(model, name, module, state)
            module.deltas.append((a, b, own, i))
        mx.eval([a for a, _, _ in pairs.values()] + [b for _, b, _ in pairs.values()])
        adapters.append(Adapter(i, str(source), float(scale), kind, len(pairs)))
    return tuple(adapters), state


def fuse_adapters(model: Any, specs: tuple[tuple[str, float], ...]) -> tuple[Adapter, ...]:
    """--lora-fuse: W += scale * (a b)^T into each adapted module's float weights (asked for speed; the numbers
    become the merged model's). A module without float weights (quantized) is a ModelLoadError."""
    adapters = []
    for i, (path, scale) in enumerate(specs):
        source = Path(path).expanduser()
        pairs, kind = (_gguf(source, model) if source.is_file() else _mlx(source))
        for name, (a, b, own) in pairs.items():
            module = _module(model, name, source.name)
            weight = getattr(module, "weight", None)
            if weight is None or hasattr(module, "scales") or not mx.issubdtype(weight.dtype, mx.floating):
                raise ModelLoadError(f"--lora-fuse: {name} has no float weights to merge into (a quantized model: "
                                     "load its adapters unfused, or --cpu-weights f32 on the CPU)")
            module.weight = weight + ((own * scale) * (a @ b).T).astype(weight.dtype)
        adapters.append(Adapter(i, str(source), float(scale), kind, len(pairs), fused=True))
    mx.eval(model.parameters())
    return tuple(adapters)


def _mlx(folder: Path) -> tuple[dict, str]:
    """An mlx-lm adapter directory: {module path: (a (in, r), b (r, out), scale)}."""
    try:
        config = json.loads((folder / "adapter_config.json").read_text())
        weights = mx.load(str(folder / "adapters.safetensors"))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"--lora {folder}: not an mlx-lm adapter directory (adapter_config.json and "
                             f"adapters.safetensors) nor a GGUF LoRA file: {exc}") from None
    kind = config.get("fine_tune_type", "lora")
    if kind != "lora":
        raise ModelLoadError(f"--lora {folder.name}: {kind!r} adapters are not supported here (lora only)")
    scale = float((config.get("lora_parameters") or {}).get("scale", 20.0))  # mlx-lm's LoRALinear default
    pairs = {}
    for key, a in weights.items():
        if key.endswith(".lora_a"):
            name = key.removesuffix(".lora_a")
            if name + ".lora_b" not in weights:
                raise ModelLoadError(f"--lora {folder.name}: {key} has no lora_b")
            pairs[name] = (a.astype(mx.float32), weights[name + ".lora_b"].astype(mx.float32), scale)
    if not pairs:
        raise ModelLoadError(f"--lora {folder.name}: adapters.safetensors holds no lora_a/lora_b pairs")
    return pairs, "mlx"


def _gguf(path: Path, model: Any) -> tuple[dict, str]:
    """A llama.cpp GGUF LoRA: its A (r, in) and B (out, r) as a = A^T, b = B^T, scale alpha / rank (when named);
    a llama model's Q/K rows put back in Hugging Face's order, as the base's are."""
    from .gguf import unpermute_rows
    from .gguf_arch import ARCHS
    from .gguf_file import read_gguf
    from .gguf_tensors import dense

    gguf = read_gguf(path)
    meta = gguf.metadata
    if meta.get("general.type") != "adapter" or meta.get("adapter.type") != "lora":
        raise ModelLoadError(f"--lora {path.name}: not a LoRA adapter GGUF (general.type {meta.get('general.type')!r})")
    arch = ARCHS.get(meta.get("general.architecture"))
    args = getattr(model, "args", None)
    if arch is None or getattr(args, "model_type", None) != arch.model_type:
        raise ModelLoadError(f"--lora {path.name}: a {meta.get('general.architecture')} adapter; the model is "
                             f"{getattr(args, 'model_type', '?')}")
    alpha = float(meta.get("adapter.lora.alpha", 0.0) or 0.0)
    pairs = {}
    for name, info in gguf.tensors.items():
        if not name.endswith(".lora_a"):
            continue
        base = name.removesuffix(".lora_a")
        if base + ".lora_b" not in gguf.tensors:
            raise ModelLoadError(f"--lora {path.name}: {name} has no lora_b")
        a, b = dense(info), dense(gguf.tensors[base + ".lora_b"])  # (r, in), (out, r)
        module = arch.mlx_name(base, path.name).removesuffix(".weight")
        if arch.permuted_qk and module.endswith(("q_proj", "k_proj")):
            heads = args.num_attention_heads if module.endswith("q_proj") else args.num_key_value_heads
            b = unpermute_rows(b, heads)
        rank = a.shape[0]
        pairs[module] = (a.T, b.T, alpha / rank if alpha else 1.0)
    if not pairs:
        raise ModelLoadError(f"--lora {path.name}: no lora_a/lora_b tensors")
    return pairs, "gguf"


def _module(model: Any, name: str, source: str) -> Any:
    node = model
    for part in name.split("."):
        node = node[int(part)] if isinstance(node, list) else getattr(node, part, None)
        if node is None:
            raise ModelLoadError(f"--lora {source}: the model has no module {name} (an adapter for another model?)")
    return node


def _wrap(model: Any, name: str, module: Any, state: LoraState) -> LoraLinear:
    parent_name, _, last = name.rpartition(".")
    parent = _module(model, parent_name, name) if parent_name else model
    wrapped = LoraLinear(module, state)
    if isinstance(parent, list):
        parent[int(last)] = wrapped
    else:
        setattr(parent, last, wrapped)
    return wrapped
