"""Train one configuration: `python train.py norm=groupnorm batch=2` (see README)."""

import hydra
from omegaconf import DictConfig

import normlab.config  # noqa: F401  (registers the resolvers conf/ uses)
from normlab.run import main


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def entry(cfg: DictConfig) -> float | None:
    return main(cfg)


if __name__ == "__main__":
    entry()
