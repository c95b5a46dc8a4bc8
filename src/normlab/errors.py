"""Errors a user can fix: raised before work starts, printed as one clear line."""


class UserError(ValueError):
    """Bad input (config, combination, data): the message names the cause and the numbers."""


class ConfigError(UserError):
    """A config value or combination that cannot work."""


class DataError(UserError):
    """Missing, truncated or corrupted data files."""


class RunDirError(UserError):
    """A run dir this run cannot use: in use by another run, holding another config's run, or
    not writable."""
