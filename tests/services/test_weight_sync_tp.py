"""Resharding on the weight plane, through real services over gloo: an actor at TP=2 syncs a
rollout at TP=1, an actor at TP=1 (DP=2) a rollout at TP=2, and TP=2 a TP=2 rollout over the
collective; each time the rollout's parameters, gathered back to TP=1 on the rollout, equal
the actor's export bit for bit (per-tensor SHA-256), and the TP=2 rollout generates the TP=1
rollout's tokens."""
import asyncio
import os

import pytest
import torch
from test_rollout_standalone import GREEDY, sft_batch
from weight_plane import export_digest


@pytest.fixture(scope="module")
def tp2(services, tmp_path_factory):
    """An actor at TP=2 and a rollout at TP=2 (two ranks each) of the session's model."""
    from tandem.config import load_config, to_yaml
    from tandem.controller.launchers import LaunchContext
    from tandem.controller.launchers.local import LocalLauncher

    out = tmp_path_factory.mktemp("tp2")
    cfg = load_config(os.path.join(services.run_dir, "config_standalone.yaml"), [
        "services.actor.world_size=2", "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
        "services.rollout.world_size=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"])
    path = out / "tp2.yaml"
    path.write_text(to_yaml(cfg))
    launcher = LocalLauncher(LaunchContext(str(path), str(out), services.run_id, startup_timeout_s=240))
    try:
        yield asyncio.run(launcher.start(["actor", "rollout"]))
    finally:
        launcher.stop()


def test_tp2_actor_to_tp1_rollout_and_tp1_actor_to_tp2_rollout(services, tp2):
    from tandem.controller.clients import ActorClient, RolloutClient

    async def main():
        actor2 = ActorClient(tp2["actor"], timeout_s=120)
        rollout2 = RolloutClient(tp2["rollout"], timeout_s=120)
        rollout1 = services.client("rollout", "rollout-1")
        await actor2.train_sft(sft_batch(services))  # TP=2 weights no rollout has seen

        version = await actor2.weights_version()
        assert (await rollout1.sync_weights(version, tp2["actor"], force=True)).weights_version == version
        want = await export_digest(tp2["actor"])
        assert await rollout1.weights_digest() == want, "TP=2 -> TP=1"
        # TP=2 -> TP=2 over a gloo weight group of three ranks (the actor's sender, two rollout ranks)
        reply = await rollout2.sync_weights(version, tp2["actor"], transport="collective", force=True)
        assert reply.weights_version == version and reply.bytes > 0
        assert await rollout2.weights_digest() == want, "TP=2 -> TP=2"
        a = await rollout1.generate_sequences(services.prompts(), **GREEDY)
        b = await rollout2.generate_sequences(services.prompts(), **GREEDY)
        assert torch.equal(a["responses"], b["responses"]) and b.meta["weights_version"] == version
        torch.testing.assert_close(a["rollout_log_probs"], b["rollout_log_probs"], atol=5e-5, rtol=0)

        # TP=1 (the session's actor, two DP ranks) -> TP=2, streamed to the front rank and
        # broadcast to the other over the rollout's own group
        actor1 = services.client("actor")
        version1 = await actor1.weights_version()
        assert (await rollout2.sync_weights(version1, services.source(), transport="stream",
                                            force=True)).weights_version == version1
        assert await rollout2.weights_digest() == await export_digest(services.source()), "TP=1 -> TP=2"
        for c in (actor1, actor2, rollout1, rollout2):
            await c.close()

    asyncio.run(main())
