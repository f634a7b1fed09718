"""Data shared by the adapter tests: the sample logs' folder, and token ids of the step-wise and
SkyRL tests (ids of the word tokenizer of conftest.WORDS)."""

from pathlib import Path

SAMPLES = Path(__file__).resolve().parents[2] / "trajectories" / "samples"

P0 = [2, 7, 6, 4]  # <|system|> you <|eot|> <|assistant|>
C0 = [20, 15, 21, 17, 6]  # calc 2 + 3 <|eot|>
OBS = [5, 22, 23, 6, 4]  # <|tool|> result 5 <|eot|> <|assistant|>
C1 = [25, 23, 6]  # answer 5 <|eot|>
