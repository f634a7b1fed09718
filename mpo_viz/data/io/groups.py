"""Re-cutting a stream of batches so that no group is split between two of them (group estimators
such as GRPO compare the trajectories of a group, so each must see the whole group)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from mpo_viz.data.trajectory import TrajectoryBatch

__all__ = ["group_chunks"]


def group_chunks(chunks: Iterable[TrajectoryBatch], *, strict: bool = True) -> Iterator[TrajectoryBatch]:
    """Re-cut a stream of TrajectoryBatches so that no group is split between two batches.

    The rows of the last group of each batch are held back and prepended to the next one. With
    ``strict``, a group id that reappears after its group was closed raises ``ValueError`` (group
    estimators would silently see a partial group); sort the file by ``group_id``.
    """
    carry = None
    closed: set = set()
    for chunk in chunks:
        if carry is not None and len(carry):
            chunk = TrajectoryBatch.concat([carry, chunk]) if len(chunk) else carry
        if not len(chunk):
            continue
        gids = list(chunk.group_ids)
        last = gids[-1]
        cut = len(gids)
        while cut > 0 and gids[cut - 1] == last:
            cut -= 1
        done = chunk[list(range(cut))] if cut else None
        carry = chunk[list(range(cut, len(gids)))]
        if done is not None and len(done):
            _check_closed(done, closed, strict)
            yield done
    if carry is not None and len(carry):
        _check_closed(carry, closed, strict)
        yield carry


def _check_closed(batch: TrajectoryBatch, closed: set, strict: bool) -> None:
    gids = list(batch.group_ids)
    here = set(gids)
    if strict:
        again = here & closed
        if again:
            g = sorted(again)[0]
            i = gids.index(g)
            raise ValueError(
                f"group_id: group {g!r} (traj_id {batch.traj_ids[i]!r}) appears again after other groups; "
                "group estimators need each group's rows together — sort the file by group_id"
            )
    closed |= here  # every group of a yielded batch is complete
