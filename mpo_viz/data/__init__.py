"""The data layer: the trajectory/v1 format, its validation, the in-memory batch and its files.

Owns the schema (:mod:`.schema`), ragged arrays (:mod:`.ragged`), turn structure (:mod:`.turns`),
mergeable statistics (:mod:`.moments`), row validation (:mod:`.validate`), :class:`TrajectoryBatch`
(:mod:`.trajectory`), reading and writing files (:mod:`.io`), synthetic batches, token display
text and the trainer's run-folder format (:mod:`.runfolder`). Nothing here imports a model,
environment or estimator.
"""
