"""Tools for reward services that speak protos/tandem/v1/reward.proto (conformance.py)."""
