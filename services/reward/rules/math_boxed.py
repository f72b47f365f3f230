"""MATH-style reward: the last ``\\boxed{...}`` answer against the ground truth, with
math-verify's equivalence (Hugging Face's ``math-verify``: LaTeX -> sympy, ``2/4`` ==
``\\frac{1}{2}``, ``3.0`` == ``3``, ``x+1`` == ``1+x``, ``10\\%`` == ``0.1``... ).

Extraction follows verl's ``reward_score/math.py`` (Hendrycks MATH): the last
``\\boxed{...}`` (balanced braces; ``\\fbox{...}`` and the brace-less ``\\boxed 5``
form also count); no box -> 0.0. The boxed answer is then equal (1.0) when its
normalised string equals the normalised ground truth (verl's ``strip_string`` with
the robustness changes below; cheap, and covers answers sympy cannot parse), or
when math-verify finds the two equivalent.

Robustness changes to the string normalisation: no ``assert``/exceptions on odd
input (every helper returns its input unchanged when it cannot parse it), a
trailing period is dropped, ``\\text{...}``/``\\mbox{...}`` wrappers are unwrapped
and trailing units removed whatever their spacing, bare ``%``/``$`` are dropped,
and ``\\boxed 12`` takes one whitespace-delimited token.

math-verify runs on the reward service's worker thread, where its signal-based
timeouts cannot work (they need the main thread): they are off, and an answer or
ground truth longer than ``MAX_VERIFY_CHARS`` is compared as a string only, so a
pathological expression cannot stall the service.
"""

from __future__ import annotations

import logging
from typing import Any

from math_verify import parse, verify

MAX_VERIFY_CHARS = 400
logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout is disabled" on every call

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_TEXT_COMMANDS = ("\\text", "\\textbf", "\\mbox")


def _matching_brace(s: str, open_idx: int) -> int | None:
    """Index of the ``}`` closing the ``{`` at ``open_idx``, or None if unbalanced."""
    depth = 0
    for i in range(open_idx, len(s)):
        if s[i] == "{":
            depth += 1
        elif s[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


def last_boxed_content(response: str) -> str | None:
    """Content of the last ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed x``; None if absent or unbalanced."""
    idx, command = max((response.rfind(c), c) for c in _BOX_COMMANDS)
    if idx < 0:
        return None
    rest = idx + len(command)
    if response.startswith("{", rest):
        close = _matching_brace(response, rest)
        return None if close is None else response[rest + 1 : close]
    if rest < len(response) and response[rest] == " ":
        # "\boxed 5." form: one token, ending at whitespace or a closing "$".
        token = response[rest:].lstrip(" ").split(maxsplit=1)
        return token[0].split("$")[0] if token else None
    return None


def _unwrap_text(s: str) -> str:
    """Drop trailing units (``5\\text{ cm}`` -> ``5``), then unwrap remaining ``\\text{X}`` -> ``X``."""
    for command in _TEXT_COMMANDS:
        start = s.rfind(command + "{")
        if start > 0 and s[:start].strip() and _matching_brace(s, start + len(command)) == len(s) - 1:
            s = s[:start]
    for command in _TEXT_COMMANDS:
        while (start := s.find(command + "{")) >= 0:
            close = _matching_brace(s, start + len(command))
            if close is None:
                break
            s = s[:start] + s[start + len(command) + 1 : close] + s[close + 1 :]
    return s


def _fix_fracs(s: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{72}`` -> ``\\frac{1}{72}``."""
    parts = s.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if part.startswith("{") or len(part) < 2:
            out += part
        elif part[1] == "{":
            out += "{" + part[0] + "}" + part[1:]
        else:
            out += "{" + part[0] + "}{" + part[1] + "}" + part[2:]
    return out


def _fix_a_slash_b(s: str) -> str:
    """``3/4`` -> ``\\frac{3}{4}`` when both sides are plain integers."""
    a, sep, b = s.partition("/")
    if sep and a.isdigit() and b.isdigit():
        return "\\frac{" + str(int(a)) + "}{" + str(int(b)) + "}"
    return s


def _fix_sqrt(s: str) -> str:
    """``\\sqrt3`` -> ``\\sqrt{3}``."""
    parts = s.split("\\sqrt")
    out = parts[0]
    for part in parts[1:]:
        out += "\\sqrt" + (part if not part or part[0] == "{" else "{" + part[0] + "}" + part[1:])
    return out


def normalize_answer(s: str) -> str:
    """verl/Hendrycks ``strip_string`` plus the robustness changes in the module docstring."""
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "").replace("$", "")
    s = _unwrap_text(s)
    s = s.replace("\\%", "").replace("%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    s = s.strip()
    if s.startswith("."):
        s = "0" + s
    # "k = 5" -> "5" (short variable name on the left of a single "=").
    lhs, sep, rhs = s.partition("=")
    if sep and "=" not in rhs and len(lhs.strip()) <= 2:
        s = rhs
    s = _fix_sqrt(s)
    s = s.replace(" ", "").rstrip(".")
    s = _fix_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _fix_a_slash_b(s)


def equivalent(answer: str, ground_truth: str) -> bool:
    """The boxed `answer` and the ground truth are the same answer (see the module docstring)."""
    expected = normalize_answer(ground_truth)
    if expected == "":
        return False
    if normalize_answer(answer) == expected:
        return True
    if len(answer) > MAX_VERIFY_CHARS or len(ground_truth) > MAX_VERIFY_CHARS:
        return False
    gold = parse(f"${ground_truth}$", parsing_timeout=None)
    pred = parse(f"\\boxed{{{answer}}}", parsing_timeout=None)
    return bool(gold and pred and verify(gold, pred, timeout_seconds=None))


def score_math_boxed(responses: list[str], ground_truths: list[str], **kw: Any) -> list[float | None]:
    """1.0 where the last boxed answer is equivalent to the ground truth, else 0.0."""
    scores: list[float | None] = []
    for response, ground_truth in zip(responses, ground_truths, strict=True):
        answer = last_boxed_content(response)
        scores.append(1.0 if answer is not None and equivalent(answer, ground_truth) else 0.0)
    return scores
