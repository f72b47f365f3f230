"""Tool and environment servers (protos/tandem/v1/tools.proto). Tandem starts none of its own: a run
calls the servers its tool config names (tandem/tools/tool_config.py). examples/ holds the example
servers, in Python (server.py) and Node.js (node/)."""
