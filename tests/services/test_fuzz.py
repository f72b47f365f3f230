"""Fuzzed requests to every RPC of every real service (tests/helpers/fuzz_*.py: hypothesis,
from the protos), with a CI budget; bench/fuzz_services.py sends 10,000. Only clear statuses
come back (OK, INVALID_ARGUMENT, RESOURCE_EXHAUSTED, FAILED_PRECONDITION, NOT_FOUND for a
checkpoint path, ABORTED for a weight-plane version an update replaced), no service dies or stops serving, and no service's memory grows past a
bound. RolloutService.SyncWeights and ActorService.JoinWeightGroup are left out (their requests
name addresses the services would dial: fuzz_strategies.DIALING). The services are put back
to their state before (checkpoints) for the tests after."""
import pytest

pytest.importorskip("hypothesis", reason="the fuzzer needs hypothesis: pip install -e '.[test]'")
from fuzz_runner import FuzzRun  # noqa: E402
from fuzz_strategies import rpcs  # noqa: E402
from fuzz_targets import Targets  # noqa: E402

BUDGET = 300  # requests
GROWTH_BOUND_MIB = 300  # resident memory a service may gain (allocator high-water marks of larger requests)


@pytest.fixture
def targets(services, tmp_path):
    t = Targets(services.endpoints, services.pids, services.tokenizer, services.vocab_size, str(tmp_path))
    yield t
    t.close()


def test_fuzzed_requests_get_clear_statuses_and_leave_services_serving(targets):
    run = FuzzRun(targets, seed=0)
    before = targets.rss_mib()
    try:
        run.run(BUDGET)
    finally:
        if not run.crashed:
            targets.restore(run.seeds)
    assert not run.crashed, f"services died: {run.crashed}, after {run.crashed_by}"
    report = [f"{code} from {role} on {case.rpc.name} ({case.how}): {details[:200]}"
              for code, role, case, details in run.unexpected]
    assert not report, "\n".join(report)
    assert run.sent >= BUDGET and sorted(run.by_rpc) == sorted(r.name for r in rpcs())  # every RPC was fuzzed
    assert sum(n for codes in run.by_rpc.values() for c, n in codes.items() if c != "OK") > BUDGET // 2
    growth = {role: targets.rss_mib()[role] - before[role] for role in before}
    assert all(g < GROWTH_BOUND_MIB for g in growth.values()), growth
