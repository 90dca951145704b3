"""One place that builds an engine for a loaded model, runs its worker, and tears it down.

`serve`, `run` and `generate` all go through `engine_session`, so there is one engine and
one code path. Nothing here imports MLX at import time (the BLAS preload comes first).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
from typing import TYPE_CHECKING, Any, Iterator, Optional

from ..errors import ConfigError
from .runner.constraints import compiler_for
from .core.prompt_cache import PromptCache
from .core.scheduler import Scheduler
from .core.step import Runner
from .core.text_stream import stream_factory
from .core.engine import Engine
from .core.slots import ModelIdentity
from .core.stats import KVInfo
from .core.worker import EngineWorker

if TYPE_CHECKING:
    from ..config import EngineConfig
    from ..models import LoadedModel

log = logging.getLogger("mlxcel_py.engine")

ROW_MARGIN = 64  # positions past a slot's context a verify span may write before it is trimmed
MAX_FIRST_CAPACITY = 32768  # a longer slot context grows its rows by doubling, as they fill


def slot_context(ctx_size: int | None, num_slots: int, model_context: int) -> int:
    """Per-slot context: the total split over slots, never more than the model's maximum."""
    if ctx_size is None:
        return model_context
    return max(1, min(ctx_size // num_slots, model_context))


def _context_shift(config: "EngineConfig", runner: Runner) -> bool:
    """--context-shift, refused at startup when the runner cannot shift this model's KV."""
    if not config.context_shift:
        return False
    why = runner.context_shift_support()
    if why is not None:
        raise ConfigError(f"--context-shift is not available for this model: {why}", flag="--context-shift")
    return True


def rows_hint(slots: int, per_slot: int) -> tuple[int, int]:
    """The owned KV rows' first size: every slot, as many pinned prefixes, and a slot's whole context
    (capped), so no join regrows them (a regrow copies every row in use: ~90 ms a 6,144-token
    admission here); pages nobody writes are not resident, so the size costs no memory."""
    return 2 * slots + 2, min(per_slot + ROW_MARGIN, MAX_FIRST_CAPACITY)


def build_engine(config: "EngineConfig", loaded: "LoadedModel", runner: Optional[Runner] = None,
                 draft: Optional["LoadedModel"] = None) -> Engine:
    """The engine for a loaded model; every front end builds it through here.

    `runner`: one built by the caller (rank 0's distributed runner); default a local ModelRunner
    with the CPU decode step and prefill kernels the loader chose. `draft`: the --draft-model."""
    from .runner.model_runner import kv_bytes_per_token  # the model-calling code loads only to build an engine
    from .runner.kv import resolve_layout

    per_slot = slot_context(config.ctx_size, config.num_slots, loaded.context_length)
    layout = resolve_layout(loaded.model, config.kv_type_k, config.kv_type_v)
    local = runner is None
    drafting = config.drafting
    if runner is None:
        runner, drafting = _local_runner(config, loaded, draft, layout, per_slot)
    elif not layout.native:
        raise ConfigError("--cache-type-k/-v apply to one process; a distributed engine keeps the model's dtype",
                          flag="--cache-type-k")
    elif draft is not None:
        log.warning("--draft-model is off: this runner (%s) drafts no tokens", type(runner).__name__)
    kv = _kv_info(layout, kv_bytes_per_token(loaded.model, layout), len(loaded.model.layers),
                  getattr(runner, "kv_window", (0, 0)))
    drafting = drafting if drafting.enabled else None
    if drafting is not None and not runner.verifies_drafts:
        log.warning("--lookup-ngram is off: this runner (%s) does not verify drafts", type(runner).__name__)
        drafting = None
    pc = config.prompt_cache
    cache = None
    if pc.enabled:
        cache = PromptCache(pc.max_bytes, pc.max_entries, pc.min_prefix, kv.bytes_per_token,
                            getattr(runner, "prefix_reach", None), (kv.window_bytes_per_token, kv.window_positions))
    scheduler = Scheduler(
        policy=config.policy,
        num_slots=config.num_slots,
        slot_context=per_slot,
        max_queue=config.max_queue,
        make_stream=stream_factory(loaded.tokenizer),
        eos_token_ids=frozenset(loaded.eos_token_ids),
        prompt_cache=cache,
        drafting=drafting,
        context_shift=_context_shift(config, runner),
    )
    _log_engine(config, per_slot, layout.describe(), kv, drafting)
    identity = model_identity(loaded, kv) if local else None  # a distributed engine keeps no slot files
    return Engine(scheduler, runner, itl_budget_ms=config.itl_budget_ms, vocab_size=loaded.logits_width, kv=kv,
                  identity=identity)


def _local_runner(config: "EngineConfig", loaded: "LoadedModel", draft: Optional["LoadedModel"], layout: Any,
                  per_slot: int) -> tuple[Runner, Any]:
    """A ModelRunner in this process, with the CPU decode step the loader chose and the --draft-model;
    with the drafting settings it implies."""
    from .runner.model_runner import ModelRunner

    drafting = config.drafting
    fast = loaded.cpu_decode if layout.native else None
    if loaded.cpu_decode is not None and fast is None:  # it writes float32 into mlx-lm's BatchKVCache
        log.info("CPU decode step off: it needs the model's own KV dtype; decoding through mlx-lm")
    drafter = None
    if draft is not None:
        from .runner.draft_model import DraftModel

        quick = draft.cpu_decode
        drafter = DraftModel(draft.model, draft.cpu_kernels, decode=quick,
                             verify=quick.verify if quick is not None else None)
        drafting = dataclasses.replace(drafting, model=True)
    runner = ModelRunner(loaded.model, compiler_for(loaded), decode=fast, kernels=loaded.cpu_kernels,
                         verify=fast.verify if fast is not None else None, draft=drafter, kv=layout,
                         rows_hint=rows_hint(config.num_slots, per_slot), rank_head=loaded.rank_head,
                         vision=loaded.vision, lora=loaded.lora)
    return runner, drafting


def _kv_info(layout: Any, bytes_per_token: int, layers: int, window: tuple[int, int]) -> KVInfo:
    """What a token costs: the layers that keep every position, and the sliding-window layers that
    keep at most `window[1]` positions a slot (the runner's `kv_window`; the layers' K/V are alike)."""
    windowed = bytes_per_token // max(1, layers) * window[0]
    return KVInfo(layout.k.name, layout.v.name, bytes_per_token - windowed, windowed, window[1])


def _log_engine(config: "EngineConfig", per_slot: int, layout: str, kv: KVInfo, drafting: Any) -> None:
    """The startup log lines of the engine just built."""
    log.info("prefill_chunk_size %s%s", config.policy.describe(),
             " until the ITL-budget calibration ends" if config.itl_budget_ms is not None else "")
    log.info("slots=%d context per slot=%d tokens (total %d)", config.num_slots, per_slot, per_slot * config.num_slots)
    window = (f" ({kv.window_bytes_per_token:,} more for the first {kv.window_positions:,} positions: the sliding-"
              "window layers keep only their window)") if kv.window_positions else ""
    log.info("KV cache: %s; %s bytes per token%s, %.1f MiB per full slot", layout, f"{kv.bytes_per_token:,}", window,
             kv.slot_bytes(per_slot) / (1 << 20))
    pc = config.prompt_cache
    if pc.enabled:
        size = "no size limit" if pc.max_bytes >= 1 << 62 else f"{pc.max_bytes >> 20} MiB"
        log.info("prompt cache: up to %d entries, %s, min prefix %d", pc.max_entries, size, pc.min_prefix)
    else:
        log.info("prompt cache: off")
    if drafting is not None:
        sources = ([f"prompt lookup ({drafting.ngram}-gram)"] if drafting.ngram else []) + (
            ["draft model"] if drafting.model else [])
        log.info("speculative decoding: %s, drafts of %d..%d tokens", " then ".join(sources),
                 max(drafting.draft_min, 1), drafting.draft_max)


def model_identity(loaded: "LoadedModel", kv: KVInfo) -> ModelIdentity:
    """What a slot file records of the model: its name, and a digest of its parameters (names, shapes,
    sampled values) and of how it was loaded, so a restore into another model is refused."""
    from .runner.slot_io import model_digest

    ident = "|".join((loaded.name, loaded.source, loaded.weights, model_digest(loaded.model)))
    return ModelIdentity(loaded.name, hashlib.sha256(ident.encode()).hexdigest()[:16], kv.type_k, kv.type_v)


@contextlib.contextmanager
def engine_session(config: "EngineConfig", loaded: "LoadedModel", runner: Optional[Runner] = None,
                   draft: Optional["LoadedModel"] = None) -> Iterator[EngineWorker]:
    """Build the engine, run its worker thread for the body, and stop it however the body ends."""
    worker = EngineWorker(build_engine(config, loaded, runner, draft)).start()
    try:
        yield worker
    finally:
        worker.stop()
