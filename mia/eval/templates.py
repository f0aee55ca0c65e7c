"""What kind of question a dataset row is: its template, its kind and the kind of its answer.

A synthetic world's question carries ``extra_info.question_type``, ``extra_info.relation`` and,
for a convention question, ``extra_info.template`` (docs/world.md). From them:

- :func:`question_template` — the template: a convention question's convention id
  (``work.who_is_behind``), any other question's relation string (``person.birth_city``, or a
  bridge chain such as ``person.birth_city>city.region``); ``""`` for a row without either.
  Questions of one template are linked through memory; they form one cluster of the protocol's
  intervals (docs/protocol.md) and one key of the ``feedback`` policy's memory;
- :func:`question_kind` — ``convention`` for a convention question, ``standard`` for
  ``single_hop``, ``bridge`` and ``comparison``, otherwise the question type (``image``);
- :func:`answer_kind` — what an answer is a value of: the last relation of the chain
  (``city.region`` for ``person.birth_city>city.region``, the same as a single-hop
  ``city.region`` question's), or ``comparison:<relation>`` (a comparison's answer names one of
  the compared entities);
- :func:`wrong_answers` — per question, a wrong answer of its answer kind, drawn from other
  questions (``eval.memory.expected_answers=wrong``).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from typing import Any

from mia.data.formats import QAItem
from mia.judge.rules import normalize_answer

STANDARD_TYPES = ("single_hop", "bridge", "comparison")


def _info(item: QAItem | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(item, QAItem):
        return item.extra_info or {}
    return item.get("extra_info") or {}


def question_type(item: QAItem | Mapping[str, Any]) -> str:
    """``extra_info.question_type`` (``""`` when the row has none)."""
    return str(_info(item).get("question_type") or "")


def question_template(item: QAItem | Mapping[str, Any]) -> str:
    """The convention id of a convention question, else the relation string (``""`` when the
    row has neither).

    >>> question_template({"extra_info": {"relation": "org.hq", "template": ""}})
    'org.hq'
    >>> question_template({"extra_info": {"relation": "org.hq", "template": "org.where_is_based"}})
    'org.where_is_based'
    """
    info = _info(item)
    return str(info.get("template") or info.get("relation") or "")


def question_kind(item: QAItem | Mapping[str, Any]) -> str:
    """``convention``, ``standard`` (single_hop, bridge, comparison) or the question type."""
    qtype = question_type(item)
    return "standard" if qtype in STANDARD_TYPES else qtype or "other"


def answer_kind(item: QAItem | Mapping[str, Any]) -> str:
    """What the answer is a value of: ``comparison:<relation>`` for a comparison, else the last
    relation of the chain.

    >>> answer_kind({"extra_info": {"question_type": "bridge", "relation": "org.founder>person.occupation"}})
    'person.occupation'
    """
    relation = str(_info(item).get("relation") or "")
    if question_type(item) == "comparison":
        return f"comparison:{relation}"
    return relation.split(">")[-1]


def wrong_answers(items: Iterable[QAItem], pool: Iterable[QAItem]) -> dict[str, str]:
    """id -> a wrong answer of the same kind for each of ``items``: one of the answers of the
    ``pool`` questions of the same :func:`answer_kind` (another entity's value of the same
    relation) that matches none of the question's own answers (SQuAD-normalised), chosen with
    ``random.Random("mia-wrong-expected:<id>")`` from the sorted candidates, so the same
    question always gets the same one. A question with no candidate is left out."""
    by_kind: dict[str, dict[str, str]] = {}
    for it in pool:
        if it.answer:
            by_kind.setdefault(answer_kind(it), {}).setdefault(
                normalize_answer(it.answer), it.answer
            )
    out: dict[str, str] = {}
    for it in items:
        own = {normalize_answer(a) for a in it.answers}
        choices = sorted(a for k, a in by_kind.get(answer_kind(it), {}).items() if k not in own)
        if choices:
            out[it.id] = random.Random(f"mia-wrong-expected:{it.id}").choice(choices)
    return out
