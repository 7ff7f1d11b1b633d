"""``python -m jianmu_fast.cli``: the ``jianmu-fast`` command line."""

import sys

from .commands import main

__all__: list[str] = []

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
