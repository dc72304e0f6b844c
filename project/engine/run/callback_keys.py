"""``--callback.<Name>=false`` and ``--callback.<Name>.<argument>=<value>``: one listed callback switched off, or one
of its arguments set, from the command line. jsonargparse sets an item of a list only by restating the whole list
(or, with ``--trainer.callbacks.<argument>``, its last item), and ``trainer.callbacks`` lists every callback."""

import inspect
import re
from typing import Any

from jsonargparse import ArgumentError, ArgumentParser

from project.engine.errors import ConfigError
from project.engine.run.checks import kind_of


def edit_callbacks(trainer: Any, edits: dict[str, Any]) -> None:
    """Applies ``edits`` (the parsed ``callback`` key: {"Name": False} or {"Name.argument": value}, or jsonargparse's
    {"Name": {"argument": value}}) to ``trainer.callbacks``, the parsed list. Name is a listed class's name (every
    listed callback of that class takes the edit)."""
    flat: dict[str, Any] = {}
    for key, value in edits.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{argument}": v for argument, v in value.items()})
        else:
            flat[key] = value
    for key, value in flat.items():
        listed = list(trainer.callbacks or [])
        name, _, argument = key.partition(".")
        matches = [cb for cb in listed if _name(cb) == name]
        if not matches:
            names = ", ".join(_name(cb) for cb in listed) or "none"
            raise ConfigError(f"callback.{key}: trainer.callbacks lists no {name}; it lists {names}.")
        if not argument:
            if value is not False:
                raise ConfigError(
                    f"callback.{name}={value!r}: false takes {name} out of trainer.callbacks; one of its arguments "
                    f"is set with --callback.{name}.<argument>=<value>."
                )
            trainer.callbacks = [cb for cb in listed if all(cb is not m for m in matches)]
            continue
        parameters = _parameters(kind_of(matches[0]))
        accepted = list(parameters)
        if argument not in accepted:
            raise ConfigError(f"callback.{key}: {name} takes no argument {argument!r}; it takes {', '.join(accepted)}.")
        value = _typed(key, value, parameters[argument].annotation)
        for callback in matches:
            if callback.get("init_args") is None:
                callback.init_args = type(callback)()  # an empty Namespace
            callback.init_args[argument] = value


def _name(callback: Any) -> str:
    """A parsed callback's class name, as a --callback key spells it."""
    return str(callback.class_path).rpartition(".")[2]


def _parameters(cls: type) -> dict[str, inspect.Parameter]:
    """The arguments ``cls`` takes: its own, and those its ``**kwargs`` hands on to the classes it derives from."""
    found: dict[str, inspect.Parameter] = {}
    for kind in cls.__mro__:
        if "__init__" not in vars(kind):
            continue
        own = inspect.signature(kind.__init__).parameters  # type: ignore[misc]
        found.update({n: p for n, p in own.items() if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                      and n not in found})  # fmt: skip
        if not any(p.kind == p.VAR_KEYWORD for p in own.values()):
            break
    return found


def _typed(key: str, value: Any, annotation: Any) -> Any:
    """``value`` checked against the argument's type, as jsonargparse checks a config's value."""
    if annotation is inspect.Parameter.empty:
        return value
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--value", type=annotation)
    try:
        return parser.parse_object({"value": value}).value
    except ArgumentError as err:
        expected = re.findall(r"Expected a (<class '[\w.]+'>|[^\n]+)", str(err))
        reason = " or ".join(e.removeprefix("<class '").removesuffix("'>") for e in expected) or str(err).strip()
        raise ConfigError(f"callback.{key}={value!r}: expected {reason}.") from None
