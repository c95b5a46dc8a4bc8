"""Train one configuration: `python train.py norm=groupnorm batch=2` (see README)."""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

import normlab.config  # registers the resolvers conf/ uses (omegaconf only: loads in ms)
import normlab.console
import normlab.run  # the run (torch and Lightning load inside it, after the checks)
import normlab.suggest

# a typo of a key or choice names the valid one first ("did you mean"), before Hydra's advice
normlab.suggest.install(Path(__file__).resolve().parent / "conf")
normlab.console.quiet()  # before an Optuna search sets up its storage


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def entry(cfg: DictConfig) -> float | None:
    checked = normlab.config.check_or_exit(cfg)  # a bad value fails before torch loads
    return normlab.run.main(cfg, validated=checked)


if __name__ == "__main__":
    try:
        entry()
    except KeyboardInterrupt:  # Ctrl+C outside a run (a multirun between jobs): no traceback
        print("interrupted (SIGINT)", file=sys.stderr)  # inside one, the run says how to resume
        raise SystemExit(130) from None
