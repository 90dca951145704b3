"""Make the GGUF + mmproj fixture in tests/fixtures/gguf/vision/: the tiny random-weight Gemma 3 VLM of
make_tiny_vlm.py (the same weights as the MLX fixture the vision tests build) written as llama.cpp lays
it out, a gemma3 text model (gemma3vl-f32.gguf) and a gemma3 projector (gemma3vl-mmproj-f32.gguf), as
llama.cpp's convert_hf_to_gguf.py (with --mmproj) converts Gemma 3: llama.cpp names, Gemma's norms
stored as 1 + w (the projector's soft-embedding norm too), the patch convolution as (out, in, kh, kw),
the vocabulary as a sentencepiece model whose scores are the merges' order. Then, when llama-server is
built (scripts/build_llama_server.sh), its greedy tokens for two images through /completion's
multimodal prompt and its reply to a chat turn with an image, in gemma3vl_llama_server.json.

    .venv/bin/python scripts/make_mmproj_fixture.py [--server llama-server] [--record-only]
"""

from __future__ import annotations

import base64
import io
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_tiny_vlm as tiny  # noqa: E402
from fixture_gguf import finish, fixture_main, llama_server  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "gguf" / "vision"
TEXT, MMPROJ = OUT / "gemma3vl-f32.gguf", OUT / "gemma3vl-mmproj-f32.gguf"
RECORD = OUT / "gemma3vl_llama_server.json"
PROMPT = "<start_of_turn>user\n<__media__>What is in the image?<end_of_turn>\n<start_of_turn>model\n"
QUESTION = "What is in the image?"
N_PREDICT = 12
BLOCK = {  # mlx-lm's gemma3 names -> llama.cpp's (models/gguf_arch.GEMMA3_BLOCK the other way)
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
}
VISION_BLOCK = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                "self_attn.out_proj": "attn_out", "layer_norm1": "ln1", "layer_norm2": "ln2",
                "mlp.fc1": "ffn_up", "mlp.fc2": "ffn_down"}


def images() -> dict[str, bytes]:
    """The recorded images as PNG bytes: one at the projector's size (no resize) and the 48x40 gradient
    (letterboxed and resized by the preprocessing)."""
    gradient = tiny.make_image()
    square = gradient.crop((4, 0, 4 + tiny.IMAGE_SIZE, tiny.IMAGE_SIZE))
    out = {}
    for name, image in (("square", square), ("gradient", gradient)):
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        out[name] = buf.getvalue()
    return out


def _weights(tmp: Path) -> tuple[dict[str, np.ndarray], dict]:
    import mlx.core as mx

    tiny.build(tmp, "float32")
    config = json.loads((tmp / "config.json").read_text())
    return {k: np.array(v) for k, v in mx.load(str(tmp / "model.safetensors")).items()}, config


def _vocab(tmp: Path) -> tuple[list[str], list[float], list[int]]:
    """tokenizer.json's BPE as a sentencepiece vocabulary: a merge's result scores by the merge's order."""
    from gguf import TokenType

    model = json.loads((tmp / "tokenizer.json").read_text())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    scores = [0.0] * len(tokens)
    for rank, merge in enumerate(model["merges"]):
        a, b = merge.split(" ") if isinstance(merge, str) else merge
        scores[model["vocab"][a + b]] = -float(rank + 1)
    kinds = []
    for i, token in enumerate(tokens):
        if token == "<unk>":
            kinds.append(TokenType.UNKNOWN)
        elif token in tiny.TOK:
            kinds.append(TokenType.CONTROL)
        elif token.startswith("<0x") and len(token) == 6:
            kinds.append(TokenType.BYTE)
        else:
            kinds.append(TokenType.NORMAL)
    return tokens, scores, [int(k) for k in kinds]


def write_text(weights: dict, config: dict, tmp: Path) -> None:
    from gguf import GGUFWriter

    text = config["text_config"]
    writer = GGUFWriter(str(TEXT), "gemma3")
    writer.add_name("tiny")
    writer.add_file_type(0)  # all float32
    writer.add_context_length(text["max_position_embeddings"])
    writer.add_embedding_length(text["hidden_size"])
    writer.add_block_count(text["num_hidden_layers"])
    writer.add_feed_forward_length(text["intermediate_size"])
    writer.add_head_count(text["num_attention_heads"])
    writer.add_head_count_kv(text["num_key_value_heads"])
    writer.add_key_length(text["head_dim"])
    writer.add_value_length(text["head_dim"])
    writer.add_layer_norm_rms_eps(text["rms_norm_eps"])
    writer.add_rope_freq_base(text["rope_global_base_freq"])
    writer.add_float32("gemma3.rope.freq_base_swa", text["rope_local_base_freq"])
    writer.add_sliding_window(text["sliding_window"])
    pattern = text["sliding_window_pattern"]
    writer.add_array("gemma3.attention.sliding_window_pattern",
                     [(i + 1) % pattern != 0 for i in range(text["num_hidden_layers"])])
    tokens, scores, kinds = _vocab(tmp)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(kinds)
    writer.add_bos_token_id(tiny.TOK["<bos>"])
    writer.add_eos_token_id(tiny.TOK["<eos>"])
    writer.add_eot_token_id(tiny.TOK["<end_of_turn>"])
    writer.add_unk_token_id(tiny.TOK["<unk>"])
    writer.add_pad_token_id(tiny.TOK["<pad>"])
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(False)
    writer.add_chat_template(tiny.GEMMA3_CHAT_TEMPLATE)
    prefix = "language_model.model."
    for name, value in sorted(weights.items()):
        if not name.startswith(prefix):
            continue
        name = name.removeprefix(prefix)
        if name == "embed_tokens.weight":
            gguf_name = "token_embd.weight"
        elif name == "norm.weight":
            gguf_name = "output_norm.weight"
        else:
            _, layer, rest = name.split(".", 2)
            module, kind = rest.rsplit(".", 1)
            gguf_name = f"blk.{layer}.{BLOCK[module]}.{kind}"
        if name.endswith("norm.weight"):
            value = value + 1.0  # Gemma's RMSNorm is x * (1 + w): llama.cpp's converter stores 1 + w
        writer.add_tensor(gguf_name, value.astype(np.float32))
    finish(writer, TEXT)


