"""`tandem run` with a bad file or argument (or a service it would start beyond loopback without a token)
stops before anything starts: exit 2, one line that names the problem (and the file, line and column for
YAML), and no run directory (so no service was started: a run's services are started after its
directory is made). main() runs in process."""
import pytest

from tandem.controller.__main__ import main

GOOD_REWARD = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n"
FILES = {
    "yaml_syntax.yaml": "data:\n  train_batch_size: 4\n  max_prompt_length: [16\ntrainer:\n  save_freq: 1\n",
    "tab_indented.yaml": "data:\n\ttrain_batch_size: 4\n",
    "top_level_list.yaml": "- data\n- trainer\n",
    "reward_syntax.py": "def compute_score(data_source, solution_str:\n    return 1.0\n",
    "reward_other_name.py": GOOD_REWARD.replace("compute_score", "score"),
}
CASES = {  # args (a file name of FILES is replaced by its path) -> the one line, after "tandem: config error: "
    "yaml syntax error": (["{yaml_syntax.yaml}"],
                          "{yaml_syntax.yaml}:4:8: YAML syntax error: expected ',' or ']', but got ':' "
                          "(while parsing a flow sequence)"),
    "tab indentation": (["{tab_indented.yaml}"],
                        "{tab_indented.yaml}:2:1: YAML syntax error: a tab; YAML indents with spaces, not tabs"),
    "top-level list": (["{top_level_list.yaml}"], "{top_level_list.yaml}: the config must be a mapping of sections "
                                                "(actor_rollout_ref:, data:, ...), not a list"),
    "reward file that does not import": (["custom_reward_function.path={reward_syntax.py}"],
                                         "custom_reward_function.path: importing '{reward_syntax.py}' raised "
                                         "SyntaxError: '(' was never closed (line 1, column 18)"),
    "reward file without the function": (["custom_reward_function.path={reward_other_name.py}"],
                                         "custom_reward_function.name: '{reward_other_name.py}' defines no "
                                         "function 'compute_score'"),
    "override without '='": (["trainer.total_training_steps", "5"],
                             "2 config problems:"),
    "first override without '='": (["trainer.total_training_steps"],
                                   "'trainer.total_training_steps' is an override missing '=' (key=value), "
                                   "or a config file that does not exist"),
    "missing config file": (["nowhere.yaml"], "config file 'nowhere.yaml' does not exist"),
    "a service beyond loopback without a token": (["services.reward.host=0.0.0.0"],
                                                  "services.reward.host: 0.0.0.0 is reachable beyond loopback and no "
                                                  "bearer token is set: set services.reward.auth.token_file (or "
                                                  ".token_env), or services.insecure=true to serve without one"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_exits_2_with_one_line_before_anything_starts(case, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    paths = {}
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
        paths[name] = str(tmp_path / name)
    args, expected = CASES[case]

    def fill(text: str) -> str:
        for name, path in paths.items():
            text = text.replace("{" + name + "}", path)
        return text

    args = [fill(a) for a in args]
    runs = tmp_path / "runs"
    assert main(["run", *args, f"trainer.default_local_dir={runs}"]) == 2
    err = capsys.readouterr().err
    expected = f"tandem: config error: {fill(expected)}"
    if case == "override without '='":  # both arguments, one line each
        assert err.splitlines() == [expected, "- 'trainer.total_training_steps' is an override missing '=' "
                                    "(key=value), or a config file that does not exist",
                                    "- '5' is an override missing '=' (key=value)"], err
    else:
        assert err.splitlines() == [expected], err
    assert not runs.exists()  # no run directory: nothing started


def test_a_good_reward_file_passes_the_check(tmp_path):
    """Control: the check imports a file that works, so the cases above fail for their own reason."""
    from tandem.config import load_config
    from tandem.controller.command_line import check_before_start

    (tmp_path / "reward.py").write_text(GOOD_REWARD)
    check_before_start(load_config(None, [f"custom_reward_function.path={tmp_path / 'reward.py'}"]))
