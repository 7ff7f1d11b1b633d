"""``python -m jianmu_fast``: the ``jianmu-fast`` command line (see ``jianmu_fast.cli``)."""

import sys

from .cli import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
