"""Optional question classifier (docs/reference.md §4.2): picks one of ten categories with the manager
LLM so memories are bucketed by question type. Off by default (every question -> "others", as in
all of the reference's TTRL services)."""

from __future__ import annotations

import logging
import re
from collections import OrderedDict

from memory_serve.config import ClassifierConfig
from memory_serve.llms import sampling
from mia.llm.base import ChatBackend, LLMError
from mia.llm.think import text_after_think
from mia.prompts.manager import DEFAULT_CATEGORY, classify_prompt
from mia.services.memory import CATEGORIES

log = logging.getLogger("memory_serve.classify")
_WORD = re.compile(r"[a-z]+")


def parse_category(text: str) -> str:
    """The first category name in the reply (after any reasoning); ``others`` if none."""
    for word in _WORD.findall(text_after_think(text).lower()):
        if word in CATEGORIES:
            return word
    return DEFAULT_CATEGORY


class Classifier:
    def __init__(self, cfg: ClassifierConfig, llm: ChatBackend | None) -> None:
        self.cfg = cfg
        self.llm = llm
        self._cache: OrderedDict[str, str] = OrderedDict()  # event-loop only: no lock needed

    @property
    def enabled(self) -> bool:
        return self.cfg.enabled and self.llm is not None

    async def classify(self, question: str) -> str:
        if not self.enabled:
            return DEFAULT_CATEGORY
        if question in self._cache:
            self._cache.move_to_end(question)
            return self._cache[question]
        assert self.llm is not None
        try:
            result = await self.llm.chat(
                [{"role": "user", "content": classify_prompt(question)}],
                sampling(self.llm, temperature=0.0, max_tokens=self.cfg.max_tokens),
            )
            category = parse_category(result.text)
        except LLMError as err:
            # The reference's rule: an unclassifiable question goes to "others".
            log.warning("classifier failed (%s); using %r", err, DEFAULT_CATEGORY)
            return DEFAULT_CATEGORY
        self._cache[question] = category
        while len(self._cache) > self.cfg.cache_size:
            self._cache.popitem(last=False)
        return category
