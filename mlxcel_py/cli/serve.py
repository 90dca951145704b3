"""`mlxcel-py serve`: the OpenAI-compatible HTTP server (see docs/SERVER.md)."""

from __future__ import annotations

from ..errors import MlxcelError
from .common import fail, resolve_or_exit
from .options import (
    CpuWeightsOpt,
    AliasOpt, ApiKeyOpt, ChatTemplateFileOpt, ChatTemplateKwargsOpt, ChatTemplateOpt, BatchSizeOpt, CacheMaxBytesOpt, CacheMaxEntriesOpt, CacheMinPrefixOpt, CorsOriginsOpt, CtxSizeOpt,
    DistributedOpt, DistributedTimeoutOpt, HostOpt, ItlBudgetOpt, LookupNgramOpt, DraftMaxOpt, DraftMinOpt, DraftModelOpt, LogLevelOpt, MaxBodyBytesOpt, MaxQueueOpt,
    MaxTokensOpt, MinPOpt, NoWebuiOpt, PoolingOpt, ReasoningBudgetOpt, ReasoningFormatOpt, ThreadsOpt, ParallelOpt, PortOpt, PrefillChunkOpt, PromptCacheOpt, RepeatPenaltyOpt, SeedOpt,
    ShutdownGraceOpt, TempOpt, TopKOpt, TopPOpt, MetricsOpt, SlotsOpt, TagsOpt, ContextShiftOpt,
    KeepAliveOpt, ModelsDirOpt, ModelsMaxOpt, ModelsMemoryOpt, ModelsOpt, ModelsPreloadOpt,
    CacheTypeKOpt, CacheTypeVOpt, CacheRamOpt, SlotSavePathOpt,
)


def serve(
    model: ModelsOpt = None,
    threads: ThreadsOpt = None,
    cpu_weights: CpuWeightsOpt = None,
    host: HostOpt = None,
    port: PortOpt = None,
    parallel: ParallelOpt = None,
    ctx_size: CtxSizeOpt = None,
    prefill_chunk_size: PrefillChunkOpt = None,
    batch_size: BatchSizeOpt = None,
    itl_budget_ms: ItlBudgetOpt = None,
    lookup_ngram: LookupNgramOpt = None,
    draft_max: DraftMaxOpt = None,
    draft_min: DraftMinOpt = None,
    draft_model: DraftModelOpt = None,
    max_queue: MaxQueueOpt = None,
    prompt_cache: PromptCacheOpt = True,
    cache_max_bytes: CacheMaxBytesOpt = None,
    cache_max_entries: CacheMaxEntriesOpt = None,
    cache_min_prefix: CacheMinPrefixOpt = None,
    temp: TempOpt = None,
    top_p: TopPOpt = None,
    top_k: TopKOpt = None,
    min_p: MinPOpt = None,
    repeat_penalty: RepeatPenaltyOpt = None,
    seed: SeedOpt = None,
    max_tokens: MaxTokensOpt = None,
    api_key: ApiKeyOpt = None,
    log_level: LogLevelOpt = None,
    alias: AliasOpt = None,
    max_body_bytes: MaxBodyBytesOpt = None,
    shutdown_grace: ShutdownGraceOpt = None,
    distributed: DistributedOpt = None,
    distributed_timeout: DistributedTimeoutOpt = None,
    cors_origins: CorsOriginsOpt = None,
    no_webui: NoWebuiOpt = False,
    metrics: MetricsOpt = None,
    slots: SlotsOpt = None,
    chat_template: ChatTemplateOpt = None,
    chat_template_file: ChatTemplateFileOpt = None,
    chat_template_kwargs: ChatTemplateKwargsOpt = None,
    reasoning_format: ReasoningFormatOpt = None,
    reasoning_budget: ReasoningBudgetOpt = None,
    tags: TagsOpt = None,
    pooling: PoolingOpt = None,
    context_shift: ContextShiftOpt = None,
    models_dir: ModelsDirOpt = None,
    models_max: ModelsMaxOpt = None,
    models_memory: ModelsMemoryOpt = None,
    keep_alive: KeepAliveOpt = None,
    models_preload: ModelsPreloadOpt = None,
    cache_type_k: CacheTypeKOpt = None,
    cache_type_v: CacheTypeVOpt = None,
    cache_ram: CacheRamOpt = None,
    slot_save_path: SlotSavePathOpt = None,
) -> None:
    """Serve the model (or several) over HTTP: the OpenAI, llama-server and Anthropic APIs (see docs/SERVER.md)."""
    cfg = resolve_or_exit(
        "serve", model=model[0] if model else None, threads=threads, cpu_weights=cpu_weights,
        host=host, port=port, parallel=parallel, ctx_size=ctx_size,
        prefill_chunk_size=prefill_chunk_size, batch_size=batch_size, max_queue=max_queue,
        prompt_cache=prompt_cache, cache_max_bytes=cache_max_bytes, cache_max_entries=cache_max_entries,
        cache_min_prefix=cache_min_prefix, temp=temp, top_p=top_p, top_k=top_k, min_p=min_p,
        repeat_penalty=repeat_penalty, seed=seed, max_tokens=max_tokens, api_key=api_key,
        log_level=log_level, model_alias=alias, itl_budget_ms=itl_budget_ms, max_body_bytes=max_body_bytes,
        lookup_ngram=lookup_ngram, draft_max=draft_max, draft_min=draft_min, draft_model=draft_model,
        shutdown_grace=shutdown_grace, distributed=distributed, distributed_timeout=distributed_timeout,
        cors_origins=cors_origins, no_webui=no_webui, metrics=metrics, slots=slots, tags=tags,
        chat_template=chat_template, chat_template_file=chat_template_file,
        chat_template_kwargs=chat_template_kwargs, reasoning_format=reasoning_format,
        reasoning_budget=reasoning_budget, pooling=pooling, context_shift=context_shift,
        extra_models=tuple(model[1:]) if model else (), models_dir=models_dir, models_max=models_max,
        models_memory=models_memory, keep_alive=keep_alive, models_preload=models_preload,
        cache_type_k=cache_type_k, cache_type_v=cache_type_v, cache_ram=cache_ram, slot_save_path=slot_save_path,
    )
    # Imported here: the server pulls in MLX, which must load after the BLAS preload.
    from ..server.http.serving import serve_forever

    try:
        serve_forever(cfg)
    except MlxcelError as exc:  # ModelLoadError, ServeError (port in use), ConfigError (MLXCEL_BLAS)
        fail(str(exc))
