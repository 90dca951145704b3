"""A qwen3 reasoning fixture: the committed qwen3-f16.gguf (llama.cpp's conversion of a tiny
random Qwen3) with Qwen3's four added tokens and a Qwen3-style template that thinks in
<think>...</think> and calls tools in <tool_call> blocks. Written in-process, loaded once.

Not a test module. The added tokens are USER_DEFINED, as convert_hf_to_gguf.py marks Qwen3's
(its tokenizer.json has them with special false); their embedding rows are random. Random
weights decide nothing a test can rely on: tests force tokens with logit_bias or a grammar."""

from __future__ import annotations

import functools

import numpy as np

from gguf_fixtures import FIXTURES
from tiny import _tmpdir

ADDED = ("<think>", "</think>", "<tool_call>", "</tool_call>")
USER_DEFINED = 4
# Qwen3's own template, cut to what the tests need: tools in the system turn, a turn's
# reasoning_content and tool calls; its generation prompt opens <think> (as Qwen3-Thinking-2507's
# does), so a greedy reply starts inside the thinking, and enable_thinking false closes it empty.
TEMPLATE = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}# Tools

You are provided with function signatures within <tools></tools> XML tags:
<tools>{% for tool in tools %}
{{ tool | tojson }}{% endfor %}
</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{"name": <function-name>, "arguments": <args-json-object>}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}{% if m.role != 'system' %}<|im_start|>{{ 'user' if m.role == 'tool' else m.role }}
{% if m.role == 'tool' %}<tool_response>
{{ m.content }}
</tool_response>{% else %}
{%- if m.role == 'assistant' and m.reasoning_content %}<think>
{{ m.reasoning_content }}
</think>

{% endif %}{{ m.content or '' }}{% for c in m.tool_calls or [] %}
<tool_call>
{"name": "{{ c.function.name }}", "arguments": \
{% if c.function.arguments is string %}{{ c.function.arguments }}{% else %}{{ c.function.arguments | tojson }}{% endif %}}
</tool_call>{% endfor %}{% endif %}<|im_end|>
{% endif %}{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% else %}<think>
{% endif %}{% endif %}"""


def write_qwen3_thinking(path) -> None:
    """qwen3-f16.gguf with ADDED appended to its vocabulary (and embedding rows) and TEMPLATE."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(FIXTURES / "qwen3-f16.gguf")
    writer = GGUFWriter(path, "qwen3")
    extra = {"tokenizer.ggml.tokens": list(ADDED), "tokenizer.ggml.token_type": [USER_DEFINED] * len(ADDED)}
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        value = field.contents()
        if field.name in extra:
            value = list(value) + extra[field.name]
        elif field.name == "tokenizer.chat_template":
            value = TEMPLATE
        sub = field.types[1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, field.types[0], sub_type=sub)
    rng = np.random.default_rng(3)
    for tensor in reader.tensors:
        data = np.asarray(tensor.data)
        if tensor.name == "token_embd.weight":
            rows = (rng.standard_normal((len(ADDED), data.shape[1])) * float(data.std())).astype(data.dtype)
            data = np.concatenate([data, rows])
        writer.add_tensor(tensor.name, data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@functools.lru_cache(maxsize=None)
def thinking_model():
    """The fixture loaded through `load_model` (dense float32); cached per process."""
    from mlxcel_py.models import load_model

    path = _tmpdir() / "qwen3think-f16.gguf"
    write_qwen3_thinking(path)
    return load_model(str(path))


def token_id(model, text: str) -> int:
    """The id of one of ADDED in the fixture's vocabulary."""
    (token,) = model.tokenizer.encode(text, add_special_tokens=False)
    return token
