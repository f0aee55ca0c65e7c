"""mia.agent protocol, prompts, tool registry and config: pure functions, exact values."""

from __future__ import annotations

import asyncio
import base64
import io
import json
from pathlib import Path

import pytest
from PIL import Image

from mia.agent import (
    TOOL_TYPES,
    AgentConfig,
    ImageSearchTool,
    SearchTool,
    Tool,
    ToolArgumentError,
    ToolConfigError,
    ToolContext,
    ToolOutput,
    build_tool,
    build_tools,
    check_format,
    load_agent_config,
    parse_turn,
    protocol,
    register_tool,
)
from mia.agent.images import (
    content_with_images,
    fill_image_placeholders,
    message_images,
    prepare_image,
    to_data_url,
)
from mia.agent.tools import format_passages, format_web_results
from mia.errors import MiaError
from mia.prompts import executor as prompts
from mia.vision import ImageError

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------- parsing


def test_valid_call_is_cut_after_the_first_close_tag() -> None:
    text = (
        "<think>look it up</think>\n<tool_call>\n"
        '{"name": "search", "arguments": {"query_list": ["a", "b"]}}\n</tool_call>'
        "\n<tool_response>hallucinated</tool_response><answer>x</answer>"
    )
    turn = parse_turn(text)
    assert turn.text == text[: text.index("</tool_call>") + len("</tool_call>")]
    assert turn.has_tool_call and turn.error is None and turn.answer is None
    assert turn.think == ["look it up"]
    assert turn.call is not None
    assert (turn.call.name, turn.call.arguments) == ("search", {"query_list": ["a", "b"]})
    assert turn.call.strict_json and not turn.call.repaired


@pytest.mark.parametrize(
    "body, args",
    [
        # single quotes, unquoted key, trailing comma (json5)
        ("{'name': 'search', arguments: {'query_list': ['x'],},}", {"query_list": ["x"]}),
        # trailing text after the object
        ('{"name": "search", "arguments": {"query": "x"}} I will wait.', {"query": "x"}),
        # missing closing braces
        ('{"name": "search", "arguments": {"query_list": ["x"]', {"query_list": ["x"]}),
        # markdown fence
        ('```json\n{"name": "search", "arguments": {"query": "x"}}\n```', {"query": "x"}),
        # Python literals
        (
            "{'name': 'search', 'arguments': {'query': 'x', 'exact': True}}",
            {"query": "x", "exact": True},
        ),
        # OpenAI style: arguments as a JSON string
        ('{"name": "search", "arguments": "{\\"query\\": \\"x\\"}"}', {"query": "x"}),
        # "parameters" alias
        ('{"name": "search", "parameters": {"query": "x"}}', {"query": "x"}),
    ],
)
def test_json_repairs(body: str, args: dict) -> None:
    turn = parse_turn(f"<tool_call>{body}</tool_call>")
    assert turn.error is None, turn.error
    assert turn.call is not None
    assert turn.call.name == "search"
    assert turn.call.arguments == args
    assert turn.call.repaired


def test_missing_close_tag_still_parses_to_the_end() -> None:
    turn = parse_turn('<tool_call>\n{"name": "search", "arguments": {"query": "x"}}')
    assert turn.call is not None and turn.call.arguments == {"query": "x"}
    assert turn.call.strict_json


def test_exact_error_texts() -> None:
    bad = parse_turn("<tool_call>search for the capital</tool_call>")
    assert bad.error_kind == protocol.MALFORMED_JSON
    assert bad.error == (
        "Error: the tool call is not valid JSON (Expecting value at line 1 column 1). "
        'Call one tool as <tool_call>{"name": "<tool name>", "arguments": {<arguments>}}'
        "</tool_call>."
    )
    arr = parse_turn('<tool_call>["search"]</tool_call>')
    assert arr.error_kind == protocol.BAD_CALL
    assert arr.error == (
        "Error: invalid tool call: expected a JSON object, got an array. "
        + protocol.CALL_FORMAT_HINT
    )
    noname = parse_turn('<tool_call>{"arguments": {}}</tool_call>')
    assert noname.error == (
        'Error: invalid tool call: the JSON object needs a string "name". '
        + protocol.CALL_FORMAT_HINT
    )
    badargs = parse_turn('<tool_call>{"name": "search", "arguments": [1]}</tool_call>')
    assert badargs.error_kind == protocol.BAD_CALL
    assert '"arguments" must be an object, got an array' in (badargs.error or "")
    assert protocol.unknown_tool_error("calc", ["search"]) == (
        'Error: unknown tool "calc". Available tools: search.'
    )
    assert protocol.timeout_error("search", 2.5) == "Error: tool search timed out after 2.5 s."


def test_final_turn_answer_extraction() -> None:
    turn = parse_turn("<think>I know this</think>\n<answer> Paris </answer>")
    assert not turn.has_tool_call
    assert turn.answer == "Paris"
    assert parse_turn("just text").answer == "just text"


