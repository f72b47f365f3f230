"""The version of what Tandem's messages mean (protos/tandem/v1): one at a time, with no fallbacks
for older services. A controller and the model services it drives speak the same version: a
service refuses a run of another one at LifecycleService.Configure and tells its own in Describe
(the controller checks the services it attaches to)."""
from __future__ import annotations

from tandem.rpc.errors import FailedPrecondition

# 2: the actor's calls name their rows (sent, or kept by its colocated rollout) and its update
# computes the old log-probs of the rows it trains on the sampling weights itself
PROTOCOL = 2


def check_protocol(theirs: int, role: str, where: str) -> None:
    """FailedPrecondition naming both versions unless `theirs` is ours."""
    if theirs != PROTOCOL:
        raise FailedPrecondition(f"protocol: {where} speaks Tandem protocol {theirs}, this {role} side {PROTOCOL}: "
                                 "run the same Tandem version on the controller and every service")
