"""An OpenAI body -> the engine request: sampling, prompt token ids, the reply's labels.

Everything here blocks (templating, tokenizing, compiling a grammar) and runs off the event
loop. A prompt that certainly cannot fit a slot is refused from its length in characters,
before tokenizing.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Optional

from ...engine import Request as EngineRequest
from ...engine import SamplingParams, check_logit_bias
from ...errors import FieldError, RequestError
from ...models.chat import validate_messages
from ...serve_config import REASONING_FORMATS
from ...tool_calls import tool_messages
from ..generation.assembler import Shape, ToolParsing
from ..generation.images import chat_prompt, take_images, with_images
from ..generation.logprobs import TokenPieces
from ..generation.prepared import Prepared, blame, refuse_unsupported
from ..generation.keep import keep_fields
from ..generation.fim import fim_prompt
from ..generation.prompt import completion_prompt_ids, content_chars
from ..generation.sampling import echo_only, max_tokens_of, model_adapter, named_adapter, sampling_params
from ..generation.schemas import GenerationRequest
from ..generation.reasoning import ReasoningMarkers, ReasoningStart, reply_reasoning
from ..generation.structured import OutputPlan, output_plan
from ..generation.template import chat_options, without_thinking
from ..generation.thinking import check_budget, with_thinking
from ..http.body import parse_body
from .fields import NOT_SUPPORTED_YET
from .schemas import ChatRequest, CompletionRequest
from .shapes import Kind, Reply

if TYPE_CHECKING:
    from ..runtime import Runtime

MAX_CHOICES = 16  # n: each choice is an engine request (and a place in the queue)


def prepare_chat(rt: "Runtime", raw: bytes) -> Prepared[Reply]:
    """POST /v1/chat/completions: the messages templated with the request's tools, and its sampling."""
    body = parse_body(raw, ChatRequest)
    _check_request(rt, body)
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    rt.prompt_limit.check_chars(content_chars(messages), "messages")
    messages, images = take_images(rt, messages)
    plan = output_plan(body, rt.tool_format, rt.worker.compiler)
    options = chat_options(body.add_generation_prompt, body.continue_final_message, body.chat_template_kwargs)
    budget = check_budget(body.thinking_budget_tokens, "thinking_budget_tokens")
    if (body.reasoning_effort == "none" or budget == 0) and rt.thinks:  # as the Responses API's effort "none"
        options = without_thinking(options)
    with blame("messages"):
        # The request's tools, and tool calls and results in the history, as the template renders them.
        messages, tools = tool_messages(validate_messages(messages), plan.tools, rt.tool_format)
        prompt, media = chat_prompt(rt, messages, tools, options, images)
    reasoning = reply_reasoning(_markers(rt, body.reasoning_format), rt.loaded.tokenizer, prompt.ids)
    return with_images(_prepared(rt, body, "chat", prompt.ids, prompt.history_boundary, plan, reasoning=reasoning,
                                 budget=budget), media)


def _markers(rt: "Runtime", fmt: Optional[str]) -> Optional[ReasoningMarkers]:
    """The split a request's reasoning_format asks for (llama-server's field; absent: --reasoning-format)."""
    if fmt is None:
        return rt.reasoning
    if fmt not in REASONING_FORMATS:
        raise FieldError(f"reasoning_format must be one of {', '.join(REASONING_FORMATS)} (got {fmt!r}); "
                         "deepseek-legacy is not supported by this server", param="reasoning_format")
    return None if fmt == "none" else rt.thinking_markers