def test_tool_response_and_truncation() -> None:
    assert protocol.format_tool_response("hits") == "<tool_response>\nhits\n</tool_response>"
    text = "abcdefghij" * 3
    assert protocol.truncate_chars(text, 10) == "abcde...(truncated)...fghij"
    assert protocol.truncate_chars(text, 10, "end") == "abcdefghij...(truncated)"
    assert protocol.truncate_chars(text, 100) == text
    assert protocol.truncate_chars(text, None) == text


def test_tags_balanced() -> None:
    assert protocol.tags_balanced("<think>a</think><think>b</think>", "think")
    assert not protocol.tags_balanced("<think>a", "think")
    assert not protocol.tags_balanced("</think><think>", "think")


def test_check_format_follows_the_reward_rules() -> None:
    good_call = '<think>s</think><tool_call>{"name": "search", "arguments": {"query_list": ["q"]}}</tool_call>'
    good_img = '<tool_call>{"name": "web_image_to_image_search", "arguments": {"img_idx": "0"}}</tool_call>'
    final = "<think>done</think><answer>Paris</answer>"
    assert check_format([good_call, good_img, final]) == protocol.FormatCheck(True, [])
    result = check_format(
        [
            "<think>open",
            '<tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call>',
            "<tool_call>{'name': 'search'}</tool_call>",
            '<tool_call>{"name": "calc", "arguments": {}}</tool_call>',
            good_img,
            good_img.replace('"0"', "0"),
            "<think>x</think><answer> </answer>",
        ]
    )
    assert result.issues == [
        "turn 1: unbalanced <think> tags",
        "turn 2: search arguments must be {query_list: [str, ...]}",
        "turn 3: tool call is not valid JSON",
        "turn 4: unknown tool 'calc'",
        'turn 6: image search arguments must be {"img_idx": "0"}',
        "2 image-search calls (at most one)",
        "empty answer",
    ]
    assert check_format(["no tags"]).issues == ["no <answer> block"]


# ---------------------------------------------------------------------------- prompts


def test_prompt_blocks_are_exact() -> None:
    assert prompts.plan_block("1. search\n2. answer") == (
        "\nHere is a guide for your reference:\n1. search\n2. answer\nBegin your answer:\n"
    )
    assert prompts.plan_block("  ") == ""
    assert prompts.revised_plan_block("look again <image>") == (
        "\nI have a revised plan for you to follow:\nlook again\n"
        "Please continue with this updated guidance:\n"
    )
    text = prompts.user_prompt("Who? <image>", plan="p", num_images=0)
    assert text == prompts.USER_PROMPT_TEXT.format(question="Who?") + prompts.plan_block("p")
    img = prompts.user_prompt("What is this?", num_images=2)
    assert img.count("<image>") == 2
    assert img.endswith("\nQuestion: <image><image>\nWhat is this?\n")
    with pytest.raises(ValueError):
        prompts.user_prompt("q", variant="video")


def test_system_prompt_lists_tool_schemas_like_qwen() -> None:
    schema = SearchTool().schema()
    text = prompts.system_prompt([schema])
    assert text.startswith("You are a helpful assistant.\n\n# Tools\n\n")
    assert "\n<tools>\n" + json.dumps(schema) + "\n</tools>\n" in text
    assert text.endswith(prompts.ONE_CALL_RULE)
    assert prompts.system_prompt([]) == "You are a helpful assistant."


# ---------------------------------------------------------------------------- images


