"""Images in a request: taken out of the messages (each becomes the {"type": "image"} part chat
templates render), decoded from data: URLs (or fetched, with --allow-image-urls) and checked before
anything else runs; then rendered and processed into the engine request's PromptImages. Every problem
is a 400 naming the part: a model without a vision side, an http(s) URL without the flag, bad base64,
bytes no image decoder reads, a format, size or count past the limits."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import io
import re
from typing import TYPE_CHECKING, Any, Optional

from ...errors import FieldError
from ...serve_config import ServerConfig

if TYPE_CHECKING:
    from ..runtime import Runtime
    from .prepared import Prepared

FETCH_TIMEOUT_S = 10.0  # an http(s) image, with --allow-image-urls
MEDIA_MARKER = "<__media__>"  # llama-server's (libmtmd's) marker for an image in a completion prompt
MAX_PIXELS = 50_000_000  # per image: a decompression bomb is refused before it is decoded
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
_DATA_URL = re.compile(r"data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^;,]*)*?);base64,(?P<data>.*)", re.S)


def _fetch(url: str, where: str, param: str, max_bytes: int) -> bytes:
    """An http(s) image (--allow-image-urls): at most `max_bytes`, FETCH_TIMEOUT_S, a few redirects."""
    import httpx

    try:
        with httpx.stream("GET", url, timeout=FETCH_TIMEOUT_S, follow_redirects=True,
                          headers={"Accept": "image/*"}) as resp:
            if resp.status_code != 200:
                raise FieldError(f"{where}: fetching the image answered HTTP {resp.status_code}", param=param)
            raw = bytearray()
            for chunk in resp.iter_bytes():
                raw += chunk
                if len(raw) > max_bytes:
                    raise FieldError(f"{where}: the image is over {max_bytes} bytes (--image-max-bytes)", param=param)
            return bytes(raw)
    except httpx.HTTPError as exc:
        raise FieldError(f"{where}: the image could not be fetched ({type(exc).__name__}: {exc})",
                         param=param) from None


def _decode(url: str, where: str, param: str, max_bytes: int, fetch: bool = False) -> bytes:
    from PIL import Image, UnidentifiedImageError

    if url.startswith(("http://", "https://")):
        if not fetch:
            raise FieldError(f"{where}: image URLs are not fetched by this server (that would be a request from "
                             "the server; --allow-image-urls turns it on); send the image inline as a data: URL "
                             "(data:image/png;base64,...)", param=param)
        raw = _fetch(url, where, param, max_bytes)
    else:
        match = _DATA_URL.fullmatch(url.strip())
        if match is None:
            raise FieldError(f"{where}: the image must be a base64 data: URL (data:image/png;base64,...)",
                             param=param)
        try:
            raw = base64.b64decode(match["data"], validate=True)
        except (binascii.Error, ValueError):
            raise FieldError(f"{where}: the image's base64 does not decode", param=param) from None
    if len(raw) > max_bytes:
        raise FieldError(f"{where}: the image is {len(raw)} bytes; at most {max_bytes} (--image-max-bytes)",
                         param=param)
    try:
        with Image.open(io.BytesIO(raw)) as image:
            kind, (width, height) = image.format, image.size
            if width * height > MAX_PIXELS:
                raise FieldError(f"{where}: the image is {width}x{height} pixels; at most {MAX_PIXELS}",
                                 param=param)
            image.verify()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        raise FieldError(f"{where}: the bytes are not an image this server reads ({', '.join(FORMATS)})",
                         param=param) from None
    if kind not in FORMATS:
        raise FieldError(f"{where}: {kind} images are not supported ({', '.join(FORMATS)})", param=param)
    return raw


def take_images(rt: "Runtime", messages: list[dict], param: str = "messages", name: Optional[str] = None
                ) -> tuple[list[dict], list[bytes]]:
    """(the messages with each image_url part as {"type": "image"}, the images' bytes in order); `param`:
    the body's field a refusal names, `name` the model's (default: the served id)."""
    server = rt.config.server or ServerConfig()
    vision, max_count = rt.loaded.vision, server.image_max_count
    out, images = [], []
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list) or not any(p.get("type") == "image_url" for p in content):
            out.append(message)
            continue
        parts = []
        for j, part in enumerate(content):
            if part.get("type") != "image_url":
                parts.append(part)
                continue
            where = part.get("where") or f"messages[{i}].content[{j}]"
            if vision is None:
                raise FieldError(f"{where}: {name or rt.model_id} takes text only; images need a vision-language model",
                                 param=param)
            if message.get("role") != "user":
                raise FieldError(f"{where}: images go in user turns", param=param)
            if len(images) == max_count:
                raise FieldError(f"{where}: at most {max_count} images per request (--image-max-count)", param=param)
            images.append(_decode(part["image_url"]["url"], where, param, server.image_max_bytes,
                                  server.allow_image_urls))
            parts.append({"type": "image"})
        out.append({**message, "content": parts})
    return out, images


def chat_prompt(rt: "Runtime", messages: list[dict], tools: Any, options: Any, images: list[bytes],
                param: str = "messages"):
    """(ChatPrompt, PromptImages or None): `messages` (validated, images taken out) rendered and tokenized;
    with images, through the model's processor, which expands each image's marker into its tokens."""
    from ...models import encode_chat
    from ...models.chat import ChatPrompt, render_chat

    if not images:
        return encode_chat(rt.loaded.tokenizer, messages, tools=tools, template=rt.chat_template, options=options,
                           before_tokenize=lambda text: rt.prompt_limit.check_chars(len(text), param)), None
    text = render_chat(rt.loaded.tokenizer, messages, tools=tools, template=rt.chat_template, options=options)
    rt.prompt_limit.check_chars(len(text), param)
    try:
        media = rt.loaded.vision.process(text, images)
    except (ValueError, OSError) as exc:
        raise FieldError(f"the images could not be processed: {exc}", param=param) from None
    return ChatPrompt(media.prompt_ids, None), media


def imaged(job: Any, media: Any) -> Any:
    """The engine request `job` carrying its prompt's images: its pieces' embeddings are built from their
    pixels, and the prompt cache indexes it under a key in which each image's tokens stand for that image
    (models/vision.PromptImages.cache_key), so a next turn over the same image adopts it; an image whose
    positions attend each other both ways is never cut between prefill pieces."""
    if media is None:
        return job
    return dataclasses.replace(job, images=media, cache_key=media.cache_key(), history_boundary=None,
                               unsplit=media.both_ways)


def with_images(prepared: "Prepared", media: Any) -> "Prepared":
    """`prepared` whose engine request carries its prompt's images (`imaged`)."""
    return prepared if media is None else dataclasses.replace(prepared, job=imaged(prepared.job, media))


def completion_images(rt: "Runtime", text: str, data: list[str], marker: str, param: str = "prompt") -> Any:
    """llama-server's multimodal completion prompt: `text` with one `marker` where each base64 image of
    `data` goes -> PromptImages (the model's image marker in its place, the BOS as for any text prompt)."""
    where = f"{param}.multimodal_data"
    vision = rt.loaded.vision
    if vision is None:
        raise FieldError(f"{where}: {rt.model_id} takes text only; images need a vision-language model",
                         param=param)
    if text.count(marker) != len(data):
        raise FieldError(f"{param}.prompt_string has {text.count(marker)} {marker} markers for {len(data)} "
                         "multimodal_data images; put one marker where each image goes", param=param)
    messages = [{"role": "user", "content": base64_parts(data, where)}]
    _, images = take_images(rt, messages, param)
    try:
        return vision.process(text.replace(marker, vision.marker), images, add_special_tokens=True)
    except (ValueError, OSError) as exc:
        raise FieldError(f"the images could not be processed: {exc}", param=param) from None


def base64_parts(images: list[str], where: str) -> list[dict]:
    """Bare base64 images (Ollama's `images`, llama-server's `multimodal_data`) as parts named where[k]."""
    return [image_part("data:;base64," + b, f"{where}[{k}]") for k, b in enumerate(images)]


def image_part(data_url: str, where: Optional[str] = None) -> dict:
    """An image as the OpenAI-form part `take_images` reads (the dialects' own forms become this);
    `where` names it in errors as the dialect's body does."""
    return {"type": "image_url", "image_url": {"url": data_url}, **({"where": where} if where else {})}
