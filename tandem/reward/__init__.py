"""Tools for reward services that speak protos/tandem/v1/reward.proto (conformance.py), and verl's
custom reward function file (function_file.py)."""
