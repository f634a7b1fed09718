"""Pre-registered experiments: the replication grids, the credit-accuracy studies, and their records.

Run from the repository root, e.g. ``python -m experiments.replication --size v3-e2 --status``.
``grids`` holds each version's grid as frozen data, ``runner`` runs and archives, ``stats`` holds
the statistics, ``report`` rebuilds records, tables and figures from the runs, ``readings`` holds the
numbers the docs quote; ``credit_accuracy``, ``truth_accuracy`` and ``headroom`` are the accuracy
studies. ``records/`` keeps what every version measured
(docs/results.md reads it).
"""
