import numpy as np
import pytest
import torch

from mpo_viz.data.turns import check_turn_ids, num_turns, turn_ids_from_mask


def test_turn_ids_from_mask_by_hand():
    mask = np.array([[0, 1, 1, 0, 0, 1, 0, 1, 1, 0], [1, 0, 1, 0, 1, 1, 0, 0, 0, 0]])
    expected = np.array([[0, 0, 0, 0, 0, 1, 1, 2, 2, 2], [0, 0, 1, 1, 2, 2, 2, 2, 2, 2]])
    np.testing.assert_array_equal(turn_ids_from_mask(mask), expected)
    t = turn_ids_from_mask(torch.tensor(mask, dtype=torch.float32))
    assert isinstance(t, torch.Tensor) and t.dtype == torch.int64
    np.testing.assert_array_equal(t.numpy(), expected)
    np.testing.assert_array_equal(num_turns(mask, expected), [3, 3])
    np.testing.assert_array_equal(num_turns(torch.tensor(mask), torch.tensor(expected)).numpy(), [3, 3])


def test_turn_ids_empty_and_no_action():
    assert turn_ids_from_mask(np.zeros((2, 0))).shape == (2, 0)
    np.testing.assert_array_equal(turn_ids_from_mask(np.zeros((1, 4))), [[0, 0, 0, 0]])
    np.testing.assert_array_equal(num_turns(np.zeros((1, 4)), np.zeros((1, 4), dtype=int)), [0])


def test_check_turn_ids_accepts_valid_and_derived():
    mask = np.array([[1, 1, 0, 1, 0, 0]])
    check_turn_ids(turn_ids_from_mask(mask), mask)
    check_turn_ids(np.array([[0, 0, 0, 0, 0, 0]]), mask)  # one turn spanning an observation is allowed


def test_check_turn_ids_ignores_masked_positions():
    # only action tokens define turns: -1 padding, a dip, NaN on masked positions are all fine
    mask = np.array([[1, 1, 0, 1, 0, 0], [0, 1, 0, 0, 1, 0]])
    check_turn_ids(np.array([[0, 0, -1, 1, -1, -1], [-1, 0, 7, 0, 1, -5]]), mask)
    check_turn_ids(np.array([[0, 0, np.nan, 1, np.inf, 0.5], [9, 0, 0, 0, 1, -1]]), mask)
    check_turn_ids(torch.tensor([[0, 0, -1, 1, -1, -1]]), torch.tensor([[1, 1, 0, 1, 0, 0]]))


@pytest.mark.parametrize(
    "ids, msg",
    [
        ([[0, 0, 1, 0]], r"position 3: expected non-decreasing ids on action tokens, found 1 \(position 2\) then 0"),
        ([[1, 1, 1, 1]], "position 0: expected the first action token in turn 0"),
        ([[0, 0, 2, 2]], "position 2: expected consecutive"),
        ([[0, 0, -1, 0]], "position 2: expected ids >= 0 on action tokens"),
        ([[0, 0, 0.5, 1]], "position 2: expected an integer id on an action token, found 0.5"),
    ],
)
def test_check_turn_ids_rejects(ids, msg):
    mask = np.array([[1, 0, 1, 1]])
    with pytest.raises(ValueError, match=msg) as e:
        check_turn_ids(np.array(ids), mask, name="turn_ids")
    assert "turn_ids: row 0" in str(e.value)


def test_check_turn_ids_shape():
    with pytest.raises(ValueError, match="shape"):
        check_turn_ids(np.zeros((1, 3), dtype=int), np.zeros((1, 4)))
