"""A BERT encoder (llama.cpp's `bert` architecture) in MLX, for cross-encoder rerankers and embedding
models: token + token-type (row 0) + absolute position embeddings, a LayerNorm, then post-norm
layers of bidirectional attention and a GELU feed-forward (llama.cpp's graph, src/models/bert.cpp:
its GELU is the tanh form). Every position sees every other, so a prompt runs as one forward: it is
never split into prefill pieces and keeps no KV cache (`make_cache` is empty)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import mlx.core as mx
import mlx.nn as nn


@dataclass
class ModelArgs:
    model_type: str
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    num_attention_heads: int
    max_position_embeddings: int
    layer_norm_eps: float = 1e-12
    type_vocab_size: int = 2
    vocab_size: int = 30522
    num_key_value_heads: Optional[int] = None

    @classmethod
    def from_dict(cls, params: dict) -> "ModelArgs":
        return cls(**{k: v for k, v in params.items() if k in cls.__dataclass_fields__})


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        dim = args.hidden_size
        self.heads = args.num_attention_heads
        self.scale = (dim // self.heads) ** -0.5
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.o_proj = nn.Linear(dim, dim)

    def __call__(self, x: mx.array) -> mx.array:
        b, length, _ = x.shape

        def heads(t: mx.array) -> mx.array:
            return t.reshape(b, length, self.heads, -1).transpose(0, 2, 1, 3)

        out = mx.fast.scaled_dot_product_attention(heads(self.q_proj(x)), heads(self.k_proj(x)),
                                                   heads(self.v_proj(x)), scale=self.scale)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, length, -1))


class Layer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.self_attn = Attention(args)
        self.attention_norm = nn.LayerNorm(args.hidden_size, eps=args.layer_norm_eps)
        self.up_proj = nn.Linear(args.hidden_size, args.intermediate_size)
        self.down_proj = nn.Linear(args.intermediate_size, args.hidden_size)
        self.output_norm = nn.LayerNorm(args.hidden_size, eps=args.layer_norm_eps)

    def __call__(self, x: mx.array) -> mx.array:
        h = self.attention_norm(x + self.self_attn(x))
        return self.output_norm(h + self.down_proj(nn.gelu_approx(self.up_proj(h))))


class Encoder(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.token_types = nn.Embedding(max(1, args.type_vocab_size), args.hidden_size)
        self.positions = nn.Embedding(args.max_position_embeddings, args.hidden_size)
        self.embed_norm = nn.LayerNorm(args.hidden_size, eps=args.layer_norm_eps)
        self.layers = [Layer(args) for _ in range(args.num_hidden_layers)]

    def __call__(self, inputs: mx.array, cache: Any = None) -> mx.array:
        """(1, T) token ids -> (1, T, hidden): the last layer's states. `cache` is ignored (none is kept)."""
        length = inputs.shape[1]
        x = self.embed_tokens(inputs) + self.token_types.weight[0] + self.positions(mx.arange(length))
        x = self.embed_norm(x)
        for layer in self.layers:
            x = layer(x)
        return x


class Model(nn.Module):
    """What the engine reads of a model: `model` (the states), `layers`, `args`, `make_cache`."""

    causal = False

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model_type = args.model_type
        self.model = Encoder(args)

    @property
    def layers(self) -> list:
        return self.model.layers

    def make_cache(self) -> list:
        return []

    def __call__(self, inputs: mx.array, cache: Any = None) -> mx.array:
        raise NotImplementedError("a BERT encoder has no language-model head: it serves embeddings and reranking")
