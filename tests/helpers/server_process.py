"""Start a server process that writes its port to a file once serving; stop it afterwards."""
import contextlib
import os
import pathlib
import signal
import subprocess
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def server_process(cmd: list[str], port_file, timeout_s: float = 60, cwd=ROOT, env: dict | None = None,
                   log_file=None):
    """Run `cmd` (which writes its bound port to `port_file`) -> "127.0.0.1:PORT"; SIGTERM at exit.
    `log_file`: its output goes there, for the test to read (a pipe read only at exit would fill
    and stall a server that logs every call)."""
    port_file = pathlib.Path(port_file)
    port_file.unlink(missing_ok=True)  # a stale file would point at a stopped server
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **(env or {}))
    out = open(log_file, "w") if log_file else subprocess.PIPE
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + timeout_s
        while not port_file.exists():
            assert proc.poll() is None, (f"{cmd[:3]} exited {proc.returncode}: "
                                         f"{proc.stdout.read() if proc.stdout else pathlib.Path(log_file).read_text()}")
            assert time.monotonic() < deadline, f"{cmd[:3]} did not start in {timeout_s} s"
            time.sleep(0.05)
        yield f"127.0.0.1:{int(port_file.read_text())}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if log_file:
            out.close()
