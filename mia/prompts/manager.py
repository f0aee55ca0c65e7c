"""Memory Manager prompts: workflow compression, question classification, plan choice, and the
text layout of retrieved memories shown to the Planner.

Wording follows the reference's prompts as summarised in docs/reference.md §4 (not copied verbatim).
Templates use ``str.format`` fields; the filled-in values may contain braces safely.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# --- workflow compression (docs/reference.md §4.3 step 2) -------------------------------------------

COMPRESS_PROMPT = (
    "Below is the trace of a research agent that answered a question with search tools.\n\n"
    "{trace}\n\n"
    "Summarise abstractly what the agent did in each major step.\n"
    "- Keep the key query strings and tool parameters.\n"
    "- Write each step as: purpose (input -> output).\n"
    "- Output numbered steps only; do not copy the trace verbatim.\n"
    "- Use at most {max_words} words.\n\n"
    "Example:\n"
    "1. Identify the landmark in the image (input image -> visual search results naming "
    "candidate buildings)\n"
    "2. Narrow down the location (candidate names -> most likely city: Lisbon)\n"
    "3. Verify with a text search (query 'tower Lisbon riverside 16th century' -> confirmation "
    "that it is Belem Tower)"
)
COMPRESS_MAX_WORDS = 300


def compress_prompt(trace: str, max_words: int = COMPRESS_MAX_WORDS) -> str:
    return COMPRESS_PROMPT.format(trace=trace, max_words=max_words)


# --- question classification (docs/reference.md §4.2) ----------------------------------------------

# The answer types (CATEGORIES) are the wire contract's: mia.services.memory.Category.
DEFAULT_CATEGORY = "others"

CLASSIFY_PROMPT = (
    "Classify the question by the type of answer it asks for. Types:\n"
    "- location: a place, country, city, building or address\n"
    "- human: a person or group of people\n"
    "- time: a date, year, period or duration\n"
    "- career: an occupation, role, title or affiliation\n"
    "- process: how something is done or happens\n"
    "- definition: what something is or means\n"
    "- event: something that happened\n"
    "- function: what something is used for\n"
    "- property: an attribute such as size, colour, number or material\n\n"
    "Examples:\n"
    "Question: In which city was this photo taken? -> location\n"
    "Question: Who designed the bridge in the picture? -> human\n"
    "Question: When did the museum open? -> time\n"
    "Question: What does this tool do? -> function\n\n"
    "Question: {question}\n"
    "Reply with exactly one type name from the list."
)


def classify_prompt(question: str) -> str:
    return CLASSIFY_PROMPT.format(question=question)


# --- choosing one of several candidate plans (TTRL /batch_evaluate "choice" rule) ------------

CHOOSE_PLAN_PROMPT = (
    "Several candidate research plans were written for the same question. Pick the plan most "
    "likely to lead to a correct answer.\n\n"
    "## Question\n{question}\n\n"
    "## Plans for similar questions (which worked, which failed)\n{plan_memory}\n\n"
    "## Candidate plans\n{candidates}\n\n"
    "Reply with the number of the best plan only (1 to {n})."
)
PLAN_PAIR_BLOCK = (
    "[Example {i}]\n- Question: {question}\n- Correct plan:\n{correct_plan}\n- Incorrect plan:\n"
    "{incorrect_plan}"
)
CANDIDATE_BLOCK = "### Plan {i}\n{plan}"


def plan_pairs_block(pairs: Sequence[Any]) -> str:
    """Remembered plan pairs (``question``, ``correct_plan``, ``incorrect_plan``) as the
    examples of the plan-choice prompt."""
    return "\n\n".join(
        PLAN_PAIR_BLOCK.format(
            i=i, question=p.question, correct_plan=p.correct_plan, incorrect_plan=p.incorrect_plan
        )
        for i, p in enumerate(pairs, start=1)
    )


def choose_plan_prompt(question: str, plan_memory: str, plans: list[str]) -> str:
    candidates = "\n\n".join(CANDIDATE_BLOCK.format(i=i + 1, plan=p) for i, p in enumerate(plans))
    return CHOOSE_PLAN_PROMPT.format(
        question=question,
        plan_memory=plan_memory or NONE_FOUND,
        candidates=candidates,
        n=len(plans),
    )


# --- retrieved memories as Planner context (docs/reference.md §4.4) ----------------------------------

CONTEXT_HEADER = "# Retrieved Relevant Memories"
POSITIVE_HEADER = "## Positive Examples (Successful Strategies - {n})"
NEGATIVE_HEADER = "## Negative Examples (Failure Lessons - {n})"
NONE_FOUND = "None found."
EXAMPLE_HEADER = "[Example {i}]"
EXAMPLE_LINES = (
    "- Modality: {modality}\n- Judgement: {judgement}\n- Question: {question}\n"
    "{caption_line}- Workflow Summary:\n{workflow_summary}"
)
CAPTION_LINE = "- Image Caption: {caption}\n"
FEEDBACK_LINE = "- Evaluator {i} Feedback: {feedback}"
# A failed memory written with the ground truth (memory.remember_expected; not the reference's):
# the answer that was expected and, in hindsight, the sentence of a search result holding it.
EXPECTED_LINE = "- Expected Answer: {answer}"
EVIDENCE_LINE = '- Where It Was: "{evidence}"'