def _png(color: tuple[int, int, int], size: tuple[int, int] = (20, 10)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


def test_images_from_bytes_base64_path_and_resize(tmp_path: Path) -> None:
    raw = _png((255, 0, 0))
    path = tmp_path / "red.png"
    path.write_bytes(raw)
    for src in (raw, base64.b64encode(raw).decode(), str(path), path):
        img = prepare_image(src, 8)
        assert img.size == (8, 8) and img.getpixel((4, 4)) == (255, 0, 0)
    assert prepare_image(raw, None).size == (20, 10)
    with pytest.raises(ImageError, match="image file not found"):
        prepare_image(str(tmp_path / "missing.png"))


def test_content_parts_and_placeholders() -> None:
    red = prepare_image(_png((255, 0, 0)), 4)
    blue = prepare_image(_png((0, 0, 255)), 4)
    parts = content_with_images("A <image> and <image>.", [red, blue])
    assert [p["type"] for p in parts] == ["text", "image_url", "text", "image_url", "text"]
    assert parts[1]["image_url"]["url"] == to_data_url(red)
    assert content_with_images("plain", []) == "plain"
    with pytest.raises(ImageError, match="1 <image> placeholder"):
        content_with_images("one <image>", [red, blue])
    msgs = [{"role": "user", "content": [{"type": "text", "text": "q"}, {"type": "image"}]}]
    filled, n = fill_image_placeholders(msgs, [blue])
    assert n == 1 and message_images(filled)[0].getpixel((0, 0)) == (0, 0, 255)
    with pytest.raises(ImageError, match="more image placeholders"):
        fill_image_placeholders(msgs, [])


# ---------------------------------------------------------------------------- tools and registry


class Echo(Tool):
    name = "echo"
    description = "Echo the text."
    parameters = {"type": "object", "properties": {"text": {"type": "string"}}}

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix

    async def __call__(self, args: dict, ctx: ToolContext) -> ToolOutput:
        return ToolOutput(self.prefix + str(args.get("text", "")))


def test_registry_builds_tools_from_config() -> None:
    register_tool("echo_test")(Echo)
    try:
        tools = build_tools(
            {
                "search": {"type": "search", "params": {"url": "http://127.0.0.1:1", "topk": 2}},
                "shout": {"type": "echo_test", "params": {"prefix": "! "}},
                "web_image_to_image_search": None,  # disabled
                "mysearch": {"_target_": "mia.agent.tools:SearchTool", "params": {"topk": 5}},
            }
        )
    finally:
        TOOL_TYPES.pop("echo_test")
    assert tools.names == ["search", "shout", "mysearch"]
    assert isinstance(tools.get("mysearch"), SearchTool) and tools.get("mysearch").topk == 5
    out = asyncio.run(tools.get("shout")({"text": "hi"}, ToolContext()))
    assert out == ToolOutput("! hi")
    assert tools.get("shout").schema()["function"]["name"] == "shout"
    with pytest.raises(ToolConfigError, match="unknown type 'nope'"):
        build_tool({"type": "nope"}, name="x")
    with pytest.raises(ToolConfigError, match="unknown key"):
        build_tool({"type": "search", "url": "x"})
    with pytest.raises(ToolConfigError, match="exactly one of"):
        build_tool({"params": {}})
    with pytest.raises(ToolConfigError, match="cannot import"):
        build_tool({"_target_": "mia.agent.tools:Missing"})
    with pytest.raises(ToolConfigError, match="bad params"):
        build_tool({"type": "search", "params": {"colour": "red"}})
    with pytest.raises(ToolConfigError, match="backend must be"):
        build_tool({"type": "search", "params": {"backend": "bing"}})


def test_search_argument_normalisation() -> None:
    tool = SearchTool(max_queries=2)
    assert tool.validate({"query_list": ["a "]}) == {"query_list": ["a"]}
    assert tool.validate({"query": "a"}) == {"query_list": ["a"]}
    assert tool.validate({"queries": ["a", "b"]}) == {"query_list": ["a", "b"]}
    for args, msg in [
        ({}, 'missing "query_list"'),
        ({"query_list": []}, "non-empty list"),
        ({"query_list": ["ok", " "]}, "query 1 must be a non-empty string"),
        ({"query_list": ["a", "b", "c"]}, "at most 2 queries"),
    ]:
        with pytest.raises(ToolArgumentError, match=msg):
            tool.validate(args)
    image = ImageSearchTool()
    assert image.validate({"img_idx": "0"}) == {"img_idx": 0}
    assert image.validate({}) == {"img_idx": 0}
    with pytest.raises(ToolArgumentError, match="image index"):
        image.validate({"img_idx": "first"})


def test_result_formats() -> None:
    docs = [
        {"document": {"id": 1, "contents": "Paris\nParis is the capital of France."}, "score": 3.0},
        {"id": 2, "contents": "Lyon\nLyon is a city."},
    ]
    assert format_passages(docs) == (
        "Doc 1(Title: Paris) Paris is the capital of France.\nDoc 2(Title: Lyon) Lyon is a city."
    )
    web = [{"title": "T", "url": "https://x.org", "snippet": "S"}, {"title": "U", "snippet": "V"}]
    assert format_web_results(web) == "Doc 1(Title: T) S (source: https://x.org)\nDoc 2(Title: U) V"


# ---------------------------------------------------------------------------- config


def test_agent_config_yaml_mirrors_the_defaults() -> None:
    assert load_agent_config(ROOT / "configs/agent/default.yaml") == AgentConfig()
    web = load_agent_config(ROOT / "configs/agent/web.yaml")
    assert web.tools["search"]["params"]["backend"] == "web"
    assert web.tools["search"]["params"]["url"] == "http://127.0.0.1:8003"
    assert (
        web.tools["web_image_to_image_search"] == AgentConfig().tools["web_image_to_image_search"]
    )
    web4 = load_agent_config(ROOT / "configs/agent/web.yaml", ["max_turns=4"])
    assert (web4.max_turns, web4.tools["search"]["params"]["topk"]) == (4, 5)
    named = load_agent_config("web", ["sampling.temperature=1.0"])  # a name in configs/agent/
    assert named.tools == web.tools and named.sampling == {"temperature": 1.0}
    with pytest.raises(MiaError, match="max_turns must be >= 1"):
        load_agent_config(overrides=["max_turns=0"])
    with pytest.raises(MiaError, match="unknown sampling key"):
        load_agent_config({"sampling": {"temprature": 1}})
    with pytest.raises(MiaError, match="bad agent config"):
        load_agent_config({"max_turn": 3})
