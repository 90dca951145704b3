"""Split GGUF files (llama.cpp's PREFIX-00001-of-0000N.gguf): a committed fixture split by the
`gguf` package's writer loads from its first part with exactly the unsplit file's logits; a
missing, misnumbered or misnamed part is a ModelLoadError naming it."""

import shutil

import mlx.core as mx
import numpy as np
import pytest

from gguf_fixtures import FIXTURES, PROMPT, fixture_model, write_split
from mlxcel_py.errors import ModelLoadError
from mlxcel_py.models import encode_text, load_model
from mlxcel_py.models.gguf_file import read_gguf


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    return write_split(FIXTURES / "llama-f16.gguf", tmp_path_factory.mktemp("split") / "llama.gguf", 8)


def _logits(lm):
    ids = mx.array([list(encode_text(lm.tokenizer, PROMPT))])
    return np.array(lm.model(ids))


def test_the_writer_made_three_parts(parts):
    assert [p.name for p in parts] == [f"llama-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    whole = read_gguf(parts[0])
    assert len(whole.tensors) == 22 and whole.metadata["split.count"] == 3
    assert len(read_gguf(FIXTURES / "llama-f16.gguf").tensors) == 22


@pytest.mark.parametrize("dense", [True, False])
def test_a_split_model_has_the_unsplit_logits_exactly(parts, dense):
    split = load_model(str(parts[0]), dense=dense)
    whole = fixture_model("llama-f16.gguf", dense=dense)
    np.testing.assert_array_equal(_logits(split), _logits(whole))
    assert split.tokenizer.encode(PROMPT) == whole.tokenizer.encode(PROMPT)


def test_a_quantized_split_loads_its_quantized_tensors(tmp_path):
    parts = write_split(FIXTURES / "llama-q8_0.gguf", tmp_path / "q.gguf", 10)
    assert len(parts) == 3
    np.testing.assert_array_equal(_logits(load_model(str(parts[0]), dense=False)),
                                  _logits(fixture_model("llama-q8_0.gguf", dense=False)))


def _copy(parts, tmp_path):
    for p in parts:
        shutil.copy(p, tmp_path / p.name)
    return [tmp_path / p.name for p in parts]


def test_a_missing_part_is_named(parts, tmp_path):
    copies = _copy(parts, tmp_path)
    copies[1].unlink()
    with pytest.raises(ModelLoadError) as info:
        load_model(str(copies[0]))
    assert str(info.value) == ("split GGUF part llama-00002-of-00003.gguf is missing (part 2 of 3, "
                               "expected next to llama-00001-of-00003.gguf)")


def test_a_later_part_names_the_first(parts):
    with pytest.raises(ModelLoadError) as info:
        read_gguf(parts[1])
    assert str(info.value) == ("llama-00002-of-00003.gguf is part 2 of a 3-part split GGUF; "
                               "load the first part, llama-00001-of-00003.gguf")


def test_misnumbered_and_misnamed_parts(parts, tmp_path):
    copies = _copy(parts, tmp_path)
    copies[1].rename(tmp_path / "swap")
    copies[2].rename(copies[1])
    (tmp_path / "swap").rename(copies[2])
    with pytest.raises(ModelLoadError, match=r"^split GGUF part llama-00002-of-00003\.gguf says it is split\.no 2, "
                                             r"expected 1$"):
        read_gguf(copies[0])
    renamed = tmp_path / "model.gguf"
    shutil.copy(parts[0], renamed)
    with pytest.raises(ModelLoadError, match=r"^model\.gguf is one of 3 split GGUF parts, but is not named "
                                             r"PREFIX-00001-of-00003\.gguf"):
        read_gguf(renamed)
