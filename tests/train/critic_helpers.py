"""Batches shared by the critic tests (the fit loop, fit_critic, the critics of mpo_viz.models): the
outcome written in the prompt, so that a tiny critic can learn every return."""

import mpo_viz as mv


def label_batch(n: int = 60, **extra) -> mv.TrajectoryBatch:
    """The outcome is written in the prompt (id 3 = win, 4 = loss; even rows win): every return is
    1 or 0, a function a one-layer critic learns exactly. ``extra``: fields added to every row."""
    return mv.TrajectoryBatch.from_rows(
        [
            {
                "traj_id": f"t{i}",
                "group_id": f"g{i}",
                "prompt_ids": [1, 3 if i % 2 == 0 else 4],
                "response_ids": [5, 6, 7, 8, 9],
                "loss_mask": [1, 1, 0, 1, 1],
                "reward": float(i % 2 == 0),
                **extra,
            }
            for i in range(n)
        ]
    )


def spread(b: mv.TrajectoryBatch, vocab: int) -> mv.TrajectoryBatch:
    """``b`` with its ids spread over ``0 .. vocab − 1`` (id·7919 mod vocab: injective for these)."""
    rows = []
    for r in b.rows():
        r = dict(r)
        for f in ("prompt_ids", "response_ids"):
            r[f] = [int(i) * 7919 % vocab for i in r[f]]
        rows.append(r)
    return mv.TrajectoryBatch.from_rows(rows)
