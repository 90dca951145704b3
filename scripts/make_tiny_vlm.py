#!/usr/bin/env python
"""Build a TINY random-weight Gemma 3 (SigLIP + projector + gemma3 text) model
directory for mlx-vlm, fully offline, and run mlx-vlm's own `generate` on it
with an in-memory image.

Groundwork for serving images (mlx-vlm is not yet a dependency of the project). Run it with
mlx-vlm 0.7.10 installed beside the project's environment without its dependencies
(`pip install --no-deps --target SITE mlx-vlm==0.7.10`; the image path needs none of them):

    PYTHONPATH=SITE .venv/bin/python scripts/make_tiny_vlm.py [--out DIR] [--dtype float32|bfloat16]

What it writes under DIR (default build/tiny-gemma3/):
    config.json               HF Gemma3ForConditionalGeneration-style config
    model.safetensors         random weights in mlx-vlm's own (converted) layout
    tokenizer.json            Gemma-style BPE (byte fallback, "▁" spaces), tiny vocab
    tokenizer_config.json     GemmaTokenizer + boi/eoi/image extra special tokens
    special_tokens_map.json
    chat_template.jinja       Gemma 3 chat template
    chat_template.json        same template (mlx-vlm's load_chat_template reads it)
    preprocessor_config.json  Gemma3ImageProcessor (PIL backend, no torch needed)
    processor_config.json     image_seq_length (read by mlx-vlm's Gemma3Processor)
    generation_config.json

Nothing is downloaded: the tokenizer is built with the `tokenizers` library,
the weights with mlx.random under a fixed seed.
"""

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from PIL import Image

SEED = 0
EMBED_STD = 0.04  # small vs. the normed layer outputs, else tied logits just echo the input token

# --- tiny dimensions --------------------------------------------------------
IMAGE_SIZE = 32          # px (real Gemma 3: 896)
PATCH_SIZE = 4           # -> 8x8 = 64 SigLIP patches (real: 14 -> 64x64)
MM_TOKENS_PER_IMAGE = 16  # 4x4 after avg-pool (real: 256 = 16x16)
TEXT_HIDDEN = 64
VISION_HIDDEN = 64

# Special tokens, in id order. Real Gemma 3 ids in comments.
SPECIALS = [
    "<pad>",               # 0   (0)
    "<eos>",               # 1   (1)
    "<bos>",               # 2   (2)
    "<unk>",               # 3   (3)
    "<mask>",              # 4   (4)
    "<start_of_turn>",     # 5   (105)
    "<end_of_turn>",       # 6   (106)
    "<start_of_image>",    # 7   (255999)  = boi_token
    "<end_of_image>",      # 8   (256000)  = eoi_token
    "<image_soft_token>",  # 9   (262144)  = image_token, config.image_token_index
]
TOK = {t: i for i, t in enumerate(SPECIALS)}

GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\\n\\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\\n'}}\n"
    "{%- endif -%}\n"
)


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


