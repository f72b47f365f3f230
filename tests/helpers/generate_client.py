"""`python tests/helpers/generate_client.py HOST:PORT CONFIG.yaml`: one greedy GenerateSequences call.

Prints {"rows": ..., "responses": [[token ids]...]} as JSON. For tests that call a service from
another network namespace (`ip netns exec NS python tests/helpers/generate_client.py ...`).
"""
import asyncio
import json
import sys

from tandem.config import load_config
from tandem.controller.clients import RolloutClient
from tandem.controller.data import collate, load_examples


async def main(endpoint: str, config_path: str) -> None:
    from transformers import AutoTokenizer

    cfg = load_config(config_path)
    tokenizer = AutoTokenizer.from_pretrained(cfg.actor_rollout_ref.model.tokenizer_path)
    examples = load_examples(cfg.data.val_files, tokenizer, cfg.data.max_prompt_length)[:4]
    client = RolloutClient(endpoint, timeout_s=120)
    try:
        await client.wait_healthy(timeout_s=60)
        out = await client.generate_sequences(collate(examples, tokenizer.pad_token_id),
                                              max_new_tokens=cfg.data.max_response_length, greedy=True)
    finally:
        await client.close()
    print(json.dumps({"rows": int(out["responses"].shape[0]), "responses": out["responses"].tolist()}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
