"""The one exception the CLI turns into a clean one-paragraph error instead of a traceback."""

from typing import TypeVar

E = TypeVar("E", bound=BaseException)


class ConfigError(ValueError):
    """A config value its type cannot rule out but the run cannot use (names the key, the value, what is allowed)."""


def cause_of(err: BaseException, kind: type[E]) -> E | None:
    """The first exception of ``kind`` in ``err``'s chain (``err`` itself, what caused it, what it interrupted)."""
    seen: list[BaseException] = []
    cause: BaseException | None = err
    while cause is not None and cause not in seen:
        if isinstance(cause, kind):
            return cause
        seen.append(cause)
        cause = cause.__cause__ or cause.__context__
    return None


def config_error_in(err: BaseException) -> "ConfigError | None":
    """The ``ConfigError`` that caused ``err``, if any: jsonargparse wraps what a constructor raised in a
    ValueError when it builds a class chosen by ``class_path``."""
    return cause_of(err, ConfigError)