# --- tokenizer --------------------------------------------------------------
def build_tokenizer(out: Path) -> int:
    """Gemma-style SentencePiece-BPE tokenizer (as transformers' GemmaTokenizer
    serialises it): normalizer ' '->'▁', BPE with byte_fallback, decoder
    Replace+ByteFallback+Fuse, post-processor '<bos> $A'.  Vocab = specials +
    256 byte tokens + printable ASCII + '▁' + '\\n' + a few merges."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

    vocab = dict(TOK)
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    chars = ["▁", "\n"] + [chr(c) for c in range(33, 127)]
    for c in chars:
        vocab.setdefault(c, len(vocab))
    # A handful of merges so multi-char pieces exist (deterministic, no training).
    merge_pairs = [("\n", "\n"), ("▁", "t"), ("h", "e"), ("▁t", "he"), ("i", "n"),
                   ("▁", "a"), ("o", "n"), ("e", "r"), ("▁", "i"), ("▁i", "s"),
                   ("i", "m"), ("a", "g"), ("ag", "e"), ("im", "age"), ("▁", "image"),
                   ("o", "f"), ("▁", "of"), ("▁", "w"), ("h", "a"), ("▁w", "ha"),
                   ("▁wha", "t"), ("▁", "D"), ("e", "s"), ("▁D", "es")]
    merges = []
    for a, b in merge_pairs:
        merged = a + b
        if merged not in vocab:
            vocab[merged] = len(vocab)
        merges.append((a, b))

    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>",
                               fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", TOK["<bos>"])])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    tok.save(str(out / "tokenizer.json"))

    extra = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
             "image_token": "<image_soft_token>"}
    write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "GemmaTokenizer",
        "processor_class": "Gemma3Processor",
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
        "unk_token": "<unk>", "mask_token": "<mask>",
        "add_bos_token": True, "add_eos_token": False,
        "extra_special_tokens": extra,
        "padding_side": "left",
        "clean_up_tokenization_spaces": False,
        "spaces_between_special_tokens": False,
        "model_max_length": 4096,
    })
    write_json(out / "special_tokens_map.json", {
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
        "unk_token": "<unk>", **extra})
    (out / "chat_template.jinja").write_text(GEMMA3_CHAT_TEMPLATE)
    write_json(out / "chat_template.json", {"chat_template": GEMMA3_CHAT_TEMPLATE})
    return len(vocab)


# --- image processor / processor configs ------------------------------------
def write_processor_configs(out: Path) -> None:
    write_json(out / "preprocessor_config.json", {
        "image_processor_type": "Gemma3ImageProcessor",
        "processor_class": "Gemma3Processor",
        "do_convert_rgb": None,
        "do_normalize": True,
        "do_pan_and_scan": None,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "image_seq_length": MM_TOKENS_PER_IMAGE,
        "pan_and_scan_max_num_crops": None,
        "pan_and_scan_min_crop_size": None,
        "pan_and_scan_min_ratio_to_activate": None,
        "resample": 2,
        "rescale_factor": 1 / 255,
        "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
    })
    write_json(out / "processor_config.json", {
        "image_seq_length": MM_TOKENS_PER_IMAGE,
        "processor_class": "Gemma3Processor",
    })


# --- model config + weights -------------------------------------------------
def make_config(vocab_size: int, dtype: str, sliding_window: int = 512) -> dict:
    text_config = {
        "model_type": "gemma3_text",
        "hidden_size": TEXT_HIDDEN,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "query_pre_attn_scalar": 32,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab_size,
        "sliding_window": sliding_window,
        # layer 0 sliding (RotatingKVCache), layer 1 global (KVCache)
        "sliding_window_pattern": 2,
        "rope_local_base_freq": 10000.0,
        "rope_global_base_freq": 1000000.0,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "mm_tokens_per_image": MM_TOKENS_PER_IMAGE,
        "max_position_embeddings": 4096,
    }
    vision_config = {
        "model_type": "siglip_vision_model",
        "hidden_size": VISION_HIDDEN,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "patch_size": PATCH_SIZE,
        "image_size": IMAGE_SIZE,
        "num_channels": 3,
        "layer_norm_eps": 1e-6,
        "vision_use_head": False,
    }
    return {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": text_config,
        "vision_config": vision_config,
        "boi_token_index": TOK["<start_of_image>"],
        "eoi_token_index": TOK["<end_of_image>"],
        "image_token_index": TOK["<image_soft_token>"],
        "mm_tokens_per_image": MM_TOKENS_PER_IMAGE,
        "pad_token_id": TOK["<pad>"],
        "eos_token_id": [TOK["<eos>"], TOK["<end_of_turn>"]],
        # mlx-vlm's Gemma3 scales image features by 1/sqrt(config.hidden_size)
        # (top level, default 2048) before the LM multiplies everything by
        # sqrt(text hidden); keep them equal so image features are unscaled.
        "hidden_size": TEXT_HIDDEN,
        "vocab_size": vocab_size,
        "torch_dtype": dtype,
    }


def make_weights(config: dict, dtype) -> dict:
    """Instantiate mlx-vlm's own Gemma3 Model and overwrite every parameter
    with seeded random values. Saved in mlx-vlm layout (what mlx_vlm.convert
    writes): conv weight (O, kH, kW, I), no lm_head (tied to embed_tokens;
    gemma3 LanguageModel.sanitize re-creates it on load)."""
    from mlx_vlm.models import gemma3
    from mlx_vlm.utils import update_module_configs

    mcfg = gemma3.ModelConfig.from_dict(config)
    mcfg = update_module_configs(mcfg, gemma3, config, ["text", "vision"])
    mx.random.seed(SEED)
    model = gemma3.Model(mcfg)
    weights = {}
    for i, (name, p) in enumerate(sorted(tree_flatten(model.parameters()))):
        if name.endswith("lm_head.weight"):
            continue
        key = mx.random.key(SEED * 1000 + i)
        if p.ndim == 1:
            # Gemma RMSNorm computes x * (1 + w): small w. LayerNorm/bias: near 1 / 0.
            base = 1.0 if ("layer_norm" in name or "layernorm" in name) and "vision" in name \
                and name.endswith("weight") else 0.0
            w = base + 0.02 * mx.random.normal(p.shape, key=key)
        elif name.endswith("embed_tokens.weight"):
            w = EMBED_STD * mx.random.normal(p.shape, key=key)
        else:
            fan_in = int(np.prod(p.shape[1:])) if "mm_input_projection" not in name else p.shape[0]
            w = mx.random.normal(p.shape, key=key) / np.sqrt(fan_in)
        weights[name] = w.astype(dtype)
    mx.eval(weights)
    return weights


def build(out: Path, dtype_name: str, sliding_window: int = 512) -> None:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    vocab_size = build_tokenizer(out)
    write_processor_configs(out)
    config = make_config(vocab_size, dtype_name, sliding_window)
    write_json(out / "config.json", config)
    write_json(out / "generation_config.json", {
        "bos_token_id": TOK["<bos>"], "eos_token_id": [TOK["<eos>"], TOK["<end_of_turn>"]],
        "pad_token_id": TOK["<pad>"], "do_sample": False})
    weights = make_weights(config, getattr(mx, dtype_name))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    n_params = sum(v.size for v in weights.values())
    print(f"built {out}  vocab={vocab_size}  params={n_params:,}  dtype={dtype_name}")


def make_image() -> Image.Image:
    """Deterministic 48x40 RGB gradient (not the model size: exercises resize)."""
    h, w = 40, 48
    y, x = np.mgrid[0:h, 0:w]
    arr = np.stack([x * 255 // (w - 1), y * 255 // (h - 1), (x + y) * 255 // (w + h - 2)], -1)
    return Image.fromarray(arr.astype(np.uint8), "RGB")


# --- run mlx-vlm ------------------------------------------------------------
def run(out: Path, max_tokens: int) -> None:
    from mlx_vlm import generate, load
    from mlx_vlm.models.cache import make_prompt_cache
    from mlx_vlm.prompt_utils import apply_chat_template
    from mlx_vlm.utils import prepare_inputs, should_add_special_tokens

    t0 = time.perf_counter()
    model, processor = load(str(out))
    print(f"load: {time.perf_counter() - t0:.2f}s  model={type(model).__module__}"
          f"  processor={type(processor).__name__}"
          f"  tokenizer={type(processor.tokenizer).__name__}"
          f"  image_processor={type(processor.image_processor).__name__}")

    image = make_image()
    prompt = apply_chat_template(processor, model.config, "What is in the image?", num_images=1)
    print("formatted prompt:", repr(prompt))

    # Same preprocessing generate() does (dispatch._prepare_generation_inputs).
    inputs = prepare_inputs(
        processor, images=[image], prompts=prompt,
        image_token_index=model.config.image_token_index,
        add_special_tokens=should_add_special_tokens(model.config.model_type, processor))
    input_ids = inputs["input_ids"]
    pixel_values = inputs["pixel_values"]
    ids = input_ids[0].tolist()
    n_img = sum(1 for t in ids if t == model.config.image_token_index)
    print(f"prompt tokens={len(ids)}  image tokens={n_img}  "
          f"pixel_values={tuple(pixel_values.shape)} {pixel_values.dtype}  "
          f"other inputs={sorted(k for k in inputs if k not in ('input_ids', 'pixel_values'))}")
    print("input_ids:", ids)
    n_bos = next(i for i, t in enumerate(ids) if t != TOK["<bos>"])
    print(f"leading <bos> tokens: {n_bos}"
          + ("  <- double BOS: template adds <bos> and the tokenizer adds another"
             " (mlx-vlm 0.7.10 does not forward add_special_tokens to Gemma3Processor;"
             " see STUDY.md 4)" if n_bos > 1 else ""))

    # Vision encoder + projector time for one image (what get_input_embeddings runs).
    dtype = model.language_model.model.embed_tokens.weight.dtype

    def encode():
        hidden, _, _ = model.vision_tower(
            pixel_values.transpose(0, 2, 3, 1).astype(dtype), output_hidden_states=True)
        feats = model.multi_modal_projector(hidden)
        mx.eval(feats)
        return feats

    feats = encode()  # warm-up
    times = []
    for _ in range(5):
        t = time.perf_counter()
        encode()
        times.append(time.perf_counter() - t)
    print(f"vision tower + projector, 1 image: {1000 * sorted(times)[2]:.2f} ms (median of 5)"
          f"  features={tuple(feats.shape)}")

    # mlx-vlm's own generate, greedy.
    result = generate(model, processor, prompt, image=[image], max_tokens=max_tokens,
                      temperature=0.0, verbose=False)
    print(f"generate: token_ids={result.token_ids}  text={result.text!r}  "
          f"finish_reason={result.finish_reason}  prompt_tokens={result.prompt_tokens}  "
          f"generation_tokens={result.generation_tokens}")
    other = Image.fromarray(255 - np.asarray(image))  # inverted colours
    result2 = generate(model, processor, prompt, image=[other], max_tokens=max_tokens,
                       temperature=0.0, verbose=False)
    print(f"generate, inverted image: token_ids={result2.token_ids}  "
          f"(differs from first image: {result2.token_ids != result.token_ids})")

    # Cross-check: replicate generate_step by hand (get_input_embeddings ->
    # language_model(inputs_embeds=..., cache=...) -> greedy decode), once with
    # a single prefill and once with chunked prefill over the merged embeddings.
    def manual(chunk):
        cache = make_prompt_cache(model.language_model)
        emb = model.get_input_embeddings(input_ids, pixel_values, mask=inputs["attention_mask"])
        e = emb.inputs_embeds
        L = e.shape[1]
        start = 0
        while L - start > 1 and chunk:
            n = min(chunk, L - 1 - start)
            model.language_model(input_ids[:, start:start + n],
                                 inputs_embeds=e[:, start:start + n], cache=cache)
            mx.eval([c.state for c in cache])
            start += n
        logits = model.language_model(input_ids[:, start:], inputs_embeds=e[:, start:],
                                      cache=cache).logits[:, -1, :]
        first_logits = logits
        out_ids = []
        y = mx.argmax(logits, axis=-1)
        for _ in range(max_tokens):
            tok = y.item()
            out_ids.append(tok)
            if tok in model.config.eos_token_id:
                break
            logits = model.language_model(y[None], cache=cache).logits[:, -1, :]
            y = mx.argmax(logits, axis=-1)
        return out_ids, first_logits

    full_ids, full_logits = manual(None)
    chunk_ids, chunk_logits = manual(7)
    diff = mx.abs(full_logits.astype(mx.float32) - chunk_logits.astype(mx.float32)).max().item()
    print(f"manual loop ids={full_ids}  matches generate: {full_ids == result.token_ids}")
    print(f"chunked prefill (7-token chunks) ids={chunk_ids}  same as unchunked: "
          f"{chunk_ids == full_ids}  max|dlogits| first step={diff:.2e}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="build/tiny-gemma3")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--sliding-window", type=int, default=512,
                    help="gemma3 sliding window of layer 0 (real 4B: 1024)")
    ap.add_argument("--build-only", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    out = Path(args.out)
    build(out, args.dtype, args.sliding_window)
    if not args.build_only:
        run(out, args.max_tokens)
    print(f"total {time.perf_counter() - t0:.1f}s")


if __name__ == "__main__":
    sys.exit(main())
