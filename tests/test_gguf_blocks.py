"""GGUF matrices held as their blocks on the CPU (`--cpu-weights native`): no float32 copy, same logits."""

import mmap
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlxcel_py.models import load_model
from mlxcel_py.models.cpu.native import NativeDecoder
from mlxcel_py.models.footprint import status_kib
from mlxcel_py.models.gguf_blocks import BlockEmbedding, BlockLinear, mapped, release
from mlxcel_py.models.cpu.quant import products, kquant_r8, vector

from test_cpu_decode import make_batch, prompt

FIXTURES = Path(__file__).parent / "fixtures" / "gguf"
LLAMAS = ["llama-q8_0", "llamaq-q4_k_m", "llamaq-q5_k_m", "llamaq-q6_k"]
TILED = 1e-4  # prefill tiles: the same float32 weights, BLAS's summation order only (measured <= 4e-6)
EXACT = 1e-4  # float activations over the blocks against the float32 model's decode step
INT8 = 0.15  # the shipped int8-activation decode kernels (docs/CPU_DECODE.md)


def _pair(name, monkeypatch=None):
    """(block layers, float32) loads; with `monkeypatch` the block layers keep the file's blocks (the
    tiles' path, not quant/r8_layers.py's repacked rows with int8 activations)."""
    if monkeypatch is not None:
        from mlxcel_py.models import gguf

        monkeypatch.setattr(gguf, "repack_block_layers", lambda model, copies=False: 0)
    path = str(FIXTURES / f"{name}.gguf")
    return load_model(path, threads=1, cpu_weights="native"), load_model(path, threads=1, cpu_weights="f32")


def _logits(lm, ids):
    cache = lm.model.make_cache() if hasattr(lm.model, "make_cache") else None
    with lm.cpu_kernels:
        return np.array(lm.model(mx.array([ids]), cache=cache))


@pytest.mark.parametrize("name", LLAMAS + ["qwen3-q8_0"])
def test_block_model_keeps_no_float32_matrix_and_its_prefill_equals_float32s(name, monkeypatch):
    blocks, f32 = _pair(name, monkeypatch)
    assert (blocks.weights, f32.weights) == ("gguf-blocks", "dense-float32")
    assert "GGUF blocks (no float32 copy)" in blocks.description
    kinds = {type(m) for _, m in blocks.model.named_modules()}
    assert BlockLinear in kinds and BlockEmbedding in kinds and mx.array not in kinds
    assert not any(v.ndim == 2 for _, v in tree_flatten(blocks.model.parameters()))  # norms and biases only
    ids = prompt(24, 3)
    got, want = _logits(blocks, ids), _logits(f32, ids)
    assert np.abs(got - want).max() < TILED
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_few_rows_equal_the_float32_path_bit_for_bit(monkeypatch):
    """A short prefill piece or the runner's LM head is a row or two: those go through the same tiles
    (not the decode kernels), each fixture matrix one tile, so they equal the f32 path exactly
    (the decode kernels' rounding changed a small model's greedy answer). The tiles' path: a repacked
    layer reads int8 activations instead (tests/test_r8_layers.py)."""
    blocks, f32 = _pair("qwen3-q8_0", monkeypatch)
    assert isinstance(blocks.cpu_decode, NativeDecoder)  # decode (and only decode) takes the kernels
    np.testing.assert_array_equal(_logits(blocks, [5, 7]), _logits(f32, [5, 7]))


