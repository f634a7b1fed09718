"""Integrations with training frameworks (top of the dependency graph: nothing in mpo_viz imports them).

``mpo_viz.integrations.verl`` is the verl plugin; verl imports it (entry point ``verl.plugins``), so
importing ``mpo_viz`` never imports verl.
"""
