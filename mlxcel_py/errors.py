"""The project's one error family. Every problem a user can act on is an `MlxcelError`.

The edges (the CLI, the HTTP layer) catch `MlxcelError` only: anything else is a bug and
keeps its traceback (in the server, a 500 with the request id, logged once).
"""

from __future__ import annotations

from typing import Optional


class MlxcelError(Exception):
    """A problem the user can act on; the message says what to do."""


class ConfigError(MlxcelError):
    """A flag or environment value that cannot be used; `flag` names it."""

    def __init__(self, message: str, *, flag: Optional[str] = None):
        super().__init__(message)
        self.flag = flag


class ModelLoadError(MlxcelError):
    """A model path, id, file or format we cannot load."""


class ServeError(MlxcelError):
    """The server cannot start (e.g. the port is taken)."""


class RequestError(MlxcelError):
    """A request the engine can never run as given; `param` names the field when one is to blame."""

    code = "invalid_request_error"

    def __init__(self, message: str, *, param: Optional[str] = None, code: Optional[str] = None):
        super().__init__(message)
        self.param = param
        if code is not None:
            self.code = code


class FieldError(RequestError):
    """A request field the server refuses as given (a 400 naming `param`). Like OpenAI's own
    field errors, its error JSON has no `code` unless one is given."""

    code = None  # type: ignore[assignment]


class SlotActionError(RequestError):
    """A /slots/{id}?action= the engine cannot do; `status` is the HTTP answer (400, 500, 501 or 503)."""

    def __init__(self, message: str, *, status: int = 400, code: Optional[str] = None):
        super().__init__(message, code=code)
        self.status = status


class PromptTooLongError(RequestError):
    """The prompt (plus room for one generated token) does not fit a slot's context."""

    code = "context_length_exceeded"

    def __init__(self, message: str, *, n_prompt_tokens: int, n_ctx: int, param: Optional[str] = None):
        super().__init__(message, param=param)
        self.n_prompt_tokens, self.n_ctx = n_prompt_tokens, n_ctx


class EngineError(MlxcelError):
    """The engine cannot take a valid request right now."""

    code = "engine_error"


class QueueFullError(EngineError):
    """Every slot is busy and the waiting queue is full; the client should retry later."""

    code = "server_busy"


class EngineStoppedError(EngineError):
    """The engine is shutting down or has stopped."""

    code = "server_shutting_down"
