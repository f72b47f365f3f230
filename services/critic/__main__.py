"""Critic service: value model (GPTModel trunk + scalar head). `python -m services.critic`."""
from __future__ import annotations

from services.critic.servicer import SERVICE, CriticServicer
from services.critic.worker import CriticWorker
from tandem.rpc.launch import init_service, load_tokenizer, parse_args
from tandem.rpc.server import run_server, serve
from tandem.rpc.worker_thread import WorkerThread


def main(argv=None) -> None:
    args = parse_args("critic", argv)
    cfg = args.cfg
    init_service("critic", args, cfg.services.critic.torch_threads, cfg.critic.megatron.seed)
    worker = CriticWorker(cfg, len(load_tokenizer(cfg)))
    thread = WorkerThread("critic")
    try:
        run_server(serve([(SERVICE, CriticServicer(worker, thread))], role="critic",
                         host=args.host, port=args.port, port_file=args.port_file))
    finally:
        thread.shutdown(wait=False)


if __name__ == "__main__":
    main()
