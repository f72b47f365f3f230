"""Reward service: rules by data_source, or verl's custom compute_score, and/or a reward model
(a Hugging Face sequence-classification checkpoint on megatron-core). `python -m services.reward`.

Rules and functions only: one process, no torch.distributed. With reward_model.enable the
service is a rank group like the critic (services.reward.world_size ranks; rank 0 serves).
"""
from __future__ import annotations

from services.reward.scorer import Scorer, text_scorer
from services.reward.servicer import SERVICE, RewardServicer
from tandem.rpc.server import run_server, serve
from tandem.serving.process import init_service, parse_args, serve_group
from tandem.serving.worker_thread import WorkerThread


def serve_rules(args) -> None:
    cfg = args.cfg
    init_service("reward", args, cfg.services.reward.torch_threads, seed=0)
    scorer = Scorer(text_scorer(cfg))
    thread = WorkerThread("reward")
    try:
        run_server(serve([(SERVICE, RewardServicer(scorer, thread))], role="reward", host=args.host,
                         port=args.port, port_file=args.port_file, security=args.security))
    finally:
        thread.shutdown(wait=False)
        scorer.close()


def serve_model(args) -> None:
    from services.reward.model import RewardModelFront, RewardModelWorker, reward_model_shape
    from tandem.parallel.layout import ParallelConfig
    from tandem.serving.rank_group import RankGroup

    cfg = args.cfg
    rm = cfg.reward_model
    init_service("reward", args, cfg.services.reward.torch_threads, rm.megatron.seed,
                 parallel=ParallelConfig.of(rm.megatron), world_size=cfg.services.reward.world_size,
                 shape=reward_model_shape(cfg))
    worker = RewardModelWorker(cfg)
    group = RankGroup({"reward_model": worker})
    scorers = []

    def servicers(thread):  # rank 0 only: the text scorer's process pool lives there
        text = text_scorer(cfg) if rm.rule_coef != 0 else None
        scorers.append(Scorer(text, RewardModelFront(group, worker, rm.micro_batch_size_per_gpu), rm.rule_coef))
        return [(SERVICE, RewardServicer(scorers[0], thread, worker.vocab_size))]

    try:
        serve_group("reward", args, group, servicers)
    finally:
        for scorer in scorers:
            scorer.close()


def main(argv=None) -> None:
    args = parse_args("reward", argv)
    (serve_model if args.cfg.reward_model.enable else serve_rules)(args)


if __name__ == "__main__":
    main()
