"""RewardWorker: score a batch of decoded responses with the registered rules.

Plain Python (no gRPC, no torch): the servicer decodes the batch, calls
``score`` and encodes the result; a ValueError from here means the request was
malformed and is mapped to ``INVALID_ARGUMENT`` there.

Rows are grouped by rule (chosen per row from ``data_source``, see
``registry.rule_for_data_source``) and each rule is called once over its rows,
so a rule that batches work (e.g. a model-based judge) sees the whole group.
"""

from __future__ import annotations

import math
from typing import Any

from tandem.services.reward.registry import get_rule, rule_for_data_source


class RewardWorker:
    """Scores responses; rows whose ``data_source`` is unknown use ``default_rule``."""

    def __init__(self, default_rule: str = "arithmetic") -> None:
        get_rule(default_rule)  # fail at startup, not on the first batch
        self.default_rule = default_rule

    def score(
        self,
        response_text: list[str],
        ground_truth: list[str],
        data_source: list[str] | None = None,
        extra_info: list[dict] | None = None,
        prompt_text: list[str] | None = None,
    ) -> list[float]:
        """One float per row, in row order. A rule's ``None`` ("not applicable") becomes 0.0.

        Raises ValueError when the per-row lists differ in length.
        """
        n = len(response_text)
        columns = {"data_source": data_source, "extra_info": extra_info, "prompt_text": prompt_text}
        lengths = {"response_text": n, "ground_truth": len(ground_truth)}
        lengths.update({k: len(v) for k, v in columns.items() if v is not None})
        if len(set(lengths.values())) > 1:
            raise ValueError(f"reward columns must have one entry per row; got lengths {lengths}")

        groups: dict[str, list[int]] = {}
        for i in range(n):
            source = data_source[i] if data_source is not None else None
            groups.setdefault(rule_for_data_source(source, self.default_rule), []).append(i)

        scores = [0.0] * n
        for name, rows in groups.items():
            kwargs: dict[str, Any] = {k: [v[i] for i in rows] for k, v in columns.items() if v is not None}
            out = get_rule(name)(
                [response_text[i] for i in rows], [ground_truth[i] for i in rows], **kwargs
            )
            if len(out) != len(rows):
                # A broken rule is a server bug, not a bad request: not a ValueError.
                raise RuntimeError(f"reward rule {name!r} returned {len(out)} scores for {len(rows)} rows")
            for i, value in zip(rows, out):
                scores[i] = 0.0 if value is None else float(value)
                if not math.isfinite(scores[i]):
                    raise RuntimeError(f"reward rule {name!r} returned non-finite score {value!r} for row {i}")
        return scores
