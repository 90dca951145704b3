"""The mlx-lm internals we rely on, checked by name so an upgrade fails here, loudly, first.

pyproject pins mlx-lm to the tested minor; when a bump breaks one of these, the failure
names the internal and the module of ours that uses it.
"""

import inspect

import mlx.core as mx
import pytest

USED = [
    # (module, attribute, where we use it)
    ("mlx_lm.tokenizer_utils", "_byte_decoder", "models/tokenizer.py: exact byte-level decoding"),
    ("mlx_lm.tokenizer_utils", "BPEStreamingDetokenizer", "models/tokenizer.py: ByteLevelDetokenizer"),
    ("mlx_lm.tokenizer_utils", "TokenizerWrapper", "models/tokenizer.py: wraps the GGUF tokenizer"),
    ("mlx_lm.models.cache", "KVCache", "engine/runner/model_runner.py: KV snapshots and adoption"),
    ("mlx_lm.models.cache", "BatchKVCache", "engine/runner/model_runner.py: the decode batch (KVCache.merge)"),
    ("mlx_lm.models.cache", "make_prompt_cache", "engine/runner/model_runner.py: per-sequence prefill caches"),
    ("mlx_lm.models.llama", "scaled_dot_product_attention", "models/cpu/prefill_kernels.py: replaced on CPU"),
    ("mlx_lm.models.llama", "swiglu", "models/cpu/prefill_kernels.py: replaced on CPU"),
    ("mlx_lm.sample_utils", "apply_top_p", "engine/runner/sampling.py"),
    ("mlx_lm.sample_utils", "apply_min_p", "engine/runner/sampling.py"),
    ("mlx_lm.sample_utils", "apply_top_k", "engine/runner/sampling.py"),
    ("mlx_lm.sample_utils", "make_repetition_penalty", "engine/runner/sampling.py"),
    ("mlx_lm.utils", "load", "models/loader.py: mlx-lm directories"),
    ("mlx_lm.utils", "dequantize_model", "models/loader.py: dense float32 on CPU"),
]


@pytest.mark.parametrize("module, name, where", USED, ids=[f"{m}.{n}" for m, n, _ in USED])
def test_internal_exists(module, name, where):
    mod = __import__(module, fromlist=[name])
    assert hasattr(mod, name), f"mlx-lm no longer has {module}.{name} (used by {where})"


def test_streaming_detokenizer_shape():
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer

    for method in ("_maybe_trim_space", "_decode_bytes", "add_token", "finalize", "reset"):
        assert callable(getattr(BPEStreamingDetokenizer, method, None)), (
            f"BPEStreamingDetokenizer.{method} changed (models/tokenizer.py overrides or calls it)"
        )
    source = inspect.getsource(BPEStreamingDetokenizer)
    for attr in ("self.tokenmap", "self._unflushed", "self.text", "self.tokens"):
        assert attr in source, f"BPEStreamingDetokenizer no longer keeps {attr} (models/tokenizer.py uses it)"


def test_kv_cache_shape():
    """The KVCache fields and the batch operations the runner calls, on a real cache."""
    from mlx_lm.models.cache import BatchKVCache, KVCache

    cache = KVCache()
    keys = mx.zeros((1, 2, 5, 4))
    cache.update_and_fetch(keys, keys)
    assert (cache.offset, cache.keys.shape[2] >= 5) == (5, True), "KVCache.offset/keys changed (engine/runner/model_runner.py)"
    assert cache.trim(2) == 2 and cache.offset == 3, "KVCache.trim changed (engine/runner/model_runner.py trims pads)"
    batch = cache.merge([cache])
    assert isinstance(batch, BatchKVCache), "KVCache.merge no longer builds a BatchKVCache (engine/runner/model_runner.py)"
    for method in ("extend", "filter", "extract"):
        assert callable(getattr(batch, method, None)), f"BatchKVCache.{method} changed (engine/runner/model_runner.py)"
    row = batch.extract(0)
    assert isinstance(row, KVCache) and row.offset == 3, "BatchKVCache.extract changed (engine/runner/model_runner.py)"


def test_tied_embedding_projection():
    from mlx_lm.models.llama import Model, ModelArgs

    args = ModelArgs(model_type="llama", hidden_size=8, num_hidden_layers=1, intermediate_size=16,
                     num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-5, vocab_size=11,
                     tie_word_embeddings=True)
    model = Model(args)
    assert callable(getattr(model.model.embed_tokens, "as_linear", None)), (
        "nn.Embedding.as_linear changed (engine/runner/model_runner.py projects the last position only)"
    )
    assert model.args.tie_word_embeddings, "llama ModelArgs.tie_word_embeddings changed (engine/runner/model_runner.py)"
