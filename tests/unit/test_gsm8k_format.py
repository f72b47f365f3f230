"""tandem/tasks/gsm8k_format.py: the built-in task in verl's gsm8k schema and answer format."""
import pyarrow.parquet as pq
from transformers import AutoTokenizer

from tandem.controller.data import load_examples
from tandem.services.reward.registry import rule_for_data_source
from tandem.services.reward.rules.gsm8k import score_gsm8k
from tandem.tasks.gsm8k_format import write_gsm8k_format


def test_gsm8k_format_rows_tokenizer_and_verifier(tmp_path):
    paths = write_gsm8k_format(str(tmp_path), train_size=30, val_size=5, seed=2)
    train = pq.read_table(paths["train"]).to_pylist()
    val = pq.read_table(paths["val"]).to_pylist()
    assert len(train) == 30 and len(val) == 5
    assert not {r["prompt"][0]["content"] for r in train} & {r["prompt"][0]["content"] for r in val}
    row = train[0]
    question = row["prompt"][0]["content"]
    a, b = map(int, question.rstrip("=").split("+"))
    assert row["data_source"] == "openai/gsm8k" and rule_for_data_source("openai/gsm8k", "arithmetic") == "gsm8k"
    assert row["reward_model"]["ground_truth"] == str(a + b)
    assert row["extra_info"]["answer"] == f"#### {a + b}"
    # the SFT target scores 1 under the '#### answer' verifier, a bare number 0
    truth = row["reward_model"]["ground_truth"]
    assert score_gsm8k([row["extra_info"]["answer"], str(a + b)], [truth, truth]) == [1.0, 0.0]
    # the tokenizer reads every character of the answer and renders prompts with its chat template
    tok = AutoTokenizer.from_pretrained(paths["tokenizer"])
    ids = tok(row["extra_info"]["answer"], add_special_tokens=False)["input_ids"]
    assert tok.pad_token_id not in ids and tok.decode(ids) == row["extra_info"]["answer"]
    assert tok.chat_template and load_examples(paths["train"], tok, 16)[0].prompt_text == question
