"""gym-sokoban's room arrays (GEM's and TextArena's Sokoban hold them) as this toolkit prints a board,
read independently of the adapters' own parse: the cross-replay tests compare the two."""


def board_of(game) -> str:
    """The room of ``game`` (``room_fixed``: 0 wall, 1 floor, 2 target; ``room_state``: 3 box on a target,
    4 box, 5 the player) as the exact model prints it: ``S`` for the player on a target, which GEM's
    own print hides."""
    sym = {0: "#", 1: "_", 2: "O"}
    rows = []
    for fixed, state in zip(game.room_fixed, game.room_state):
        cells = []
        for f, s in zip(fixed, state):
            if s == 5:
                cells.append("S" if f == 2 else "P")
            else:
                cells.append("√" if s == 3 else "X" if s == 4 else sym[int(f)])
        rows.append(" ".join(cells))
    return "\n".join(rows)
