"""The example tool server (services/tools/examples/server.py) in its own process, and verl
tool-config YAMLs routing its `calculator` and `calc_gsm8k_reward` tools: what
multi_turn.tool_config_path points at."""
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


# verl's gsm8k tool as its examples configure it, with the Tandem key saying where it is served
GSM8K = """tools:
  - class_name: verl.tools.gsm8k_tool.Gsm8kTool
    config: {{type: native, endpoint: "{endpoint}"}}
    tool_schema:
      type: function
      function:
        name: calc_gsm8k_reward
        description: A tool for calculating the reward of gsm8k
        parameters: {{type: object, properties: {{answer: {{type: string}}}}, required: [answer]}}
"""


@contextlib.contextmanager
def example_tool_server(tmp_path, log_file=None):
    """Start the example server -> its endpoint; stopped at exit. `log_file`: the server's JSON log,
    an `rpc` line per call."""
    cmd = [sys.executable, "-m", "tandem.services.tools.examples.server", "--port-file", str(tmp_path / "port")]
    with server_process(cmd, tmp_path / "port", log_file=log_file) as endpoint:
        yield endpoint


@contextlib.contextmanager
def calculator_tool_config(tmp_path, log_file=None):
    """Start the example server -> the path of a tool-config YAML (in tmp_path) naming it; stopped at exit."""
    with example_tool_server(tmp_path, log_file) as endpoint:
        path = tmp_path / "tools.yaml"
        path.write_text(CALCULATOR.format(endpoint=endpoint))
        yield path
