"""tandem/process_exit.py: a process ended by exit_process keeps its exit code, runs its atexit
handlers and flushes what it printed, and skips the interpreter's final collection (control: the same
script's normal exit does run it)."""
import subprocess
import sys

SCRIPT = """
import atexit, gc, sys
from tandem.process_exit import exit_process

def handler(path):
    with open(path, "w") as f:
        f.write("ran")

class Collected:  # in a reference cycle: only the final collection frees it
    def __init__(self):
        self.me = self
    def __del__(self):
        print("collected at exit", flush=True)

atexit.register(handler, sys.argv[2])
gc.disable()
Collected()
print("buffered, no newline", end="")
if sys.argv[1] == "fast":
    exit_process(3)
sys.exit(3)
"""


def test_exit_code_atexit_handlers_and_output_are_kept_without_the_final_collection(tmp_path):
    for mode in ("fast", "normal"):
        marker = tmp_path / mode
        done = subprocess.run([sys.executable, "-c", SCRIPT, mode, str(marker)], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 3, done.stderr
        assert marker.read_text() == "ran"
        assert done.stdout.startswith("buffered, no newline")
        assert ("collected at exit" in done.stdout) == (mode == "normal"), done.stdout
