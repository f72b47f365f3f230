"""The training path keeps its scalar metrics on the device and reads them back once per
train_steps call (schedule.is_scalar, step.host_floats); device.to_device copies inputs
without a stream sync on GPUs and is a plain .to() elsewhere."""
import pytest
import torch

from tandem.parallel.device import to_device
from tandem.train.schedule import is_scalar
from tandem.train.step import host_floats


def test_scalar_metrics_are_floats_and_0_dim_tensors_not_per_row_outputs():
    assert is_scalar(0.5) and is_scalar(torch.tensor(2.0))
    assert not is_scalar(torch.zeros(4, 3)) and not is_scalar(torch.zeros(1)) and not is_scalar(3)


def test_host_floats_reads_every_tensor_back_as_a_float():
    out = host_floats({"a": torch.tensor(1.5), "b": 2.0, "c": torch.tensor(3, dtype=torch.int64)})
    assert out == {"a": 1.5, "b": 2.0, "c": 3.0}
    assert all(type(v) is float for v in out.values())
    assert host_floats({"b": 2.0}) == {"b": 2.0}  # nothing to read: no stack of nothing


def test_to_device_on_the_host_is_a_plain_copy():
    t = torch.arange(6).view(2, 3)
    out = to_device(t, torch.device("cpu"))
    assert torch.equal(out, t) and out.device.type == "cpu"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_to_device_copies_to_the_gpu_exactly():
    t = torch.randn(1000)
    out = to_device(t, torch.device("cuda"))
    assert out.is_cuda and torch.equal(out.cpu(), t)


def test_the_actor_loss_leaves_its_metrics_on_the_device(megatron_dist):
    """ppo_actor_loss's metrics are 0-dim tensors (no host read per micro-batch) and its
    units come from the host mask."""
    from tandem.config import ActorConfig
    from tandem.data.batch import DataProto
    from tandem.train.losses import ppo_actor_loss

    b, r, v = 3, 4, 11
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    mb = DataProto(tensors={"responses": torch.randint(0, v, (b, r), generator=g), "response_mask": mask,
                            "old_log_probs": -torch.rand(b, r, generator=g), "advantages": torch.randn(b, r, generator=g)})
    logits = torch.randn(b, r + 2, v, generator=g, requires_grad=True)  # [B, T, V]: the last r+1 predict responses
    loss, units, metrics = ppo_actor_loss(logits, mb, cfg=ActorConfig(), temperature=1.0)
    assert units == 7
    assert metrics and all(isinstance(m, torch.Tensor) and m.dim() == 0 for m in metrics.values())
    loss.backward()
    assert logits.grad is not None and logits.grad.abs().sum() > 0
