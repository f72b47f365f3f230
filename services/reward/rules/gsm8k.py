"""GSM8K reward: the final answer after the last ``"#### "`` marker.

Mirrors verl's ``reward_score/gsm8k.py`` "strict" method: the response must use
GSM8K's own answer format ``#### <number>``; the number is normalised by
dropping thousands commas, ``$`` and a trailing period, then compared as a
string with the (equally normalised) ground truth. Correct -> 1.0; wrong or no
marker -> 0.0 (verl's default ``format_score`` is 0, so there is no partial
credit for format alone).

One deliberate difference from verl: verl takes the last *regex match* of
``#### <number>``, so ``"#### 5 ... #### five"`` scores the 5. Here only the text
after the LAST marker counts (what the model finally committed to), so that
example scores 0. verl also clips the response to its last 300 characters
before matching; we do not, because the answer marker is searched with
``rfind`` and the cost is linear anyway.

Not done: numeric equivalence ("18.0" vs "18"), the "flexible" method (last
number anywhere).
"""

from __future__ import annotations

import re
from typing import Any

ANSWER_MARKER = "#### "
# A (possibly negative, possibly $-prefixed) number right after the marker.
_NUMBER_RE = re.compile(r"\s*\$?\s*(-?[0-9][0-9.,]*|-?\.[0-9][0-9,]*)")


def normalize_number(text: str) -> str:
    """Drop whitespace, thousands commas, ``$`` and trailing periods: ``"$1,000."`` -> ``"1000"``."""
    return text.strip().replace(",", "").replace("$", "").replace(" ", "").rstrip(".")


def extract_answer(response: str) -> str | None:
    """Normalised number after the last ``"#### "``, or None when absent."""
    idx = response.rfind(ANSWER_MARKER)
    if idx < 0:
        return None
    match = _NUMBER_RE.match(response, idx + len(ANSWER_MARKER))
    if match is None:
        return None
    answer = normalize_number(match.group(1))
    return answer or None


def normalize_ground_truth(ground_truth: str) -> str:
    """Accept either the bare answer ("1,000") or a full GSM8K solution ending in "#### 1000"."""
    if ANSWER_MARKER in ground_truth:
        extracted = extract_answer(ground_truth)
        if extracted is not None:
            return extracted
    return normalize_number(ground_truth)


def score_gsm8k(responses: list[str], ground_truths: list[str], **kw: Any) -> list[float | None]:
    """1.0 where the answer after the last ``#### `` equals the ground truth, else 0.0."""
    scores: list[float | None] = []
    for response, ground_truth in zip(responses, ground_truths, strict=True):
        answer = extract_answer(response)
        scores.append(1.0 if answer is not None and answer == normalize_ground_truth(ground_truth) else 0.0)
    return scores
