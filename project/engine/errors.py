"""The one exception the CLI turns into a clean one-paragraph error instead of a traceback, and where an error
raised in the user's own code came from."""

import functools
import importlib.metadata
import linecache
import sys
from types import FrameType, TracebackType
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


def _yours(frame: FrameType) -> bool:
    """A frame of the user's code: not Python's, not an installed library's (wherever it is installed: a venv, a
    --target folder on PYTHONPATH), not the engine's; the package's user rooms and modules of the user's own are."""
    module = str(frame.f_globals.get("__name__", ""))
    top = module.partition(".")[0]
    package = __name__.partition(".")[0]  # the package (its name in a repository of your own)
    if frame.f_code.co_filename.startswith("<") or top in sys.stdlib_module_names:
        return False
    if top == package:
        return not module.startswith(f"{package}.engine")
    return top not in _libraries()


@functools.cache
def _libraries() -> set[str]:
    """The top-level modules of the installed distributions."""
    return set(importlib.metadata.packages_distributions())


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
            if _yours(tb.tb_frame):
                last = tb
            tb = tb.tb_next
        if last is not None:
            frame, line = last.tb_frame, last.tb_lineno
            source = linecache.getline(frame.f_code.co_filename, line).strip()
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
