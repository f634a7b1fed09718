"""Training: SFT warm start, critic warm-up and RL iterations with any estimator and loss.

``Trainer(Config(...), run_dir)`` in a notebook (``for m in trainer.iterate(5): ...``),
``launch(cfg, run_dir)`` for a subprocess the notebook can watch with a ``TrainingDashboard``, and
``mpo-viz train`` in the shell. Modules: ``config`` (the flat :class:`Config`), ``loop``
(:class:`Trainer`), ``update`` (epochs × minibatches × micro-batches), ``sft``, ``checkpoint``,
``runfolder``, ``launch``. See docs/training.md.
"""

from mpo_viz.train.config import Config, TrustRegionWarning
from mpo_viz.train.launch import RunHandle, launch
from mpo_viz.train.loop import Trainer

__all__ = ["Config", "RunHandle", "Trainer", "TrustRegionWarning", "launch"]
