"""pyproject.toml's package list is every package of the tree, under the one top-level name `tandem`
(services/ and controller/ install as tandem.services and tandem.controller); the install itself is
tests/e2e/test_install.py."""
import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_package_list_is_every_folder_with_an_init():
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {p.parent.relative_to(ROOT).as_posix() for top in ("tandem", "services", "controller")
               for p in (ROOT / top).rglob("__init__.py") if "__pycache__" not in p.parts}
    installed = {f.replace("/", ".") if f.startswith("tandem") else "tandem." + f.replace("/", ".") for f in folders}
    assert set(tool["packages"]) == installed
    assert all(p == "tandem" or p.startswith("tandem.") for p in tool["packages"])
    assert tool["package-dir"] == {"": ".", "tandem.services": "services", "tandem.controller": "controller"}


def test_source_checkout_resolves_the_installed_names():
    import importlib

    import tandem.controller.tracking
    import tandem.services.reward.registry

    importlib.import_module("controller.tracking")  # the folder's own name still imports (python -m services.x)

    assert pathlib.Path(tandem.services.reward.registry.__file__) == ROOT / "services" / "reward" / "registry.py"
    assert pathlib.Path(tandem.controller.tracking.__file__) == ROOT / "controller" / "tracking.py"
