"""``python -m stagelens.cli``: the console script without its installed wrapper."""

import sys

from stagelens.cli import main

sys.exit(main())
