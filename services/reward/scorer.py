"""What the reward service scores a batch with, by config: rules, a custom function, a reward model.

- text scoring: verl's `custom_reward_function` when its path is set (every row goes through
  it), else the rule registry by `data_source` (services/reward/worker.py);
- with `reward_model.enable`: the reward model's score, plus `reward_model.rule_coef` x the text
  score when that coefficient is not 0 (0, the default, is verl's behaviour: the model's score
  alone, and the text scorer is not called).

A row that failed in the text scorer fails in the sum too. Plain Python over DataProto: the
servicer decodes and validates, this combines, the workers compute.
"""
from __future__ import annotations

import math

from tandem.data.batch import DataProto
from tandem.logging import get_logger
from tandem.services.reward.result import Scored
from tandem.services.reward.worker import RewardWorker

_log = get_logger("services.reward.scorer")
TEXT_COLUMNS = ("response_text", "ground_truth", "data_source", "extra_info", "prompt_text")


def text_scorer(cfg):
    """The custom function when custom_reward_function.path is set, else the rules."""
    c = cfg.custom_reward_function
    if c.path:
        from tandem.services.reward.custom_function import CustomRewardFunction

        return CustomRewardFunction(c.path, c.name, dict(c.reward_kwargs), c.timeout_s, c.num_workers)
    return RewardWorker(default_rule=cfg.reward_model.default_rule)


class Scorer:
    def __init__(self, text, model=None, rule_coef: float = 0.0):
        """text: RewardWorker or CustomRewardFunction; model: RewardModelFront or None."""
        self.text, self.model, self.rule_coef = text, model, rule_coef

    @property
    def needs_tokens(self) -> bool:
        return self.model is not None

    def _text(self, batch: DataProto) -> Scored:
        kwargs = {k: batch.columns[k] for k in TEXT_COLUMNS if k in batch.columns}
        out = self.text.score(**kwargs)
        return out if isinstance(out, Scored) else Scored.of(out)

    def score(self, batch: DataProto) -> Scored:
        if self.model is None:
            return self._text(batch)
        model_scores = self.model.score(batch).tolist()
        if self.rule_coef == 0:
            return Scored.of(model_scores)
        text = self._text(batch)
        combined = [m + self.rule_coef * t for m, t in zip(model_scores, text.scores)]
        return Scored([math.nan if i in text.failures else v for i, v in enumerate(combined)], text.failures)

    def close(self) -> None:
        if self.text is not None and hasattr(self.text, "close"):
            self.text.close()
