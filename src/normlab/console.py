"""What a run prints: each log line once, and no third-party tips or deprecation noise.

Lightning gives its `lightning` logger a console handler of its own ("INFO: ...") and also lets
its records propagate to the root logger, where Hydra's job logging prints them again (and
writes them to the run's log file). `configure()` leaves them to the root logger when it has
handlers, so each line is printed once and still reaches Hydra's log file.
"""

from __future__ import annotations

import logging
import warnings

# loggers that may carry a console handler of Lightning's own
LIGHTNING_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric")
# (logger, text in the message) of INFO lines that are advertisements, not about the run
DROPPED_LINES = (("lightning.pytorch.utilities.rank_zero", "litlogger"),)
# (message regex, category) of warnings about third-party internals the user cannot act on
IGNORED_WARNINGS = (
    # Lightning's own _pytree helper builds torch's deprecated LeafSpec on every fit
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning),
)


class DropLines(logging.Filter):
    """Drops records whose message contains `text`."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def configure() -> None:
    """Print each Lightning log line once and drop known noise (safe to call repeatedly)."""
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
