"""llama.cpp's built-in chat templates by name (`--chat-template chatml`), rendered as
llama.cpp's `llm_chat_apply_template` renders them (src/llama-chat.cpp, ggml-org/llama.cpp
2a20c85): role and content strings only, no tools, no Jinja.

Each renderer takes the messages ({"role", "content"} with string contents) and whether to
append the generation prompt, and returns the prompt text.
"""

from __future__ import annotations

from typing import Callable

Renderer = Callable[[list[dict], bool], str]
_C_SPACE = " \t\n\v\f\r"  # llama.cpp trims with C's isspace, not Unicode whitespace
EOS_DEEPSEEK = "<\uff5cend\u2581of\u2581sentence\uff5c>"


def _trim(text: str) -> str:
    return text.strip(_C_SPACE)


def _each(fmt: Callable[[str, str], str], prompt: str) -> Renderer:
    """Templates that render every message alike, then a fixed generation prompt."""
    return lambda msgs, add: "".join(fmt(m["role"], m["content"]) for m in msgs) + (prompt if add else "")


def _by_role(parts: dict[str, Callable[[str], str]], prompt: str, other: str = "") -> Renderer:
    """Templates with one format per role; roles without one use `other` (or are dropped)."""
    def render(msgs: list[dict], add: bool) -> str:
        out = []
        for m in msgs:
            fmt = parts.get(m["role"], parts.get(other) if other else None)
            if fmt is not None:
                out.append(fmt(m["content"]))
        return "".join(out) + (prompt if add else "")
    return render


def _mistral_v7(space: str) -> Renderer:
    parts = {"system": lambda c: f"[SYSTEM_PROMPT]{space}{c}[/SYSTEM_PROMPT]",
             "user": lambda c: f"[INST]{space}{c}[/INST]", "assistant": lambda c: f"{space}{c}</s>"}
    return _by_role(parts, "", other="assistant")  # never a generation prompt, as llama.cpp


def _mistral_v1_v3(lead: str, trail: str, trim_reply: bool) -> Renderer:
    def render(msgs: list[dict], add: bool) -> str:
        out, inside = [], False
        for m in msgs:
            if not inside:
                out.append(f"{lead}[INST]{trail}")
                inside = True
            role, content = m["role"], m["content"]
            if role == "system":
                out.append(content + "\n\n")
            elif role == "user":
                out.append(f"{content}{lead}[/INST]")
            else:
                out.append(trail + (_trim(content) if trim_reply else content) + "</s>")
                inside = False
        return "".join(out)
    return render


def _llama2(system: bool, bos_inside: bool, strip: bool) -> Renderer:
    def render(msgs: list[dict], add: bool) -> str:
        out, inside = ["[INST] "], True
        for m in msgs:
            role, content = m["role"], _trim(m["content"]) if strip else m["content"]
            if not inside:
                inside = True
                out.append("<s>[INST] " if bos_inside else "[INST] ")
            if role == "system":
                out.append(f"<<SYS>>\n{content}\n<</SYS>>\n\n" if system else content + "\n")
            elif role == "user":
                out.append(content + " [/INST]")
            else:
                out.append(content + "</s>")
                inside = False
        return "".join(out)
    return render


def _monarch(msgs: list[dict], add: bool) -> str:
    out = "".join(("" if i == 0 else "<s>") + f"{m['role']}\n{m['content']}</s>\n" for i, m in enumerate(msgs))
    return out + ("<s>assistant\n" if add else "")


def _gemma(msgs: list[dict], add: bool) -> str:
    # Gemma has no system turn: llama.cpp folds the system text into the next user turn.
    out, system = [], ""
    for m in msgs:
        if m["role"] == "system":
            system += _trim(m["content"])
            continue
        role = "model" if m["role"] == "assistant" else m["role"]
        out.append(f"<start_of_turn>{role}\n")
        if system and role != "model":
            out.append(system + "\n\n")
            system = ""
        out.append(_trim(m["content"]) + "<end_of_turn>\n")
    return "".join(out) + ("<start_of_turn>model\n" if add else "")


def _orion(msgs: list[dict], add: bool) -> str:
    out, system = [], ""
    for m in msgs:
        if m["role"] == "system":
            system += m["content"]
        elif m["role"] == "user":
            out.append("Human: " + (system + "\n\n" if system else "") + m["content"] + "\n\nAssistant: </s>")
            system = ""
        else:
            out.append(m["content"] + "</s>")
    return "".join(out)


def _openchat(msgs: list[dict], add: bool) -> str:
    out = "".join(m["content"] + "<|end_of_turn|>" if m["role"] == "system"
                  else f"GPT4 Correct {m['role'][:1].upper()}{m['role'][1:]}: {m['content']}<|end_of_turn|>"
                  for m in msgs)
    return out + ("GPT4 Correct Assistant:" if add else "")


def _vicuna(orca: bool) -> Renderer:
    return _by_role({"system": (lambda c: f"SYSTEM: {c}\n") if orca else (lambda c: c + "\n\n"),
                     "user": lambda c: f"USER: {c}\n", "assistant": lambda c: f"ASSISTANT: {c}</s>\n"},
                    "ASSISTANT:")


