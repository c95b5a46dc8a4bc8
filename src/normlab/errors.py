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


def user_error(err: BaseException) -> UserError | None:
    """The UserError behind err (Hydra's instantiate wraps what a constructor raises)."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, UserError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
