"""Making instances of frozen, slotted dataclasses in bulk (the SDK's consume() makes a Message
per message of a batch, the broker a frame per row of a pop's answer)."""

from __future__ import annotations

import dataclasses
from typing import Any


def slot_maker(cls: type[Any]) -> Any:
    """A function taking every field of the frozen, slotted dataclass ``cls`` positionally
    (in field order) and making an instance: its slots set through their descriptors, as the
    class's own ``__init__`` sets them but without the frozen ``object.__setattr__`` per field
    (a 12-field Message in 0.6 µs rather than 1.2). Made from the fields, as dataclasses makes
    ``__init__``; for classes without ``__post_init__`` or field defaults made by factories."""
    assert dataclasses.is_dataclass(cls) and not hasattr(cls, "__post_init__")
    names = [f.name for f in dataclasses.fields(cls)]
    scope: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    scope.update({f"_set_{n}": getattr(cls, n).__set__ for n in names})
    lines = [f"def make({', '.join(names)}):", "    o = _new(_cls)",
             *(f"    _set_{n}(o, {n})" for n in names), "    return o"]
    exec("\n".join(lines), scope)  # noqa: S102 - code made from field names only
    return scope["make"]
