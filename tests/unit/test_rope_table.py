"""RoPE from a cos / sin table (tandem/models/rope_table.py): megatron's arithmetic exactly, and
the packed forward uses it."""
import pytest
import torch

from tandem.models import rope_table


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mscale", [1.0, 1.3])
def test_table_equals_megatron_rope(dtype, mscale):
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd

    g = torch.Generator().manual_seed(0)
    t = torch.randn(37, 3, 16, generator=g).to(dtype)  # [tokens, heads, head dim]
    angles = torch.rand(37, 1, 12, generator=g) * 500  # rotates 12 of 16 dims; large angles as late positions
    want = _apply_rotary_pos_emb_bshd(t, angles, mscale=mscale)
    got = rope_table.apply(t, rope_table.table(angles), mscale)
    assert got.dtype == want.dtype and torch.equal(got, want)
    assert not torch.equal(got[..., :12], t[..., :12]) and torch.equal(got[..., 12:], t[..., 12:])


def test_rows_rounded_once_as_megatron_rounds():
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd

    angles = torch.rand(50, 1, 1, 8) * 50  # positions 0..49
    positions = torch.tensor([3, 0, 49, 7, 7])
    rows = rope_table.rows(angles, positions, torch.bfloat16)
    assert rows.shape == (5, 1, 16) and rows.dtype == torch.bfloat16
    t = torch.randn(5, 2, 8).to(torch.bfloat16)
    assert torch.equal(rope_table.apply(t, rows), _apply_rotary_pos_emb_bshd(t, angles[positions].squeeze(1)))


def test_angles_and_tables_told_apart():
    t = torch.zeros(5, 2, 8)
    assert not rope_table.is_table(torch.zeros(5, 1, 8), t) and not rope_table.is_table(torch.zeros(5, 1, 6), t)
    assert rope_table.is_table(torch.zeros(5, 1, 16), t)


def test_usable_only_for_plain_rotate_half():
    from types import SimpleNamespace as NS

    assert rope_table.usable(NS(apply_rope_fusion=False, rotary_interleaved=False, multi_latent_attention=False))
    for key in ("apply_rope_fusion", "rotary_interleaved", "multi_latent_attention"):
        assert not rope_table.usable(NS(**{key: True}))


def test_megatron_attention_keeps_angles(megatron_dist):
    """Installed, megatron's attention still applies angles itself (unpacked batches, generation)."""
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd
    from megatron.core.transformer import attention
    from megatron.core.transformer.transformer_config import TransformerConfig

    rope_table.install()
    rope_table.install()  # idempotent: not wrapped twice
    fn = attention.apply_rotary_pos_emb
    assert fn._tandem_table and fn.__closure__[0].cell_contents.__module__.startswith("megatron")
    cfg = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2)
    t, angles = torch.randn(4, 1, 2, 8), torch.rand(4, 1, 1, 8)
    assert torch.equal(fn(t, angles, cfg), _apply_rotary_pos_emb_bshd(t, angles))
    assert torch.equal(fn(t, rope_table.table(angles), cfg), _apply_rotary_pos_emb_bshd(t, angles))
