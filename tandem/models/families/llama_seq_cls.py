"""LlamaForSequenceClassification: a reward model on the llama trunk (tandem/models/families/llama.py) with a one-label
`score` head in place of `lm_head` (families/_common.py `sequence_classification`)."""
from __future__ import annotations

from tandem.models.families import llama
from tandem.models.families._common import sequence_classification

FAMILY = sequence_classification(llama.FAMILY)
