"""Critic service: value model (GPTModel trunk + scalar head). `python -m services.critic`.

With services.critic.world_size > 1 this process is rank 0 (the front door) and starts
the other ranks.
"""
from __future__ import annotations

from services.critic.front import CriticFront
from services.critic.servicer import SERVICE, CriticServicer
from services.critic.worker import CriticWorker
from tandem.dist.parallel import ParallelConfig
from tandem.dist.rank_group import RankGroup
from tandem.models.shape_from_config import model_shape
from tandem.rpc.launch import init_service, load_tokenizer, parse_args
from tandem.rpc.server import run_server, serve
from tandem.rpc.worker_thread import WorkerThread


def main(argv=None) -> None:
    args = parse_args("critic", argv)
    cfg = args.cfg
    m = cfg.critic.megatron
    tokenizer_len = len(load_tokenizer(cfg))
    init_service("critic", args, cfg.services.critic.torch_threads, m.seed,
                 parallel=ParallelConfig.of(m),
                 world_size=cfg.services.critic.world_size,
                 shape=model_shape(cfg.actor_rollout_ref.model, tokenizer_len))
    worker = CriticWorker(cfg, tokenizer_len)
    group = RankGroup({"critic": worker})
    if not group.is_front:
        group.follow()
        return
    thread = WorkerThread("critic")
    try:
        run_server(serve([(SERVICE, CriticServicer(CriticFront(group, worker), thread))], role="critic",
                         host=args.host, port=args.port, port_file=args.port_file))
    finally:
        thread.shutdown(wait=True)  # the running call finishes on every rank first
        group.stop()


if __name__ == "__main__":
    main()
