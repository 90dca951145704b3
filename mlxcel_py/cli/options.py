"""Shared Typer options, named like llama.cpp / mlx_lm.

Every option defaults to None so "not given" reaches `config.resolve`, which owns the
defaults (they differ per command) and the environment fallbacks.
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
ParallelOpt = Annotated[
    Optional[int],
    typer.Option("--parallel", "-np", help="Sequences decoded together (slots). Default 4; env LLAMA_ARG_N_PARALLEL."),
]

# Server and prompt-cache options; their names match the ones config.resolve's errors use.
HostOpt = Annotated[
    Optional[str],
    typer.Option("--host", help="Addresses to bind, comma-separated (each is bound). Default 127.0.0.1; "
                 "env LLAMA_ARG_HOST."),
]
PortOpt = Annotated[
    Optional[int], typer.Option("--port", help="Port to bind (0 picks one). Default 8080; env LLAMA_ARG_PORT.")
]
ApiKeyOpt = Annotated[
    Optional[str], typer.Option("--api-key", help="Require this bearer token. Default: none; env MLXCEL_API_KEY.")
]
LogLevelOpt = Annotated[
    Optional[str], typer.Option("--log-level", help="debug, info, warning, error or critical. Default info.")
]
MaxBodyBytesOpt = Annotated[
    Optional[int], typer.Option("--max-body-bytes", help="Largest request body; bigger ones get 413. Default 8 MiB.")
]
ShutdownGraceOpt = Annotated[
    Optional[float],
    typer.Option("--shutdown-grace", help="Seconds in-flight requests may finish after SIGTERM/SIGINT. Default 10."),
]
AliasOpt = Annotated[
    Optional[str],
    typer.Option("--alias", "-a", help="Model names, comma-separated; the first is the id replies report "
                 "(any name is accepted in requests). Env LLAMA_ARG_ALIAS."),
]
TagsOpt = Annotated[
    Optional[str],
    typer.Option("--tags", help="Model tags, comma-separated (informational: listed in /v1/models). Env LLAMA_ARG_TAGS."),
]
CorsOriginsOpt = Annotated[
    Optional[str],
    typer.Option("--cors-origins", help="Browser origins allowed besides the loopback ones, comma-separated: "
                 "http://host:port, http://host:* or * (any site). Env MLXCEL_CORS_ORIGINS."),
]
NoWebuiOpt = Annotated[
    bool, typer.Option("--no-webui", help="Do not serve the chat page at / (docs/WEBUI.md). Env LLAMA_ARG_NO_WEBUI=1.")
]
MetricsOpt = Annotated[
    Optional[bool],
    typer.Option("--metrics/--no-metrics", help="The Prometheus /metrics endpoint (off: 501, as llama-server "
                 "without --metrics). Default on; env LLAMA_ARG_ENDPOINT_METRICS."),
]
SlotsOpt = Annotated[
    Optional[bool],
    typer.Option("--slots/--no-slots", help="The /slots monitoring endpoint (off: 501). Default on; "
                 "env LLAMA_ARG_ENDPOINT_SLOTS."),
]
ContextShiftOpt = Annotated[
    Optional[bool],
    typer.Option("--context-shift/--no-context-shift", help="When a reply fills its slot's context, discard the "
                 "oldest half of the tokens after n_keep and go on (llama-server's; the default off ends it with "
                 "'length'). Env LLAMA_ARG_CONTEXT_SHIFT."),
]
MaxQueueOpt = Annotated[
    Optional[int], typer.Option("--max-queue", help="Requests that may wait for a slot. Default 64.")
]
PromptCacheOpt = Annotated[
    bool, typer.Option("--prompt-cache/--no-prompt-cache", help="Reuse the KV of shared prompt prefixes.")
]
CacheMaxBytesOpt = Annotated[
    Optional[int], typer.Option("--cache-max-bytes", help="Prompt cache size limit in bytes. Default 8 GiB "
                                "(--cache-ram's default); give one of the two.")
]
CacheMaxEntriesOpt = Annotated[
    Optional[int], typer.Option("--cache-max-entries", help="Prompt cache entry limit. Default 16.")
]
CacheMinPrefixOpt = Annotated[
    Optional[int], typer.Option("--cache-min-prefix", help="Shortest prefix (tokens) worth caching. Default 32.")
]
DistributedOpt = Annotated[
    Optional[str],
    typer.Option(
        "--distributed",
        help="Under mlx.launch: tensor (shard every layer), pipeline (split the layers) or auto "
        "(tensor where the model supports it). Default auto when launched. See docs/DISTRIBUTED.md.",
    ),
]
DistributedTimeoutOpt = Annotated[
    Optional[float],
    typer.Option(
        "--distributed-timeout",
        help="Seconds one decode step or prefill piece may take on every rank before the server "
        "counts a rank as lost and exits. Default 60.",
    ),
]
ChatTemplateOpt = Annotated[
    Optional[str],
    typer.Option("--chat-template", help="A built-in template name (chatml, llama3, llama2, mistral-v7, gemma, phi3, "
                 "deepseek3, command-r, qwen3, ...: llama-server's list) or Jinja source; it replaces the model's "
                 "template on every route. Env LLAMA_ARG_CHAT_TEMPLATE."),
]
ChatTemplateFileOpt = Annotated[
    Optional[str],
    typer.Option("--chat-template-file", help="A Jinja chat template file, instead of the model's template. "
                 "Env LLAMA_ARG_CHAT_TEMPLATE_FILE."),
]
ChatTemplateKwargsOpt = Annotated[
    Optional[str],
    typer.Option("--chat-template-kwargs", help='Template variables for every request, as a JSON object, e.g. '
                 '\'{"enable_thinking": false}\'; a request\'s chat_template_kwargs merge over them. '
                 "Env LLAMA_CHAT_TEMPLATE_KWARGS."),
]
PoolingOpt = Annotated[
    Optional[str],
    typer.Option("--pooling", help="Embedding pooling: mean, cls, last or none (per token, /embedding only). "
                 "Default: the GGUF's pooling_type, else last; env LLAMA_ARG_POOLING."),
]
ReasoningFormatOpt = Annotated[
    Optional[str],
    typer.Option("--reasoning-format", help="none (thinking stays in the answer), deepseek or auto (a reasoning "
                 "model's <think> text goes to reasoning_content on the chat route). Default auto; env LLAMA_ARG_THINK."),
]
ReasoningBudgetOpt = Annotated[
    Optional[int],
    typer.Option("--reasoning-budget", help="-1: unrestricted thinking; 0: thinking off (enable_thinking false for "
                 "templates that take it); N: the thinking's end marker is forced after N thinking tokens. "
                 "Default -1; env LLAMA_ARG_THINK_BUDGET."),
]
# Several models behind one server (serve only; docs/SERVER.md "Several models").
ModelsOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--model",
        "-m",
        help="An mlx-lm model directory, a .gguf file, or a Hugging Face id org/name[@rev][:FILE.gguf|:Q4_K_M] "
        "(from the HF cache first), optionally NAME=SPEC; repeat it to serve several models, each request "
        "choosing one by its `model`. Default: the embedded SmolLM2-135M-Instruct.",
    ),
]
ModelsDirOpt = Annotated[
    Optional[str],
    typer.Option("--models-dir", help="Serve every .gguf file and mlx-lm model directory in this folder, named by "
                 "file or directory stem, loaded on first use. Env LLAMA_ARG_MODELS_DIR."),
]
ModelsMaxOpt = Annotated[
    Optional[int],
    typer.Option("--models-max", help="With several models: how many may be resident at once; loading one more "
                 "unloads the least recently used idle one. Default 4; env LLAMA_ARG_MODELS_MAX."),
]
ModelsMemoryOpt = Annotated[
    Optional[float],
    typer.Option("--models-memory", help="With several models: a resident-memory budget in GiB (estimated from "
                 "the files, measured after load). Default none; env MLXCEL_MODELS_MEMORY."),
]
KeepAliveOpt = Annotated[
    Optional[str],
    typer.Option("--keep-alive", help="With several models: unload a model idle this long (seconds, or 30s, 5m, "
                 "1h); -1 never. Ollama requests' keep_alive overrides it. Default -1; env MLXCEL_KEEP_ALIVE."),
]
ModelsPreloadOpt = Annotated[
    Optional[str],
    typer.Option("--models-preload", help="With several models: these names (comma-separated) load at startup."),
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
CacheRamOpt = Annotated[
    Optional[int],
    typer.Option("--cache-ram", "-cram", help="Prompt cache size limit in MiB: -1 no limit, 0 off. Default 8192 "
                 "(llama-server's); env LLAMA_ARG_CACHE_RAM."),
]
SlotSavePathOpt = Annotated[
    Optional[str],
    typer.Option("--slot-save-path", help="An existing directory: enables POST /slots/{id}?action=save|restore"
                 "|erase (llama-server's; docs/KV_CACHE.md). Default: off."),
]
