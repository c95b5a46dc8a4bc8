"""What a run prints: each log line once, and no third-party tips, inventories or deprecation
noise.

Lightning gives its `lightning` logger a console handler of its own ("INFO: ...") and also lets
its records propagate to the root logger, where Hydra's job logging prints them again (and
writes them to the run's log file). `configure()` leaves them to the root logger when it has
handlers, so each line is printed once and still reaches Hydra's log file.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Callable

# loggers that may carry a console handler of Lightning's own
LIGHTNING_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric")
RANK_ZERO = "lightning.pytorch.utilities.rank_zero"  # the logger of Lightning's INFO lines
# (logger, text in the message) of lines that are advertisements or say nothing the run's
# config does not: Lightning's accelerator inventory (trainer.accelerator says what is used),
# MLflow's note that it creates the experiment of the first run in a store
DROPPED_LINES = (
    (RANK_ZERO, "litlogger"),
    (RANK_ZERO, "GPU available: "),
    (RANK_ZERO, "TPU available: "),
    (RANK_ZERO, "HPU available: "),
    ("lightning.pytorch.loggers.mlflow", "not found. Creating it."),
)
# loggers whose INFO lines are another library's internals: Optuna's sqlite storage sets up
# alembic ("setup plugin alembic...", "Context impl SQLiteImpl."), 7 lines per search
QUIET_LOGGERS = ("alembic",)
# (message regex, category) of warnings about third-party internals the user cannot act on
IGNORED_WARNINGS = (
    # Lightning's own _pytree helper builds torch's deprecated LeafSpec on every fit
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning),
)

# (message regex, what to do in this config's terms) of warnings the user can act on: said as
# an override, which Lightning's own text (a Trainer argument) does not
ADVICE = (
    (
        r"is smaller than the logging interval Trainer\(log_every_n_steps=",
        "set trainer.log_every_n_steps=N, N at most the training batches of an epoch, or "
        "ignore this: the metrics logged per epoch are logged all the same",
    ),
    (  # a continue line printed before the first checkpoint (ckpt_path=last_or_new) starts anew
        r"Experiment logs directory .* exists and is not empty",
        "the run starts anew in its run dir, whose earlier attempt left no checkpoint to resume: "
        "its logs are replaced; use another hydra.run.dir to keep them",
    ),
)


def advised(show: Callable[..., None]) -> Callable[..., None]:
    """warnings.showwarning that appends ADVICE's text to the warnings it names."""

    def showwarning(message, category, filename, lineno, file=None, line=None) -> None:
        text = str(message)
        for pattern, advice in ADVICE:
            if re.search(pattern, text) and advice not in text:
                text = f"{text} (normlab: {advice})"
        show(text, category, filename, lineno, file, line)

    showwarning.advised = True  # type: ignore[attr-defined]
    return showwarning


class DropLines(logging.Filter):
    """Drops records whose message contains `text`."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def quiet() -> None:
    """Only warnings from QUIET_LOGGERS (call before they log: train.py does at import)."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def configure() -> None:
    """Print each Lightning log line once and drop known noise (safe to call repeatedly)."""
    quiet()
    if logging.getLogger().hasHandlers():  # Hydra's job logging (console + file), or pytest's
        for name in LIGHTNING_LOGGERS:
            logger = logging.getLogger(name)
            for handler in list(logger.handlers):
                if type(handler) is logging.StreamHandler:  # Lightning's console handler
                    logger.removeHandler(handler)
            logger.propagate = True
    for name, text in DROPPED_LINES:
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropLines) and f.text == text for f in logger.filters):
            logger.addFilter(DropLines(text))
    for message, category in IGNORED_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)
    if not getattr(warnings.showwarning, "advised", False):
        warnings.showwarning = advised(warnings.showwarning)
