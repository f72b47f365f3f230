"""Reward rules, registry and RewardWorker: hand-picked cases, no gRPC, no torch."""

from __future__ import annotations

import pytest

from tandem.services.reward import registry
from tandem.services.reward.registry import (
    REWARD_RULES,
    get_rule,
    register_rule,
    rule_for_data_source,
)
from tandem.services.reward.rules.arithmetic import score_exact_match
from tandem.services.reward.rules.gsm8k import extract_answer, score_gsm8k
from tandem.services.reward.rules.math_boxed import (
    last_boxed_content,
    normalize_answer,
    score_math_boxed,
)
from tandem.services.reward.worker import RewardWorker

# --- arithmetic ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("168", "168", 1.0),
        (" 168\n", "168", 1.0),  # surrounding whitespace is not part of the answer
        ("168", " 168 ", 1.0),
        ("167", "168", 0.0),
        ("1680", "168", 0.0),  # strict: no prefix match
        ("168.0", "168", 0.0),  # strict: no number parsing
        ("0168", "168", 0.0),
        ("168 is the answer", "168", 0.0),
        ("", "168", 0.0),
    ],
)
def test_arithmetic_exact_match(response: str, truth: str, expected: float) -> None:
    assert score_exact_match([response], [truth]) == [expected]


def test_arithmetic_batch_and_extra_columns_ignored() -> None:
    out = score_exact_match(["1", "2", "3"], ["1", "5", "3"], data_source=["x"] * 3, prompt_text=["a"] * 3)
    assert out == [1.0, 0.0, 1.0]


# --- gsm8k --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("She pays 3*6=18 dollars.\n#### 18", "18", 1.0),
        ("#### 1,000", "1000", 1.0),  # thousands comma dropped
        ("#### $1,000.", "1000", 1.0),  # $ and trailing period dropped
        ("#### -7", "-7", 1.0),
        ("#### 2.5", "2.5", 1.0),
        ("#### 18", "1,8", 1.0),  # ground truth normalised the same way
        ("#### 5\nwait, no\n#### 18", "18", 1.0),  # the LAST marker counts
        ("#### 18\nactually\n#### 19", "18", 0.0),
        ("#### 17", "18", 0.0),
        ("The answer is 18", "18", 0.0),  # no marker -> 0 (format score is 0)
        ("####18", "18", 0.0),  # marker is "#### " with the space, as in verl
        ("#### eighteen", "18", 0.0),
        ("#### 18.0", "18", 0.0),  # string compare, no numeric equivalence (documented)
    ],
)
def test_gsm8k(response: str, truth: str, expected: float) -> None:
    assert score_gsm8k([response], [truth]) == [expected]


def test_gsm8k_full_solution_as_ground_truth() -> None:
    truth = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72"
    assert score_gsm8k(["... #### 72", "#### 24"], [truth, truth]) == [1.0, 0.0]
    assert extract_answer("no answer here") is None


# --- math (boxed) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "truth"),
    [
        (r"so the answer is $\boxed{\dfrac{1}{2}}$.", r"\frac{1}{2}"),
        (r"\boxed{\frac12}", r"\frac{1}{2}"),
        (r"\boxed{0.5}", r"\frac{1}{2}"),  # verl's only numeric special case
        (r"\boxed{.5}", r"\frac{1}{2}"),
        (r"\boxed{3/4}", r"\frac{3}{4}"),
        (r"\boxed{90^\circ}", "90"),
        (r"\boxed{90^{\circ}}", "90"),
        (r"\boxed{5\text{ cm}}", "5"),  # trailing units removed
        (r"\boxed{5 \mbox{cm}}", "5"),
        (r"\boxed{\text{(A)}}", "(A)"),  # whole-answer \text unwrapped
        (r"\boxed{50\%}", "50"),
        (r"\boxed{\left( 3, \frac{\pi}{2} \right)}", r"(3,\frac{\pi}{2})"),
        (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt3}{2}"),  # nested braces, \sqrt3 -> \sqrt{3}
        (r"\boxed{x = 3}", "3"),
        (r"\boxed{1\!000}", "1000"),
        (r"\boxed{7.}", "7"),  # trailing period
        (r"The answer is \boxed 5.", "5"),  # brace-less form
        (r"$\boxed 12$", "12"),
        (r"\fbox{7}", "7"),
        (r"first \boxed{1}, finally \boxed{2}", "2"),  # last box counts
    ],
)
def test_math_boxed_correct(response: str, truth: str) -> None:
    assert score_math_boxed([response], [truth]) == [1.0]


