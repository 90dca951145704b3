"""GGUF tensor types: our reader and MLX repacks against gguf-py's writer and reference dequantizer."""

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGUFWriter, quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

from mlxcel_py.models import ModelLoadError
from mlxcel_py.models import gguf_tensors
from mlxcel_py.models.gguf_file import TensorInfo, read_gguf

# Byte offsets of each block's float16 scale fields: set to sane values in random blocks.
F16_FIELDS = {
    T.Q4_0: (0,), T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q8_0: (0,), T.Q2_K: (80, 82),
    T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,),
}
QUANTIZED = gguf_tensors.REPACKED + gguf_tensors.REQUANTIZED


def random_blocks(qtype: T, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """Random quantized rows (every code and sub-scale pattern), with finite float16 scales."""
    rng = np.random.default_rng(seed)
    block, size = GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for offset in F16_FIELDS[qtype]:
        scales = rng.uniform(1e-3, 1e-2, (rows, cols // block)).astype(np.float16)
        data[..., offset : offset + 2] = scales.view(np.uint8).reshape(rows, cols // block, 2)
    return data.reshape(rows, -1)


@pytest.mark.parametrize("qtype", QUANTIZED, ids=lambda t: t.name)
def test_mlx_quantized_tensor_matches_the_reference_dequantizer(qtype):
    data = random_blocks(qtype, 8, 512)
    want = quants.dequantize(data, qtype)
    got = gguf_tensors.quantized(TensorInfo("w", qtype, (8, 512), data), dtype=mx.float32)
    back = np.array(mx.dequantize(got.weight, got.scales, got.biases, group_size=32, bits=got.bits))
    if qtype in gguf_tensors.REPACKED:
        # Same codes, same scale and offset per 32 values: exact.
        assert got.bits == {T.Q8_0: 8, T.Q5_K: 5, T.Q5_0: 5, T.Q5_1: 5}.get(qtype, 4)
        np.testing.assert_array_equal(back, want)
    else:
        # Requantized to 8 bits per 32 values (MLX keeps 0 exact): within one step of each group's range.
        assert got.bits == 8
        groups = want.reshape(8, -1, 32)
        step = (groups.max(-1) - groups.min(-1)) / 255
        assert np.all(np.abs(back.reshape(8, -1, 32) - groups) <= step[..., None] + 1e-6)


@pytest.mark.parametrize("qtype", QUANTIZED, ids=lambda t: t.name)
def test_dense_tensor_is_the_reference_dequantization(qtype):
    data = random_blocks(qtype, 4, 256, seed=1)
    got = np.array(gguf_tensors.dense(TensorInfo("w", qtype, (4, 256), data)))
    np.testing.assert_array_equal(got, quants.dequantize(data, qtype))


def _write(path, tensors: dict, arch: str = "llama") -> None:
    writer = GGUFWriter(str(path), arch)
    writer.add_uint32("test.count", 7)
    writer.add_array("test.floats", [0.5, 1.5])
    writer.add_array("test.words", ["a", "bb", "ccc"])
    for name, (array, raw_type) in tensors.items():
        writer.add_tensor(name, array, raw_dtype=raw_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_reader_reads_what_gguf_py_writes(tmp_path):
    rng = np.random.default_rng(2)
    floats = rng.standard_normal((3, 64)).astype(np.float32)
    halves = rng.standard_normal((2, 3, 32)).astype(np.float16)
    q8 = quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), T.Q8_0)
    q4k = random_blocks(T.Q4_K, 2, 256)
    _write(tmp_path / "t.gguf", {
        "a": (floats, None), "b": (halves, None), "c": (q8, T.Q8_0), "d": (q4k, T.Q4_K),
    })
    got = read_gguf(tmp_path / "t.gguf")
    assert got.metadata["general.architecture"] == "llama" and got.metadata["test.count"] == 7
    assert got.metadata["test.floats"] == [0.5, 1.5] and got.metadata["test.words"] == ["a", "bb", "ccc"]
    shapes = {name: (t.type_name, t.shape) for name, t in got.tensors.items()}
    assert shapes == {"a": ("F32", (3, 64)), "b": ("F16", (2, 3, 32)), "c": ("Q8_0", (4, 64)), "d": ("Q4_K", (2, 256))}
    np.testing.assert_array_equal(np.array(gguf_tensors.dense(got.tensors["a"])), floats)
    np.testing.assert_array_equal(np.array(gguf_tensors.native(got.tensors["b"])), halves)
    np.testing.assert_array_equal(np.array(gguf_tensors.dense(got.tensors["c"])), quants.dequantize(q8, T.Q8_0))
    np.testing.assert_array_equal(np.array(gguf_tensors.dense(got.tensors["d"])), quants.dequantize(q4k, T.Q4_K))


def test_bfloat16_kept_and_dense(tmp_path):
    values = np.random.default_rng(3).standard_normal((2, 32)).astype(np.float32)
    stored = quants.quantize(values, T.BF16)
    _write(tmp_path / "b.gguf", {"w": (stored, T.BF16)})
    info = read_gguf(tmp_path / "b.gguf").tensors["w"]
    want = quants.dequantize(stored, T.BF16)
    assert gguf_tensors.native(info).dtype == mx.bfloat16
    np.testing.assert_array_equal(np.array(gguf_tensors.native(info).astype(mx.float32)), want)
    np.testing.assert_array_equal(np.array(gguf_tensors.dense(info)), want)


def test_unsupported_tensor_type_is_named(tmp_path):
    _write(tmp_path / "iq.gguf", {"blk.0.attn_q.weight": (np.zeros((2, 66), np.uint8), T.TQ2_0)})
    info = read_gguf(tmp_path / "iq.gguf").tensors["blk.0.attn_q.weight"]
    message = r"^unsupported GGUF tensor type TQ2_0 for 'blk\.0\.attn_q\.weight' in iq\.gguf \(supported: F32, F16, BF16, Q4_0"
    with pytest.raises(ModelLoadError, match=message):
        gguf_tensors.check_supported(info, "iq.gguf")


def test_not_gguf_and_truncated(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"GGML" + b"\0" * 40)
    with pytest.raises(ModelLoadError, match=r"not a readable GGUF file: .*x\.gguf \(no GGUF magic\)$"):
        read_gguf(tmp_path / "x.gguf")
    _write(tmp_path / "t.gguf", {"a": (np.ones((64, 64), np.float32), None)})
    raw = (tmp_path / "t.gguf").read_bytes()
    (tmp_path / "t.gguf").write_bytes(raw[: len(raw) - 100])
    with pytest.raises(ModelLoadError, match=r"^truncated GGUF file: t\.gguf \(tensor 'a' runs past the end\)$"):
        read_gguf(tmp_path / "t.gguf")
