"""The commands' flags as typed records: one frozen dataclass per command, composed of shared groups.

Each leaf field carries its Typer option (the `Annotated` aliases of cli/options*.py), so the
command's signature is built from the record (cli/parse.py) and Typer parses the command line
once into it. A default is "not given" (None, or the switch's off/on) as the options always had:
`config.resolve` owns the real defaults, which differ per command, and the environment fallbacks.

Adding a flag: its field here (in the group the commands that take it share), its line in
docs/CONFIG.md, and its consumer (which reads `AppConfig.flags` or the resolved group).
"""

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

from .cli.options import (
    BatchSizeOpt, CacheTypeKOpt, CacheTypeVOpt, ChatSystemOpt, ContextShiftOpt, CpuWeightsOpt, CtxSizeOpt,
    DraftMaxOpt, DraftMinOpt, DraftModelOpt, ItlBudgetOpt, LogLevelOpt, LookupNgramOpt, LoraFuseOpt, LoraOpt,
    LoraScaledOpt,
    MarkdownOpt, MaxTokensOpt,
    MinPOpt, ModelOpt, PrefillChunkOpt, PromptArg, PromptCacheOpt, RawOpt, RepeatPenaltyOpt, SeedOpt, SystemOpt,
    TempOpt, ThreadsOpt, TopKOpt, TopPOpt,
)
from .cli.options import (
    DynatempExpOpt, DynatempRangeOpt, MinKeepOpt, MirostatEntOpt, MirostatLrOpt, MirostatOpt, SamplersOpt,
    SamplingSeqOpt, TopNSigmaOpt, TypicalOpt, XtcProbabilityOpt, XtcThresholdOpt,
)
from .cli.options_bench import (
    ArmOpt, BenchModelOpt, BenchSeedOpt, BudgetArmOpt, NullOpt, OutOpt, PromptTokensOpt, QuietOpt, RoundsOpt,
    ServerParallelOpt, StreamPromptTokensOpt, StreamsOpt, TailTokensOpt, UrlOpt, WarmupRoundsOpt,
)
from .cli.options_serve import (
    AliasOpt, AllowImageUrlsOpt, ApiKeyOpt, CacheMaxBytesOpt, CacheMaxEntriesOpt, CacheMinPrefixOpt, CacheRamOpt,
    ChatTemplateFileOpt, ChatTemplateKwargsOpt, ChatTemplateOpt, CorsOriginsOpt, DistributedOpt, DistributedTimeoutOpt,
    HostOpt, ImageMaxBytesOpt, ImageMaxCountOpt, KeepAliveOpt, LoraInitWithoutApplyOpt, MaxBodyBytesOpt, MaxQueueOpt,
    MetricsOpt, MmprojOpt, ModelsDirOpt, ModelsMaxOpt, ModelsMemoryOpt, ModelsOpt, ModelsPreloadOpt, NoWebuiOpt,
    ParallelOpt, PoolingOpt, PortOpt, ReasoningBudgetOpt, ReasoningFormatOpt, RerankOpt, ShutdownGraceOpt,
    SlotSavePathOpt, SlotsOpt, SpmInfillOpt, TagsOpt,
)

frozen = dataclass(frozen=True)


def group(kind: type) -> Any:
    """A field holding a group record (its own fields are the command's options)."""
    return field(default_factory=kind)


# The groups the commands share.
@frozen
class ModelFlags:
    model: ModelOpt = None
    threads: ThreadsOpt = None
    cpu_weights: CpuWeightsOpt = None
    draft_model: DraftModelOpt = None
    lora: LoraOpt = None
    lora_scaled: LoraScaledOpt = None
    lora_fuse: LoraFuseOpt = False


@frozen
class ServeModelFlags(ModelFlags):
    model: ModelsOpt = None  # -m repeats: several models behind one server
    mmproj: MmprojOpt = None
    lora_init_without_apply: LoraInitWithoutApplyOpt = False


@frozen
class SamplingFlags:
    temp: TempOpt = None
    top_p: TopPOpt = None
    top_k: TopKOpt = None
    min_p: MinPOpt = None
    repeat_penalty: RepeatPenaltyOpt = None
    seed: SeedOpt = None
    max_tokens: MaxTokensOpt = None
    samplers: SamplersOpt = None
    sampling_seq: SamplingSeqOpt = None
    typical: TypicalOpt = None
    mirostat: MirostatOpt = None
    mirostat_lr: MirostatLrOpt = None
    mirostat_ent: MirostatEntOpt = None
    dynatemp_range: DynatempRangeOpt = None
    dynatemp_exp: DynatempExpOpt = None
    xtc_probability: XtcProbabilityOpt = None
    xtc_threshold: XtcThresholdOpt = None
    top_nsigma: TopNSigmaOpt = None
    min_keep: MinKeepOpt = None


