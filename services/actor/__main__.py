"""Actor service: policy + reference (+ the colocated rollout). `python -m services.actor`."""
from __future__ import annotations

from services.actor import hybrid
from services.actor.servicer import SERVICE, ActorServicer
from services.actor.worker import ActorWorker
from tandem.rollout.servicer import SERVICE as ROLLOUT_SERVICE
from tandem.rpc.launch import init_service, load_tokenizer, parse_args
from tandem.rpc.server import run_server, serve
from tandem.rpc.worker_thread import WorkerThread


def main(argv=None) -> None:
    args = parse_args("actor", argv)
    cfg = args.cfg
    init_service("actor", args, cfg.services.actor.torch_threads, cfg.actor_rollout_ref.actor.megatron.seed)
    tokenizer = load_tokenizer(cfg)
    worker = ActorWorker(cfg, len(tokenizer))
    thread = WorkerThread("actor")
    servicers = [(SERVICE, ActorServicer(worker, thread))]
    if cfg.actor_rollout_ref.rollout.mode == "colocated":
        servicers.append((ROLLOUT_SERVICE, hybrid.colocated_rollout(
            worker, thread, tokenizer, cfg.actor_rollout_ref.rollout.max_batch_size)))
    try:
        run_server(serve(servicers, role="actor", host=args.host, port=args.port, port_file=args.port_file))
    finally:
        thread.shutdown(wait=False)


if __name__ == "__main__":
    main()
