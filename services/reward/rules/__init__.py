"""Built-in reward rules.

Each rule follows TRL's reward-function contract: a plain function over lists,
``fn(responses, ground_truths, **columns) -> list[float | None]``, one entry per
row, ``None`` meaning "this rule does not apply to this row". Extra dataset
columns (``data_source``, ``extra_info``, ``prompt_text``) arrive as keyword
arguments; a rule ignores the ones it does not need.

Rules are pure Python (stdlib only): no torch, no gRPC, no sympy. Names are
bound in :mod:`services.reward.registry`, not here.
"""
