"""The route rules' URL builders, compiled once per process (queen_trio/api/rules.py).

``SharedBuilderRule`` overrides Werkzeug's ``Rule._compile_builder(append_unknown)``, which is
not public API: the first test fails, naming the module, as soon as Werkzeug compiles rules
another way (adapt rules.py and the pin in pyproject.toml together).
"""

from __future__ import annotations

import inspect

from werkzeug.routing import IntegerConverter, Map
from werkzeug.routing import rules as werkzeug_rules

from queen_trio.api import create_app
from queen_trio.api.rules import SharedBuilderRule
from queen_trio.server import BrokerHandle

_RULES = ("Werkzeug's Rule is not the one queen_trio/api/rules.py is written for (Werkzeug "
          "3.1); adapt rules.py and the pin in pyproject.toml together")


def test_the_werkzeug_internals_rules_py_builds_on() -> None:
    compile_source = inspect.getsource(werkzeug_rules.Rule.compile)
    for call in ("self._compile_builder(False)", "self._compile_builder(True)"):
        assert call in compile_source, _RULES
    assert list(inspect.signature(werkzeug_rules.Rule._compile_builder).parameters) == [
        "self", "append_unknown"], _RULES
    # The builder reads the converters through the rule it is bound to, not from the map it
    # was compiled for: that is what lets rules of two maps share it.
    assert werkzeug_rules._CALL_CONVERTER_CODE_FMT.startswith("self._converters["), _RULES


def _sample(rule: werkzeug_rules.Rule) -> dict[str, object]:
    values: dict[str, object] = {"unknown": "a b"}  # appended as a query string
    for name in rule.arguments:
        converter = rule._converters[name]
        values[name] = 7 if isinstance(converter, IntegerConverter) else "q/ 1é"
    return values


async def test_apps_share_builders_that_build_what_werkzeug_builds(
        broker: BrokerHandle) -> None:
    first, second = create_app(broker.context), create_app(broker.context)
    rules = [rule for rule in second.url_map.iter_rules() if rule.endpoint != "static"]
    assert len(rules) > 40
    built_first = {(rule.rule, rule.endpoint): rule for rule in first.url_map.iter_rules()}
    for rule in rules:
        assert isinstance(rule, SharedBuilderRule)
        # Compiled once: the second app's rule calls the first app's builder.
        twin = built_first[rule.rule, rule.endpoint]
        assert rule._build.__func__ is twin._build.__func__  # type: ignore[attr-defined]
        assert (rule._build_unknown.__func__  # type: ignore[attr-defined]
                is twin._build_unknown.__func__)  # type: ignore[attr-defined]

    # The URLs built are Werkzeug's own, with and without unknown arguments.
    plain = Map(merge_slashes=second.url_map.merge_slashes,
                converters=dict(second.url_map.converters))
    for rule in rules:
        plain.add(werkzeug_rules.Rule(rule.rule, methods=rule.methods, endpoint=rule.endpoint,
                                      websocket=rule.websocket))  # the streaming pop: ws://
    ours, theirs = second.url_map.bind("localhost"), plain.bind("localhost")
    for rule in rules:
        values = _sample(rule)
        method = sorted(rule.methods or {"GET"})[0]
        for append_unknown in (True, False):
            assert ours.build(rule.endpoint, values, method=method,
                              append_unknown=append_unknown) == theirs.build(
                rule.endpoint, values, method=method, append_unknown=append_unknown), rule
