"""Typer options of `serve` alone: the HTTP server, chat templates, several models, the ranks
of `mlx.launch`, and the prompt cache's limits; their names match the ones config.resolve's errors use.

Like cli/options.py, every option defaults to "not given" so `config.resolve` owns the defaults.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

ParallelOpt = Annotated[
    Optional[int],
    typer.Option("--parallel", "-np", help="Sequences decoded together (slots). Default 4; env LLAMA_ARG_N_PARALLEL."),
]
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
MaxBodyBytesOpt = Annotated[
    Optional[int], typer.Option("--max-body-bytes", help="Largest request body; bigger ones get 413. Default 8 MiB.")
]
ImageMaxBytesOpt = Annotated[
    Optional[int], typer.Option("--image-max-bytes", help="Largest image a request may send, decoded (a bigger "
                                "one is a 400). Default 20 MiB.")
]
ImageMaxCountOpt = Annotated[
    Optional[int], typer.Option("--image-max-count", help="Most images in one request (more is a 400). Default 8.")
]
AllowImageUrlsOpt = Annotated[
    bool, typer.Option("--allow-image-urls", help="Fetch http(s) image URLs in requests (off: a 400 asking for a "
                       "data: URL). The server then makes requests a client chooses: only where that is safe.")
]
SpmInfillOpt = Annotated[
    bool, typer.Option("--spm-infill", help="Infill prompts in llama.cpp's suffix/prefix/middle order (some FIM "
                       "models are trained so). Env LLAMA_ARG_SPM_INFILL=1.")
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
MaxQueueOpt = Annotated[
    Optional[int], typer.Option("--max-queue", help="Requests that may wait for a slot. Default 64.")
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
RerankOpt = Annotated[
    bool,
    typer.Option("--rerank", "--reranking", help="Serve a reranking model (a GGUF with pooling_type rank and a "
                 "classifier head) at /v1/rerank; refuse to start with any other model. A reranker serves "
                 "/v1/rerank whether given or not. Env LLAMA_ARG_RERANKING=1."),
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
LoraInitWithoutApplyOpt = Annotated[
    bool, typer.Option("--lora-init-without-apply", help="Load the --lora adapters at scale 0, to be applied "
                       "later through POST /lora-adapters or a request's lora (llama-server's flag).")
]
MmprojOpt = Annotated[
    Optional[str],
    typer.Option("--mmproj", "-mm", help="A llama.cpp multimodal projector GGUF for the GGUF model's images "
                 "(llama-server's flag; Gemma 3's gemma3 projector), docs/VISION.md. Env LLAMA_ARG_MMPROJ. "
                 "Default: none."),
]
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
