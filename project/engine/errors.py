"""The one exception the CLI turns into a clean one-paragraph error instead of a traceback."""


class ConfigError(ValueError):
    """A config value its type cannot rule out but the run cannot use (names the key, the value, what is allowed)."""


def config_error_in(err: BaseException) -> "ConfigError | None":
    """The ``ConfigError`` that caused ``err``, if any: jsonargparse wraps what a constructor raised in a
    ValueError when it builds a class chosen by ``class_path``."""
    cause: BaseException | None = err
    while cause is not None and not isinstance(cause, ConfigError):
        cause = cause.__cause__ or cause.__context__
    return cause
