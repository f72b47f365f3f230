"""MATH-style reward: the last ``\\boxed{...}`` answer, compared after string normalisation.

Follows verl's ``reward_score/math.py`` (Hendrycks MATH ``strip_string``): take
the last ``\\boxed{...}`` (balanced braces; ``\\fbox{...}`` and the brace-less
``\\boxed 5`` form also count), normalise both it and the ground truth, and
compare strings. Equal -> 1.0, otherwise (including no box) -> 0.0.

Differences from verl, all toward robustness: no ``assert``/exceptions on odd
input (every helper returns its input unchanged when it cannot parse it), a
trailing period is dropped, ``\\text{...}``/``\\mbox{...}`` wrappers are
unwrapped and trailing units removed whatever their spacing, bare ``%``/``$``
are dropped, and ``\\boxed 12`` takes one whitespace-delimited token rather than
everything up to the next ``$``.

Deliberately NOT done: symbolic equivalence (no sympy), so ``2/4`` vs
``\\frac{1}{2}`` or ``x+1`` vs ``1+x`` are different answers. The only
numeric special case is verl's own ``0.5`` -> ``\\frac{1}{2}``.
"""

from __future__ import annotations

from typing import Any

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


def score_math_boxed(responses: list[str], ground_truths: list[str], **kw: Any) -> list[float | None]:
    """1.0 where the last boxed answer equals the ground truth after normalisation, else 0.0."""
    scores: list[float | None] = []
    for response, ground_truth in zip(responses, ground_truths, strict=True):
        answer = last_boxed_content(response)
        expected = normalize_answer(ground_truth)
        ok = answer is not None and expected != "" and normalize_answer(answer) == expected
        scores.append(1.0 if ok else 0.0)
    return scores
