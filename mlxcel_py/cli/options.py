"""Shared Typer options, named like llama.cpp / mlx_lm (serve's own: options_serve.py).

The fields of the flag records (flags.py) carry these; every record field defaults to "not
given" (None, or a switch's off/on) so that reaches `config.resolve`, which owns the defaults
(they differ per command) and the environment fallbacks.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

ModelOpt = Annotated[
    Optional[str],
    typer.Option(
        "--model",
        "-m",
        help="An mlx-lm model directory, a .gguf file, or a Hugging Face id org/name[@rev][:FILE.gguf|:Q4_K_M] "
        "(from the HF cache first). Default: the embedded SmolLM2-135M-Instruct.",
    ),
]
ThreadsOpt = Annotated[
    Optional[int],
    typer.Option(
        "--threads",
        "-t",
        help="CPU threads for the CPU decode kernels and OpenBLAS. Default: every core (fastest on a quiet "
        "machine; use 1 where other work shares the cores); env LLAMA_ARG_THREADS.",
    ),
]
CpuWeightsOpt = Annotated[
    Optional[str],
    typer.Option(
        "--cpu-weights",
        help="CPU decode step of a GGUF: native (over the file's quantized blocks) or f32 (float32 copies). "
        "Default: native on AVX2 CPUs (measured faster), else f32; env MLXCEL_CPU_WEIGHTS.",
    ),
]
PrefillChunkOpt = Annotated[
    Optional[int],
    typer.Option(
        "--prefill-chunk-size",
        help="Prefill chunk in tokens. Default: 2048 when no other sequence is decoding, 512 when one is; "
        "MLXCEL_PREFILL_CHUNK overrides. 0 disables chunking.",
    ),
]
BatchSizeOpt = Annotated[
    Optional[int],
    typer.Option("--batch-size", "-b", help="Alias of --prefill-chunk-size (llama-server); env LLAMA_ARG_BATCH"),
]
ItlBudgetOpt = Annotated[
    Optional[int],
    typer.Option(
        "--itl-budget-ms",
        help="Choose the prefill chunk each tick so a tick (decode step plus prefill piece) fits this many ms; "
        "env MLXCEL_ITL_BUDGET_MS. Default: off. An explicit chunk wins.",
    ),
]
LookupNgramOpt = Annotated[
    Optional[int],
    typer.Option("--lookup-ngram", help="Prompt-lookup speculative decoding: draft the continuation of the last N "
                 "tokens' earlier occurrence, verified in the decode step (docs/SPECULATIVE.md); env "
                 "MLXCEL_LOOKUP_NGRAM. Default: off."),
]
DraftMaxOpt = Annotated[
    Optional[int],
    typer.Option("--draft-max", help="Most draft tokens per step (llama-server); env LLAMA_ARG_DRAFT_MAX. Default: 16."),
]
DraftMinOpt = Annotated[
    Optional[int],
    typer.Option("--draft-min", help="Fewest draft tokens worth verifying (llama-server); env LLAMA_ARG_DRAFT_MIN. "
                 "Default: 0."),
]
DraftModelOpt = Annotated[
    Optional[str],
    typer.Option("--draft-model", "-md", help="Speculative decoding with a draft model (a GGUF file, mlx-lm directory "
                 "or Hugging Face id with the target's vocabulary), verified in the decode step (docs/SPECULATIVE.md); "
                 "env LLAMA_ARG_MODEL_DRAFT. Default: none."),
]
LoraOpt = Annotated[Optional[list[str]], typer.Option(
    "--lora", help="A LoRA adapter applied to every request: an mlx-lm adapter directory or a llama.cpp GGUF LoRA; "
    "repeat it or separate by commas (llama-server's flag). docs/MODELS.md#lora-adapters.")]
LoraScaledOpt = Annotated[Optional[list[str]], typer.Option(
    "--lora-scaled", help="An adapter with its scale, FILE:SCALE (commas for several; llama-server's flag).")]
LoraFuseOpt = Annotated[bool, typer.Option(
    "--lora-fuse", help="Merge the --lora adapters into float32 weights for speed (their scales then fixed; "
    "not over quantized MLX weights).")]
TempOpt = Annotated[Optional[float], typer.Option("--temp", help="Sampling temperature; 0 is greedy.")]
TopPOpt = Annotated[Optional[float], typer.Option("--top-p", help="Nucleus sampling: keep the top-p probability mass.")]
TopKOpt = Annotated[Optional[int], typer.Option("--top-k", help="Keep the k most likely tokens; 0 keeps all.")]
MinPOpt = Annotated[
    Optional[float], typer.Option("--min-p", help="Drop tokens below min-p times the top token's probability.")
]
RepeatPenaltyOpt = Annotated[
    Optional[float], typer.Option("--repeat-penalty", help="Penalty for recently generated tokens; 1.0 is off.")
]
SeedOpt = Annotated[Optional[int], typer.Option("--seed", help="Random seed for sampling.")]
# llama.cpp's sampler chain (docs/API_NATIVE.md#samplers-llamacpps-chain): llama-server's flags
SamplersOpt = Annotated[Optional[str], typer.Option(
    "--samplers", help="The sampler chain's order, names split by ';' (llama-server's: "
    "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature). Default: the plain path unless a "
    "chain sampler is on.")]
SamplingSeqOpt = Annotated[Optional[str], typer.Option(
    "--sampling-seq", "--sampler-seq", help="The chain's order as letters (llama-server's: edskypmxt).")]
TypicalOpt = Annotated[Optional[float], typer.Option("--typical", help="Locally typical sampling p; 1.0 is off.")]
MirostatOpt = Annotated[Optional[int], typer.Option("--mirostat", help="Mirostat 1 or 2; 0 is off.")]
MirostatLrOpt = Annotated[Optional[float], typer.Option("--mirostat-lr", help="Mirostat's eta. Default: 0.1.")]
MirostatEntOpt = Annotated[Optional[float], typer.Option("--mirostat-ent", help="Mirostat's tau. Default: 5.0.")]
DynatempRangeOpt = Annotated[Optional[float], typer.Option(
    "--dynatemp-range", help="Dynamic temperature: the temperature +/- this by the entropy; 0 is off.")]
DynatempExpOpt = Annotated[Optional[float], typer.Option(
    "--dynatemp-exp", help="Dynamic temperature's exponent. Default: 1.0.")]
XtcProbabilityOpt = Annotated[Optional[float], typer.Option(
    "--xtc-probability", help="XTC: the chance of removing the top tokens; 0 is off.")]
XtcThresholdOpt = Annotated[Optional[float], typer.Option(
    "--xtc-threshold", help="XTC: the probability above which a top token is removed. Default: 0.1.")]
TopNSigmaOpt = Annotated[Optional[float], typer.Option(
    "--top-nsigma", "--top-n-sigma", help="Top-n-sigma: keep logits within n standard deviations of the top; "
    "-1 is off.")]
MinKeepOpt = Annotated[Optional[int], typer.Option(
    "--min-keep", help="The fewest tokens top-p, min-p, typical and XTC keep. Default: 0.")]
MaxTokensOpt = Annotated[
    Optional[int], typer.Option("--max-tokens", "-n", help="Most tokens to generate per request.")
]
CtxSizeOpt = Annotated[
    Optional[int],
    typer.Option(
        "--ctx-size",
        "-c",
        help="KV cache tokens over all slots. Default: the model's context for each slot; env LLAMA_ARG_CTX_SIZE.",
    ),
]
LogLevelOpt = Annotated[
    Optional[str], typer.Option("--log-level", help="debug, info, warning, error or critical. Default info.")
]
ContextShiftOpt = Annotated[
    Optional[bool],
    typer.Option("--context-shift/--no-context-shift", help="When a reply fills its slot's context, discard the "
                 "oldest half of the tokens after n_keep and go on (llama-server's; the default off ends it with "
                 "'length'). Env LLAMA_ARG_CONTEXT_SHIFT."),
]
PromptCacheOpt = Annotated[
    bool, typer.Option("--prompt-cache/--no-prompt-cache", help="Reuse the KV of shared prompt prefixes.")
]
CacheTypeKOpt = Annotated[
    Optional[str],
    typer.Option("--cache-type-k", "-ctk", help="KV storage type of K: f32, f16, bf16, q8_0, q4_0 (group 32). "
                 "Default: the model's dtype; env LLAMA_ARG_CACHE_TYPE_K (docs/KV_CACHE.md, KV cache types)."),
]
CacheTypeVOpt = Annotated[
    Optional[str],
    typer.Option("--cache-type-v", "-ctv", help="KV storage type of V (as --cache-type-k); a quantized type "
                 "needs the same one for K. Env LLAMA_ARG_CACHE_TYPE_V."),
]
SystemOpt = Annotated[Optional[str], typer.Option("--system", "-s", help="System prompt.")]
RawOpt = Annotated[bool, typer.Option("--raw", help="Send the prompt as is, without the chat template.")]
PromptArg = Annotated[
    Optional[str], typer.Argument(help="The prompt; read from stdin when omitted.", show_default=False)
]
ChatSystemOpt = Annotated[
    Optional[str], typer.Option("--system", "-s", help="System prompt (also /system in the chat).")
]
MarkdownOpt = Annotated[
    bool, typer.Option("--markdown/--no-markdown", help="Redraw finished answers as Markdown on a terminal.")
]
