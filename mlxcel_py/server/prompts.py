"""A validated body -> the engine request: sampling, prompt token ids, the reply's labels.

Everything here blocks (templating, tokenizing) and runs off the event loop. A prompt that
certainly cannot fit a slot is refused from its length in characters, before tokenizing.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence

from ..engine import ConstraintSpec, SamplingParams, check_logit_bias
from ..engine import Request as EngineRequest
from ..errors import PromptTooLongError, RequestError
from ..models.vocab import backend_tokenizer
from .assembler import Shape, ToolParsing
from .errors import APIError, from_error
from .logprobs import TokenPieces
from .responses import Kind, Reply
from .sampling_fields import PARAM_OF, echo_only, processor_fields
from .schemas import ChatRequest, CompletionRequest, GenerationRequest
from .structured import OutputPlan, output_plan
from .unsupported import refuse_unsupported

if TYPE_CHECKING:
    from .runtime import Runtime


@dataclass(frozen=True, slots=True)
class PromptLimit:
    """What a prompt must fit: a slot's context, and how many characters one token can cover."""

    slot_context: int
    chars_per_token: int  # no token stands for more characters than this

    def check_chars(self, num_chars: int, param: str) -> None:
        at_least = -(-num_chars // self.chars_per_token)
        if at_least >= self.slot_context:
            raise PromptTooLongError(
                f"the prompt has at least {at_least} tokens ({num_chars} characters, at most "
                f"{self.chars_per_token} per token), but a slot's context holds {self.slot_context}; "
                "shorten it or raise --ctx-size",
                n_prompt_tokens=at_least, n_ctx=self.slot_context, param=param,
            )


def max_token_chars(tokenizer: Any, vocab_size: int) -> int:
    """The most characters any single token decodes to, plus one for a leading space that
    a SentencePiece decoder strips from a lone token."""
    fast = backend_tokenizer(tokenizer)
    ids = [[i] for i in range(vocab_size)]
    if fast is not None:
        texts = fast.decode_batch(ids, skip_special_tokens=False)
    else:
        texts = [tokenizer.decode(i) for i in ids]
    return max(map(len, texts), default=1) + 1


@dataclass(frozen=True, slots=True)
class Prepared:
    job: EngineRequest
    reply: Reply
    stream: bool


def prepare_chat(rt: "Runtime", raw: bytes) -> Prepared:
    from ..models import encode_chat
    from ..models.chat import validate_messages
    from ..tool_calls.render import tool_messages
    from .body import parse_body

    body = parse_body(raw, ChatRequest)
    _check_request(rt, body)
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    rt.prompt_limit.check_chars(sum(_chars(m.get("content")) for m in messages), "messages")
    plan = output_plan(body, rt.tool_format, rt.worker.compiler)
    try:
        # The request's tools, and tool calls and results in the history, as the template renders them.
        messages, tools = tool_messages(validate_messages(messages), plan.tools, rt.tool_format)
        prompt = encode_chat(rt.loaded.tokenizer, messages, tools=tools,
                             before_tokenize=lambda text: rt.prompt_limit.check_chars(len(text), "messages"))
    except RequestError as exc:
        raise from_error(exc, "messages") from None
    return _prepared(rt, body, "chat", prompt.ids, prompt.history_boundary, plan)


def prepare_completion(rt: "Runtime", raw: bytes) -> Prepared:
    from .body import parse_body

    body = parse_body(raw, CompletionRequest)
    _check_request(rt, body)
    plan = output_plan(body, None, rt.worker.compiler)
    try:
        ids = completion_prompt_ids(body.prompt, rt)
    except RequestError as exc:
        raise from_error(exc, "prompt") from None
    echo = None
    if body.echo:  # the prompt as sent; token ids are decoded
        prompt = body.prompt[0] if isinstance(body.prompt, list) and len(body.prompt) == 1 else body.prompt
        echo = prompt if isinstance(prompt, str) else rt.loaded.tokenizer.decode(list(ids))
    return _prepared(rt, body, "completion", ids, None, plan, echo)


def _chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    return sum(len(p.get("text", "")) for p in content) if isinstance(content, list) else 0


def _check_request(rt: "Runtime", body: GenerationRequest) -> None:
    rt.check_model(body.model)
    refuse_unsupported(body)
    if body.n not in (None, 1):
        raise APIError(400, f"only n=1 is supported (got {body.n})", param="n")


def _shape(rt: "Runtime", sampling: SamplingParams, ids: tuple[int, ...], plan: OutputPlan,
           echo: Optional[str], hide_output: bool) -> Shape:
    tools = plan.tools
    parsing = None
    if tools is not None and tools.choice != "none":  # with "none" the model was not shown the tools
        parsing = ToolParsing(rt.tool_format, tools.as_openai(), tools.parallel, plan.legacy_functions)
    if not sampling.logprobs:
        return Shape(echo=echo, hide_output=hide_output, tools=parsing)
    # Token bytes from llguidance's tables: built here, off the event loop, on first use.
    pieces = TokenPieces(rt.loaded.tokenizer, rt.worker.compiler)
    return Shape(sampling.top_logprobs, echo, ids[0], hide_output, parsing, pieces)


def _prepared(rt: "Runtime", body: GenerationRequest, kind: Kind, ids: tuple[int, ...],
              boundary: Optional[int], plan: OutputPlan, echo: Optional[str] = None) -> Prepared:
    sampling = sampling_params(body, rt.config.sampling, rt.prompt_limit.slot_context, plan.constraint)
    try:
        check_logit_bias(sampling, rt.vocab_size)
    except RequestError as exc:
        raise APIError(400, str(exc), param="logit_bias") from None
    request_id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
    stream = bool(body.stream)
    hidden = echo is not None and echo_only(body, _max_tokens(body, rt.config.sampling.max_tokens))
    reply = Reply(kind, request_id, int(time.time()), rt.model_id,
                  include_usage=stream and body.include_usage, return_progress=bool(body.return_progress),
                  shape=_shape(rt, sampling, ids, plan, echo, hidden), fingerprint=rt.fingerprint)
    cache_prompt = True if body.cache_prompt is None else body.cache_prompt
    return Prepared(EngineRequest(request_id, ids, sampling, boundary, cache_prompt), reply, stream)


def _max_tokens(req: GenerationRequest, default: int) -> int:
    for value in (getattr(req, "max_completion_tokens", None), req.max_tokens):
        if value is not None:
            return value
    # llama-server's n_predict: -1 means "until the context is full", i.e. the default.
    if req.n_predict is not None and req.n_predict != -1:
        return req.n_predict
    return default


def _repetition(req: GenerationRequest, slot_context: int) -> dict:
    """repeat_penalty and llama-server's repeat_last_n (0 = off, -1 = the whole context)."""
    penalty = req.repetition_penalty if req.repetition_penalty is not None else req.repeat_penalty
    last_n = req.repeat_last_n
    if last_n is not None and last_n < -1:
        raise APIError(400, f"repeat_last_n must be -1, 0 or positive (got {last_n})", param="repeat_last_n")
    if last_n == 0:
        return {"repetition_penalty": 1.0}
    context = slot_context if last_n == -1 else last_n
    return {"repetition_penalty": penalty, "repetition_context": context}


def sampling_params(req: GenerationRequest, defaults: SamplingParams, slot_context: int,
                    constraint: Optional[ConstraintSpec] = None) -> SamplingParams:
    """The request's sampling fields over the server's defaults; a bad value is a 400."""
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    max_tokens = _max_tokens(req, defaults.max_tokens)
    given = {
        "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k, "min_p": req.min_p,
        "seed": req.seed, "max_tokens": 1 if echo_only(req, max_tokens) else max_tokens, "stop": stop,
        "ignore_eos": req.ignore_eos, **_repetition(req, slot_context), **processor_fields(req),
        "constraint": constraint,
    }
    overrides = {k: v for k, v in given.items() if v is not None}
    if req.seed == -1:  # llama-server's "random seed"
        overrides["seed"] = None
    try:
        return dataclasses.replace(defaults, **overrides)
    except RequestError as exc:
        raise APIError(400, str(exc), param=PARAM_OF.get(exc.param, exc.param)) from None


def completion_prompt_ids(prompt: Any, rt: "Runtime") -> tuple[int, ...]:
    """A completions `prompt` (string, [string], token ids or [token ids]) -> token ids."""
    from ..models import encode_text

    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise APIError(400, "prompt must not be empty", param="prompt")
        rt.prompt_limit.check_chars(len(prompt), "prompt")
        return encode_text(rt.loaded.tokenizer, prompt)
    if not prompt:
        raise APIError(400, "prompt must not be empty", param="prompt")
    if all(type(t) is int for t in prompt):
        check_token_ids(prompt, rt.vocab_size, "prompt")
        return tuple(prompt)
    raise APIError(400, "only one prompt per request is supported", param="prompt")


def check_token_ids(ids: Sequence[int], vocab_size: int, param: str) -> None:
    for i, t in enumerate(ids):
        if not 0 <= t < vocab_size:
            raise APIError(400, f"{param}[{i}] = {t} is not a token id (the vocabulary has {vocab_size})", param=param)
