"""python -m agnostic: the same as the `agnostic` command."""
import sys

from agnostic.cli import main

sys.exit(main())
