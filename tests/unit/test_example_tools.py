"""The example tool server's logic without gRPC: the calculator is exact (checked against Python's own
integers on random expressions), its schema checks name the property, the guess-the-number episodes
keep their rules, and arguments made from a schema satisfy it."""
import json
import random
import re

import pytest

from tandem.rpc.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound
from tandem.services.tools.examples import calculator, gsm8k
from tandem.services.tools.examples.guess_number import GuessNumber
from tandem.services.tools.examples.server import instance_kwargs
from tandem.tools.schemas import example_arguments, function_problems


def test_calculator_is_exact_on_random_expressions():
    rng = random.Random(0)
    for _ in range(300):
        parts = [str(rng.randint(0, 10 ** rng.randint(1, 40))) for _ in range(rng.randint(1, 6))]
        expr = parts[0]
        for p in parts[1:]:
            expr += rng.choice(["+", "-", "*", " * ", " - -"]) + p
        assert calculator.evaluate(expr) == eval(expr), expr  # noqa: S307 - digits and + - * only


@pytest.mark.parametrize("expr, why", [("", "empty expression"), ("2 +", "expected a number, got the end"),
                                       ("1 2", "expected + - or *, got '2'"), ("2/3", "expected + - or *, got '/'"),
                                       ("9" * 4001, "expression too long: 4001 characters")])
def test_calculator_failures_say_why(expr, why):
    with pytest.raises(calculator.ToolFailed, match=re.escape(why)):
        calculator.evaluate(expr)


def test_calculator_arguments_are_checked_against_the_schema():
    assert calculator.call_tool("add", '{"a": "-5", "b": "12345678901234567890"}') == "12345678901234567885"
    for name, args, message in [("nope", "{}", "no tool named 'nope'"), ("add", "[1]", "must be a JSON object"),
                                ("add", '{"a": "1"}', "missing required property 'b'"),
                                ("add", '{"a": "1", "b": "2", "c": "3"}', "unknown property 'c'"),
                                ("add", '{"a": "1.5", "b": "2"}', "property 'a' must be an integer in decimal digits"),
                                ("calculator", '{"expression": 7}', "property 'expression' must be a string")]:
        with pytest.raises((calculator.UnknownTool, calculator.BadArguments), match=message):
            calculator.call_tool(name, args)
    for tool in calculator.TOOLS:  # the conformance kit's own checks, and its example arguments
        assert function_problems(tool) == []
        params = tool["function"]["parameters"]
        calculator.call_tool(tool["function"]["name"], json.dumps(example_arguments(params)))


def test_gsm8k_checker_answers_from_the_rows_kwargs():
    def check(answer, kwargs):
        return gsm8k.call_tool("calc_gsm8k_reward", json.dumps({"answer": answer}), kwargs)

    def truth(value):
        return {"create_kwargs": {"ground_truth": value}, "execute_kwargs": {"unused": 1}}

    assert check("#### 1,234", truth("1234")) == "answer '1234': correct, score 1.0"
    assert check("It costs $72.0 in all", truth(72)) == "answer '72.0': correct, score 1.0"  # a number from parquet
    assert check("71", truth("72")) == "answer '71': not correct, score 0.0"
    assert check("I do not know", truth("72")) == "answer: no number found, score 0.0"
    with pytest.raises(calculator.ToolFailed, match=re.escape("no ground truth (tools_kwargs.calc_gsm8k_reward.")):
        check("72", {})  # a row without kwargs: the tool's own error, shown to the model
    for kwargs, message in [({"create_kwargs": ["72"]}, "instance_kwargs_json: create_kwargs must be a JSON object"),
                            (truth({"n": 72}), "create_kwargs.ground_truth must be a string or a number, got dict")]:
        with pytest.raises(calculator.BadArguments, match=re.escape(message)):
            check("72", kwargs)
    with pytest.raises(calculator.BadArguments, match="property 'answer' must be a string"):
        gsm8k.call_tool("calc_gsm8k_reward", '{"answer": 72}', truth("72"))
    assert [function_problems(t) for t in gsm8k.TOOLS] == [[]]
    # the request field: empty is none; anything but a JSON object names it
    assert instance_kwargs("") == {} and instance_kwargs('{"create_kwargs": {}}') == {"create_kwargs": {}}
    for text, message in [("{", "instance_kwargs_json: not valid JSON"),
                          ("[1]", "instance_kwargs_json: must be a JSON object, got list")]:
        with pytest.raises(calculator.BadArguments, match=re.escape(message)):  # INVALID_ARGUMENT on the wire
            instance_kwargs(text)


def test_guess_number_episodes():
    env = GuessNumber()
    env.start("a", json.dumps({"secret": 30, "max_turns": 3}))
    assert env.step("a", "50") == ("Lower.", 0.0, False)
    assert env.step("a", "I think 20") == ("Higher.", 0.0, False)
    assert env.step("a", "25") == ("Higher. Out of turns: it was 30.", 0.0, True)
    with pytest.raises(FailedPrecondition, match="the episode is over"):
        env.step("a", "30")
    env.close("a")
    with pytest.raises(NotFound):
        env.close("a")
    env.start("b", "{}")  # the secret comes from the id: the same every time
    secret = random.Random("b").randint(1, 100)
    assert env.step("b", str(secret)) == ("Correct.", 1.0, True)
    with pytest.raises(AlreadyExists):
        env.start("b", "{}")
    for task, message in [("[1]", "must be a JSON object"), ('{"secret": 0}', "'secret' must be an integer from 1"),
                          ("{", "not valid JSON")]:
        with pytest.raises(InvalidArgument, match=message):
            env.start("c", task)
