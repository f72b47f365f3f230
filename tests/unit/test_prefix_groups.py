"""prefix_groups.PrefixGroups: which slots share a prompt, and groups broken when a slot is refilled."""
import pytest
import torch

from tandem.generation.prefix_groups import PrefixGroups


def test_a_group_is_listed_at_its_first_slot_with_its_prompt_length():
    pg = PrefixGroups(8, 2, torch.device("cpu"))
    pg.admit([((2, 3), 7), ((5, 0), 4)])
    assert pg.plen.tolist() == [4, 0, 7, 7, 0, 4, 0, 0]
    assert pg.members[0].tolist() == [0, 5] and pg.members[2].tolist() == [2, 3]
    assert (pg.members[[1, 3, 4, 5, 6, 7]] == -1).all()


def test_a_refilled_slot_breaks_its_old_group():
    """The old group's other slots read their own copies (plen 0) and its entry is cleared: a stale
    entry never writes for a slot that changed hands."""
    pg = PrefixGroups(6, 3, torch.device("cpu"))
    pg.admit([((0, 1, 2), 5), ((3, 4, 5), 6)])
    pg.admit([((1, 4, 2), 9)])  # slots of both groups finished and were refilled
    assert pg.plen.tolist() == [0, 9, 9, 0, 9, 0]
    assert pg.members[1].tolist() == [1, 2, 4]
    assert (pg.members[[0, 2, 3, 4, 5]] == -1).all()
    pg.admit([((0, 3, 5), 2)])  # its slots were in no group any more: nothing else changes
    assert pg.plen.tolist() == [2, 9, 9, 2, 9, 2] and pg.members[0].tolist() == [0, 3, 5]
    pg.reset()
    assert pg.plen.tolist() == [0] * 6 and (pg.members == -1).all()


def test_a_group_of_the_wrong_size_is_refused_and_changes_nothing():
    pg = PrefixGroups(4, 2, torch.device("cpu"))
    pg.admit([((0, 1), 3)])
    with pytest.raises(ValueError, match="n=2"):
        pg.admit([((2, 3, 1), 3)])
    assert pg.plen.tolist() == [3, 3, 0, 0] and pg.members[0].tolist() == [0, 1]
