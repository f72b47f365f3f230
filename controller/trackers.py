"""Third-party metric sinks (optional extras: `pip install tandem[wandb]`, `tandem[mlflow]`).

Each sink takes the same `{key: scalar}` dicts as controller/tracking.py's own sinks, at the same
steps, and logs the run's resolved config once. Where they write follows each library's own
settings, as in verl:

- wandb: `WANDB_MODE` (`offline` writes `run_dir/wandb/` with no network; `online` needs a login),
  project = trainer.project_name, run name = trainer.experiment_name;
- mlflow: `MLFLOW_TRACKING_URI` (default: the local file store `file:run_dir/mlruns`, which mlflow
  3.10+ opens only with MLFLOW_ALLOW_FILE_STORE=true: set for that default), experiment =
  project_name, run name = experiment_name; keys with characters mlflow refuses (`@` in
  `val-core/.../mean@4`) are logged with `@` -> `_at_`, as verl does.

swanlab is not offered: its releases (0.10) require protobuf < 7, and Tandem's generated gRPC code
needs protobuf >= 7.35 (grpcio-tools 1.85), so the two cannot be installed together.

Deliberately not here: console, JSONL and TensorBoard (tracking.py), what the keys are.
"""
from __future__ import annotations

import json
import os
import re
import time
from typing import Any

SINKS = ("wandb", "mlflow")
_EXTRA = "install it with: pip install 'tandem[{name}]'"


def _import(name: str):
    try:
        return __import__(name)
    except ImportError:
        raise ValueError(f"trainer.logger: {name!r} needs the {name} package; " + _EXTRA.format(name=name)) from None


class WandbSink:
    def __init__(self, run_dir: str, project: str, experiment: str, config: dict[str, Any]):
        wandb = _import("wandb")
        self.run = wandb.init(project=project, name=experiment, dir=run_dir, config=config,
                              mode=os.environ.get("WANDB_MODE", "online"))

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def log_generations(self, rows: list[dict], step: int) -> None:
        import wandb

        table = wandb.Table(columns=["step", "input", "output", "score"],
                            data=[[r["step"], r["input"], r["output"], r["score"]] for r in rows])
        self.run.log({"val/generations": table}, step=step)

    def close(self) -> None:
        self.run.finish()


_MLFLOW_BAD = re.compile(r"[^0-9A-Za-z_\-. /:]")


def mlflow_key(key: str) -> str:
    """A metric key mlflow accepts: `@` -> `_at_` (verl's spelling), any other refused char -> `_`."""
    return _MLFLOW_BAD.sub("_", key.replace("@", "_at_"))


class MlflowSink:
    def __init__(self, run_dir: str, project: str, experiment: str, config: dict[str, Any]):
        mlflow = _import("mlflow")
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:  # the local file store, which mlflow >= 3.10 opens only when asked to
            uri = "file:" + os.path.join(os.path.abspath(run_dir), "mlruns")
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = mlflow.MlflowClient(uri)
        found = self.client.get_experiment_by_name(project)
        experiment_id = found.experiment_id if found else self.client.create_experiment(project)
        self.run_id = self.client.create_run(experiment_id, run_name=experiment).info.run_id
        from mlflow.entities import Param

        params = [Param(k[:250], str(v)[:6000]) for k, v in _flat(config).items()]
        for i in range(0, len(params), 100):  # mlflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def log(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(mlflow_key(k), float(v), now, step)
                                                    for k, v in values.items()])

    def log_generations(self, rows: list[dict], step: int) -> None:
        self.client.log_text(self.run_id, "\n".join(json.dumps(r) for r in rows),
                             f"val_generations/step_{step}.jsonl")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _flat(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def make_sink(name: str, run_dir: str, project: str, experiment: str, config: dict[str, Any]):
    """The sink called `name` (one of SINKS)."""
    cls = {"wandb": WandbSink, "mlflow": MlflowSink}[name]
    return cls(run_dir, project, experiment, config)
