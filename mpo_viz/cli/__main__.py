"""``python -m mpo_viz.cli`` runs the ``mpo-viz`` command."""

import sys

from mpo_viz.cli import main

sys.exit(main())
