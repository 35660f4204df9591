"""Cheaper construction for frozen, slotted dataclasses made once per timer of a 500-timer
bundle (the SDK's builders, specs and results; the broker's validated operations).

A frozen dataclass's generated ``__init__`` assigns each field through
``object.__setattr__``, which costs about three times what setting the slots directly does
(a 7-field builder: 3.3 µs against 1.2 µs here); a 500-timer bundle builds six such objects
per timer. The class keeps its frozen ``__setattr__`` (assignment still raises
FrozenInstanceError), its repr, eq and fields; only construction goes through the slots'
descriptors, which the frozen guard does not see.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

C = TypeVar("C", bound=type)


def _generate(cls: type, name: str, head: list[str], first: str, last: str) -> Any:
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    params, body = [], [first] if first else []
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING:  # pragma: no cover - none use one
            raise TypeError(f"{cls.__name__}.{f.name}: default_factory is not supported")
        if f.default is dataclasses.MISSING:
            params.append(f.name)
        else:
            namespace[f"_d_{f.name}"] = f.default
            params.append(f"{f.name}=_d_{f.name}")
        namespace[f"_s_{f.name}"] = cls.__dict__[f.name].__set__
        body.append(f"    _s_{f.name}(self, {f.name})")
    body.append(last or "    pass")
    source = f"def {name}({', '.join([*head, *params])}):\n" + "\n".join(body)
    exec(source, namespace)  # noqa: S102 - generated from the dataclass's own field names
    return namespace[name]


def slotted_init(cls: C) -> C:
    """Replace the ``__init__`` of ``cls`` (a ``@dataclass(frozen=True, slots=True)``) by one
    of the same parameters and defaults that sets its slots directly."""
    init = _generate(cls, "__init__", ["self"], "", "")
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init  # type: ignore[misc]
    return cls