@frozen
class ChunkFlags:
    prefill_chunk_size: PrefillChunkOpt = None
    batch_size: BatchSizeOpt = None
    itl_budget_ms: ItlBudgetOpt = None


@frozen
class DraftFlags:
    lookup_ngram: LookupNgramOpt = None
    draft_max: DraftMaxOpt = None
    draft_min: DraftMinOpt = None


@frozen
class SlotFlags:
    ctx_size: CtxSizeOpt = None
    context_shift: ContextShiftOpt = None


@frozen
class ServeSlotFlags(SlotFlags):
    parallel: ParallelOpt = None
    max_queue: MaxQueueOpt = None


@frozen
class KVFlags:
    cache_type_k: CacheTypeKOpt = None
    cache_type_v: CacheTypeVOpt = None


@frozen
class ChatCacheFlags(KVFlags):
    prompt_cache: PromptCacheOpt = True


@frozen
class ServeCacheFlags(ChatCacheFlags):
    cache_max_bytes: CacheMaxBytesOpt = None
    cache_max_entries: CacheMaxEntriesOpt = None
    cache_min_prefix: CacheMinPrefixOpt = None
    cache_ram: CacheRamOpt = None


# The groups of serve alone.
@frozen
class ServerFlags:
    host: HostOpt = None
    port: PortOpt = None
    api_key: ApiKeyOpt = None
    model_alias: AliasOpt = None
    max_body_bytes: MaxBodyBytesOpt = None
    image_max_bytes: ImageMaxBytesOpt = None
    image_max_count: ImageMaxCountOpt = None
    allow_image_urls: AllowImageUrlsOpt = False
    spm_infill: SpmInfillOpt = False
    shutdown_grace: ShutdownGraceOpt = None
    cors_origins: CorsOriginsOpt = None
    no_webui: NoWebuiOpt = False
    metrics: MetricsOpt = None
    slots: SlotsOpt = None
    tags: TagsOpt = None
    pooling: PoolingOpt = None
    rerank: RerankOpt = False
    slot_save_path: SlotSavePathOpt = None


@frozen
class TemplateFlags:
    chat_template: ChatTemplateOpt = None
    chat_template_file: ChatTemplateFileOpt = None
    chat_template_kwargs: ChatTemplateKwargsOpt = None
    reasoning_format: ReasoningFormatOpt = None
    reasoning_budget: ReasoningBudgetOpt = None


@frozen
class RouterFlags:
    models_dir: ModelsDirOpt = None
    models_max: ModelsMaxOpt = None
    models_memory: ModelsMemoryOpt = None
    keep_alive: KeepAliveOpt = None
    models_preload: ModelsPreloadOpt = None


@frozen
class DistFlags:
    distributed: DistributedOpt = None
    distributed_timeout: DistributedTimeoutOpt = None


# One record per command. `help_order` lists the options in the order `--help` shows them;
# a field it does not name comes after them, in declaration order.
@frozen
class ServeFlags:
    """Every flag `config.resolve` reads: serve takes them all (a record of another command resolves
    as this one with the flags that command lacks not given)."""

    model: ServeModelFlags = group(ServeModelFlags)
    engine: ServeSlotFlags = group(ServeSlotFlags)
    chunk: ChunkFlags = group(ChunkFlags)
    draft: DraftFlags = group(DraftFlags)
    cache: ServeCacheFlags = group(ServeCacheFlags)
    sampling: SamplingFlags = group(SamplingFlags)
    server: ServerFlags = group(ServerFlags)
    template: TemplateFlags = group(TemplateFlags)
    router: RouterFlags = group(RouterFlags)
    dist: DistFlags = group(DistFlags)
    log_level: LogLevelOpt = None

    help_order: ClassVar[tuple[str, ...]] = (
        "model", "threads", "cpu_weights", "host", "port", "parallel", "ctx_size", "prefill_chunk_size", "batch_size",
        "itl_budget_ms", "lookup_ngram", "draft_max", "draft_min", "draft_model", "lora", "lora_scaled",
        "lora_fuse", "lora_init_without_apply", "max_queue",
        "prompt_cache",
        "cache_max_bytes", "cache_max_entries", "cache_min_prefix", "temp", "top_p", "top_k", "min_p",
        "repeat_penalty", "seed", "samplers", "sampling_seq", "typical", "mirostat", "mirostat_lr", "mirostat_ent",
        "dynatemp_range", "dynatemp_exp", "xtc_probability", "xtc_threshold", "top_nsigma", "min_keep", "max_tokens",
        "api_key", "log_level", "model_alias", "max_body_bytes",
        "mmproj", "image_max_bytes", "image_max_count", "allow_image_urls", "spm_infill",
        "shutdown_grace", "distributed", "distributed_timeout", "cors_origins", "no_webui", "metrics", "slots",
        "chat_template", "chat_template_file", "chat_template_kwargs", "reasoning_format", "reasoning_budget", "tags",
        "pooling", "rerank", "context_shift", "models_dir", "models_max", "models_memory", "keep_alive",
        "models_preload", "cache_type_k", "cache_type_v", "cache_ram", "slot_save_path",
    )


