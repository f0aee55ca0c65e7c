"""Rule-based judging: SQuAD-style normalisation, exact match, token F1, containment, and the
reward-side answer extraction (``<answer>`` after the last ``</think>``).

Normalisation is SQuAD's (lowercase, drop punctuation, drop the articles a/an/the, collapse
whitespace), extended to Unicode punctuation so curly quotes and dashes from LLMs do not block a
match. ``contains`` matches whole tokens: gold "paris" is in "it is paris france" but not in
"comparison".
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from mia.judge.base import JudgeError, Judgement, as_golds

_ASCII_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def _is_punct(ch: str) -> bool:
    return ch in _ASCII_PUNCT or unicodedata.category(ch).startswith("P")


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lowercase, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if not _is_punct(ch))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _golds(golds: str | Sequence[str]) -> list[str]:
    return as_golds(golds, "rule")


def exact_match(prediction: str, golds: str | Sequence[str]) -> float:
    """1.0 if the normalised prediction equals any normalised gold, else 0.0."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in _golds(golds)))


def _f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    if not pred_tokens or not gold_tokens:
        # SQuAD: two empty answers agree; one empty answer shares nothing.
        return float(pred_tokens == gold_tokens)
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str, golds: str | Sequence[str]) -> float:
    """SQuAD token F1 of the prediction against the best-matching gold."""
    pred = normalize_answer(prediction).split()
    return max(_f1(pred, normalize_answer(g).split()) for g in _golds(golds))


def contains(prediction: str, golds: str | Sequence[str]) -> float:
    """1.0 if any non-empty normalised gold occurs as whole tokens in the normalised prediction."""
    pred = f" {normalize_answer(prediction)} "
    for gold in _golds(golds):
        norm = normalize_answer(gold)
        if norm and f" {norm} " in pred:
            return 1.0
    return 0.0


_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_AFTER_TOOL = re.compile(r"</tool_response>\s*assistant\s*\n(.*?)$", re.DOTALL | re.MULTILINE)
_TOOL_BLOCKS = re.compile(
    r"<tool_call>.*?</tool_call>|<tool_response>.*?</tool_response>", re.DOTALL
)
_ROLE_WORDS = re.compile(r"\b(user|assistant)\b")


def extract_answer(text: str) -> str:
    """The final answer in a model output, as the training rewards read it.

    After the last ``</think>``: the last ``<answer>...</answer>``; else the text after the last
    tool response of a flattened transcript; else (when there was a ``</think>``) the remaining
    text with tool blocks and role words removed; else the whole text. Never ``None``.
    """
    text = text.replace("<|im_end|>", "")
    tail = text.split("</think>")[-1].strip()
    found = _ANSWER.findall(tail)
    if found:
        answer = found[-1].strip()
    else:
        after_tool = _AFTER_TOOL.search(tail)
        if after_tool:
            answer = after_tool.group(1).strip()
        elif "</think>" in text:
            answer = _ROLE_WORDS.sub("", _TOOL_BLOCKS.sub("", tail)).strip()
        else:
            answer = text.strip()
    return answer or text.strip()


MODES = ("em", "f1", "contains")


@dataclass
class RuleJudge:
    """Grades by rules. ``mode``: ``em`` (exact match), ``f1`` (token F1 >= ``f1_threshold``)
    or ``contains`` (a gold occurs in the prediction). An empty prediction is not attempted.
    ``score`` is the mode's value (F1 itself in ``f1`` mode); ``detail`` holds all three."""

    mode: str = "contains"
    f1_threshold: float = 0.5

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise JudgeError(f"rule judge: mode must be one of {MODES}, got {self.mode!r}")
        if not 0.0 <= self.f1_threshold <= 1.0:
            raise JudgeError(f"rule judge: f1_threshold must be in [0, 1], got {self.f1_threshold}")

    @property
    def name(self) -> str:
        return f"rules:{self.mode}"

    def grade_sync(
        self,
        question: str,
        prediction: str,
        golds: str | Sequence[str] | None = None,
        trajectory: str = "",
    ) -> Judgement:
        gold_list = as_golds(golds, "rule")
        detail = {
            "em": exact_match(prediction, gold_list),
            "f1": token_f1(prediction, gold_list),
            "contains": contains(prediction, gold_list),
            "mode": self.mode,
        }
        if not normalize_answer(prediction):
            return Judgement("not_attempted", 0.0, self.name, detail)
        if self.mode == "f1":
            score = detail["f1"]
            ok = score >= self.f1_threshold
        else:
            score = detail[self.mode]
            ok = score == 1.0
        return Judgement("correct" if ok else "incorrect", score, self.name, detail)

    async def grade(
        self,
        question: str,
        prediction: str,
        golds: str | Sequence[str] | None = None,
        trajectory: str = "",
    ) -> Judgement:
        return self.grade_sync(question, prediction, golds, trajectory)
