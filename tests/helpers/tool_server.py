"""The example tool server (services/tools/examples/server.py) in its own process, and a verl
tool-config YAML routing its `calculator` tool: what multi_turn.tool_config_path points at."""
import contextlib
import sys

from server_process import server_process

CALCULATOR = """tools:
  - class_name: tandem.calculator   # the name the built-in task's call format writes
    config: {{endpoint: "{endpoint}"}}
    tool_schema:
      type: function
      function:
        name: calculator
        parameters: {{type: object, properties: {{expression: {{type: string}}}}, required: [expression]}}
"""


@contextlib.contextmanager
def calculator_tool_config(tmp_path, log_file=None):
    """Start the example server -> the path of a tool-config YAML (in tmp_path) naming it; stopped at exit.
    `log_file`: the server's JSON log, an `rpc` line per call."""
    cmd = [sys.executable, "-m", "tandem.services.tools.examples.server", "--port-file", str(tmp_path / "port")]
    with server_process(cmd, tmp_path / "port", log_file=log_file) as endpoint:
        path = tmp_path / "tools.yaml"
        path.write_text(CALCULATOR.format(endpoint=endpoint))
        yield path
