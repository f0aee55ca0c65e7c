"""Reading verdict letters and critic scores out of free-form LLM replies.

Models add noise around the answer ("**A**", "A.", "Answer: B", a stray reasoning block, the
label word instead of the letter). These parsers accept that noise but never guess: a reply that
names no verdict returns ``None`` and the caller reports it.
"""

from __future__ import annotations

import re

from mia.llm.think import strip_think

_LABEL_WORDS = {
    "A": re.compile(r"\bCORRECT\b"),
    "B": re.compile(r"\bINCORRECT\b"),
    "C": re.compile(r"\bNOT[ _]ATTEMPTED\b"),
}


def _clean(reply: str) -> str:
    text = strip_think(reply) if "</think>" in reply else reply
    return text.replace("*", "").replace("`", "").strip()


def parse_letter(reply: str, letters: str = "ABC") -> str | None:
    """The verdict letter in ``reply`` (one of ``letters``), or ``None`` if it names none.

    Tried in order: the reply is just the letter (``"A"``, ``"(b)."``); it starts with the
    letter followed by a separator (``"A: CORRECT"``); an ``answer/grade/verdict: X`` phrase;
    exactly one label word (``NOT_ATTEMPTED``, ``INCORRECT``, ``CORRECT``); exactly one
    distinct standalone capital letter.
    """
    text = _clean(reply)
    allowed = re.escape(letters)
    m = re.fullmatch(rf"[\s(\[\"']*([{allowed}])[\s)\]\"'.:]*", text, re.IGNORECASE)
    if m:
        return m.group(1).upper()
    m = re.match(rf"\s*[(\[]?([{allowed}])(?:[)\]]|\s*[:.)\-]|\s*$)", text)
    if m:
        return m.group(1)
    m = re.search(
        rf"\b(?:answer|grade|verdict|choice)\b[^A-Za-z]{{0,12}}(?:is\s*)?[(\[]?([{allowed}])\b",
        text,
        re.IGNORECASE,
    )
    if m:
        return m.group(1).upper()
    upper = text.upper()
    # INCORRECT contains CORRECT and NOT_ATTEMPTED has no overlap: check the longer words first.
    words = [k for k in ("C", "B") if k in letters and _LABEL_WORDS[k].search(upper)]
    rest = _LABEL_WORDS["B"].sub(" ", upper)
    if "A" in letters and _LABEL_WORDS["A"].search(rest):
        words.append("A")
    if len(words) == 1:
        return words[0]
    singles = set(re.findall(rf"\b([{allowed}])\b", text))
    if len(singles) == 1:
        return singles.pop()
    return None


_SCORE = re.compile(r"score\s*[:=\-]?\s*\(?\s*(\d+(?:\.\d+)?)\s*(?:/\s*10)?", re.IGNORECASE)
_REASON = re.compile(r"reason(?:ing)?\s*[:=\-]\s*(.+)", re.IGNORECASE | re.DOTALL)
_BARE_SCORE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:/\s*10)?\b")


def parse_critic(reply: str, max_words: int = 50) -> tuple[float | None, str]:
    """``(score, reason)`` from a critic reply: ``Score: 7`` (also ``7/10``, ``- **Score**: 7``)
    clamped to 1..10, and the ``Reason:`` text cut to ``max_words`` words. Missing score ->
    ``None``; missing reason label -> the reply without its score line."""
    text = _clean(reply)
    score: float | None = None
    m = _SCORE.search(text) or _BARE_SCORE.search(text)
    if m:
        score = min(10.0, max(1.0, float(m.group(1))))
    r = _REASON.search(text)
    if r:
        reason = r.group(1)
    else:
        reason = text[: m.start()] + text[m.end() :] if m else text
    words = reason.replace("\n", " ").split()
    return score, " ".join(words[:max_words]).strip(" -")
