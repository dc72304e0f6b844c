"""The one exception the CLI turns into a clean one-paragraph error instead of a traceback, and where an error
raised in the user's own code came from."""

import sysconfig
from pathlib import Path
from types import TracebackType
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


_NOT_YOURS = (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
              str(Path(__file__).parent))  # Python's, the installed libraries', the engine's  # fmt: skip


def _yours(filename: str) -> bool:
    return not filename.startswith(("<", *_NOT_YOURS)) and "site-packages" not in filename


def raised_in_your_code(err: BaseException) -> str | None:
    """Where an exception in ``err``'s chain was raised in code of the user's own (a task, a net, a DataModule: not
    the engine's, a library's or Python's), with the exception: "mynet.py, line 6 (`def forward(self, x: Any):`),
    in Net: NameError: name 'Any' is not defined". jsonargparse wraps what importing or building a class raised in
    an error of its own that keeps only the message. None where no frame of the chain is the user's."""
    seen: list[BaseException] = []
    cause: BaseException | None = err
    while cause is not None and cause not in seen:
        seen.append(cause)
        tb: TracebackType | None = cause.__traceback__
        last = None
        while tb is not None:
            if _yours(tb.tb_frame.f_code.co_filename):
                last = tb
            tb = tb.tb_next
        if last is not None:
            frame, line = last.tb_frame, last.tb_lineno
            source = _source_line(frame.f_code.co_filename, line)
            owner, function = frame.f_locals.get("self"), frame.f_code.co_name
            inside = (
                f", in {type(owner).__module__}.{type(owner).__qualname__}.{function}"
                if owner is not None
                else f", in {function}"
            )
            return (f"{frame.f_code.co_filename}, line {line}{f' (`{source}`)' if source else ''}{inside}: "
                    f"{type(cause).__name__}: {cause}")  # fmt: skip
        cause = cause.__cause__ or cause.__context__
    return None


def _source_line(filename: str, line: int) -> str:
    import linecache

    return linecache.getline(filename, line).strip()