def prepare_completion(rt: "Runtime", raw: bytes) -> Prepared[Reply]:
    """POST /v1/completions: the prompt's token ids (echoed when asked), and its sampling."""
    body = parse_body(raw, CompletionRequest)
    _check_request(rt, body)
    plan = output_plan(body, None, rt.worker.compiler)
    if body.suffix:  # fill-in-the-middle: the prompt is the code before the insertion, `suffix` after it
        ids = tuple(fim_prompt(rt, _fim_prefix(body), body.suffix, param="suffix"))
    else:
        with blame("prompt"):
            ids = completion_prompt_ids(body.prompt, rt)
    echo = None
    if body.echo:  # the prompt as sent; token ids are decoded
        prompt = body.prompt[0] if isinstance(body.prompt, list) and len(body.prompt) == 1 else body.prompt
        echo = prompt if isinstance(prompt, str) else rt.loaded.tokenizer.decode(list(ids))
    return _prepared(rt, body, "completion", ids, None, plan, echo)


def _fim_prefix(body: CompletionRequest) -> str:
    """The text before the insertion: `prompt`, one string (a `suffix` request)."""
    prompt = body.prompt[0] if isinstance(body.prompt, list) and len(body.prompt) == 1 else body.prompt
    if not isinstance(prompt, str):
        raise FieldError("with a suffix, prompt must be one string (the text before the insertion)", param="prompt")
    if body.echo:
        raise FieldError("echo cannot be used with suffix (an insertion is not a continuation of the prompt)",
                         param="echo")
    return prompt


def _check_request(rt: "Runtime", body: GenerationRequest) -> None:
    rt.check_model(body.model)
    refuse_unsupported(body, NOT_SUPPORTED_YET)
    if body.n is not None and not 1 <= body.n <= MAX_CHOICES:
        raise FieldError(f"n must be between 1 and {MAX_CHOICES} (got {body.n})", param="n")


def _shape(rt: "Runtime", sampling: SamplingParams, ids: tuple[int, ...], plan: OutputPlan,
           echo: Optional[str], hide_output: bool, reasoning: Optional[ReasoningStart]) -> Shape:
    tools = plan.tools
    parsing = None
    if tools is not None and tools.choice != "none":  # with "none" the model was not shown the tools
        parsing = ToolParsing(rt.tool_format, tools.as_openai(), tools.parallel, plan.legacy_functions)
    if not sampling.logprobs:
        return Shape(echo=echo, hide_output=hide_output, tools=parsing, reasoning=reasoning)
    # Token bytes from llguidance's tables: built here, off the event loop, on first use.
    pieces = TokenPieces(rt.loaded.tokenizer, rt.worker.compiler)
    return Shape(sampling.top_logprobs, echo, ids[0], hide_output, parsing, pieces, reasoning)


def _prepared(rt: "Runtime", body: GenerationRequest, kind: Kind, ids: tuple[int, ...], boundary: Optional[int],
              plan: OutputPlan, echo: Optional[str] = None, reasoning: Optional[ReasoningStart] = None,
              budget: Optional[int] = None) -> Prepared[Reply]:
    sampling = sampling_params(body, rt.config.sampling, rt.prompt_limit.slot_context, plan.constraint,
                               rt.loaded.tokenizer)
    if kind == "chat":  # the thinking's budget, and a schema or forced call that starts after it
        sampling = with_thinking(rt, sampling, ids, budget)
    try:
        check_logit_bias(sampling, rt.vocab_size)
    except RequestError as exc:  # OpenAI's field errors carry no code
        raise FieldError(str(exc), param="logit_bias") from None
    request_id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
    stream = bool(body.stream)
    hidden = echo is not None and echo_only(body, max_tokens_of(body, rt.config.sampling.max_tokens))
    reply = Reply(kind, request_id, int(time.time()), rt.model_id,
                  include_usage=stream and body.include_usage, return_progress=bool(body.return_progress),
                  shape=_shape(rt, sampling, ids, plan, echo, hidden, reasoning), fingerprint=rt.fingerprint,
                  choices=body.n or 1)
    cache_prompt = True if body.cache_prompt is None else body.cache_prompt
    lora = named_adapter(rt, body.adapters) if body.adapters is not None else model_adapter(rt, body.model)
    job = EngineRequest(request_id, ids, sampling, boundary, cache_prompt, lora=lora, **keep_fields(body, rt, ids))
    return Prepared(job, reply, stream)
