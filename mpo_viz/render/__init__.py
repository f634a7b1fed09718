"""Rendering: figures, the token strip, the offline HTML page and report, files out.

Owns how results look outside a live kernel (:mod:`.plots`, :mod:`.strip`, :mod:`.page`,
:mod:`.export`, :mod:`.report`, :mod:`.annotate`); the Jupyter views (:mod:`mpo_viz.widgets`) build
on it. It reads batches and analysis results and never trains or rolls out.
"""
