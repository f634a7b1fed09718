"""Training: SFT warm start, critic warm-up and RL iterations with any estimator and loss.

``Trainer(Config(...), run_dir)`` in a notebook (``for m in trainer.iterate(5): ...``),
``launch(cfg, run_dir)`` for a subprocess the notebook can watch with a ``TrainingDashboard``, and
``mpo-viz train`` in the shell. Modules: ``config`` (the flat :class:`Config`), ``loop``
(:class:`Trainer`), ``update`` (epochs × minibatches × micro-batches), ``sft``, ``checkpoint``,
``runfolder``, ``launch``, ``export`` (a trained checkpoint as a model: :func:`load_model`,
:func:`export`). See docs/training.md.

``Trainer`` is imported on first use (``mpo_viz.train.Trainer``): it pulls in the models and
their tokenizer (transformers, about a second), which the ``mpo-viz`` commands other than ``train``
never need, while they read the :class:`Config` declarations for their flags.
"""

from mpo_viz.train.config import Config, TrustRegionWarning
from mpo_viz.train.launch import RunHandle, launch

__all__ = ["Config", "RunHandle", "Trainer", "TrustRegionWarning", "export", "launch", "load_model", "load_trained"]


def __getattr__(name):
    if name == "Trainer":
        from mpo_viz.train.loop import Trainer

        return Trainer
    if name in ("export", "load_model", "load_trained"):
        from mpo_viz.train import export as exporting

        return getattr(exporting, name)
    raise AttributeError(f"module 'mpo_viz.train' has no attribute {name!r}")
