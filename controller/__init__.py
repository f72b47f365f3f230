"""The controller: `tandem run` and the code that sequences a run over the role services.

run.py (the Run: directory, services, warm start, RL loop, checkpoints, summary), step.py
(one PPO/GRPO step in phases), scoring.py, dapo.py, validation.py, sft.py, roles.py and
clients.py (the services, as typed clients), launchers/ (how the services are started),
data.py, tracking.py, plot.py, checkpointing.py, run_dir.py. It never imports megatron-core
(tests/unit/test_import_rules.py): all model work happens in the services.
"""
