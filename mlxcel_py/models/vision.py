"""Images for a vision-language model directory, through mlx-vlm (a maintained library, pinned in the
Makefile's setup): its processor turns a prompt's text and images into token ids and pixels, its vision
tower and projector into the features that take the image tokens' places in the prompt's input
embeddings. The language model stays the one mlx-lm loaded from the same directory (the engine's
batching, caches and CPU kernels are unchanged); mlx-vlm's own copy of it is never read (loaded lazily,
then replaced by ours).

Architectures: gemma3 (Gemma 3 4B-27B: SigLIP + projector). A prompt's pieces take slices of the
merged embeddings, so an image's tokens can fall across pieces (mlx-vlm's gemma3 attends causally)."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ..errors import ModelLoadError

ARCHITECTURES = ("gemma3",)
log = logging.getLogger("mlxcel_py.models")


@dataclass(frozen=True, slots=True, eq=False)
class PromptImages:
    """A prompt's images, processed: what the engine needs to build its input embeddings (data only)."""

    prompt_ids: tuple[int, ...]  # the whole prompt, image tokens expanded
    pixel_values: np.ndarray  # (images, channels, height, width), the processor's
    digests: tuple[str, ...]  # sha256 of each image's bytes, in order
    image_token_id: int
    # Runs of image positions [lo, hi) that attend each other both ways (llama.cpp's Gemma 3 images); empty
    # when every position attends causally (mlx-vlm's)
    both_ways: tuple[tuple[int, int], ...] = ()

    @property
    def last_image_token(self) -> int:
        """The position of the prompt's last image token (-1: none)."""
        return max((i for i, t in enumerate(self.prompt_ids) if t == self.image_token_id), default=-1)

    def cache_key(self) -> Optional[tuple[int, ...]]:
        """The prompt as the prompt cache indexes it: each image's run of tokens a negative id that stands
        for its bytes (never a real token), so a prefix matches only over the same images. None when the
        runs do not pair with the images."""
        key, runs, previous = list(self.prompt_ids), 0, False
        for i, token in enumerate(self.prompt_ids):
            image = token == self.image_token_id
            runs += image and not previous
            if image and runs <= len(self.digests):
                key[i] = -1 - int(self.digests[runs - 1][:15], 16)
            previous = image
        return tuple(key) if runs == len(self.digests) else None


@dataclass(frozen=True, slots=True)
class Vision:
    """A loaded vision-language model's image side: mlx-vlm's model (its language model ours) and processor."""

    model: Any
    processor: Any
    image_token_id: int
    image_tokens: int  # tokens one image becomes
    marker: str  # the text a prompt writes where an image goes (Gemma 3's <start_of_image>)

    def process(self, text: str, images: list[bytes], add_special_tokens: bool = False) -> PromptImages:
        """The rendered prompt (one image marker per image, as the chat template writes it) and the
        images' bytes -> token ids with every image expanded, and pixels. ValueError for bad images.
        `add_special_tokens`: the BOS of a raw (untemplated) prompt; a rendered one carries its own."""
        from PIL import Image

        pictures = [Image.open(io.BytesIO(raw)).convert("RGB") for raw in images]
        out = self.processor(text=[text], images=pictures, return_tensors="np",
                             add_special_tokens=add_special_tokens)
        ids = tuple(int(t) for t in np.asarray(out["input_ids"])[0])
        digests = tuple(hashlib.sha256(raw).hexdigest() for raw in images)
        return PromptImages(ids, np.asarray(out["pixel_values"]), digests, self.image_token_id)

    def embed(self, media: PromptImages):
        """(1, prompt tokens, hidden): the text tokens' embeddings with the image features in place."""
        import mlx.core as mx

        ids = mx.array([list(media.prompt_ids)])
        got = self.model.get_input_embeddings(ids, mx.array(media.pixel_values), mask=mx.ones_like(ids))
        return got.inputs_embeds


def vision_config(path: Path) -> Optional[dict]:
    """The directory's config.json when it describes a vision-language model, else None."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config.get("vision_config"), dict) else None


def load_vision(path: Path, language_model: Any, float32: bool = False) -> Optional[Vision]:
    """The image side of the VLM at `path` around `language_model`, mlx-lm's model of its text part
    (what mlx-vlm's `language_model` submodule would be); None when `path` is no VLM. `float32`: the
    vision tower and projector in float32 (the CPU path: MLX's half-precision matmuls there are many
    times slower, as for the language model)."""
    config = vision_config(path)
    if config is None:
        return None
    if config.get("model_type") not in ARCHITECTURES:
        log.warning("%s: images of a %r model are not supported (supported: %s); serving its text model only",
                    path.name, config.get("model_type"), ", ".join(ARCHITECTURES))
        return None
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local directory: mlx-vlm must not reach for the hub
    try:
        from mlx_vlm.utils import load
    except ImportError as exc:
        log.warning("%s is a vision-language model but mlx-vlm is not installed (make setup installs it): %s; "
                    "serving its text model only", path.name, exc)
        return None
    import mlx.core as mx

    try:
        vlm, processor = load(str(path), lazy=True)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load the vision side of {path.name}: {exc}") from None
    vlm.language_model = language_model  # ours: mlx-vlm's copy stays unread
    for part in ("vision_tower", "multi_modal_projector"):
        if float32:
            getattr(vlm, part).set_dtype(mx.float32)
        mx.eval(getattr(vlm, part).parameters())
    if float32:  # the CPU path: the tower's attention in numpy (models/vision_attention.py)
        from .vision_attention import install

        install(vlm.vision_tower)
    tokens = int(getattr(processor, "image_seq_length", 0) or config.get("mm_tokens_per_image", 0))
    marker = getattr(processor, "boi_token", None) or getattr(processor, "image_token", None) or "<image>"
    return Vision(vlm, processor, int(config["image_token_index"]), tokens, marker)
