"""``python -m charon_search.profiling ...`` = ``charon-search profile ...``."""

import sys

from charon_search.cli import main

sys.exit(main(["profile", *sys.argv[1:]]))
