"""What scoring a batch gives: one score per row, and the rows that could not be scored.

A failed row's score is NaN and its reason is in `failures`; the servicer sends both
(ScoreResponse.failures) and the controller fails the step or drops the row, as configured.
Nothing here turns a failure into a number.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Scored:
    scores: list[float]  # one per row; NaN where the row failed
    failures: dict[int, str] = field(default_factory=dict)  # row -> why it could not be scored

    @classmethod
    def of(cls, values: list, failures: dict[int, str] | None = None) -> Scored:
        failures = dict(failures or {})
        return cls([math.nan if i in failures else float(v) for i, v in enumerate(values)], failures)
