"""What `pip install normlab` takes: the Optuna sweeper, with its optuna<3 and sqlalchemy<2 pins,
only through the `optuna` extra (which `dev`, the tests' install, includes)."""

from __future__ import annotations

import re

import pytest
from conftest import REPO

tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_optuna_sweeper_and_its_pins_are_an_extra():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert not {"hydra-optuna-sweeper", "sqlalchemy", "optuna"} & _names(project["dependencies"])
    assert _names(extras["optuna"]) == {"hydra-optuna-sweeper", "sqlalchemy"}
    assert "normlab[optuna]" in extras["dev"]
