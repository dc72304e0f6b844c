"""The config parser: jsonargparse's error for a bad key shortened to one sentence, and a bare optimizer name on the
command line read as torch's."""

import inspect
import os
import pkgutil
import re
import sys
from typing import Any, NoReturn

import torch
from lightning.pytorch.cli import LightningArgumentParser

from project.engine.errors import ConfigError, raised_in_your_code
from project.engine.model.optimization import WarmupSchedule

# --help lists the Trainer's keys but not those of the classes a config chooses (the task, its net, the DataModule).
KEYS_HINT = "every key of a config: --print_config; of one class: --model.help <class path>"


class Parser(LightningArgumentParser):
    """jsonargparse's parser, with its error for a bad key of a task or DataModule (classes chosen by class_path)
    shortened from the union's every alternative to the key and its own complaint, and printed alone: jsonargparse
    prints the whole usage (~50 lines) before it."""

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error or os.environ.get("JSONARGPARSE_DEBUG"):  # raised for a caller to handle
            super().error(condensed(message), ex)
        where = raised_in_your_code(ex) if ex is not None else None
        if where:  # importing a class of the user's failed: their line, then the key that named the class
            key = condensed(message).partition(":")[0]
            print(f"error: {where} (importing the class that {key} names)", file=sys.stderr)
            sys.exit(2)
        print(f"error: {condensed(message)}  ({KEYS_HINT})", file=sys.stderr)
        sys.exit(2)


def condensed(message: str) -> str:
    """'Parser key "model": Does not validate against any of the Union subtypes ... Parser key "lr": Expected a
    <class 'float'>. Got value: abc ...' -> 'model.lr: Expected a <class 'float'>. Got value: abc'."""
    if "Does not validate against any of the Union subtypes" not in message:
        return message
    keys, reason = [], ""
    for line in message.splitlines():
        text = line.strip()
        if key := re.fullmatch(r'(?:error: )?Parser key "([^"]+)":', text):
            keys.append(key.group(1))
        elif text.startswith("- Expected a <class 'NoneType'>"):
            break
        elif text and not text.startswith(("Does not validate", "Subtypes:", "Errors:", "- Problem with given")):
            reason = text
    given = re.search(r"Given value: NestedArg\(key='([^']+)'", message)  # the key as the command line spelled it
    name = f"{keys[0]}.{given.group(1)}" if given and keys else ".".join(keys)
    # A recipe class that does not exist, by name (SGDD) or by a path (torch.optim.SGDD): what exists instead.
    unknown = re.fullmatch(r"- Expected a dot import path string: (.+)", reason)
    missing = re.fullmatch(r"- Type .* callable class: ((?:module|No module) .+?)\. Got value: (\S+)", reason)
    found = missing or unknown
    if found and name.rpartition(".")[2] in _RECIPE_CLASSES:
        kind, known = _RECIPE_CLASSES[name.rpartition(".")[2]]
        said = f"{found[2]}: {found[1]}" if found is missing else f"{found[1]}: no {kind} has that name"
        return f"{name}={said}; give one of {', '.join(known())} or the class path of your own (my_package.Class)."
    # A bad argument of an injected class (model.optimizer.lr=abc): the class, not the whole Callable type and the
    # parsed Namespace jsonargparse names; a Literal: its choices in plain words.
    reason = re.sub(r"^Type .* expects a function or a callable class: (?:\w+: )?", "", reason)
    reason = re.sub(r"\. Got value: Namespace\(class_path='([^']+)'.*$", r" (\1)", reason)
    reason = re.sub(r"Expected a typing\.Literal\[(.*)\]\. Got value: (.*?)( \(|$)", r"\2 is not one of \1\3", reason)
    return f"{name}: {reason}" if name and reason else message


