"""The papers' comparison plots: one entry per NAME of `python scripts/reproduce.py NAME`,
each declared in conf/reproduce/NAME.yaml (normlab.analysis.sweep.load)."""

from __future__ import annotations

from normlab.analysis.sweep import Reproduction, declared

REPRODUCTIONS: dict[str, Reproduction] = declared()
