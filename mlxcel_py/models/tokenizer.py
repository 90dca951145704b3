"""Rebuild a GGUF's tokenizer (byte-level BPE with `tokenizers`, sentencepiece through
transformers' GGUF support), wrapped for mlx-lm."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from mlx_lm.tokenizer_utils import (
    BPEStreamingDetokenizer, NaiveStreamingDetokenizer, SPMStreamingDetokenizer, TokenizerWrapper, _byte_decoder,
)
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from ..errors import ModelLoadError
from .fim import FimTokens, find_fim_tokens

CONTROL, USER_DEFINED = 3, 4
_BYTE_DECODER = _byte_decoder()
# llama.cpp's split regexes (llama-vocab.cpp) for tokenizer.ggml.pre "llama-bpe" and "qwen2".
LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Token texts llama.cpp ends generation on whatever the eos id says (llama-vocab.cpp).
EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>",
    "<|end_of_text|>", "<\uff5cend\u2581of\u2581sentence\uff5c>",
})
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# Each name's regexes, applied one after the other as llama.cpp does (llm_tokenizer_bpe).
SPLIT_REGEXES = {
    "llama-bpe": (LLAMA3_REGEX,), "llama3": (LLAMA3_REGEX,), "qwen2": (QWEN2_REGEX,),
    "deepseek-r1-qwen": (QWEN2_REGEX,), "gpt-2": (GPT2_REGEX,), "mpt": (GPT2_REGEX,), "olmo": (GPT2_REGEX,),
    "smollm": (r"\p{N}", GPT2_REGEX), "starcoder": (r"\p{N}", GPT2_REGEX), "refact": (r"\p{N}", GPT2_REGEX),
    # a BPE vocabulary that names no pre-tokenizer: llama.cpp's fallback rules
    "default": (r"[\p{P}\$\+<=>\^~\|]+", GPT2_REGEX, r"\p{N}+", r"[0-9][0-9][0-9]"),
}


@dataclass(frozen=True, slots=True)
class TokenizerInfo:
    wrapper: Any  # TokenizerWrapper
    bos_token_id: Optional[int]
    eos_token_ids: frozenset[int]
    add_bos: bool
    # tokenizer.ggml.add_eos_token's eos, which encode(add_special_tokens=True) appends as llama.cpp's
    # tokenize(add_special) does (a Qwen3-Embedding GGUF pools its state); None when the file does not ask.
    appended_eos: Optional[int] = None
    fim: FimTokens = FimTokens()  # fill-in-the-middle tokens (models/fim.py); none for most models


class ByteLevelDetokenizer(BPEStreamingDetokenizer):
    """mlx-lm's BPE streaming detokenizer without its leading-space trim.

    Streamed text must equal `tokenizer.decode(tokens)`, which keeps a leading space."""

    def _maybe_trim_space(self, current_text):
        return current_text

    def add_token(self, token):
        # The parent holds a lone-space token back to maybe trim it; with no trim here that
        # only delays text (digits are split one per token, so " 2" is " " then "2").
        self.tokens.append(token)
        self._unflushed += self.tokenmap[token] if token < len(self.tokenmap) else "!"
        text = self._decode_bytes(self._unflushed)
        if not text.endswith("\ufffd"):  # wait only for an incomplete UTF-8 character
            self.text += text
            self._unflushed = ""

    def _decode_bytes(self, seq):
        # The parent drops byte 0 (it tests `if res:`); map every byte-level char exactly.
        out = bytearray()
        for c in seq:
            byte = _BYTE_DECODER.get(c)
            out.extend(c.encode("utf-8") if byte is None else (byte,))
        return out.decode("utf-8", "replace")


def keep_leading_space(wrapper: Any) -> Any:
    """Make `wrapper`'s streaming detokenizer keep a leading space, as llama-server streams token
    pieces: generated text continues the prompt, so " 100" after "boils at" stays " 100" (mlx-lm's
    SPM and BPE detokenizers drop it, as if the tokens began a text). Returns the wrapper."""
    detok = wrapper._detokenizer  # mlx-lm's template detokenizer; `.detokenizer` hands out copies
    if isinstance(detok, SPMStreamingDetokenizer):
        detok.trim_space = False
    elif type(detok) is BPEStreamingDetokenizer:
        wrapper._detokenizer = ByteLevelDetokenizer(wrapper._tokenizer)
    elif type(detok) is NaiveStreamingDetokenizer and _sentencepiece_pieces(wrapper._tokenizer):
        # A slow sentencepiece tokenizer: mlx-lm re-decodes the whole text, which drops the space.
        wrapper._detokenizer = SPMStreamingDetokenizer(wrapper._tokenizer, trim_space=False)
    return wrapper


def _sentencepiece_pieces(hf: Any) -> bool:
    """Whether the vocabulary writes spaces as sentencepiece's "▁"."""
    pieces = hf.convert_ids_to_tokens(list(range(min(len(hf), 4096))))
    return any(isinstance(p, str) and p.startswith("\u2581") for p in pieces)


