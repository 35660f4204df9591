"""Route rules whose URL builders are compiled once per process rather than once per app.

For every rule of every app, Werkzeug generates two URL-building functions (an AST turned into
code by ``compile()``): about 1 ms of CPU a rule, two thirds of a broker's start-up with 58
rules, paid again by each of the test suite's in-process brokers. A builder depends only on
the rule's parsed text (its ``_trace``) and its defaults, and reads the map's converters through
``self`` when called, so rules with the same text share one. Werkzeug's ``Rule.compile``
calls ``_compile_builder(append_unknown)``, which is not public API
(tests/unit/test_route_rules.py checks it, with the pin in pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quart.routing import QuartRule

_BUILDERS: dict[tuple[str, tuple[tuple[bool, str], ...], bool], Callable[..., Any]] = {}


class SharedBuilderRule(QuartRule):
    def _compile_builder(self, append_unknown: bool = True) -> Callable[..., Any]:
        if self.defaults:  # a default may be folded into the code through a converter
            return super()._compile_builder(append_unknown)
        key = (self.rule, tuple(self._trace), append_unknown)
        builder = _BUILDERS.get(key)
        if builder is None:
            builder = _BUILDERS[key] = super()._compile_builder(append_unknown)
        return builder
