"""Reward for Tandem's built-in arithmetic task.

The prompt looks like ``"123+45="`` and the model should answer the sum as
digits followed by EOS. The response text reaching this rule has had special
tokens (EOS, padding) removed by the rollout's detokenizer.

Scoring is deliberately strict: 1.0 iff ``response.strip() == ground_truth.strip()``,
else 0.0. No partial credit, no number parsing ("168" vs "168.0" vs "0168" are
different answers), no extraction from surrounding text: the task is small
enough that the policy must learn the exact output format, and a lenient
parser would let "168 is the answer" or "1680" style drift go unpunished.
"""

from __future__ import annotations

from typing import Any


def score_exact_match(
    responses: list[str], ground_truths: list[str], **kw: Any
) -> list[float | None]:
    """1.0 where the stripped response equals the stripped ground truth, else 0.0."""
    return [1.0 if r.strip() == g.strip() else 0.0 for r, g in zip(responses, ground_truths, strict=True)]


def score_final_answer(
    responses: list[str], ground_truths: list[str], **kw: Any
) -> list[float | None]:
    """The built-in tool task (tandem/tasks/calculator_tool.py): exact match of what follows the last
    tool observation, `[a+b]{sum}ANSWER` -> ANSWER (a row without a call is scored whole)."""
    return score_exact_match([r.rsplit("}", 1)[-1] for r in responses], ground_truths)
