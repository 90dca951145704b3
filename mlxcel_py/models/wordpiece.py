"""A GGUF's WordPiece vocabulary (tokenizer.ggml.model "bert": BERT cross-encoders and embedding models)
rebuilt with `tokenizers` as llama.cpp's WPM tokenizer reads it (llama-vocab.cpp, llm_tokenizer_wpm).

llama.cpp's converter stores a word-initial piece as "\u2581piece" and a continuation as "piece" (the
"phantom space" form); here they are WordPiece's "piece" and "##piece" again. Text is split as
BertPreTokenizer does (whitespace, punctuation and CJK characters alone), lowercased and stripped of
accents as the file's tokenizer.ggml.normalizer.* say (default: both); a word with an unmatched part
becomes the unknown token whole, as in llama.cpp."""

from __future__ import annotations

from typing import Optional

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

PHANTOM = "\u2581"
CONTROL = 3
# llama.cpp's defaults for a "bert" vocabulary when the file names no special tokens.
DEFAULT_IDS = {"bos": 101, "unk": 100, "sep": 102, "pad": 0}


def special_id(meta: dict, key: str) -> Optional[int]:
    value = meta.get(f"tokenizer.ggml.{key}_token_id", DEFAULT_IDS.get(key))
    if key == "sep":
        value = meta.get("tokenizer.ggml.seperator_token_id", value)
    return None if value is None else int(value)


def wordpiece_tokenizer(meta: dict, add_bos: bool, add_sep: bool):
    """The PreTrainedTokenizerFast; with add_special_tokens, [BOS] text [SEP] as llama.cpp's tokenize."""
    from transformers import PreTrainedTokenizerFast

    tokens = meta["tokenizer.ggml.tokens"]
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    vocab: dict[str, int] = {}
    for i, (text, kind) in enumerate(zip(tokens, types)):
        key = text if kind == CONTROL else text[len(PHANTOM):] if text.startswith(PHANTOM) else "##" + text
        if key and key != "##":
            vocab.setdefault(key, i)
    name = {key: tokens[i] for key in DEFAULT_IDS if (i := special_id(meta, key)) is not None and i < len(tokens)}
    tok = Tokenizer(models.WordPiece(vocab, unk_token=name.get("unk", "[UNK]"), continuing_subword_prefix="##",
                                     max_input_chars_per_word=1 << 30))
    lowercase = bool(meta.get("tokenizer.ggml.normalizer.lowercase", True))
    strip = bool(meta.get("tokenizer.ggml.normalizer.strip_accents", lowercase))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=strip,
                                                lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, kind in zip(tokens, types) if kind == CONTROL])
    added = [key for key, wanted in (("bos", add_bos), ("sep", add_sep)) if wanted and key in name]
    single = ([name["bos"]] if "bos" in added else []) + ["$A"] + ([name["sep"]] if "sep" in added else [])
    specials = sorted({(name[key], special_id(meta, key)) for key in added})
    tok.post_processor = processors.TemplateProcessing(single=" ".join(single), special_tokens=specials)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=name.get("bos"), unk_token=name.get("unk"), sep_token=name.get("sep"),
        pad_token=name.get("pad"), cls_token=name.get("bos"),
    )