@pytest.mark.parametrize(
    ("response", "truth"),
    [
        (r"\boxed{4}", "3"),  # wrong
        ("the answer is 3", "3"),  # no box
        (r"\boxed{3", "3"),  # unbalanced braces
        (r"\boxed", "3"),
        (r"\boxed{}", ""),  # empty ground truth never gives a free 1.0
        (r"\boxed{2} no wait \boxed{3}", "2"),  # last box counts
    ],
)
def test_math_boxed_wrong_or_missing(response: str, truth: str) -> None:
    assert score_math_boxed([response], [truth]) == [0.0]


# math-verify's equivalence: (boxed answer, ground truth, equal?). The two cases first.
MATH_VERIFY_TABLE = [
    (r"2/4", r"\frac{1}{2}", True),
    (r"3.0", "3", True),
    (r"x+1", "1+x", True),
    (r"\frac{\sqrt{2}}{2}", r"\frac{1}{\sqrt{2}}", True),
    (r"0.50", r"\frac12", True),
    (r"\dfrac{6}{8}", "0.75", True),
    (r"2\pi", r"\pi \cdot 2", True),
    (r"(1,2)", "(1, 2)", True),
    (r"x^2+2x+1", r"(x+1)^2", True),
    (r"1/3", "0.33", False),  # rounded is not equal
    (r"2/4", r"\frac{1}{4}", False),
    (r"3.01", "3", False),
    (r"x-1", "1-x", False),
    (r"\sqrt{2}", "2", False),
    (r"(1,2)", "(2, 1)", False),
    (r"x+1", "x+2", False),
]


@pytest.mark.parametrize(("answer", "truth", "same"), MATH_VERIFY_TABLE)
def test_math_boxed_equivalence_by_math_verify(answer: str, truth: str, same: bool) -> None:
    assert score_math_boxed([rf"so \boxed{{{answer}}}"], [truth]) == [1.0 if same else 0.0]


def test_math_verify_runs_off_the_main_thread_and_long_answers_are_strings_only() -> None:
    """The reward service scores on a worker thread: math-verify's signal timeouts must be off there."""
    import threading

    out = []
    worker = threading.Thread(target=lambda: out.append(score_math_boxed([r"\boxed{2/4}"], [r"\frac{1}{2}"])))
    worker.start()
    worker.join(timeout=60)
    assert out == [[1.0]]
    long = "+".join(["1"] * 300)  # over MAX_VERIFY_CHARS: no sympy, string comparison only
    assert score_math_boxed([rf"\boxed{{{long}}}"], ["300"]) == [0.0]
    assert score_math_boxed([rf"\boxed{{{long}}}"], [long]) == [1.0]


def test_math_helpers() -> None:
    assert last_boxed_content(r"a \boxed{\frac{1}{\sqrt{2}}} b") == r"\frac{1}{\sqrt{2}}"
    assert last_boxed_content("nothing") is None
    assert normalize_answer(r"\left[ 1, 2 \right]") == "[1,2]"
    assert normalize_answer(r"\$5") == "5"


# --- registry -----------------------------------------------------------------


def test_registry_builtins() -> None:
    assert get_rule("arithmetic") is score_exact_match
    assert get_rule("gsm8k") is score_gsm8k
    assert get_rule("math") is score_math_boxed


def test_registry_duplicate_raises() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_rule("gsm8k", lambda responses, ground_truths, **kw: [0.0] * len(responses))
    assert get_rule("gsm8k") is score_gsm8k  # unchanged


def test_registry_unknown_lists_known() -> None:
    with pytest.raises(ValueError, match=r"unknown reward rule 'nope'.*arithmetic.*gsm8k.*math"):
        get_rule("nope")