def _pre_tokenizer(pre: str, source: str):
    if pre not in SPLIT_REGEXES:
        raise ModelLoadError(
            f"unsupported GGUF tokenizer pre-tokenizer {pre!r} in {source} (supported: {', '.join(SPLIT_REGEXES)})"
        )
    splits = [pre_tokenizers.Split(Regex(regex), behavior="isolated") for regex in SPLIT_REGEXES[pre]]
    return pre_tokenizers.Sequence([*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _metadata_int(meta: dict, key: str) -> Optional[int]:
    value = meta.get(key)
    return None if value is None else int(value)


def _build_tokenizer(meta: dict, source: str) -> Tokenizer:
    tokens = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = _pre_tokenizer(str(meta.get("tokenizer.ggml.pre", "default")), source)
    tok.decoder = decoders.ByteLevel()
    kinds = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    # Control tokens (e.g. <|im_start|>) must encode as one id and never be split.
    tok.add_special_tokens([
        AddedToken(tokens[i], special=True, normalized=False) for i, k in enumerate(kinds) if k == CONTROL
    ])
    tok.add_tokens([
        AddedToken(tokens[i], special=False, normalized=False)
        for i, k in enumerate(kinds) if k == USER_DEFINED
    ])
    return tok


def end_of_generation_ids(meta: dict, fim: Optional[FimTokens] = None) -> set[int]:
    """llama.cpp's end-of-generation set: the eos/eot/eom ids, every token spelled like a turn end
    (Gemma's <end_of_turn> and Phi-3's <|end|> are not the files' eos), and the FIM pad, repo and file
    separator tokens."""
    keys = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
    ids = {i for key in keys if (i := _metadata_int(meta, key)) is not None}
    named = {i for i, text in enumerate(meta["tokenizer.ggml.tokens"]) if text in EOG_TEXTS}
    return ids | (fim or gguf_fim(meta)).ends | named


def gguf_fim(meta: dict) -> FimTokens:
    """A GGUF's fill-in-the-middle tokens (its keys, else llama.cpp's text forms)."""
    return find_fim_tokens({t: i for i, t in enumerate(meta["tokenizer.ggml.tokens"])}, meta)


def _byte_level(meta: dict, source: str, bos: Optional[int], eos: Optional[int], add_bos: bool,
                add_eos: bool = False):
    from transformers import PreTrainedTokenizerFast  # slow import, only when loading

    tokens = meta["tokenizer.ggml.tokens"]
    tok = _build_tokenizer(meta, source)
    head = [bos] if add_bos and bos is not None else []
    tail = [eos] if add_eos and eos is not None else []
    if head or tail:
        ends = lambda ids: " ".join(tokens[i] for i in ids)  # noqa: E731
        tok.post_processor = processors.TemplateProcessing(
            single=f"{ends(head)} $A {ends(tail)}".strip(), pair=f"{ends(head)} $A $B {ends(tail)}".strip(),
            special_tokens=[(tokens[i], i) for i in dict.fromkeys(head + tail)],
        )
    name = lambda i: tokens[i] if i is not None and i < len(tokens) else None  # noqa: E731
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=name(bos),
        eos_token=name(eos),
        pad_token=name(_metadata_int(meta, "tokenizer.ggml.padding_token_id")),
        add_bos_token=add_bos,  # transformers 5 rebuilds the post-processor from this flag
        add_eos_token=add_eos,
        chat_template=meta.get("tokenizer.chat_template"),
    )


def _sentencepiece(meta: dict, source: str):
    """A sentencepiece vocabulary (tokenizer.ggml.model "llama"), rebuilt by transformers' GGUF builders.

    Its public GGUF entry point reads the file through torch; the builders themselves need
    only the metadata we already parsed."""
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import (
            GGUF_TOKENIZER_MAPPING, convert_gguf_tokenizer,
        )
        from transformers import PreTrainedTokenizerFast
    except ImportError as exc:
        raise ModelLoadError(f"sentencepiece GGUF tokenizer in {source} needs transformers>=5.0 ({exc})") from None
    renames = GGUF_TOKENIZER_MAPPING["tokenizer"]
    info = {name: meta[f"tokenizer.{key}"] for key, name in renames.items() if f"tokenizer.{key}" in meta}
    try:
        backend, _ = convert_gguf_tokenizer(meta.get("general.architecture", "llama"), info)
    except (ValueError, KeyError) as exc:
        raise ModelLoadError(f"cannot build the sentencepiece tokenizer of {source}: {exc}") from None
    tokens = meta["tokenizer.ggml.tokens"]

    def name(key: str) -> Optional[str]:
        i = _metadata_int(meta, key)
        return tokens[i] if i is not None and i < len(tokens) else None

    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token=name("tokenizer.ggml.bos_token_id"),
        eos_token=name("tokenizer.ggml.eos_token_id"), unk_token=name("tokenizer.ggml.unknown_token_id"),
        pad_token=name("tokenizer.ggml.padding_token_id"), chat_template=meta.get("tokenizer.chat_template"),
    )


