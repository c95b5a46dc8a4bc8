"""Train one configuration: `python train.py norm=groupnorm batch=2` (see README).

The same as `normlab-train` (normlab.train.main), on the conf/ beside this file."""

from pathlib import Path

from normlab.train import main

if __name__ == "__main__":
    main(Path(__file__).resolve().parent / "conf")
