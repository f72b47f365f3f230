"""Reward service: rule verifiers chosen per row by data_source. `python -m services.reward`."""
from __future__ import annotations

from services.reward.servicer import SERVICE, RewardServicer
from services.reward.worker import RewardWorker
from tandem.rpc.server import run_server, serve
from tandem.serving.process import init_service, parse_args
from tandem.serving.worker_thread import WorkerThread


def main(argv=None) -> None:
    args = parse_args("reward", argv)
    init_service("reward", args, args.cfg.services.reward.torch_threads, seed=0)
    worker = RewardWorker(default_rule=args.cfg.reward_model.default_rule)
    thread = WorkerThread("reward")
    try:
        run_server(serve([(SERVICE, RewardServicer(worker, thread))], role="reward",
                         host=args.host, port=args.port, port_file=args.port_file, metrics_port=args.metrics_port))
    finally:
        thread.shutdown(wait=False)


if __name__ == "__main__":
    main()
