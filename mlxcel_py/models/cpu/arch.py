"""What differs between the architectures the CPU decode step runs, as data.

`spec_for(model)` reads an mlx-lm model (llama, mistral as llama, qwen2, qwen3, gemma3_text, phi3)
into a frozen `ArchSpec` and per-layer `LayerWeights`: q/k/v biases (qwen2), per-head q/k RMS
norms (qwen3, gemma3), norm weights stored as `w` but applied as `1 + w` (gemma3), the sandwich
norms after attention and MLP (gemma3), GELU-tanh instead of SiLU (gemma3), a sliding window and
its own rope per layer (gemma3), the embedding scale (gemma3: sqrt(hidden) rounded to bfloat16,
as mlx-lm multiplies it). The decode step (decoder.py) and its kernels read only these.
An absent part is an empty float32 array, so one compiled kernel serves every architecture."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..gguf_arch import ARCHS as GGUF_ARCHS

NONE = np.zeros(0, np.float32)  # an absent norm or bias
SILU, GELU_TANH = 0, 1
# mlx-lm model types the step runs, from the one architecture table (mistral loads as llama)
ARCHS = tuple(a.model_type for a in GGUF_ARCHS.values() if a.cpu_step)


@dataclass(frozen=True, slots=True)
class ArchSpec:
    """The model-wide numbers of a decode step; `windows[i]` 0 is full attention, `rope_of[i]` the
    index of layer i's rope in `ropes`."""

    arch: str
    heads: int
    kv_heads: int
    head_dim: int
    scale: float
    eps: float
    activation: int
    embed_scale: float  # 1.0: none
    norm_offset: float  # added to every RMS norm weight
    windows: tuple[int, ...]
    rope_of: tuple[int, ...]
    ropes: tuple[Callable, ...]

    @property
    def plain(self) -> bool:
        """True for a llama layer (the original single-call `layer_step`)."""
        return self.arch == "llama" and not any(self.windows)

    @property
    def llama_layer(self) -> bool:
        """True for llama's layer with at most a bias on q/k/v (qwen2): what the fused step
        (fused_step.py) and the engine's own KV rows (rows.py, tick.py) run."""
        return self.arch in ("llama", "qwen2") and not any(self.windows)


def qkv_bias(layer) -> np.ndarray:
    """A decoder layer's q/k/v bias (`Norms.qkv_bias`; NONE for a llama layer, whose `norms` is None)."""
    return NONE if layer.norms is None else layer.norms.qkv_bias


def _module_name(model) -> str:
    return type(model).__module__.rsplit(".", 1)[-1]


def _norm(module, offset: float) -> np.ndarray:
    w = module.weight
    return np.asarray(w + offset if offset else w).astype(np.float32, copy=False)


def _rope_dims(rope) -> Optional[int]:
    return getattr(rope, "dims", None) or getattr(rope, "dim", None)


class RopeTable:
    """cos/sin by position, taken from the model's own rope module (so they match it bit for bit)."""

    def __init__(self, rope: Callable, head_dim: int):
        self._rope, self._half, self._len = rope, head_dim // 2, 0
        self.cos = self.sin = np.zeros((0, self._half), np.float32)

    def at(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(B, head_dim / 2) cos and sin for one position per row."""
        need = int(positions.max()) + 1
        if need > self._len:
            self._grow(max(need, 2 * self._len, 512))
        return self.cos[positions], self.sin[positions]

    def _grow(self, length: int) -> None:
        unit = mx.concatenate([mx.ones((self._half,)), mx.zeros((self._half,))])
        table = np.array(self._rope(mx.broadcast_to(unit, (1, 1, length, 2 * self._half)), offset=0)[0, 0])
        self.cos, self.sin, self._len = table[:, : self._half].copy(), table[:, self._half :].copy(), length


def rope_is_rotate_half(rope, head_dim: int) -> bool:
    """True when `rope` rotates the two halves of each head (what the table step computes), found by
    running it on a random head against the rotation its own cos/sin table gives."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 1, 5, head_dim)).astype(np.float32)
    got = np.array(rope(mx.array(x), offset=3))
    table = RopeTable(rope, head_dim)
    cos, sin = table.at(np.arange(3, 8))
    half = head_dim // 2
    x1, x2 = x[0, 0, :, :half], x[0, 0, :, half:]
    want = np.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
    return bool(np.allclose(got[0, 0], want, atol=1e-4, rtol=1e-4))


def _rope_key(rope, head_dim: int) -> bytes:
    """Equal for ropes that rotate alike (gemma3 builds one per layer): their output at a few offsets."""
    x = mx.ones((1, 1, 1, head_dim))
    return b"".join(np.array(rope(x, offset=o)).tobytes() for o in (1, 4099, 65537))


def _why_not(model) -> Optional[str]:
    name = _module_name(model)
    if name not in ARCHS or type(model).__name__ != "Model":
        return f"model class {type(model).__module__}.{type(model).__name__}"
    args = model.args
    if getattr(args, "mlp_bias", False) or (name != "qwen2" and getattr(args, "attention_bias", False)):
        return "biases"
    if name == "llama" and any(t != "full_attention" for t in args.layer_types):
        return "sliding-window layers"
    from mlx_lm.models.cache import KVCache, make_prompt_cache

    kinds = {type(c) for c in make_prompt_cache(model)}
    if kinds != {KVCache}:  # mlx-lm's own gemma3 gives RotatingKVCache to sliding layers
        return "KV caches " + ", ".join(sorted(k.__name__ for k in kinds))
    head_dim = _head_dim(model)
    for rope in {id(l.self_attn.rope): l.self_attn.rope for l in model.layers}.values():
        if _rope_dims(rope) not in (None, head_dim):
            return "partial rope"
        if getattr(rope, "traditional", False) or not rope_is_rotate_half(rope, head_dim):
            return f"rope {type(rope).__name__}"
    return None


def _head_dim(model) -> int:
    attn = model.layers[0].self_attn
    args = model.args
    return int(getattr(attn, "head_dim", None) or getattr(args, "head_dim", None) or args.hidden_size // attn.n_heads)


def supported(model) -> Optional[str]:
    """None when `model` can decode on the CPU step, else why not (it then decodes through mlx-lm)."""
    why = _why_not(model)
    if why is not None:
        return why
    for _, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Embedding)) and type(module) not in (nn.Linear, nn.Embedding):
            return f"{type(module).__name__} layers"
        weight = getattr(module, "weight", None)
        if isinstance(weight, mx.array) and weight.dtype != mx.float32:
            return f"{weight.dtype} weights"
    return None


