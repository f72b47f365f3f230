"""Critic service: value model (GPTModel trunk + scalar head). `python -m services.critic`.

With services.critic.world_size > 1 this process is rank 0 (the front door) and starts
the other ranks.
"""
from __future__ import annotations

from services.critic.front import CriticFront
from services.critic.servicer import SERVICE, CriticServicer
from services.critic.worker import CriticWorker
from tandem.models.shape_from_config import model_shape
from tandem.parallel.layout import ParallelConfig
from tandem.serving.process import init_service, load_tokenizer, parse_args, serve_group
from tandem.serving.rank_group import RankGroup


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
    serve_group("critic", args, group, lambda thread: [(SERVICE, CriticServicer(CriticFront(group, worker), thread))])


if __name__ == "__main__":
    main()