def gguf_tokenizer(meta: dict, source: str) -> TokenizerInfo:
    """Build the tokenizer a GGUF describes; `source` names the file in error messages."""
    kind = meta.get("tokenizer.ggml.model")
    if kind not in ("gpt2", "llama", "bert") or "tokenizer.ggml.tokens" not in meta:
        raise ModelLoadError(
            f"unsupported GGUF tokenizer model {kind!r} in {source} "
            "(supported: gpt2 byte-level BPE, llama sentencepiece, bert WordPiece)"
        )
    if kind == "bert":
        return _wordpiece(meta)
    bos = _metadata_int(meta, "tokenizer.ggml.bos_token_id")
    eos = _metadata_int(meta, "tokenizer.ggml.eos_token_id")
    # llama.cpp appends the eos to text tokenized with add_special when the file asks (Qwen3-Embedding).
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and eos is not None
    if kind == "gpt2":
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
        hf, detokenizer = _byte_level(meta, source, bos, eos, add_bos, add_eos), ByteLevelDetokenizer
    else:
        # llama.cpp adds BOS to a sentencepiece vocabulary unless the file says otherwise.
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", True))
        # mlx-lm's SPM detokenizer: byte-fallback tokens as raw bytes, as llama.cpp streams them.
        hf, detokenizer = _sentencepiece(meta, source), SPMStreamingDetokenizer
        hf.add_bos_token = add_bos
        hf.add_eos_token = add_eos
    fim = gguf_fim(meta)  # one pass over the vocabulary, for the FIM roles and the ends they add
    wrapper = keep_leading_space(TokenizerWrapper(hf, detokenizer_class=detokenizer,
                                                  eos_token_ids=end_of_generation_ids(meta, fim)))
    return TokenizerInfo(wrapper, bos, frozenset(wrapper.eos_token_ids), add_bos, eos if add_eos else None, fim)


def _wordpiece(meta: dict) -> TokenizerInfo:
    """A "bert" vocabulary (models/wordpiece.py); llama.cpp adds [CLS] and [SEP] unless the file says not."""
    from .wordpiece import special_id, wordpiece_tokenizer

    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", True))
    add_sep = bool(meta.get("tokenizer.ggml.add_sep_token", True))
    wrapper = TokenizerWrapper(wordpiece_tokenizer(meta, add_bos, add_sep),
                               detokenizer_class=NaiveStreamingDetokenizer, eos_token_ids=end_of_generation_ids(meta))
    return TokenizerInfo(wrapper, special_id(meta, "bos"), frozenset(wrapper.eos_token_ids), add_bos)
