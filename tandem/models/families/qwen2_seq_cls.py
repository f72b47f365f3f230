"""Qwen2ForSequenceClassification: a reward model on the qwen2 trunk (tandem/models/families/qwen2.py) with a one-label
`score` head in place of `lm_head` (families/_common.py `sequence_classification`)."""
from __future__ import annotations

from tandem.models.families import qwen2
from tandem.models.families._common import sequence_classification

FAMILY = sequence_classification(qwen2.FAMILY)
