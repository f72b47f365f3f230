"""Checkpoints a model service cannot take, at run time: a checkpoint of another role
(FAILED_PRECONDITION naming the checkpoint and a tensor it lacks), a relative save path, a save
over a directory that is not a checkpoint; each leaves the service's state as it was."""
import asyncio

import grpc
import torch

INVALID = grpc.StatusCode.INVALID_ARGUMENT


def test_another_roles_checkpoint_is_refused_naming_a_tensor(services, tmp_path):
    async def main():
        actor, critic = services.client("actor"), services.client("critic")
        seq = services.sequences(await services.client("rollout", "actor").generate_sequences(
            services.prompts(), max_new_tokens=6, n=2, temperature=0.7, seed=3))
        before = (await actor.compute_log_prob(seq))[0]["old_log_probs"]
        critic_ckpt = await critic.save_checkpoint(str(tmp_path / "critic"))
        await services.expect_error(actor.load_checkpoint(critic_ckpt), grpc.StatusCode.FAILED_PRECONDITION,
                                    f"{critic_ckpt!r}", "has no 'policy.", "another role's")
        await services.expect_error(actor.save_checkpoint("relative/actor"), INVALID, "must be absolute")
        await services.expect_error(critic.save_checkpoint(str(tmp_path)), grpc.StatusCode.FAILED_PRECONDITION,
                                    "not a Tandem checkpoint")  # tmp_path holds critic/: never replaced
        assert (tmp_path / "critic" / "tandem_complete").is_file()
        assert torch.equal((await actor.compute_log_prob(seq))[0]["old_log_probs"], before)
        await actor.close()
        await critic.close()

    asyncio.run(main())
