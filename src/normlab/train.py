"""Train one configuration: `normlab-train norm=groupnorm batch=2` from an installed normlab, or
`python train.py norm=groupnorm batch=2` from a checkout (README). Both run `main`: the wheel's on
the conf/ inside the package (normlab.layout.conf_dir), train.py on the conf/ beside it."""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

import normlab.config  # registers the resolvers conf/ uses (omegaconf only: loads in ms)
import normlab.console
import normlab.run  # the run (torch and Lightning load inside it, after the checks)
import normlab.suggest
from normlab import layout


def _train(cfg: DictConfig) -> float | None:
    checked = normlab.config.check_or_exit(cfg)  # a bad value fails before torch loads
    return normlab.run.main(cfg, validated=checked)


def main(conf: str | Path | None = None) -> None:
    """Compose conf/train.yaml with the command line's overrides (Hydra) and run it: `conf` is
    the config dir, normlab's own (layout.conf_dir()) when None."""
    conf = Path(conf or layout.conf_dir()).resolve()
    # a typo of a key or choice names the valid one first ("did you mean"), before Hydra's advice
    normlab.suggest.install(conf)
    normlab.console.quiet()  # before an Optuna search sets up its storage
    entry = hydra.main(version_base="1.3", config_path=str(conf), config_name="train")(_train)
    try:
        entry()
    except KeyboardInterrupt:  # Ctrl+C outside a run (a multirun between jobs): no traceback
        print("interrupted (SIGINT)", file=sys.stderr)  # inside one, the run says how to resume
        raise SystemExit(130) from None


if __name__ == "__main__":  # python -m normlab.train ARGS
    main()
