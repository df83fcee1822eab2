"""``python -m mpsim`` runs the command line."""

import sys

from mpsim.cli import main

sys.exit(main())
