"""deploy/compose.yaml: generated from controller/launchers/commands.py, valid Compose, and shaped as documented.

No docker engine is reachable here, so the file is validated offline: against the Compose
Specification's own JSON schema (deploy/schema/compose-spec.json, copied unchanged from the
compose-spec/compose-spec repository, Apache-2.0, commit 170098ba07d9) with jsonschema, plus the
cross-references `docker compose config` would resolve (services named in depends_on, volumes,
build files). tests/e2e/test_compose_processes.py runs the file's commands as processes.
"""
import copy
import json
import pathlib

import pytest
import yaml

from tandem.controller.launchers import commands, compose_file

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema validates the compose file (pip install jsonschema)")

ROOT = pathlib.Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "compose.yaml"


@pytest.fixture(scope="module")
def doc() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def schema_errors(doc: dict) -> list[str]:
    schema = json.loads((ROOT / "deploy" / "schema" / "compose-spec.json").read_text())
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in jsonschema.Draft7Validator(schema).iter_errors(doc)]


def test_committed_file_is_the_generated_one():
    assert compose_file.main([str(COMPOSE), "--check"]) == 0, "regenerate: python -m tandem.controller.launchers.compose_file"
    assert COMPOSE.read_text() == compose_file.render()


def test_valid_against_the_compose_spec_schema(doc):
    assert schema_errors(doc) == []
    broken = copy.deepcopy(doc)  # the check can fail: an unknown key and a wrong type
    broken["services"]["actor"]["gpus_please"] = 1
    broken["services"]["reward"]["healthcheck"]["test"] = {"cmd": "x"}
    assert len(schema_errors(broken)) == 2


def test_references_resolve(doc):
    services, volumes = doc["services"], doc["volumes"]
    for name, svc in services.items():
        assert set(svc.get("depends_on", {})) <= set(services), name
        for mount in svc.get("volumes", []):
            assert mount.split(":")[0] in volumes, (name, mount)
        if "build" in svc:
            assert (COMPOSE.parent / svc["build"]["context"] / svc["build"]["dockerfile"]).is_file(), name
    built = {svc["image"] for svc in services.values() if "build" in svc}
    assert built == {svc["image"] for svc in services.values()}, "every image has a build"


def test_every_role_runs_the_shared_command_with_health_checks(doc):
    services = doc["services"]
    for role in commands.ROLES:
        for name in (role, f"{role}-cpu") if role != "reward" else (role,):
            svc = services[name]
            port = commands.PORTS[role]
            assert svc["command"] == commands.service_argv(role, compose_file.SPEC_CONFIG, host="0.0.0.0", port=port,
                                                           run_id=compose_file.RUN_ID, python="python", insecure=True)
            assert svc["environment"] == commands.service_env()
            assert svc["healthcheck"]["test"] == ["CMD", "python", "-m", "tandem.rpc.healthcheck", f"127.0.0.1:{port}"]
            assert "runs:/runs" in svc["volumes"]
            assert svc["depends_on"] == {"prepare": {"condition": "service_completed_successfully"}}
            assert svc["restart"] == "on-failure"  # a service that dies comes back (the compose launcher's restart)
    assert "restart" not in services["controller"] and "restart" not in services["prepare"]  # one-shots
    assert services["controller"]["command"] == ["python", "-m", "tandem.controller", "run", compose_file.SPEC_CONFIG]


def test_gpu_profiles_reserve_a_gpu_per_model_service_and_cpu_profiles_none(doc):
    services = doc["services"]
    for role in ("actor", "rollout", "critic"):
        gpu, cpu = services[role], services[f"{role}-cpu"]
        assert gpu["deploy"]["resources"]["reservations"]["devices"] == [
            {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
        assert "deploy" not in cpu and cpu["networks"]["default"]["aliases"] == [role]  # reached as `<role>`
        assert gpu["profiles"][0].startswith("gpu") and cpu["profiles"][0].startswith("cpu")
    for shared in ("prepare", "reward", "controller"):
        assert "deploy" not in services[shared] and set(services[shared]["profiles"]) == {"gpu", "cpu"}
    cpu_profile = [name for name, svc in services.items() if "cpu" in svc["profiles"]]
    assert sorted(cpu_profile) == ["actor-cpu", "controller", "prepare", "reward"]  # the built-in task, no GPU


def test_builds_take_the_base_and_pip_settings_as_arguments(doc):
    """Each image's FROM is its Dockerfile's `BASE` build argument, defaulting there and here to the same
    public image; pip's settings pass through only when set (a value-less argument), never as empty strings."""
    for device, image in compose_file.IMAGES.items():
        (build,) = [svc["build"] for svc in doc["services"].values() if svc["image"] == image and "build" in svc]
        dockerfile = (COMPOSE.parent / build["context"] / build["dockerfile"]).read_text().splitlines()
        default = compose_file.BASES[device]
        assert f"ARG BASE={default}" in dockerfile and "FROM ${BASE}" in dockerfile, device
        assert build["args"]["BASE"] == f"${{TANDEM_BASE_{device.upper()}:-{default}}}"
        assert {k: v for k, v in build["args"].items() if k != "BASE"} == dict.fromkeys(compose_file.PIP_ARGS)
        assert f"ARG {' '.join(compose_file.PIP_ARGS)}" in dockerfile, device  # declared, so RUN sees them
