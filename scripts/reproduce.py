"""Reproduce the papers' comparison plots from run logs: `python scripts/reproduce.py NAME ...`.

The same as `normlab-reproduce NAME ...` from an installed normlab: both run
normlab.analysis.reproduce.main, whose --help and docstring say what it does.
"""

from normlab.analysis.reproduce import main

if __name__ == "__main__":
    main()
