"""The arguments SLM-Lab passes to the drop-in's methods, checked: ``update`` and
``add_experience`` values bound to the interface's names (``bind``), the env axis of a
vector env's step (``check_env_axis``) and a batch size (``batch_count``)."""
from __future__ import annotations

import numbers

import numpy as np

from ..errors import InterfaceMismatchError, InvalidArgumentError, SchemaMismatchError


def bind(method: str, args: tuple, kwargs: dict, names: tuple, slm_version: str, chosen: str) -> tuple:
    """The values of ``args`` and ``kwargs`` in the order of ``names`` (the ``slm_version``
    interface's, chosen because ``chosen``), or an error that says which interface is in use."""
    if not kwargs and len(args) == len(names):
        return args
    if not args and len(kwargs) == len(names):
        try:
            return tuple(kwargs[name] for name in names)
        except KeyError:
            pass
    given = len(args) + len(kwargs)
    rest = dict(kwargs)
    values = list(args[: len(names)])
    missing = []
    for name in names[len(values):]:
        if name in rest:
            values.append(rest.pop(name))
        else:
            missing.append(name)
    duplicated = [name for name in names[: len(args)] if name in rest]
    problems = []
    if len(args) > len(names):
        problems.append(f"{len(args) - len(names)} argument(s) too many")
    if missing:
        problems.append(f"missing {', '.join(missing)}")
    if duplicated:
        problems.append(f"{', '.join(duplicated)} given twice")
    unknown = [name for name in rest if name not in duplicated]
    if unknown:
        problems.append(f"unexpected {', '.join(unknown)}")
    if not problems:
        return tuple(values)
    other = "v5" if slm_version == "v4" else "v4"
    raise InterfaceMismatchError(
        f"{method}() got {given} argument(s) ({'; '.join(problems)}); this memory follows SLM-Lab "
        f"{slm_version}'s interface, {method}({', '.join(names)}), because {chosen}. "
        f"SLM-Lab v4 passes a body and calls update(state, action, reward, next_state, done); v5 passes "
        f"the agent and adds terminated, truncated. For {other}'s interface construct "
        f"DiskReplay{other.upper()} or pass what {other} passes")


def check_env_axis(values: tuple, value_names: tuple, num_envs: int) -> tuple:
    """``values`` (named ``value_names``) if each has a leading env axis of ``num_envs``."""
    n = num_envs
    for name, value in zip(value_names, values):
        if len(np.shape(value)) == 0 or np.shape(value)[0] != n:
            raise SchemaMismatchError(
                f"{name}: got shape {np.shape(value)}; a step of a vector env of {n} envs has a leading "
                f"env axis of {n} (use add_experience for one transition)")
    return values


def batch_count(batch_size) -> int:
    if isinstance(batch_size, (bool, np.bool_)) or not isinstance(batch_size, numbers.Integral) or batch_size < 1:
        raise InvalidArgumentError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    return int(batch_size)