def refused_by_constructor(err: ValueError) -> ConfigError | None:
    """jsonargparse's error for a class whose constructor refused its arguments (a Lightning profiler's unknown
    ``sort_by_key``, EarlyStopping's ``mode``) in one sentence: the class (or, in a list, its kind) and the
    constructor's own message; None for any other error."""
    message = str(err)
    given = re.search(r"Given value: Namespace\(class_path='([^']+)'", message)
    kind = re.search(r"<class '([\w.]+)'>", message)
    reasons = [
        text[2:]
        for line in message.splitlines()
        if (text := line.strip()).startswith("- ")
        and not text.startswith(("- Expected a <class", "- Problem with given", "- Not a valid subclass"))
    ]
    if not reasons or not (given or kind):
        return None
    return ConfigError(f"{given[1] if given else f'a {kind[1]} of the config'}: {reasons[0]}")  # type: ignore[index]


def _subclasses(base: type) -> list[type]:
    """``base``'s subclasses imported so far, at any depth (AdamW is a subclass of Adam), in the order they were
    defined, a subclass's own after it."""
    found: list[type] = []
    todo: list[type] = base.__subclasses__()
    while todo:
        found.append(kind := todo.pop(0))
        todo = kind.__subclasses__() + todo
    return list(dict.fromkeys(found))


def _optimizers() -> list[str]:
    # Not those the recipe's parameter groups cannot use: LBFGS (no groups), SparseAdam (sparse gradients only), Muon
    # (matrices only).
    unfit = {"LBFGS", "SparseAdam", "Muon"}
    found = _subclasses(torch.optim.Optimizer)
    return sorted(c.__name__ for c in found if c.__name__ not in unfit and getattr(torch.optim, c.__name__, 0) is c)


def _schedules() -> list[str]:
    """The warmup schedules imported so far (``project/recipe.py``'s once the config named one)."""
    return list(dict.fromkeys(c.__name__ for c in _subclasses(WarmupSchedule)))


def torch_optimizer_names(args: list[str]) -> list[str]:
    """A bare optimizer name on the command line (``--model.optimizer=SGD``) is torch.optim's: jsonargparse refuses a
    name that two imported libraries share (bitsandbytes, which peft imports where it is installed, has an SGD)."""
    key, named = "--model.optimizer", []
    for i, arg in enumerate(args):
        name = arg.removeprefix(key + "=") if arg.startswith(key + "=") else arg if i and args[i - 1] == key else ""
        if name.isidentifier() and isinstance(getattr(torch.optim, name, None), type):
            arg = arg.removesuffix(name) + f"torch.optim.{name}"
        named.append(arg)
    return named


def carried_over(args: list[str], optimizer: Any) -> str | None:
    """A line naming the arguments that switching ``model.optimizer``'s class on the command line kept from the
    config's optimizer (jsonargparse keeps those the new class takes too: AdamW's weight_decay goes into SGD), those
    the command line did not give and that differ from the new class's defaults; None if it switched no class."""
    key = "--model.optimizer"
    if optimizer is None or not any(a == key or a.startswith(f"{key}=") for a in args):
        return None
    given = {a.partition("=")[0].removeprefix(f"{key}.").removeprefix("init_args.") for a in args
             if a.startswith(f"{key}.")}  # fmt: skip
    cls = pkgutil.resolve_name(str(optimizer.class_path))
    defaults = {n: p.default for n, p in inspect.signature(cls).parameters.items()}
    kept = {n: v for n, v in dict(optimizer.get("init_args") or {}).items()
            if n not in given and n in defaults and v != defaults[n]}  # fmt: skip
    if not kept:
        return None
    shown = ", ".join(f"{n}={v}" for n, v in kept.items())
    return (f"model.optimizer={cls.__name__} keeps {shown} from the config's optimizer (arguments {cls.__name__} "
            f"takes too); give --model.optimizer.<argument>=<value> for another value.")  # fmt: skip


# The task's recipe arguments that name a class: what each is, and the names it knows.
_RECIPE_CLASSES = {"optimizer": ("torch.optim optimizer", _optimizers), "schedule": ("schedule", _schedules)}