def _rwkv(msgs: list[dict], add: bool) -> str:
    out = []
    for i, m in enumerate(msgs):
        role, content = m["role"], _trim(m["content"])
        if role in ("system", "user", "assistant"):
            out.append(f"{role.capitalize()}: {content}\n\n")
        if role == "user" and i == len(msgs) - 1:
            out.append("Assistant:")
    return "".join(out)


def _gigachat(msgs: list[dict], add: bool) -> str:
    has_system = bool(msgs) and msgs[0]["role"] == "system"
    out = ["<s>" + (msgs[0]["content"] + "<|message_sep|>" if has_system else "")]
    for m in msgs[1 if has_system else 0:]:
        if m["role"] == "user":
            out.append(f"user<|role_sep|>{m['content']}<|message_sep|>available functions<|role_sep|>[]<|message_sep|>")
        elif m["role"] == "assistant":
            out.append(f"assistant<|role_sep|>{m['content']}<|message_sep|>")
    return "".join(out) + ("assistant<|role_sep|>" if add else "")


def _bailing(think: bool, v2: bool) -> Renderer:
    def render(msgs: list[dict], add: bool) -> str:
        out = []
        if v2 and not (msgs and msgs[0]["role"] == "system"):
            out.append("<role>SYSTEM</role>detailed thinking off<|role_end|>")
        for m in msgs:
            role = "HUMAN" if m["role"] == "user" else m["role"].upper()
            out.append(f"<role>{role}</role>{m['content']}" + ("<|role_end|>" if v2 else ""))
        if add:
            out.append("<role>ASSISTANT</role>" + ("<think>" if think else ""))
        return "".join(out)
    return render


def _hunyuan_dense(msgs: list[dict], add: bool) -> str:
    out = []
    for i, m in enumerate(msgs):
        if i == 0 and m["role"] == "system":
            out.append(m["content"] + "<\uff5chy_place\u2581holder\u2581no\u25813\uff5c>")
        if m["role"] == "assistant":
            out.append(f"<\uff5chy_Assistant\uff5c>{m['content']}<\uff5chy_place\u2581holder\u2581no\u25812\uff5c>")
        elif m["role"] == "user":
            out.append(f"<\uff5chy_User\uff5c>{m['content']}<\uff5chy_Assistant\uff5c>")
    return "".join(out)


def _pangu(msgs: list[dict], add: bool) -> str:
    names = {"system": "系统", "user": "用户", "assistant": "助手", "tool": "工具", "function": "方法"}
    out = ["[unused9]系统：[unused10]"] if msgs and msgs[0]["role"] != "system" else []
    out += [f"[unused9]{names[m['role']]}：{m['content']}[unused10]" for m in msgs if m["role"] in names]
    return "".join(out) + ("[unused9]助手：" if add else "")


def _cohere(tag: str) -> Callable[[str], str]:
    return lambda c: f"<|START_OF_TURN_TOKEN|><|{tag}_TOKEN|>{_trim(c)}<|END_OF_TURN_TOKEN|>"


_KIMI_ROLES = {"system": "<|im_system|>system", "user": "<|im_user|>user",
               "assistant": "<|im_assistant|>assistant", "tool": "<|im_system|>tool"}

