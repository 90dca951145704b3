"""Expected renderings of llama.cpp's built-in chat templates for one conversation.

LLAMA_CPP: copied from llama.cpp's tests/test-chat-template.cpp (ggml-org/llama.cpp 03f94f1,
`main_automated_tests`: `expected_output`, which llama_chat_apply_template must produce for
the template each case's `template_str` is detected as); the name is that case's detected
built-in. FROM_SOURCE: names llama.cpp's tests have no case for, written out by hand from
src/llama-chat.cpp (2a20c85) `llm_chat_apply_template`, the reference for each name.
"""

CONVERSATION = [
    {"role": "system", "content": "You are a helpful assistant"},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi there"},
    {"role": "user", "content": "Who are you"},
    {"role": "assistant", "content": "   I am an assistant   "},
    {"role": "user", "content": "Another question"},
]
DS_EOS = "<\uff5cend\u2581of\u2581sentence\uff5c>"

LLAMA_CPP = {
    # teknium/OpenHermes-2.5-Mistral-7B
    "chatml": "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n   I am an assistant   <|im_end|>\n<|im_start|>user\nAnother question<|im_end|>\n<|im_start|>assistant\n",
    # mistralai/Mistral-7B-Instruct-v0.2 (old pre-v1 without a system prompt)
    "llama2": "[INST] You are a helpful assistant\nHello [/INST]Hi there</s>[INST] Who are you [/INST]   I am an assistant   </s>[INST] Another question [/INST]",
    # TheBloke/FusionNet_34Bx2_MoE-AWQ
    "llama2-sys-bos": "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s><s>[INST] Who are you [/INST]   I am an assistant   </s><s>[INST] Another question [/INST]",
    # bofenghuang/vigogne-2-70b-chat
    "llama2-sys-strip": "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>[INST] Who are you [/INST]I am an assistant</s>[INST] Another question [/INST]",
    # mlabonne/AlphaMonarch-7B
    "monarch": "system\nYou are a helpful assistant</s>\n<s>user\nHello</s>\n<s>assistant\nHi there</s>\n<s>user\nWho are you</s>\n<s>assistant\n   I am an assistant   </s>\n<s>user\nAnother question</s>\n<s>assistant\n",
    # google/gemma-7b-it
    "gemma": "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n<start_of_turn>model\nHi there<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\nI am an assistant<end_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n<start_of_turn>model\n",
    # OrionStarAI/Orion-14B-Chat
    "orion": "Human: You are a helpful assistant\n\nHello\n\nAssistant: </s>Hi there</s>Human: Who are you\n\nAssistant: </s>   I am an assistant   </s>Human: Another question\n\nAssistant: </s>",
    # openchat/openchat-3.5-0106
    "openchat": "You are a helpful assistant<|end_of_turn|>GPT4 Correct User: Hello<|end_of_turn|>GPT4 Correct Assistant: Hi there<|end_of_turn|>GPT4 Correct User: Who are you<|end_of_turn|>GPT4 Correct Assistant:    I am an assistant   <|end_of_turn|>GPT4 Correct User: Another question<|end_of_turn|>GPT4 Correct Assistant:",
    # deepseek-ai/deepseek-coder-33b-instruct
    "deepseek": "You are a helpful assistant### Instruction:\nHello\n### Response:\nHi there\n<|EOT|>\n### Instruction:\nWho are you\n### Response:\n   I am an assistant   \n<|EOT|>\n### Instruction:\nAnother question\n### Response:\n",
    # eachadea/vicuna-13b-1.1
    "vicuna": "You are a helpful assistant\n\nUSER: Hello\nASSISTANT: Hi there</s>\nUSER: Who are you\nASSISTANT:    I am an assistant   </s>\nUSER: Another question\nASSISTANT:",
    # Orca-Vicuna
    "vicuna-orca": "SYSTEM: You are a helpful assistant\nUSER: Hello\nASSISTANT: Hi there</s>\nUSER: Who are you\nASSISTANT:    I am an assistant   </s>\nUSER: Another question\nASSISTANT:",
    # CohereForAI/c4ai-command-r-plus
    "command-r": "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a helpful assistant<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hello<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>Hi there<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Who are you<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>I am an assistant<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|USER_TOKEN|>Another question<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
    # Llama-3
    "llama3": "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nI am an assistant<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnother question<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
    # Phi-3-mini, -small, -medium and -vision
    "phi3": "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n<|assistant|>\nHi there<|end|>\n<|user|>\nWho are you<|end|>\n<|assistant|>\n   I am an assistant   <|end|>\n<|user|>\nAnother question<|end|>\n<|assistant|>\n",
    # ChatGLM3
    "chatglm3": "[gMASK]sop<|system|>\n You are a helpful assistant<|user|>\n Hello<|assistant|>\n Hi there<|user|>\n Who are you<|assistant|>\n    I am an assistant   <|user|>\n Another question<|assistant|>",
    # ChatGLM4
    "chatglm4": "[gMASK]<sop><|system|>\nYou are a helpful assistant<|user|>\nHello<|assistant|>\nHi there<|user|>\nWho are you<|assistant|>\n   I am an assistant   <|user|>\nAnother question<|assistant|>\n",
    # GLMEdge
    "glmedge": "<|system|>\nYou are a helpful assistant<|user|>\nHello<|assistant|>\nHi there<|user|>\nWho are you<|assistant|>\n   I am an assistant   <|user|>\nAnother question<|assistant|>",
    # MiniCPM-3B-OpenHermes-2.5-v2-GGUF
    "minicpm": "You are a helpful assistant<用户>Hello<AI>Hi there<用户>Who are you<AI>I am an assistant<用户>Another question<AI>",
    # DeepSeek-V2
    "deepseek2": f"You are a helpful assistant\n\nUser: Hello\n\nAssistant: Hi there{DS_EOS}User: Who are you\n\nAssistant:    I am an assistant   {DS_EOS}User: Another question\n\nAssistant:",
    # ibm-granite/granite-3.0-8b-instruct
    "granite": "<|start_of_role|>system<|end_of_role|>You are a helpful assistant<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Hello<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>Hi there<|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Who are you<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>   I am an assistant   <|end_of_text|>\n<|start_of_role|>user<|end_of_role|>Another question<|end_of_text|>\n<|start_of_role|>assistant<|end_of_role|>",
    # mistralai/Mistral-7B-Instruct-v0.2 (mistralai 'v1' template with a system prompt)
    "mistral-v1": " [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s> [INST] Who are you [/INST]    I am an assistant   </s> [INST] Another question [/INST]",
    # Mistral-Large-Instruct-2407 (mistralai 'v3' template)
    "mistral-v3": "[INST] You are a helpful assistant\n\nHello[/INST] Hi there</s>[INST] Who are you[/INST] I am an assistant</s>[INST] Another question[/INST]",
    # Mistral-Nemo-Instruct-2407 (mistralai 'v3-tekken' template)
    "mistral-v3-tekken": "[INST]You are a helpful assistant\n\nHello[/INST]Hi there</s>[INST]Who are you[/INST]   I am an assistant   </s>[INST]Another question[/INST]",
    # mistralai/Mistral-Large-Instruct-2411 (mistralai 'v7' template)
    "mistral-v7": "[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT][INST] Hello[/INST] Hi there</s>[INST] Who are you[/INST]    I am an assistant   </s>[INST] Another question[/INST]",
    # ai-sage/GigaChat-20B-A3B-instruct
    "gigachat": "<s>You are a helpful assistant<|message_sep|>user<|role_sep|>Hello<|message_sep|>available functions<|role_sep|>[]<|message_sep|>assistant<|role_sep|>Hi there<|message_sep|>user<|role_sep|>Who are you<|message_sep|>available functions<|role_sep|>[]<|message_sep|>assistant<|role_sep|>   I am an assistant   <|message_sep|>user<|role_sep|>Another question<|message_sep|>available functions<|role_sep|>[]<|message_sep|>assistant<|role_sep|>",
    # Infinigence/Megrez-3B-Instruct
    "megrez": "<|role_start|>system<|role_end|>You are a helpful assistant<|turn_end|><|role_start|>user<|role_end|>Hello<|turn_end|><|role_start|>assistant<|role_end|>Hi there<|turn_end|><|role_start|>user<|role_end|>Who are you<|turn_end|><|role_start|>assistant<|role_end|>   I am an assistant   <|turn_end|><|role_start|>user<|role_end|>Another question<|turn_end|><|role_start|>assistant<|role_end|>",
    # phi-4
    "phi4": "<|im_start|>system<|im_sep|>You are a helpful assistant<|im_end|><|im_start|>user<|im_sep|>Hello<|im_end|><|im_start|>assistant<|im_sep|>Hi there<|im_end|><|im_start|>user<|im_sep|>Who are you<|im_end|><|im_start|>assistant<|im_sep|>   I am an assistant   <|im_end|><|im_start|>user<|im_sep|>Another question<|im_end|><|im_start|>assistant<|im_sep|>",
    # yandex/YandexGPT-5-Lite-8B-instruct
    "yandex": " Пользователь: Hello\n\n Ассистент: Hi there\n\n Пользователь: Who are you\n\n Ассистент:    I am an assistant   \n\n Пользователь: Another question\n\n Ассистент:[SEP]",
    # inclusionAI/Ling-lite
    "bailing": "<role>SYSTEM</role>You are a helpful assistant<role>HUMAN</role>Hello<role>ASSISTANT</role>Hi there<role>HUMAN</role>Who are you<role>ASSISTANT</role>   I am an assistant   <role>HUMAN</role>Another question<role>ASSISTANT</role>",
    # ByteDance-Seed/Seed-OSS-36B-Instruct
    "seed_oss": "<seed:bos>system\nYou are a helpful assistant<seed:eos><seed:bos>user\nHello<seed:eos><seed:bos>assistant\nHi there<seed:eos><seed:bos>user\nWho are you<seed:eos><seed:bos>assistant\nI am an assistant<seed:eos><seed:bos>user\nAnother question<seed:eos><seed:bos>assistant\n",
}

