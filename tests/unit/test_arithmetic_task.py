"""The built-in task's data (tandem/tasks/arithmetic.py): the fixed-width format (the default)
and the unpadded one draw the same operands; train and val are disjoint; the run writes the
format its config names."""
import pyarrow.parquet as pq

from tandem.tasks.arithmetic import make_problems, write_dataset


def test_fixed_width_pads_operands_to_3_digits_and_the_sum_to_4():
    plain, fixed = make_problems(200, seed=5), make_problems(200, seed=5, fixed_width=True)
    assert len(fixed) == 200
    for (p, a), (fp, fa) in zip(plain, fixed):
        x, y = p[:-1].split("+")
        assert fp == f"{int(x):03d}+{int(y):03d}=" and len(fp) == 8
        assert fa == f"{int(a):04d}" and int(fa) == int(x) + int(y)
    assert any(len(p) < 8 for p, _ in plain)  # the unpadded format does vary in width


def test_written_dataset_is_disjoint_and_in_the_asked_format(tmp_path):
    for fixed in (True, False):
        train, val = write_dataset(str(tmp_path / str(fixed)), 300, 40, seed=2, fixed_width=fixed)
        rows = {name: pq.read_table(path).to_pylist() for name, path in (("train", train), ("val", val))}
        prompts = {n: [r["prompt"][0]["content"] for r in rs] for n, rs in rows.items()}
        assert len(prompts["train"]) == 300 and len(prompts["val"]) == 40
        assert set(prompts["train"]).isdisjoint(prompts["val"])
        widths = {len(r["reward_model"]["ground_truth"]) for rs in rows.values() for r in rs}
        assert (widths == {4}) if fixed else (len(widths) > 1)


def test_a_run_writes_the_configured_format(tmp_path):
    from tandem.config import load_config
    from tandem.controller.run_dir import create_run_dir

    for fixed, padded in ((None, True), ("false", False)):  # the default is fixed width
        keys = [f"trainer.default_local_dir={tmp_path / str(fixed)}", "data.builtin_train_size=20",
                "data.builtin_val_size=4"] + ([f"data.builtin_fixed_width={fixed}"] if fixed else [])
        cfg, _ = create_run_dir(load_config(None, keys))
        prompts = [r["prompt"][0]["content"] for r in pq.read_table(cfg.data.train_files).to_pylist()]
        assert all(len(p) == 8 for p in prompts) if padded else any(len(p) < 8 for p in prompts)