def write_mmproj(weights: dict, config: dict) -> None:
    from gguf import GGUFWriter

    vision, text = config["vision_config"], config["text_config"]
    writer = GGUFWriter(str(MMPROJ), "clip")
    writer.add_name("tiny")
    writer.add_file_type(0)
    writer.add_string("clip.projector_type", "gemma3")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.use_gelu", True)
    writer.add_uint32("clip.vision.projection_dim", text["hidden_size"])
    writer.add_uint32("clip.vision.image_size", vision["image_size"])
    writer.add_uint32("clip.vision.patch_size", vision["patch_size"])
    writer.add_uint32("clip.vision.embedding_length", vision["hidden_size"])
    writer.add_uint32("clip.vision.feed_forward_length", vision["intermediate_size"])
    writer.add_uint32("clip.vision.block_count", vision["num_hidden_layers"])
    writer.add_uint32("clip.vision.attention.head_count", vision["num_attention_heads"])
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", vision["layer_norm_eps"])
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    per_side = vision["image_size"] // vision["patch_size"]
    writer.add_uint32("clip.vision.projector.scale_factor", per_side // int(config["mm_tokens_per_image"] ** 0.5))
    for name, value in sorted(weights.items()):
        if name.startswith("multi_modal_projector."):
            if name.endswith("mm_input_projection_weight"):
                writer.add_tensor("mm.input_projection.weight", value.astype(np.float32))
            else:
                writer.add_tensor("mm.soft_emb_norm.weight", (value + 1.0).astype(np.float32))
            continue
        if not name.startswith("vision_tower.vision_model."):
            continue
        name = name.removeprefix("vision_tower.vision_model.")
        if name.startswith("embeddings.patch_embedding."):
            kind = name.rsplit(".", 1)[1]
            value = value.transpose(0, 3, 1, 2) if kind == "weight" else value  # (out, kh, kw, in) -> torch's
            writer.add_tensor(f"v.patch_embd.{kind}", value.astype(np.float32))
        elif name == "embeddings.position_embedding.weight":
            writer.add_tensor("v.position_embd.weight", value.astype(np.float32))
        elif name.startswith("post_layernorm."):
            writer.add_tensor(f"v.post_ln.{name.rsplit('.', 1)[1]}", value.astype(np.float32))
        else:
            _, _, layer, rest = name.split(".", 3)
            module, kind = rest.rsplit(".", 1)
            writer.add_tensor(f"v.blk.{layer}.{VISION_BLOCK[module]}.{kind}", value.astype(np.float32))
    finish(writer, MMPROJ)


def write() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        weights, config = _weights(Path(tmp))
        write_text(weights, config, Path(tmp))
        write_mmproj(weights, config)


def record(server: str) -> None:
    import httpx

    pictures = {name: base64.b64encode(raw).decode() for name, raw in images().items()}
    got = {"prompt_string": PROMPT, "question": QUESTION, "n_predict": N_PREDICT, "completion": {}, "chat": {}}
    flags = ("--mmproj", str(MMPROJ), "-c", "1024", "-np", "1", "--no-warmup")
    with llama_server(server, TEXT, *flags) as (port, cmd):
        got["command"] = cmd.replace(str(MMPROJ), MMPROJ.name)
        marker = httpx.get(f"http://127.0.0.1:{port}/props").json()["media_marker"]  # random per start
        for name, image in pictures.items():
            prompt = {"prompt_string": PROMPT.replace("<__media__>", marker), "multimodal_data": [image]}
            body = {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0, "return_tokens": True,
                    "cache_prompt": False}
            reply = httpx.post(f"http://127.0.0.1:{port}/completion", json=body, timeout=120).json()
            got["completion"][name] = {"tokens": reply["tokens"], "content": reply["content"],
                                       "prompt_tokens": reply["timings"]["prompt_n"]}
            chat = {"messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{image}"}},
                {"type": "text", "text": QUESTION}]}], "max_tokens": N_PREDICT, "temperature": 0}
            reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=chat, timeout=120).json()
            got["chat"][name] = {"content": reply["choices"][0]["message"]["content"],
                                 "prompt_tokens": reply["usage"]["prompt_tokens"]}
    RECORD.write_text(json.dumps(got, indent=1) + "\n")
    print(f"recorded {RECORD.name}: {json.dumps(got['completion'])}")


if __name__ == "__main__":
    fixture_main(__doc__, write, record, "llama-server's tokens")