_ONE_SLOT_ORDER = (
    "model", "threads", "cpu_weights", "system", "raw", "max_tokens", "temp", "top_p", "top_k", "min_p",
    "repeat_penalty", "seed", "samplers", "sampling_seq", "typical", "mirostat", "mirostat_lr", "mirostat_ent",
    "dynatemp_range", "dynatemp_exp", "xtc_probability", "xtc_threshold", "top_nsigma", "min_keep", "ctx_size",
    "prefill_chunk_size", "batch_size", "itl_budget_ms", "lookup_ngram", "draft_max", "draft_min", "draft_model",
    "lora", "lora_scaled", "lora_fuse", "context_shift", "cache_type_k", "cache_type_v", "prompt_cache", "markdown",
    "log_level",
)


@frozen
class GenerateFlags:
    prompt: PromptArg = None
    model: ModelFlags = group(ModelFlags)
    system: SystemOpt = None
    raw: RawOpt = False
    sampling: SamplingFlags = group(SamplingFlags)
    engine: SlotFlags = group(SlotFlags)
    chunk: ChunkFlags = group(ChunkFlags)
    draft: DraftFlags = group(DraftFlags)
    cache: KVFlags = group(KVFlags)
    log_level: LogLevelOpt = None

    help_order: ClassVar[tuple[str, ...]] = ("prompt", *_ONE_SLOT_ORDER)


@frozen
class RunFlags:
    model: ModelFlags = group(ModelFlags)
    system: ChatSystemOpt = None
    sampling: SamplingFlags = group(SamplingFlags)
    engine: SlotFlags = group(SlotFlags)
    chunk: ChunkFlags = group(ChunkFlags)
    draft: DraftFlags = group(DraftFlags)
    cache: ChatCacheFlags = group(ChatCacheFlags)
    markdown: MarkdownOpt = True
    log_level: LogLevelOpt = None

    help_order: ClassVar[tuple[str, ...]] = _ONE_SLOT_ORDER


# `bench admit` and `bench ttft`: the servers they measure, then each one's own settings.
@frozen
class BenchTargets:
    arm: ArmOpt = field(default_factory=list)
    url: UrlOpt = field(default_factory=list)
    model: BenchModelOpt = None


@frozen
class AdmitFlags:
    targets: BenchTargets = group(BenchTargets)
    streams: StreamsOpt = 4
    prompt_tokens: PromptTokensOpt = 2048
    stream_prompt_tokens: StreamPromptTokensOpt = 32
    quiet_s: QuietOpt = 3.0
    rounds: RoundsOpt = 3
    warmup_rounds: WarmupRoundsOpt = 1
    tail_tokens: TailTokensOpt = 2
    seed: BenchSeedOpt = 0
    itl_budget_ms: BudgetArmOpt = None
    out: OutOpt = None


@frozen
class TtftFlags:
    targets: BenchTargets = group(BenchTargets)
    prompt_tokens: PromptTokensOpt = 2048
    rounds: RoundsOpt = 5
    parallel: ServerParallelOpt = None
    null: NullOpt = None
    seed: BenchSeedOpt = 0
    out: OutOpt = None


# Walking a record: its leaves (the options), building one from leaf values, and reading them back.
def _groups_and_leaves(kind: type) -> list[tuple[dataclasses.Field, Any]]:
    hints = typing.get_type_hints(kind, include_extras=True)
    return [(f, hints[f.name]) for f in dataclasses.fields(kind)]


def is_group(annotation: Any) -> bool:
    return isinstance(annotation, type) and dataclasses.is_dataclass(annotation)


def leaves(kind: type) -> list[tuple[str, Any, Any]]:
    """(name, annotation, default) of every option in a record, groups flattened, in declaration order."""
    found: list[tuple[str, Any, Any]] = []
    for f, annotation in _groups_and_leaves(kind):
        if is_group(annotation):
            found += leaves(annotation)
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            found.append((f.name, annotation, default))
    return found


def build(kind: type, values: Mapping[str, Any]) -> Any:
    """A `kind` record from leaf values by name (a missing one is not given); lists become tuples."""
    given: dict[str, Any] = {}
    for f, annotation in _groups_and_leaves(kind):
        if is_group(annotation):
            given[f.name] = build(annotation, values)
        elif f.name in values:
            value = values[f.name]
            given[f.name] = tuple(value) if isinstance(value, list) else value
    return kind(**given)


def values_of(record: Any) -> dict[str, Any]:
    """The leaf values of a record by name, groups flattened (build's inverse)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        out.update(values_of(value) if dataclasses.is_dataclass(value) else {f.name: value})
    return out
