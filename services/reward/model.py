"""The reward model: a Hugging Face XForSequenceClassification checkpoint on megatron-core, one
score per row at its last non-pad token (tandem/models/scalar_head.py, shared with the critic).

`RewardModelWorker` is one rank's shard (built from `reward_model.*`, the weights streamed from
`reward_model.model.path` through the model registry's sequence-classification table);
`RewardModelFront` is the service's API over its rank group (batches laid out over DP ranks,
micro-batches of `reward_model.micro_batch_size_per_gpu`). It reads the policy's token ids
(`input_ids`, `attention_mask`: [left-padded prompt | right-padded response]), so the reward
model must share the policy's tokenizer (verl's default; re-tokenising text is not offered).

Deliberately not here: rules and custom functions, combining scores (services/reward/scorer.py).
"""
from __future__ import annotations

import torch

from tandem.config.transformer_overrides import passed_overrides
from tandem.data.batch import DataProto
from tandem.models.registry import read_hf_config, shape_from_hf_config
from tandem.models.scalar_head import build_scalar_model, sequence_scores
from tandem.serving.front import FrontDoor
from tandem.serving.rank_group import RankGroup
from tandem.train.microbatch import micro_batches
from tandem.train.schedule import run_schedule


def reward_model_shape(cfg):
    """The ModelShape of reward_model.model.path's config.json."""
    return shape_from_hf_config(read_hf_config(cfg.reward_model.model.path))


class RewardModelWorker:
    def __init__(self, cfg):
        from megatron.core import parallel_state as ps

        from tandem.convert.hf_load import load_hf_weights

        rm = cfg.reward_model
        hf = read_hf_config(rm.model.path)
        self.shape = shape_from_hf_config(hf)
        self.vocab_size = self.shape.vocab_size
        self.pad_token_id = hf.get("pad_token_id")  # transformers reads the score at the last token not equal to it
        self.model = build_scalar_model(self.shape, rm.megatron, overrides=passed_overrides(rm.megatron))
        load_hf_weights(self.model, rm.model.path, self.shape, ps.get_tensor_model_parallel_rank(),
                        rm.megatron.tensor_model_parallel_size)
        self.model.eval()

    @torch.no_grad()
    def scores(self, shards: list[DataProto | None], micro_rows: int) -> list[DataProto | None]:
        """Each shard's rows -> {"rm_scores": [rows] fp32} (None for an empty shard)."""
        def loss_fn(output, mb):
            score = sequence_scores(output, mb["input_ids"], mb["attention_mask"], self.pad_token_id)
            return output.new_zeros(()), 0, {"rm_scores": score}

        out = []
        for shard in shards:
            parts = run_schedule(self.model, micro_batches(shard, micro_rows), loss_fn,
                                 forward_only=True) if shard is not None else []
            out.append(DataProto(tensors={"rm_scores": torch.cat([p["rm_scores"] for p in parts]).cpu()})
                       if parts else None)
        return out


class RewardModelFront:
    """The reward model over its rank group: `score(batch) -> [rows] fp32`."""

    def __init__(self, group: RankGroup, local: RewardModelWorker, micro_rows: int):
        self.door = FrontDoor(group, "reward_model")
        self.vocab_size = local.vocab_size
        self.micro_rows = micro_rows

    def score(self, batch: DataProto) -> torch.Tensor:
        seq = batch.select(tensor_keys=["input_ids", "attention_mask"], column_keys=[])
        out = self.door.map_rows("scores", seq, self.micro_rows, rows_per_mini=len(seq), micro=self.micro_rows)
        return out["rm_scores"]