def llama_like(model) -> bool:
    """An mlx-lm llama or qwen2 with llama's layer (a q/k/v bias allowed; no q/k norms, windows or other
    rope: ArchSpec.llama_layer): what the fused decode step runs."""
    from mlx_lm.models import llama, qwen2

    return type(model) in (llama.Model, qwen2.Model) and supported(model) is None and spec_for(model).llama_layer


def spec_for(model) -> ArchSpec:
    """The ArchSpec of a `supported` model."""
    name, args = _module_name(model), model.args
    layers = model.layers
    attn = layers[0].self_attn
    gemma = name == "gemma3_text"
    keys = [_rope_key(l.self_attn.rope, _head_dim(model)) for l in layers]
    ropes = {k: l.self_attn.rope for k, l in reversed(list(zip(keys, layers)))}  # the first layer's of each
    order = sorted(ropes, key=keys.index)
    rope_of = tuple(order.index(k) for k in keys)
    window = int(getattr(model.model, "window_size", 0) or 0) if gemma else 0
    embed_scale = float(mx.array(args.hidden_size**0.5, mx.bfloat16).astype(mx.float32).item()) if gemma else 1.0
    return ArchSpec(
        arch=name, heads=attn.n_heads, kv_heads=attn.n_kv_heads, head_dim=_head_dim(model),
        scale=float(attn.scale), eps=float(args.rms_norm_eps), activation=GELU_TANH if gemma else SILU,
        embed_scale=embed_scale, norm_offset=1.0 if gemma else 0.0,
        windows=tuple(window if gemma and l.self_attn.is_sliding else 0 for l in layers),
        rope_of=rope_of, ropes=tuple(ropes[k] for k in order),
    )


@dataclass(frozen=True, slots=True)
class Norms:
    """A layer's norm weights and biases beyond llama's two (each NONE when absent), offset applied."""

    qkv_bias: np.ndarray
    q_norm: np.ndarray
    k_norm: np.ndarray
    post_attn: np.ndarray  # gemma3: on the attention output, before the residual
    post_ffn: np.ndarray  # gemma3: on the MLP output


def layer_norms(layer, spec: ArchSpec) -> tuple[np.ndarray, np.ndarray, Norms]:
    """(the norm before attention, the norm before the MLP, the rest) of one mlx-lm layer."""
    a, off = layer.self_attn, spec.norm_offset
    q_norm = getattr(a, "q_norm", None)
    biases = [getattr(p, "bias", None) for p in _qkv_modules(a)]
    bias = np.concatenate([np.asarray(b) for b in biases]) if all(b is not None for b in biases) and biases else NONE
    if spec.arch == "gemma3_text":
        pre_ffn, post_attn = layer.pre_feedforward_layernorm, _norm(layer.post_attention_layernorm, off)
        post_ffn = _norm(layer.post_feedforward_layernorm, off)
    else:
        pre_ffn, post_attn, post_ffn = layer.post_attention_layernorm, NONE, NONE
    norms = Norms(bias.astype(np.float32, copy=False),
                  _norm(q_norm, off) if q_norm is not None else NONE,
                  _norm(a.k_norm, off) if q_norm is not None else NONE, post_attn, post_ffn)
    return _norm(layer.input_layernorm, off), _norm(pre_ffn, off), norms


def _qkv_modules(attn) -> list:
    fused = getattr(attn, "qkv_proj", None)
    return [fused] if fused is not None else [attn.q_proj, attn.k_proj, attn.v_proj]


def projections(layer) -> tuple[list, list, list, list]:
    """The (qkv, o, gate_up, down) modules of a layer, each a list to fuse (phi3's are fused already)
    and the parameter names after `model.layers.N.`."""
    a, m = layer.self_attn, layer.mlp
    if hasattr(a, "qkv_proj"):
        return [a.qkv_proj], [a.o_proj], [m.gate_up_proj], [m.down_proj]
    return [a.q_proj, a.k_proj, a.v_proj], [a.o_proj], [m.gate_proj, m.up_proj], [m.down_proj]


def projection_keys(layer, i: int) -> tuple[list[str], ...]:
    """The mlx-lm weight names of `projections(layer)`."""
    p = f"model.layers.{i}."
    if hasattr(layer.self_attn, "qkv_proj"):
        return ([p + "self_attn.qkv_proj.weight"], [p + "self_attn.o_proj.weight"],
                [p + "mlp.gate_up_proj.weight"], [p + "mlp.down_proj.weight"])
    return ([p + f"self_attn.{x}_proj.weight" for x in "qkv"], [p + "self_attn.o_proj.weight"],
            [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"], [p + "mlp.down_proj.weight"])


def final_norm(model, spec: ArchSpec) -> np.ndarray:
    return _norm(model.model.norm, spec.norm_offset)
