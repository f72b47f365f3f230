"""Layering rules, checked on the source (ast) and in a fresh interpreter.

- the controller never loads megatron (it only talks to services);
- a service never imports another service (services/<a> -/-> services.<b>);
- the library (tandem/) never imports services or controller;
- only the wire edge imports the generated tandem.v1 messages.
"""
import ast
import fnmatch
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("tandem", "services", "controller")
V1_ALLOWED = ["tandem/data/codec.py", "tandem/rpc/*", "services/*/servicer.py", "tandem/rollout/servicer.py",
              "controller/clients.py", "services/reward/examples/*", "tandem/v1/*"]


def source_files(top: str) -> list[pathlib.Path]:
    return sorted(p for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts)


def module_of(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: pathlib.Path) -> set[str]:
    """Absolute names of everything `path` imports (relative imports resolved; `from a import b`
    counts as a and a.b; importlib.import_module("x") / __import__("x") with a literal too)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module_of(path) if path.name == "__init__.py" else module_of(path).rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if name in ("import_module", "__import__"):
                out.add(node.args[0].value)
    return out


def under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def rel(path: pathlib.Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_the_scan_sees_imports():
    """The scanner itself works (else every rule below would pass vacuously)."""
    assert "tandem.v1.actor_pb2" in imported_modules(ROOT / "services/actor/servicer.py")
    assert "services.actor.worker" in imported_modules(ROOT / "services/actor/hybrid.py")
    assert "controller.launcher" in imported_modules(ROOT / "controller/loop.py")
    assert len(source_files("services")) >= 10 and len(source_files("tandem")) >= 30


def megatron_modules_after(imports: str) -> list[str]:
    code = (f"import json, sys\n{imports}\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('megatron', 'transformer_engine'))))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_controller_does_not_load_megatron():
    loaded = megatron_modules_after("import controller.loop, controller.step, controller.__main__")
    assert loaded == [], f"importing the controller loaded {loaded[:10]}"
    # control: the same check does see megatron once something loads it
    assert "megatron.core" in megatron_modules_after("import controller.loop, megatron.core")


def test_services_do_not_import_each_other():
    roles = sorted(p.name for p in (ROOT / "services").iterdir() if p.is_dir() and p.name != "__pycache__")
    assert {"actor", "critic", "reward", "rollout"} <= set(roles)
    offenders = []
    for role in roles:
        for path in source_files(f"services/{role}"):
            for name in imported_modules(path):
                other = name.split(".")[1] if under(name, "services") and name.count(".") >= 1 else None
                if other is not None and other != role:
                    offenders.append(f"{rel(path)} imports {name}")
    assert not offenders, "a service imports another service:\n" + "\n".join(sorted(offenders))


def test_library_does_not_import_services_or_controller():
    offenders = [f"{rel(p)} imports {name}" for p in source_files("tandem") for name in imported_modules(p)
                 if under(name, "services") or under(name, "controller")]
    assert not offenders, "tandem/ imports services/controller:\n" + "\n".join(sorted(offenders))


def test_only_the_wire_edge_imports_tandem_v1():
    offenders = []
    for top in PACKAGES:
        for path in source_files(top):
            r = rel(path)
            if any(fnmatch.fnmatch(r, pat) for pat in V1_ALLOWED):
                continue
            bad = sorted(n for n in imported_modules(path) if under(n, "tandem.v1"))
            if bad:
                offenders.append(f"{r} imports {bad}")
    assert not offenders, "tandem.v1 imported outside the wire edge:\n" + "\n".join(sorted(offenders))
