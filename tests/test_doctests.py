"""The examples in docstrings are tests too: every ``>>>`` in the package must hold."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mia", "memory_serve", "serve", "local_search", "ttrl", "ttrl_streaming",
            "planner_train", "executor_train", "web_tools")  # fmt: skip


def modules_with_examples() -> list[str]:
    found = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if ">>> " in path.read_text(encoding="utf-8"):
                rel = path.relative_to(ROOT).with_suffix("")
                found.append(".".join(rel.parts).removesuffix(".__init__"))
    return found


def test_the_examples_are_found() -> None:
    assert {"mia.embedding", "mia.eval.harness"} <= set(modules_with_examples())


@pytest.mark.parametrize("name", modules_with_examples())
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