BUILTIN: dict[str, Renderer] = {
    "chatml": _each(lambda r, c: f"<|im_start|>{r}\n{c}<|im_end|>\n", "<|im_start|>assistant\n"),
    "llama2": _llama2(False, False, False),
    "llama2-sys": _llama2(True, False, False),
    "llama2-sys-bos": _llama2(True, True, False),
    "llama2-sys-strip": _llama2(True, False, True),
    "mistral-v1": _mistral_v1_v3(" ", " ", False),
    "mistral-v3": _mistral_v1_v3("", " ", True),
    "mistral-v3-tekken": _mistral_v1_v3("", "", False),
    "mistral-v7": _mistral_v7(" "),
    "mistral-v7-tekken": _mistral_v7(""),
    "phi3": _each(lambda r, c: f"<|{r}|>\n{c}<|end|>\n", "<|assistant|>\n"),
    "phi4": _each(lambda r, c: f"<|im_start|>{r}<|im_sep|>{c}<|im_end|>", "<|im_start|>assistant<|im_sep|>"),
    "falcon3": _each(lambda r, c: f"<|{r}|>\n{c}\n", "<|assistant|>\n"),
    "zephyr": _each(lambda r, c: f"<|{r}|>\n{c}<|endoftext|>\n", "<|assistant|>\n"),
    "monarch": _monarch,
    "gemma": _gemma,
    "orion": _orion,
    "openchat": _openchat,
    "vicuna": _vicuna(False),
    "vicuna-orca": _vicuna(True),
    "deepseek": _by_role({"system": lambda c: c, "user": lambda c: f"### Instruction:\n{c}\n",
                          "assistant": lambda c: f"### Response:\n{c}\n<|EOT|>\n"}, "### Response:\n"),
    "deepseek2": _by_role({"system": lambda c: c + "\n\n", "user": lambda c: f"User: {c}\n\n",
                           "assistant": lambda c: f"Assistant: {c}{EOS_DEEPSEEK}"}, "Assistant:"),
    "deepseek3": _by_role({"system": lambda c: c + "\n\n", "user": lambda c: f"<\uff5cUser\uff5c>{c}",
                           "assistant": lambda c: f"<\uff5cAssistant\uff5c>{c}{EOS_DEEPSEEK}"},
                          "<\uff5cAssistant\uff5c>"),
    "command-r": _by_role({"system": _cohere("SYSTEM"), "user": _cohere("USER"), "assistant": _cohere("CHATBOT")},
                          "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"),
    "llama3": _each(lambda r, c: f"<|start_header_id|>{r}<|end_header_id|>\n\n{_trim(c)}<|eot_id|>",
                    "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    "chatglm3": lambda msgs, add: "[gMASK]sop" + _each(lambda r, c: f"<|{r}|>\n {c}", "<|assistant|>")(msgs, add),
    "chatglm4": lambda msgs, add: "[gMASK]<sop>" + _each(lambda r, c: f"<|{r}|>\n{c}", "<|assistant|>\n")(msgs, add),
    "glmedge": _each(lambda r, c: f"<|{r}|>\n{c}", "<|assistant|>"),
    "minicpm": lambda msgs, add: "".join(f"<用户>{_trim(m['content'])}<AI>" if m["role"] == "user"
                                         else _trim(m["content"]) for m in msgs),
    "exaone3": _by_role({"system": lambda c: f"[|system|]{_trim(c)}[|endofturn|]\n",
                         "user": lambda c: f"[|user|]{_trim(c)}\n",
                         "assistant": lambda c: f"[|assistant|]{_trim(c)}[|endofturn|]\n"}, "[|assistant|]"),
    "exaone4": _by_role({"system": lambda c: f"[|system|]{_trim(c)}[|endofturn|]\n",
                         "user": lambda c: f"[|user|]{_trim(c)}\n",
                         "assistant": lambda c: f"[|assistant|]{_trim(c)}[|endofturn|]\n",
                         "tool": lambda c: f"[|tool|]{_trim(c)}[|endofturn|]\n"}, "[|assistant|]"),
    "rwkv-world": _rwkv,
    "granite": _each(lambda r, c: f"<|start_of_role|>{r}<|end_of_role|>"
                     + ("<|tool_call|>" if r == "assistant_tool_call" else "") + f"{c}<|end_of_text|>\n",
                     "<|start_of_role|>assistant<|end_of_role|>"),
    "gigachat": _gigachat,
    "megrez": _each(lambda r, c: f"<|role_start|>{r}<|role_end|>{c}<|turn_end|>", "<|role_start|>assistant<|role_end|>"),
    "yandex": _by_role({"user": lambda c: f" Пользователь: {c}\n\n", "assistant": lambda c: f" Ассистент: {c}\n\n"},
                       " Ассистент:[SEP]"),
    "bailing": _bailing(False, False),
    "bailing-think": _bailing(True, False),
    "bailing2": _bailing(False, True),
    "llama4": _each(lambda r, c: f"<|header_start|>{r}<|header_end|>\n\n{_trim(c)}<|eot|>",
                    "<|header_start|>assistant<|header_end|>\n\n"),
    "smolvlm": lambda msgs, add: "<|im_start|>" + _by_role(
        {"system": lambda c: c + "\n\n", "user": lambda c: f"User: {c}<end_of_utterance>\n",
         "assistant": lambda c: f"Assistant: {c}<end_of_utterance>\n"}, "Assistant:", other="assistant")(msgs, add),
    "hunyuan-moe": _by_role({"system": lambda c: f"<|startoftext|>{c}<|extra_4|>",
                             "assistant": lambda c: f"{c}<|eos|>", "user": lambda c: f"<|startoftext|>{c}<|extra_0|>"},
                            "", other="user"),
    "gpt-oss": _each(lambda r, c: f"<|start|>{r}<|message|>{c}" + ("<|return|>" if r == "assistant" else "<|end|>"),
                     "<|start|>assistant"),
    "hunyuan-dense": _hunyuan_dense,
    "kimi-k2": _each(lambda r, c: (_KIMI_ROLES[r] + "<|im_middle|>" if r in _KIMI_ROLES else "") + f"{c}<|im_end|>",
                     "<|im_assistant|>assistant<|im_middle|>"),
    "seed_oss": _each(lambda r, c: f"<seed:bos>{r}\n{_trim(c) if r == 'assistant' else c}<seed:eos>",
                      "<seed:bos>assistant\n"),
    "grok-2": _by_role({"system": lambda c: f"System: {_trim(c)}<|separator|>\n\n",
                        "user": lambda c: f"Human: {_trim(c)}<|separator|>\n\n",
                        "assistant": lambda c: f"Assistant: {c}<|separator|>\n\n"}, "Assistant:"),
    "pangu-embedded": _pangu,
}
