"""The engine's public API: requests in, events out, through one worker thread that owns MLX.

Importing this package does not import MLX; `build_engine` loads the runner when called.
Inside: core/ (pure Python: Engine, scheduler, records), chunking/ (the prefill chunk policies),
runner/ and distributed/ (the only engine code that imports MLX).
"""

from ..errors import EngineError, EngineStoppedError, PromptTooLongError, QueueFullError, RequestError
from .chunking.budget import BudgetStats
from .core.events import Embedding, Event, Finished, FinishReason, PromptProgress, Timings, TokenDelta, TokenLogprobs, Usage, empty_finish
from .lifecycle import build_engine, engine_session, slot_context
from .core.request import MAX_TOKENS_LIMIT, MAX_TOP_LOGPROBS, POOLINGS, ConstraintSpec, Request, SamplingParams, check_logit_bias
from .core.request import ThinkingSpec
from .core.stats import EngineStats, Limits, SlotInfo
from .core.engine import Engine
from .core.worker import EngineWorker, RequestHandle
from .distributed.group import JoinedGroup, follow_leader, join_group, leader_runner

__all__ = [
    "BudgetStats", "ConstraintSpec", "Embedding", "MAX_TOP_LOGPROBS", "POOLINGS", "TokenLogprobs", "check_logit_bias",
    "Engine", "EngineError", "EngineStats", "EngineStoppedError", "EngineWorker", "Event", "FinishReason",
    "Finished", "Limits", "MAX_TOKENS_LIMIT", "PromptProgress", "PromptTooLongError", "QueueFullError",
    "Request", "RequestError", "RequestHandle", "SamplingParams", "SlotInfo", "ThinkingSpec", "Timings", "TokenDelta",
    "Usage",
    "build_engine", "empty_finish", "engine_session", "slot_context",
    "JoinedGroup", "follow_leader", "join_group", "leader_runner",
]
