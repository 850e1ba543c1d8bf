"""Errors caused by the user's input (config, data, model files), as opposed to bugs.

The command line prints a UserError as one message and exits with code 2, without a traceback.
"""


def listed(names: list[str], limit: int) -> str:
    """The first `limit` names of an error message, comma-separated, and how many more there are."""
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


class UserError(Exception):
    """Bad input that the user can fix; the message names the offending item and the problem."""


class ConfigError(UserError):
    """An experiment configuration that cannot run."""


class DataError(UserError):
    """A prompt file that cannot be used."""