@pytest.mark.parametrize(
    ("source", "rule"),
    [
        ("openai/gsm8k", "gsm8k"),
        ("lighteval/MATH", "math"),
        ("DigitalLearningGmbH/MATH-lighteval", "math"),
        ("math_dapo", "math"),
        ("aime2024", "math"),
        ("tandem/arithmetic", "arithmetic"),
        ("gsm8k", "gsm8k"),  # a registered rule name selects itself
        ("someone/unknown", "arithmetic"),
        ("", "arithmetic"),
        (None, "arithmetic"),
    ],
)
def test_rule_for_data_source(source: str | None, rule: str) -> None:
    assert rule_for_data_source(source, default="arithmetic") == rule


def test_rule_for_data_source_default_is_configurable_and_validated() -> None:
    assert rule_for_data_source("someone/unknown", default="math") == "math"
    with pytest.raises(ValueError, match="known rules"):
        rule_for_data_source("openai/gsm8k", default="nope")


@pytest.fixture
def temp_rule(monkeypatch: pytest.MonkeyPatch):
    """Register rules for one test only."""
    monkeypatch.setattr(registry, "REWARD_RULES", dict(REWARD_RULES))
    return registry.register_rule


# --- worker -------------------------------------------------------------------


def test_worker_rejects_unknown_default() -> None:
    with pytest.raises(ValueError, match="known rules"):
        RewardWorker(default_rule="nope")


def test_worker_mixed_sources_keep_row_order() -> None:
    worker = RewardWorker(default_rule="arithmetic")
    responses = ["#### 18", "168", r"\boxed{\frac12}", "#### 3", "12", r"\boxed{9}"]
    truths = ["18", "168", "0.5", "4", "12", "9"]
    sources = ["openai/gsm8k", "tandem/arithmetic", "lighteval/MATH", "openai/gsm8k", "unknown/src", "math_dapo"]
    assert worker.score(responses, truths, sources) == [1.0, 1.0, 1.0, 0.0, 1.0, 1.0]


def test_worker_without_data_source_uses_default() -> None:
    assert RewardWorker("gsm8k").score(["#### 7", "7"], ["7", "7"]) == [1.0, 0.0]
    assert RewardWorker().score([], []) == []


def test_worker_calls_each_rule_once_with_its_rows_and_columns(temp_rule) -> None:
    calls = []

    def spy(responses, ground_truths, **kw):
        calls.append((responses, ground_truths, kw))
        return [None if r == "skip" else 0.25 for r in responses]

    temp_rule("spy", spy)
    worker = RewardWorker()
    out = worker.score(
        ["a", "1", "skip"],
        ["x", "1", "y"],
        data_source=["spy", "tandem/arithmetic", "spy"],
        extra_info=[{"i": 0}, {"i": 1}, {"i": 2}],
        prompt_text=["p0", "p1", "p2"],
    )
    assert out == [0.25, 1.0, 0.0]  # None ("not applicable") -> 0.0
    assert calls == [
        (
            ["a", "skip"],
            ["x", "y"],
            {"data_source": ["spy", "spy"], "extra_info": [{"i": 0}, {"i": 2}], "prompt_text": ["p0", "p2"]},
        )
    ]


def test_worker_broken_rule_is_not_a_bad_request(temp_rule) -> None:
    temp_rule("short", lambda responses, ground_truths, **kw: [1.0])
    with pytest.raises(RuntimeError, match="'short' returned 1 scores for 2 rows"):
        RewardWorker("short").score(["a", "b"], ["a", "b"])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"ground_truth": ["1"]},
        {"data_source": ["openai/gsm8k"]},
        {"extra_info": [{}, {}, {}]},
        {"prompt_text": []},
    ],
)
def test_worker_length_mismatch_raises(kwargs: dict) -> None:
    args = {"response_text": ["1", "2"], "ground_truth": ["1", "2"], **kwargs}
    with pytest.raises(ValueError, match="one entry per row"):
        RewardWorker().score(**args)