@pytest.mark.parametrize("name,fused", [("llama-q8_0", 2), ("llamaq-q4_k_m", 1), ("llamaq-q6_k", 2)])
def test_qkv_and_gate_up_of_one_type_are_row_slices_of_one_array(name, fused):
    blocks, _ = _pair(name)
    layer = blocks.model.model.layers[0]
    groups = [[layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj],
              [layer.mlp.gate_proj, layer.mlp.up_proj]]
    whole = [g for g in groups if g[0].fused is not None]
    keep = kquant_r8.repacked_types(blocks.model)  # types the fused step repacks: their groups stay views of the file
    qtype = lambda m: (m.blocks or m.r8).qtype  # noqa: E731
    kept = [g for g in groups if len({qtype(m) for m in g}) == 1 and qtype(g[0]) in keep]
    copies = (layer.self_attn.q_proj, layer.self_attn.k_proj)  # the file's q/k row order undone: copies,
    # repacked at load where the step repacks their type, the copies then dropped
    assert all(m.fused is None and (m.blocks is None if any(m is c for c in copies) else mapped(m.blocks.blocks))
               for g in kept for m in g)
    fused -= len(kept)
    assert len(whole) == fused  # q4_k_m: v is Q6_K beside Q4_K q/k, so only gate/up fuse (unless repacked)
    assert len(kept) == (0 if not keep else {"llama-q8_0": 2, "llamaq-q4_k_m": 1, "llamaq-q6_k": 2}[name])
    for group in whole:
        assert all(np.shares_memory(m.blocks.blocks, group[0].fused.blocks) for m in group)
        assert sum(m.blocks.shape[0] for m in group) == group[0].fused.shape[0]


@pytest.mark.parametrize("name", LLAMAS)
def test_native_decode_over_the_block_model_equals_float32s(name, monkeypatch):
    blocks, f32 = _pair(name, monkeypatch)  # the file's blocks: products.linear below forces their activations
    assert isinstance(blocks.cpu_decode, NativeDecoder) and blocks.cpu_decode.counts()[1] == 0
    prompts = [prompt(9, 0), prompt(20, 1)]
    ours, theirs = make_batch(blocks.model, prompts), make_batch(f32.model, prompts)
    tokens = [p[-1] for p in prompts]
    worst_int8 = float(np.abs(np.array(blocks.cpu_decode(tokens, ours)) - np.array(f32.cpu_decode(tokens, theirs))).max())
    assert worst_int8 < INT8
    monkeypatch.setattr(products, "linear", _float_linear)  # float activations: rounding only
    ours, theirs = make_batch(blocks.model, prompts), make_batch(f32.model, prompts)
    for _ in range(4):
        got, want = np.array(blocks.cpu_decode(tokens, ours)), np.array(f32.cpu_decode(tokens, theirs))
        assert np.abs(got - want).max() < EXACT and got.argmax(-1).tolist() == want.argmax(-1).tolist()
        tokens = want.argmax(-1).tolist()


def _float_linear(x, w, out=None, threads=None):
    kernel = products.linear_vector if int(w.qtype) in vector.VECTOR_TYPES else products.linear_float
    return kernel(x, w, out, threads)


def test_release_drops_a_copied_tensors_pages_from_resident_memory(tmp_path):
    path = tmp_path / "pages.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 255, 8 << 20, dtype=np.uint8).tobytes())
    view = np.memmap(path, dtype=np.uint8, mode="r")[mmap.PAGESIZE:].reshape(-1, 1024)
    before = status_kib("RssFile")
    assert int(view.sum(dtype=np.int64)) > 0  # every page read in
    touched = status_kib("RssFile")
    release(view)
    assert touched - before > 6 * 1024 and status_kib("RssFile") < touched - 6 * 1024
    assert int(view[-1].sum(dtype=np.int64)) > 0  # still readable: pages fault back in
    release(np.ones((4, 4), np.uint8))  # a copy: nothing to drop, no error


def test_the_memory_estimate_follows_the_cpu_weights():
    from mlxcel_py.models import default_model_path
    from mlxcel_py.models.footprint import estimate_bytes

    path = str(default_model_path())
    size = Path(path).stat().st_size
    native, dense = estimate_bytes(path, "native"), estimate_bytes(path, "f32")
    assert size <= native < 1.1 * size  # the blocks are the file; only norms become float32 arrays
    assert dense > 5 * size  # a float32 copy of every tensor beside the file
