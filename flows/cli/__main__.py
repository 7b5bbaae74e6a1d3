"""``python -m flows.cli``: the ``labelshift`` command."""
import sys

from flows.cli import main

sys.exit(main())
