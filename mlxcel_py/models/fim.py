"""Fill-in-the-middle: a model's FIM tokens, and the infill prompt as llama.cpp lays it out.

The tokens come from a GGUF's `tokenizer.ggml.fim_*_token_id` keys (or the deprecated prefix/suffix/middle
ones) and otherwise, as llama.cpp's vocabulary loader finds them, by their text: the Qwen2.5-Coder,
CodeGemma (`<|fim_prefix|>`...), StarCoder/Granite (`<fim_prefix>`...), CodeLlama (`<PRE>`...),
DeepSeek-Coder and GLM forms. `infill_ids` transcribes llama-server's `format_prompt_infill`: the
repo-level pattern ([FIM_REP]myproject, [FIM_SEP]filename + each extra chunk, [FIM_SEP]filename), then
[BOS] [FIM_PRE] prefix prompt [FIM_SUF] suffix [FIM_MID] (suffix first with --spm-infill), the prefix
and suffix cut to fit a batch (3:1) and the extra chunks to the rest of the context. Text is tokenized
without reading special tokens in it, as llama.cpp does for these fields."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

# llama.cpp's text forms of each FIM token (src/llama-vocab.cpp), by role.
FORMS = {
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
            "<|code_prefix|>", "<|prefix|>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
            "<|code_suffix|>", "<|suffix|>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
            "<|code_middle|>", "<|middle|>"),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "sep": ("<|file_sep|>",),
}
KEYS = {role: (f"tokenizer.ggml.fim_{role}_token_id",) for role in FORMS}
KEYS["pre"] += ("tokenizer.ggml.prefix_token_id",)
KEYS["suf"] += ("tokenizer.ggml.suffix_token_id",)
KEYS["mid"] += ("tokenizer.ggml.middle_token_id",)
CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"  # between extra chunks when the model has no [FIM_SEP]
DEFAULT_BATCH = 2048  # llama-server's -b, which sizes the prefix and suffix it keeps

Piece = Union[str, int]


@dataclass(frozen=True, slots=True)
class FimTokens:
    pre: Optional[int] = None
    suf: Optional[int] = None
    mid: Optional[int] = None
    pad: Optional[int] = None
    rep: Optional[int] = None
    sep: Optional[int] = None

    @property
    def missing(self) -> list[str]:
        """The roles an infill needs that the model lacks (llama-server's words)."""
        return [f"{name} token is missing" for name, token in (("prefix", self.pre), ("suffix", self.suf),
                                                                 ("middle", self.mid)) if token is None]

    @property
    def ends(self) -> frozenset[int]:
        """Tokens that end a generation as llama.cpp counts them (pad, repo and file separators)."""
        return frozenset(t for t in (self.pad, self.rep, self.sep) if t is not None)


def find_fim_tokens(vocab: dict[str, int], metadata: Optional[dict] = None) -> FimTokens:
    """A model's FIM tokens: the GGUF's keys where it has them, else the first known text form in `vocab`."""
    found = {}
    for role, forms in FORMS.items():
        ids = [metadata.get(key) for key in KEYS[role]] if metadata else []
        token = next((int(i) for i in ids if isinstance(i, int) and 0 <= i < len(vocab)), None)
        if token is None:
            token = next((vocab[form] for form in forms if form in vocab), None)
        found[role] = token
    return FimTokens(**found)


def infill_ids(fim: FimTokens, encode: Callable[[str], list[int]], prefix: Sequence[Piece], suffix: Sequence[Piece],
               extra: Sequence[tuple[str, str]], prompt: Sequence[int], *, bos: Optional[int], n_batch: int,
               n_predict: int, n_ctx: int, spm: bool = False) -> list[int]:
    """llama-server's infill prompt. `encode`: plain text -> ids (no BOS, special tokens not read);
    `prefix`/`suffix`: text or token ids, mixed; `extra`: (filename, text) chunks; `prompt`: the ids of the
    text that follows the prefix; `bos`: prepended when the model adds one."""
    tokens_prefix, tokens_suffix = _mixed(prefix, encode), _mixed(suffix, encode)
    extra_tokens: list[int] = []
    if fim.rep is not None:
        extra_tokens += [fim.rep] + encode("myproject\n")
    for filename, text in extra:
        extra_tokens += [fim.sep] + encode(filename + "\n") if fim.sep is not None else encode(CHUNK_SEPARATOR)
        extra_tokens += encode(text)
    if fim.sep is not None:
        extra_tokens += [fim.sep] + encode("filename\n")
    n_prefix_take = min(len(tokens_prefix), 3 * (n_batch // 4))
    n_suffix_take = min(len(tokens_suffix), max(0, n_batch // 4 - (2 + len(prompt))))
    n_extra_take = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_tokens))
    head = [fim.pre] + tokens_prefix[len(tokens_prefix) - n_prefix_take:] + list(prompt)
    tail = [fim.suf] + tokens_suffix[:n_suffix_take]
    first, second = (tail, head) if spm else (head, tail)
    if bos is not None:
        first = [bos] + first
    return extra_tokens[len(extra_tokens) - n_extra_take:] + first + second + [fim.mid]


def _mixed(pieces: Sequence[Piece], encode: Callable[[str], list[int]]) -> list[int]:
    if isinstance(pieces, str):
        return encode(pieces)
    out: list[int] = []
    for piece in pieces:
        out += [piece] if isinstance(piece, int) else encode(piece)
    return out
