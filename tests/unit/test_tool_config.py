"""verl's tool-config YAML -> routes and schemas (tandem/tools/tool_config.py): a verl file with
Tandem's `config.endpoint` loads, verl's class settings come back as notices, and every bad field is
an error naming it."""
import textwrap

import pytest

from tandem.rpc.tls import TLSFiles
from tandem.tools.tool_config import ToolConfigError, ToolRoute, load_tool_config

GSM8K = """\
tools:
  - class_name: verl.tools.gsm8k_tool.Gsm8kTool
    config:
      type: native
      endpoint: 127.0.0.1:50090
      timeout_s: 5
      auth: {token_file: tools.token}
      rate_limit: 10
    tool_schema:
      type: function
      function:
        name: calc_gsm8k_reward
        description: A tool for calculating the reward of gsm8k
        parameters:
          type: object
          properties:
            answer: {type: string, description: The model's answer to the GSM8K math problem}
          required: [answer]
  - class_name: tandem.calculator
    tool_schema:
      type: function
      function:
        name: calculator
        parameters: {type: object, properties: {expression: {type: string}}, required: [expression]}
"""


def write(tmp_path, text: str):
    path = tmp_path / "tools.yaml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_a_verl_file_loads_with_endpoints_and_notices(tmp_path):
    (tmp_path / "tools.token").write_text("s3cret\n")  # relative to the YAML file, not the working directory
    cfg = load_tool_config(write(tmp_path, GSM8K), default_endpoint="10.0.0.7:7000")
    assert [s["function"]["name"] for s in cfg.schemas] == ["calc_gsm8k_reward", "calculator"]
    gsm8k, calc = cfg.routes["calc_gsm8k_reward"], cfg.routes["calculator"]
    assert (gsm8k.endpoint, gsm8k.timeout_s, gsm8k.security.token, gsm8k.security.tls) == \
        ("127.0.0.1:50090", 5, "s3cret", None)
    assert calc == ToolRoute("10.0.0.7:7000")  # no config: the default endpoint, plaintext, the caller's timeout
    assert cfg.notices == [
        "tools[0] calc_gsm8k_reward (verl.tools.gsm8k_tool.Gsm8kTool): called at 127.0.0.1:50090; not used "
        "(settings of verl's tool class): tools[0].config.rate_limit",
        "tools[1] calculator (tandem.calculator): called at 10.0.0.7:7000"]


def test_tls_files_are_read_at_load(tmp_path):
    (tmp_path / "ca.pem").write_text("not checked until a channel opens, but readable\n")
    text = GSM8K.replace("auth: {token_file: tools.token}", "tls: {ca_file: ca.pem, server_name: tools.internal}")
    route = load_tool_config(write(tmp_path, text), "h:1").routes["calc_gsm8k_reward"]
    assert route.security.tls == TLSFiles(ca_file=str(tmp_path / "ca.pem"), server_name="tools.internal",
                                          key_prefix="tools[0].config.tls")
    with pytest.raises(ToolConfigError, match=r"tools\[0\]\.config\.tls: tools\[0\]\.config\.tls\.ca_file: cannot read"):
        load_tool_config(write(tmp_path, text.replace("ca.pem", "missing.pem")), "h:1")


@pytest.mark.parametrize("edit, message", [
    (("endpoint: 127.0.0.1:50090", "endpoint: nowhere"), r"tools\[0\]\.config\.endpoint: 'nowhere' is not HOST:PORT"),
    (("type: native", "type: mcp"), r"tools\[0\]\.config\.type: 'mcp': only native tools"),
    (("timeout_s: 5", "timeout_s: -1"), r"tools\[0\]\.config\.timeout_s: must be a number of seconds > 0, got -1"),
    (("auth: {token_file: tools.token}", "auth: {token_file: absent.token}"),
     r"tools\[0\]\.config\.auth: tools\[0\]\.config\.auth\.token_file: cannot read"),
    (("auth: {token_file: tools.token}", "auth: {password: x}"), r"tools\[0\]\.config\.auth: must be a mapping of"),
    (("name: calculator", "name: calc_gsm8k_reward"),
     r"tools\[1\]\.tool_schema\.function\.name: 'calc_gsm8k_reward' is named by an earlier tool too"),
    (("name: calculator", "name: calc ulator"),
     r"tools\[1\]\.tool_schema\.function\.name: must be 1-64 letters, digits, _ or -, got 'calc ulator'"),
    (("required: [answer]", "required: [question]"),
     r"tools\[0\]\.tool_schema\.function\.parameters\.required: must list names of its properties"),
    (("type: function\n      function:\n        name: calculator", "type: retrieval\n      function:\n        name: c"),
     r"tools\[1\]\.tool_schema\.type: must be \"function\", got 'retrieval'"),
])
def test_bad_fields_are_named(tmp_path, edit, message):
    (tmp_path / "tools.token").write_text("s3cret")
    old, new = edit
    assert old in GSM8K
    with pytest.raises(ToolConfigError, match=message):
        load_tool_config(write(tmp_path, GSM8K.replace(old, new)), default_endpoint="h:1")


def test_whole_file_problems(tmp_path):
    with pytest.raises(ToolConfigError, match=r"tools\[1\]\.config\.endpoint: missing: the HOST:PORT of the "
                                              r"ToolService that serves 'calculator'"):
        (tmp_path / "tools.token").write_text("s3cret")
        load_tool_config(write(tmp_path, GSM8K))  # no default endpoint for the tool without one
    with pytest.raises(ToolConfigError, match="tools: must be a non-empty list"):
        load_tool_config(write(tmp_path, "tools: []\n"))
    with pytest.raises(ToolConfigError, match=r"tools\[0\]\.tool_schema: must be an object, got NoneType"):
        load_tool_config(write(tmp_path, "tools:\n  - class_name: x\n    config: {endpoint: 'h:1'}\n"))
    with pytest.raises(ToolConfigError, match="cannot read"):
        load_tool_config(str(tmp_path / "absent.yaml"))
