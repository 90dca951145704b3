"""Images for a GGUF language model through a llama.cpp projector file (--mmproj, as llama-server): the
file's vision tower and projector, read with our GGUF reader into mlx-vlm's own modules (the same code
that serves an MLX directory's images), around the GGUF's language model.

Everything a prompt sees follows llama.cpp's libmtmd, the reference for these files: each image is
letterboxed onto a black square and resized (bilinear) to the tower's size, normalized with the file's
mean and std; its features take the places of `<start_of_image>` + one placeholder per feature +
`<end_of_image>`, with the text between images tokenized piece by piece; the features enter the
language model unscaled (its token embeddings are scaled by sqrt(hidden), the features are not).

Projectors: gemma3 (Gemma 3 4B-27B: SigLIP + average pool + soft-embedding norm + projection)."""

from __future__ import annotations

import hashlib
import io
import math
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from ..errors import ModelLoadError
from .vision import PromptImages

PROJECTORS = {"gemma3": ("<start_of_image>", "<end_of_image>")}  # projector type -> the text around an image
PLACEHOLDER = "<image_soft_token>"  # the id an image's positions carry (Gemma 3's vocabulary has it)
DEFAULT_MERGE = 4  # llama.cpp's gemma3 pooling factor per side, unless the file names another
VISION_BLOCK = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_out": "self_attn.out_proj", "ln1": "layer_norm1", "ln2": "layer_norm2",
                "ffn_up": "mlp.fc1", "ffn_down": "mlp.fc2"}


