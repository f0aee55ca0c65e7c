"""The ChatML chat template shared by the tiny test models and the embedded default model.

One template for every model we build, so the agent loop sees one rendering everywhere. It
follows Qwen2.5's template (tools block in the system turn, ``<tool_call>`` JSON for assistant
tool calls, consecutive ``tool`` messages grouped into one ``user`` turn of ``<tool_response>``
blocks) and Qwen2.5-VL's handling of content parts (an image part becomes
``<|vision_start|><|image_pad|><|vision_end|>``). Content may be a string or a list of OpenAI-style
parts (``{"type": "text", "text": ...}``, ``{"type": "image"}``, ``{"type": "image_url", ...}``).
"""

from __future__ import annotations

import json

IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
VIDEO_PLACEHOLDER = "<|vision_start|><|video_pad|><|vision_end|>"

# Qwen2.5's tool block around the tool schemas, character for character (mia.prompts.executor
# writes the same block into the system message).
TOOLS_INTRO = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
TOOLS_OUTRO = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def chatml_template(default_system: str | None, vision: bool) -> str:
    """Build the Jinja chat template.

    ``default_system`` is inserted when the conversation has no system message (None: insert
    nothing). With ``vision=False`` an image or video part raises instead of rendering tokens the
    model has never seen.
    """
    if vision:
        image = IMAGE_PLACEHOLDER
        video = VIDEO_PLACEHOLDER
    else:
        image = "{{- raise_exception('this model does not accept images') -}}"
        video = "{{- raise_exception('this model does not accept videos') -}}"
    # json.dumps gives Jinja-safe string literals for the fixed texts.
    default = json.dumps(default_system) if default_system else "none"
    return (
        "{%- macro render(content) -%}"
        "{%- if content is string -%}{{- content -}}"
        "{%- elif content is not none -%}"
        "{%- for part in content -%}"
        "{%- if part is string -%}{{- part -}}"
        "{%- elif part.type == 'image' or part.type == 'image_url' or 'image' in part"
        " or 'image_url' in part -%}"
        + image
        + "{%- elif part.type == 'video' or 'video' in part -%}"
        "" + video + "{%- elif 'text' in part -%}{{- part.text -}}"
        "{%- endif -%}"
        "{%- endfor -%}"
        "{%- endif -%}"
        "{%- endmacro -%}"
        "{%- set default_system = " + default + " -%}"
        "{%- if messages and messages[0].role == 'system' -%}"
        "{%- set system = render(messages[0].content) -%}{%- set rest = messages[1:] -%}"
        "{%- else -%}{%- set system = default_system -%}{%- set rest = messages -%}"
        "{%- endif -%}"
        "{%- if tools -%}"
        "{{- '<|im_start|>system\\n' -}}{%- if system -%}{{- system -}}{%- endif -%}"
        "{{- " + json.dumps(TOOLS_INTRO) + " -}}"
        "{%- for tool in tools -%}{{- '\\n' -}}{{- tool | tojson -}}{%- endfor -%}"
        "{{- " + json.dumps(TOOLS_OUTRO) + " -}}{{- '<|im_end|>\\n' -}}"
        "{%- elif system is not none -%}"
        "{{- '<|im_start|>system\\n' + system + '<|im_end|>\\n' -}}"
        "{%- endif -%}"
        "{%- for message in rest -%}"
        "{%- if message.role == 'assistant' and message.tool_calls -%}"
        "{{- '<|im_start|>assistant' -}}"
        "{%- if message.content -%}{{- '\\n' + render(message.content) -}}{%- endif -%}"
        "{%- for call in message.tool_calls -%}"
        "{%- if call.function is defined -%}{%- set call = call.function -%}{%- endif -%}"
        '{{- \'\\n<tool_call>\\n{"name": "\' + call.name + \'", "arguments": \' -}}'
        "{%- if call.arguments is string -%}{{- call.arguments -}}"
        "{%- else -%}{{- call.arguments | tojson -}}{%- endif -%}"
        "{{- '}\\n</tool_call>' -}}"
        "{%- endfor -%}"
        "{{- '<|im_end|>\\n' -}}"
        "{%- elif message.role == 'tool' -%}"
        "{%- if loop.first or loop.previtem.role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
        "{{- '\\n<tool_response>\\n' + render(message.content) + '\\n</tool_response>' -}}"
        "{%- if loop.last or loop.nextitem.role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
        "{%- else -%}"
        "{{- '<|im_start|>' + message.role + '\\n' + render(message.content) + '<|im_end|>\\n' -}}"
        "{%- endif -%}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
    )
