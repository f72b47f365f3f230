"""A non-editable install into a fresh virtual environment: site-packages gets `tandem` (with
tandem.services and tandem.controller) and nothing generic at its top level; the console scripts and
`python -m tandem.services.<role>` run from outside the repository. The venv reuses this
interpreter's packages (--system-site-packages) so nothing is downloaded; the source is a copy of
the tracked files, so the build leaves the checkout clean.

With -s the test prints site-packages' top level."""
import os
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_fresh_venv_install_has_one_top_level_package(tmp_path):
    src = tmp_path / "src"
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for f in tracked:
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / f, src / f)
    venv = tmp_path / "venv"
    # --without-pip: the venv's own bundled setuptools may predate wheel building; this interpreter's pip
    # and setuptools (system site) install into the venv (its sys.prefix)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], check=True,
                   timeout=300)
    py = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--ignore-installed", str(src)], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    site = pathlib.Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                       capture_output=True, text=True, check=True, env=env).stdout.strip())
    top = sorted(p.name for p in site.iterdir() if p.name != "__pycache__")
    print("site-packages top level:", top)
    assert top == ["tandem", "tandem-0.1.0.dist-info"], top
    assert (site / "tandem" / "services" / "actor" / "__main__.py").is_file()
    assert (site / "tandem" / "controller" / "launchers" / "local.py").is_file()
    assert (site / "tandem" / "config" / "verl_defaults.yaml").is_file()  # package data
    # from outside the repository: the installed copy, its scripts and module entry points
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    where = subprocess.run([str(py), "-c", "import tandem.services.reward.registry as r, tandem.controller.run as c; "
                            "print(r.__file__); print(c.__file__)"], cwd=outside, capture_output=True, text=True,
                           env=env, timeout=300)
    assert where.returncode == 0, where.stderr[-2000:]
    assert all(line.startswith(str(site)) for line in where.stdout.split()), where.stdout
    run = subprocess.run([str(venv / "bin" / "tandem"), "run", "bogus.key=1"], cwd=outside, capture_output=True,
                         text=True, env=env, timeout=300)
    assert run.returncode == 2 and "unknown config key 'bogus.key'" in run.stderr, run.stderr[-2000:]
    for cmd in ([str(venv / "bin" / "tandem-reward"), "--help"], [str(py), "-m", "tandem.services.actor", "--help"]):
        r = subprocess.run(cmd, cwd=outside, capture_output=True, text=True, env=env, timeout=300)
        assert r.returncode == 0 and "--metrics-port" in r.stdout, (cmd, r.stderr[-2000:])
