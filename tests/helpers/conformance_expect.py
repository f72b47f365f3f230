"""What the conformance tests share: the Node.js examples' interpreter (skipped with the reason where
node or an example's `npm ci` is missing; a failure in CI, which installs them), and "these rules, all
passed"."""
import os
import shutil

import pytest

from tandem.rpc.conformance import report


def node_for(example_dir) -> str:
    """The node binary, once `example_dir` has its node_modules."""
    node = shutil.which("node")
    if node is None or not (example_dir / "node_modules" / "@grpc" / "grpc-js").is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"CI must install the Node.js example (npm ci in {example_dir})")
        pytest.skip(f"node or the Node.js example's node_modules (npm ci in {example_dir}) missing")
    return node


def assert_passes(results, rules: list[str]) -> None:
    assert [r.rule for r in results] == rules, report(results)
    assert all(r.passed for r in results), report(results)