@dataclass(frozen=True, slots=True)
class MmprojVision:
    """A projector file's image side around a GGUF language model (models/vision.Vision's interface)."""

    tower: Any  # mlx-vlm's SigLIP VisionModel
    projector: Any  # mlx-vlm's Gemma3MultiModalProjector
    embed_tokens: Any  # the language model's token embedding
    tokenizer: Any
    image_size: int
    mean: np.ndarray
    std: np.ndarray
    image_token_id: int  # the placeholder id of an image's positions
    image_tokens: int  # features one image becomes
    marker: str  # what a rendered prompt writes where an image goes (and what opens an image)
    closer: str  # what closes an image
    bos: int | None  # prepended to a raw prompt (add_special_tokens), as llama.cpp's add_bos
    text_scale: float  # what the language model multiplies its input embeddings by

    def pixels(self, raw: bytes) -> np.ndarray:
        """(channels, size, size) float32: letterboxed on black, bilinear, normalized (libmtmd's gemma3)."""
        from PIL import Image

        image = Image.open(io.BytesIO(raw)).convert("RGB")
        size = self.image_size
        if image.size != (size, size):
            scale = min(size / image.width, size / image.height)
            width = min(math.ceil(image.width * scale), size)
            height = min(math.ceil(image.height * scale), size)
            square = Image.new("RGB", (size, size), (0, 0, 0))
            square.paste(image.resize((width, height), Image.Resampling.BILINEAR),
                         ((size - width) // 2, (size - height) // 2))
            image = square
        values = np.asarray(image, dtype=np.float32) / np.float32(255.0)
        return ((values - self.mean) / self.std).transpose(2, 0, 1)

    def process(self, text: str, images: list[bytes], add_special_tokens: bool = False) -> PromptImages:
        """The rendered prompt (one `marker` per image) and the images' bytes -> token ids with each image
        expanded, and pixels. ValueError when the markers and images do not pair or an image is unreadable."""
        parts = text.split(self.marker)
        if len(parts) - 1 != len(images):
            raise ValueError(f"the prompt has {len(parts) - 1} {self.marker} markers for {len(images)} images")
        encode = lambda s: list(self.tokenizer.encode(s, add_special_tokens=False)) if s else []  # noqa: E731
        ids = [self.bos] if add_special_tokens and self.bos is not None else []
        ids += encode(parts[0])
        for part in parts[1:]:
            ids += encode(self.marker) + [self.image_token_id] * self.image_tokens + encode(self.closer)
            ids += encode(part)
        pixels = np.stack([self.pixels(raw) for raw in images]) if images else np.zeros((0, 3, 1, 1), np.float32)
        digests = tuple(hashlib.sha256(raw).hexdigest() for raw in images)
        return PromptImages(tuple(ids), pixels, digests, self.image_token_id, _runs(ids, self.image_token_id))

    def forward(self, model: Any, embeds: Any, cache: list, spans: tuple[tuple[int, int], ...]) -> Any:
        """mlx-lm's gemma3 forward over a piece's input embeddings (1, L, hidden) -> its final hidden states,
        with the piece's image positions `spans` ([lo, hi) within the piece) attending each other both
        ways, as llama.cpp decodes a Gemma 3 image (non-causal); every other position as mlx-lm's."""
        import mlx.core as mx
        from mlx_lm.models.base import create_attention_mask

        inner = model.model
        h = embeds * mx.array(inner.args.hidden_size ** 0.5, mx.bfloat16).astype(embeds.dtype)
        pattern = inner.sliding_window_pattern
        masks = {True: _opened(create_attention_mask(h, cache[pattern - 1], return_array=True), spans)}
        if pattern > 1:
            masks[False] = _opened(create_attention_mask(h, cache[0], window_size=inner.window_size,
                                                         return_array=True), spans)
        for i, (layer, layer_cache) in enumerate(zip(inner.layers, cache)):
            h = layer(h, masks[pattern == 1 or i % pattern == pattern - 1], layer_cache)
        return inner.norm(h)

    @staticmethod
    def logits(model: Any, hidden: Any) -> Any:
        """The language model's head over `forward`'s hidden states."""
        tied = getattr(model, "tie_word_embeddings", False)
        return model.model.embed_tokens.as_linear(hidden) if tied else model.lm_head(hidden)

    def embed(self, media: PromptImages):
        """(1, prompt tokens, hidden): the tokens' embeddings with each image's features in its places."""
        import mlx.core as mx

        ids = np.asarray(media.prompt_ids)
        embeds = self.embed_tokens(mx.array(ids[None]))
        places = np.flatnonzero(ids == self.image_token_id)
        hidden, _, _ = self.tower(mx.array(media.pixel_values.transpose(0, 2, 3, 1)).astype(embeds.dtype))
        features = self.projector(hidden).reshape(-1, embeds.shape[-1])
        if features.shape[0] != places.size:
            raise ValueError(f"{places.size} image places for {features.shape[0]} image features")
        # The language model scales every input embedding; an image's features must reach it unscaled.
        embeds[0, mx.array(places)] = (features / self.text_scale).astype(embeds.dtype)
        return embeds


def load_mmproj(path: Path, language_model: Any, tokenizer: Any, bos: int | None, float32: bool) -> MmprojVision:
    """The image side of projector file `path` around a GGUF's `language_model` (mlx-lm's gemma3 model)."""
    import mlx.core as mx
    from mlx_vlm.models.gemma3.gemma3 import Gemma3MultiModalProjector
    from mlx_vlm.models.gemma3.vision import VisionModel

    from .gguf_file import read_gguf
    from .gguf_tensors import dense

    if not path.is_file():
        raise ModelLoadError(f"--mmproj: no such file: {path}")
    meta = read_gguf(path)
    info, source = meta.metadata, path.name
    kind = info.get("clip.vision.projector_type") or info.get("clip.projector_type")
    if info.get("general.architecture") != "clip" or not info.get("clip.has_vision_encoder"):
        raise ModelLoadError(f"{source} is no llama.cpp vision projector (an mmproj file has a clip vision encoder)")
    if kind not in PROJECTORS:
        raise ModelLoadError(f"{source}: {kind!r} projectors are not supported here (supported: "
                             f"{', '.join(PROJECTORS)}); its text model can be served without --mmproj")
    args = getattr(language_model, "args", None)
    if getattr(args, "model_type", None) != "gemma3_text":
        raise ModelLoadError(f"{source} is a Gemma 3 projector; the model is not Gemma 3 "
                             f"({getattr(args, 'model_type', type(language_model).__name__)})")

    def key(name: str, default: Any = None) -> Any:
        value = info.get(f"clip.vision.{name}", default)
        if value is None:
            raise ModelLoadError(f"GGUF metadata key 'clip.vision.{name}' missing in {source}")
        return value

    size, patch = int(key("image_size")), int(key("patch_size"))
    vision = SimpleNamespace(
        model_type="siglip_vision_model", hidden_size=int(key("embedding_length")),
        intermediate_size=int(key("feed_forward_length")), num_hidden_layers=int(key("block_count")),
        num_attention_heads=int(key("attention.head_count")), patch_size=patch, image_size=size, num_channels=3,
        layer_norm_eps=float(key("attention.layer_norm_epsilon", 1e-6)))
    per_side = size // patch // int(key("projector.scale_factor", DEFAULT_MERGE))
    text = SimpleNamespace(hidden_size=args.hidden_size, mm_tokens_per_image=per_side * per_side)
    tower = VisionModel(vision)
    tower.vision_model.post_layernorm.eps = vision.layer_norm_eps  # llama.cpp's (mlx-vlm keeps 1e-5)
    projector = Gemma3MultiModalProjector(SimpleNamespace(vision_config=vision, text_config=text))
    tower.load_weights(list(_tower_weights(meta.tensors, vision.hidden_size, dense, source).items()))
    projector.load_weights([
        ("mm_input_projection_weight", dense(_tensor(meta.tensors, "mm.input_projection.weight", source))),
        ("mm_soft_emb_norm.weight", dense(_tensor(meta.tensors, "mm.soft_emb_norm.weight", source)) - 1.0)])
    if projector.mm_input_projection_weight.shape != (vision.hidden_size, args.hidden_size):
        raise ModelLoadError(f"{source} projects to {projector.mm_input_projection_weight.shape[1]} wide "
                             f"embeddings; the model's are {args.hidden_size} wide (not this model's projector)")
    dtype = mx.float32 if float32 else mx.float16
    for part in (tower, projector):
        part.set_dtype(dtype)
        mx.eval(part.parameters())
    if float32:  # the CPU path: the tower's attention in numpy (models/vision_attention.py)
        from .vision_attention import install

        install(tower)
    placeholder = _token_id(tokenizer, PLACEHOLDER)
    if placeholder is None:
        raise ModelLoadError(f"{source}: the model's vocabulary has no {PLACEHOLDER} for an image's places")
    opener, closer = PROJECTORS[kind]
    scale = float(mx.array(args.hidden_size ** 0.5, mx.bfloat16).astype(mx.float32).item())  # as mlx-lm's gemma3
    return MmprojVision(tower, projector, language_model.model.embed_tokens, tokenizer, size,
                        np.asarray(key("image_mean"), np.float32), np.asarray(key("image_std"), np.float32),
                        placeholder, per_side * per_side, opener, closer, bos, scale)


def _opened(mask: Any, spans: tuple[tuple[int, int], ...]) -> Any:
    """A boolean (L, keys) attention mask whose last L keys are the piece's, each span's block opened."""
    import mlx.core as mx

    length, keys = mask.shape[-2], mask.shape[-1]
    opened = np.zeros((length, keys), dtype=bool)
    for lo, hi in spans:
        opened[lo:hi, keys - length + lo:keys - length + hi] = True
    return mx.logical_or(mask, mx.array(opened))


def _tensor(tensors: dict, name: str, source: str) -> Any:
    if name not in tensors:
        raise ModelLoadError(f"tensor {name!r} missing in {source}")
    return tensors[name]


def _tower_weights(tensors: dict, width: int, dense: Any, source: str) -> dict:
    """The vision tensors under mlx-vlm's names: the patch convolution as (out, kh, kw, in); a file whose
    feed-forward up and down were stored swapped (older converters) put back, as llama.cpp does."""
    out = {}
    for name, info in tensors.items():
        if not name.startswith("v."):
            continue
        parts = name.split(".")
        if name.startswith("v.patch_embd."):
            value = dense(info)
            out[f"vision_model.embeddings.patch_embedding.{parts[-1]}"] = (
                value.transpose(0, 2, 3, 1) if parts[-1] == "weight" else value)
        elif name == "v.position_embd.weight":
            out["vision_model.embeddings.position_embedding.weight"] = dense(info)
        elif name.startswith("v.post_ln."):
            out[f"vision_model.post_layernorm.{parts[-1]}"] = dense(info)
        elif parts[1] == "blk" and parts[3] in VISION_BLOCK:
            down = tensors.get(f"v.blk.{parts[2]}.ffn_down.weight")
            swapped = down is not None and down.shape[-1] == width and parts[3] in ("ffn_up", "ffn_down")
            part = {"ffn_up": "ffn_down", "ffn_down": "ffn_up"}[parts[3]] if swapped else parts[3]
            out[f"vision_model.encoder.layers.{parts[2]}.{VISION_BLOCK[part]}.{parts[-1]}"] = dense(info)
        else:
            raise ModelLoadError(f"unsupported tensor {name!r} in {source} (not part of a gemma3 projector)")
    return out


def _runs(ids: list[int], token: int) -> tuple[tuple[int, int], ...]:
    """The [lo, hi) runs of `token` in `ids`."""
    places = np.flatnonzero(np.asarray(ids) == token)
    if places.size == 0:
        return ()
    breaks = np.flatnonzero(np.diff(places) > 1)
    starts = np.concatenate([places[:1], places[breaks + 1]])
    ends = np.concatenate([places[breaks], places[-1:]]) + 1
    return tuple((int(lo), int(hi)) for lo, hi in zip(starts, ends))


def _token_id(tokenizer: Any, text: str) -> int | None:
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    return ids[0] if len(ids) == 1 else None
