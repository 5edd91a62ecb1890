"""``python -m sojourn.actors.cli``: the same as the ``sojourn`` console script."""

import sys

from . import main

sys.exit(main())
