"""What a run needs from its files is checked when the config loads, before any service starts
(tandem/config/checks/files.py, model_file.py), one test per error; each names the key and the file."""
import json
import shutil
import subprocess
import sys

import pytest

from tandem.config import ConfigError, load_config
from tandem.config.paths import check_paths

CONFIG = dict(architectures=["Qwen2ForCausalLM"], vocab_size=128, hidden_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
              rms_norm_eps=1e-6, rope_theta=10000)


def error_of(*overrides) -> str:
    """The error the controller stops with (load_config, then the files only it reads: check_paths)."""
    with pytest.raises(ConfigError) as e:
        check_paths(load_config(None, list(overrides)))
    return str(e.value)


def tokenizer(path, vocab: list[str], eos: str | None = "<eos>"):
    """A word-level fast tokenizer over `vocab`, saved to `path`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(vocab)}, unk_token=vocab[0] if vocab else None))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    special = {"eos_token": eos} if eos else {}
    PreTrainedTokenizerFast(tokenizer_object=core, **special).save_pretrained(str(path))
    return path


def model_dir(path, weights: bool = True, tok: list[str] | None = None, **config):
    """config.json (a tiny Qwen2 unless overridden), a weights file, a tokenizer when `tok` is given."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({**CONFIG, **config}))
    if weights:
        (path / "model.safetensors").write_bytes(b"")
    if tok is not None:
        tokenizer(path, tok)
    return path


VOCAB = ["<unk>", "<eos>", "a", "b", "c"]


def test_model_without_tokenizer_files(tmp_path):
    msg = error_of(f"actor_rollout_ref.model.path={model_dir(tmp_path / 'm')}")
    assert msg.startswith("actor_rollout_ref.model.path:") and "has no tokenizer files" in msg
    assert str(tmp_path / "m") in msg and "tokenizer_path" in msg  # where it would come from instead


def test_model_without_weights(tmp_path):
    msg = error_of(f"actor_rollout_ref.model.path={model_dir(tmp_path / 'm', weights=False, tok=VOCAB)}")
    assert msg == f"actor_rollout_ref.model.path: '{tmp_path / 'm'}' has config.json but no *.safetensors weights"


def test_empty_vocabulary(tmp_path):
    tok = tokenizer(tmp_path / "tok", [], eos=None)
    msg = error_of(f"actor_rollout_ref.model.path={model_dir(tmp_path / 'm')}", f"actor_rollout_ref.model.tokenizer_path={tok}")
    assert msg.startswith("actor_rollout_ref.model.tokenizer_path:") and "vocabulary is empty" in msg


def test_tokenizer_without_eos(tmp_path):
    tok = tokenizer(tmp_path / "tok", VOCAB, eos=None)
    msg = error_of(f"actor_rollout_ref.model.path={model_dir(tmp_path / 'm')}", f"actor_rollout_ref.model.tokenizer_path={tok}")
    assert msg.startswith("actor_rollout_ref.model.tokenizer_path:") and "no EOS token" in msg


def test_tokenizer_ids_beyond_the_models_vocabulary(tmp_path):
    tok = tokenizer(tmp_path / "tok", VOCAB + [f"w{i}" for i in range(200)])
    msg = error_of(f"actor_rollout_ref.model.path={model_dir(tmp_path / 'm')}", f"actor_rollout_ref.model.tokenizer_path={tok}")
    assert "205 tokens, more than the model's vocab_size=128" in msg and str(tok) in msg


def test_unsupported_architecture(tmp_path):
    msg = error_of(f"actor_rollout_ref.model.path={model_dir(tmp_path / 'm', tok=VOCAB, architectures=['GemmaForCausalLM'])}")
    assert msg.startswith("actor_rollout_ref.model.path: unsupported HF config: architectures=['GemmaForCausalLM']")
    assert "Qwen3ForCausalLM" in msg  # the known ones are listed


def test_data_file_missing_or_not_data(tmp_path):
    assert error_of(f"data.train_files={tmp_path}/train.parquet") == \
        f"data.train_files: '{tmp_path}/train.parquet' does not exist"
    (tmp_path / "train.csv").write_text("prompt\nx\n")
    assert "expected a .parquet or .jsonl file" in error_of(f"data.train_files={tmp_path}/train.csv")
    (tmp_path / "bad.parquet").write_text("not parquet")
    assert "is not readable as parquet" in error_of(f"data.val_files={tmp_path}/bad.parquet")


def test_prompt_column_missing(tmp_path):
    rows = [{"question": [{"role": "user", "content": "1+1="}], "reward_model": {"ground_truth": "2"}}]
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    msg = error_of(f"data.train_files={tmp_path}/t.jsonl")
    assert msg.startswith(f"data.train_files: '{tmp_path}/t.jsonl' has no column 'prompt' (data.prompt_key)")
    check_paths(load_config(None, [f"data.train_files={tmp_path}/t.jsonl", "data.prompt_key=question"]))  # verl's key fixes it


def test_cli_stops_before_any_service(tmp_path):
    """The issue's case: weights and config.json but no tokenizer used to fail 16 s into the run."""
    model = model_dir(tmp_path / "m")
    shutil.copy(model / "config.json", tmp_path / "config.json")
    r = subprocess.run([sys.executable, "-m", "tandem.controller", "run", f"actor_rollout_ref.model.path={model}",
                        f"trainer.default_local_dir={tmp_path}/runs"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "has no tokenizer files" in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "runs").exists()  # no run directory, no service
