"""Resolve an ``env.entry_point`` string ('module:callable') to the callable it names.

The part before the colon is imported with ``importlib.import_module``; the part after it is looked up
attribute by attribute (``'pkg.mod:Factory.build'`` is allowed). Every failure is a ValueError that names
``env.entry_point``, the env it belongs to and what is wrong, so a bad config fails with a readable message.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from configs.baselines import is_entry_point_form
from envs.errors import EnvConfigError

EXAMPLE = "mpe2.simple_spread_v3:parallel_env"


def import_attribute(module_name: str, attrs: list[str], *, where: str, error: type[Exception]) -> Any:
    """The object at ``module_name`` then the attribute path ``attrs``; ``error`` naming ``where`` when the module
    cannot be imported (or raises while it runs) or an attribute is missing."""
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise error(f"{where}: module {module_name!r} cannot be imported: {exc}") from exc
    except Exception as exc:  # a module that fails while running its top level is the caller's error too
        raise error(f"{where}: importing module {module_name!r} raised {exc!r}") from exc
    for depth, attr in enumerate(attrs):
        try:
            obj = getattr(obj, attr)
        except AttributeError as exc:
            owner = ".".join([module_name, *attrs[:depth]])
            raise error(f"{where}: {owner!r} has no attribute {attr!r}") from exc
    return obj


def resolve_entry_point(text: str, *, env_name: str) -> Callable[..., Any]:
    """The callable ``text`` ('module:callable' or 'module:attr.attr') names; ValueError if it cannot be had."""
    where = f"env.entry_point {text!r} (env '{env_name}')"
    module_name, _, attr_path = text.partition(":")
    attrs = attr_path.split(".")
    if not is_entry_point_form(text):
        raise EnvConfigError(f"{where} must look like 'module:callable' (a dotted module path, a colon, then an "
                         f"attribute path), e.g. {EXAMPLE!r}")
    obj = import_attribute(module_name, attrs, where=where, error=EnvConfigError)
    if not callable(obj):
        raise EnvConfigError(f"{where}: {module_name}:{attr_path} is not callable (its type is {type(obj).__name__})")
    return obj