# ibm-granite/granite-3.x (tool call): the conversation plus these turns.
GRANITE_TOOL_TURNS = [
    {"role": "user", "content": "What is the weather?"},
    {"role": "assistant_tool_call", "content": "[{\"name\": \"get_weather\", \"arguments\": {\"location\": \"NYC\"}}]"},
    {"role": "tool_response", "content": "{\"temperature\": 72}"},
]
GRANITE_TOOL = LLAMA_CPP["granite"].removesuffix("<|start_of_role|>assistant<|end_of_role|>") + (
    "<|start_of_role|>user<|end_of_role|>What is the weather?<|end_of_text|>\n"
    "<|start_of_role|>assistant_tool_call<|end_of_role|><|tool_call|>[{\"name\": \"get_weather\", \"arguments\": "
    "{\"location\": \"NYC\"}}]<|end_of_text|>\n"
    "<|start_of_role|>tool_response<|end_of_role|>{\"temperature\": 72}<|end_of_text|>\n"
    "<|start_of_role|>assistant<|end_of_role|>"
)

_S, _U1, _A1, _U2, _A2, _U3 = (m["content"] for m in CONVERSATION)
FROM_SOURCE = {
    "llama2-sys": f"[INST] <<SYS>>\n{_S}\n<</SYS>>\n\n{_U1} [/INST]{_A1}</s>[INST] {_U2} [/INST]{_A2}</s>[INST] {_U3} [/INST]",
    "mistral-v7-tekken": f"[SYSTEM_PROMPT]{_S}[/SYSTEM_PROMPT][INST]{_U1}[/INST]{_A1}</s>[INST]{_U2}[/INST]{_A2}</s>[INST]{_U3}[/INST]",
    "falcon3": f"<|system|>\n{_S}\n<|user|>\n{_U1}\n<|assistant|>\n{_A1}\n<|user|>\n{_U2}\n<|assistant|>\n{_A2}\n<|user|>\n{_U3}\n<|assistant|>\n",
    "zephyr": f"<|system|>\n{_S}<|endoftext|>\n<|user|>\n{_U1}<|endoftext|>\n<|assistant|>\n{_A1}<|endoftext|>\n<|user|>\n{_U2}<|endoftext|>\n<|assistant|>\n{_A2}<|endoftext|>\n<|user|>\n{_U3}<|endoftext|>\n<|assistant|>\n",
    "deepseek3": f"{_S}\n\n<\uff5cUser\uff5c>{_U1}<\uff5cAssistant\uff5c>{_A1}{DS_EOS}<\uff5cUser\uff5c>{_U2}<\uff5cAssistant\uff5c>{_A2}{DS_EOS}<\uff5cUser\uff5c>{_U3}<\uff5cAssistant\uff5c>",
    "exaone3": f"[|system|]{_S}[|endofturn|]\n[|user|]{_U1}\n[|assistant|]{_A1}[|endofturn|]\n[|user|]{_U2}\n[|assistant|]I am an assistant[|endofturn|]\n[|user|]{_U3}\n[|assistant|]",
    "exaone4": f"[|system|]{_S}[|endofturn|]\n[|user|]{_U1}\n[|assistant|]{_A1}[|endofturn|]\n[|user|]{_U2}\n[|assistant|]I am an assistant[|endofturn|]\n[|user|]{_U3}\n[|assistant|]",
    "rwkv-world": f"System: {_S}\n\nUser: {_U1}\n\nAssistant: {_A1}\n\nUser: {_U2}\n\nAssistant: I am an assistant\n\nUser: {_U3}\n\nAssistant:",
    "bailing-think": LLAMA_CPP["bailing"] + "<think>",
    "bailing2": f"<role>SYSTEM</role>{_S}<|role_end|><role>HUMAN</role>{_U1}<|role_end|><role>ASSISTANT</role>{_A1}<|role_end|><role>HUMAN</role>{_U2}<|role_end|><role>ASSISTANT</role>{_A2}<|role_end|><role>HUMAN</role>{_U3}<|role_end|><role>ASSISTANT</role>",
    "llama4": f"<|header_start|>system<|header_end|>\n\n{_S}<|eot|><|header_start|>user<|header_end|>\n\n{_U1}<|eot|><|header_start|>assistant<|header_end|>\n\n{_A1}<|eot|><|header_start|>user<|header_end|>\n\n{_U2}<|eot|><|header_start|>assistant<|header_end|>\n\nI am an assistant<|eot|><|header_start|>user<|header_end|>\n\n{_U3}<|eot|><|header_start|>assistant<|header_end|>\n\n",
    "smolvlm": f"<|im_start|>{_S}\n\nUser: {_U1}<end_of_utterance>\nAssistant: {_A1}<end_of_utterance>\nUser: {_U2}<end_of_utterance>\nAssistant: {_A2}<end_of_utterance>\nUser: {_U3}<end_of_utterance>\nAssistant:",
    "hunyuan-moe": f"<|startoftext|>{_S}<|extra_4|><|startoftext|>{_U1}<|extra_0|>{_A1}<|eos|><|startoftext|>{_U2}<|extra_0|>{_A2}<|eos|><|startoftext|>{_U3}<|extra_0|>",
    "gpt-oss": f"<|start|>system<|message|>{_S}<|end|><|start|>user<|message|>{_U1}<|end|><|start|>assistant<|message|>{_A1}<|return|><|start|>user<|message|>{_U2}<|end|><|start|>assistant<|message|>{_A2}<|return|><|start|>user<|message|>{_U3}<|end|><|start|>assistant",
    "hunyuan-dense": f"{_S}<\uff5chy_place\u2581holder\u2581no\u25813\uff5c><\uff5chy_User\uff5c>{_U1}<\uff5chy_Assistant\uff5c><\uff5chy_Assistant\uff5c>{_A1}<\uff5chy_place\u2581holder\u2581no\u25812\uff5c><\uff5chy_User\uff5c>{_U2}<\uff5chy_Assistant\uff5c><\uff5chy_Assistant\uff5c>{_A2}<\uff5chy_place\u2581holder\u2581no\u25812\uff5c><\uff5chy_User\uff5c>{_U3}<\uff5chy_Assistant\uff5c>",
    "kimi-k2": f"<|im_system|>system<|im_middle|>{_S}<|im_end|><|im_user|>user<|im_middle|>{_U1}<|im_end|><|im_assistant|>assistant<|im_middle|>{_A1}<|im_end|><|im_user|>user<|im_middle|>{_U2}<|im_end|><|im_assistant|>assistant<|im_middle|>{_A2}<|im_end|><|im_user|>user<|im_middle|>{_U3}<|im_end|><|im_assistant|>assistant<|im_middle|>",
    "grok-2": f"System: {_S}<|separator|>\n\nHuman: {_U1}<|separator|>\n\nAssistant: {_A1}<|separator|>\n\nHuman: {_U2}<|separator|>\n\nAssistant: {_A2}<|separator|>\n\nHuman: {_U3}<|separator|>\n\nAssistant:",
    "pangu-embedded": f"[unused9]系统：{_S}[unused10][unused9]用户：{_U1}[unused10][unused9]助手：{_A1}[unused10][unused9]用户：{_U2}[unused10][unused9]助手：{_A2}[unused10][unused9]用户：{_U3}[unused10][unused9]助手：",
    # not a llama.cpp name: chatml (see models/chat_template.py)
    "qwen3": LLAMA_CPP["chatml"],
}
