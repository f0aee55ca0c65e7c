"""Rule workflow summaries (``mia.trace.rule_summary``): what the embedded Manager stores."""

from __future__ import annotations

import json

from mia.trace import REVISED_PLAN_TEMPLATE, rule_summary


def _call(*queries: str) -> str:
    call = {"name": "search", "arguments": {"query_list": list(queries)}}
    return f"<think>\nI will search.\n</think>\n<tool_call>\n{json.dumps(call)}\n</tool_call>"


def _obs(*titles: str) -> dict:
    body = "\n".join(f"Doc {i}(Title: {t}) text" for i, t in enumerate(titles, 1))
    return {"role": "user", "content": f"<tool_response>\n{body}\n</tool_response>"}


def test_one_step_per_action_with_queries_titles_and_the_conclusion() -> None:
    messages = [
        {"role": "assistant", "content": _call("Vorlanic Institute founded by")},
        _obs("Vorlanic Institute", "Reception of X", "Vorlenic Institute", "Fourth"),
        {
            "role": "assistant",
            "content": '<think>\nThe passage says: "It was founded in 1924 by Kaleth Morvaine." '
            "So the founder of Vorlanic Institute is Kaleth Morvaine.\n</think>\n"
            "<answer>Kaleth Morvaine</answer>",
        },
    ]
    assert rule_summary("Who founded Vorlanic Institute?", messages) == (
        '1. search (query "Vorlanic Institute founded by" -> passages: Vorlanic Institute, '
        "Reception of X, Vorlenic Institute)\n"
        "2. answer (So the founder of Vorlanic Institute is Kaleth Morvaine. -> "
        '"Kaleth Morvaine")'
    )


def test_replans_two_queries_and_nothing_done() -> None:
    messages = [
        {"role": "assistant", "content": "<think>\nguess\n</think>\n<answer>Nobody</answer>"},
        {"role": "user", "content": REVISED_PLAN_TEMPLATE.format(replan="1. Search.")},
        {"role": "assistant", "content": _call("A born", "B born")},
        _obs("A", "B"),
        {"role": "assistant", "content": "<think>\nA is older.\n</think>\n<answer>A</answer>"},
    ]
    assert rule_summary("q", messages).splitlines() == [
        '1. answer (guess -> "Nobody")',
        "2. revised plan (the Planner asked for another attempt)",
        '3. search (query "A born"; "B born" -> passages: A, B)',
        '4. answer (A is older. -> "A")',
    ]
    assert rule_summary("q", []) == "1. no action (the Executor neither searched nor answered)"
