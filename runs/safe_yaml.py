"""Untrusted YAML (a manifest `lint` reads in CI) loaded with bounded work and no surprises.

PyYAML would build an alias bomb ("billion laughs") as a small graph of shared objects that
every later walk (the rules' CEL conversion, a JSON dump) expands to billions of nodes, and a
recursive alias (`loop: &loop [*loop]`) as an object that contains itself, which recursive
native code walks until the C stack overflows (a segfault). So the document is read here from
libyaml's event stream, which is flat (no recursion), counting as it goes: every node, an alias
counting as the whole node it repeats; an alias to a node still open is a cycle. Past a bound,
or on a cycle, the file is refused before anything is expanded. The objects built are plain
JSON data, as the API server would hold them after kubectl's YAML-to-JSON step: mapping keys are
strings (`null:` -> "null", `7:` -> "7"), timestamps stay their text (`2026-01-01`), !!binary
its base64 text; ints, floats, booleans and null keep their type (positions the schema types
as strings are the caller's: runs.manifest)."""

from __future__ import annotations

import math

import yaml
from yaml.constructor import SafeConstructor
from yaml.events import (
    AliasEvent,
    DocumentEndEvent,
    DocumentStartEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
    StreamEndEvent,
    StreamStartEvent,
)
from yaml.nodes import ScalarNode

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's when built with it: ~5x faster

# A JobSet is a few hundred nodes, nested ~20 deep; a `kind: List` of many, a few thousand each.
MAX_NODES = 200_000  # per file, aliases counted expanded
MAX_DEPTH = 100  # nesting, aliases counted expanded
INT64 = (-(1 << 63), (1 << 63) - 1)  # what a Kubernetes integer field holds

_T = "tag:yaml.org,2002:"
_SCALARS = SafeConstructor()


class YamlError(ValueError):
    """Not YAML, or YAML refused as hostile or unrepresentable: one line, `where` its place."""


class _Frame:
    """A collection being built: its items, the node count under it and its anchor."""

    __slots__ = ("anchor", "depth", "items", "key", "mapping", "merges", "nodes", "line")

    def __init__(self, mapping: bool, anchor: str | None, line: int):
        self.mapping, self.anchor, self.line = mapping, anchor, line
        self.items: list = []
        self.nodes, self.depth = 1, 1  # expanded: itself and everything under it so far
        self.key: object = _NO_KEY
        self.merges: list[dict] = []


_NO_KEY = object()
_MERGE = object()


def load_all(text: str | bytes) -> list[object]:
    """Every document of `text`, as plain data. Raises YamlError (one line) on bad or hostile
    YAML: more than MAX_NODES nodes or deeper than MAX_DEPTH (aliases expanded), a recursive
    alias, a key that is not a scalar, a scalar its tag cannot hold."""
    loader = LOADER(text)
    try:
        return _documents(loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise YamlError(f"not YAML{where}: {problem}") from None
    finally:
        loader.dispose()


def _documents(loader) -> list[object]:
    docs: list[object] = []
    anchors: dict[str, tuple[object, int, int]] = {}  # anchor -> (value, nodes, depth), closed only
    open_anchors: set[str] = set()
    stack: list[_Frame] = []
    total = 0
    result: list[object] = []

    def place(value, added: int, nodes: int, depth: int, line: int) -> None:
        """`value` into its parent: `added` new nodes to the file's count (an alias: all it
        repeats; a collection: itself, its items counted as they came), `nodes` and `depth`
        its size and height expanded."""
        nonlocal total
        total += added
        if total > MAX_NODES:
            raise YamlError(f"more than {MAX_NODES} YAML nodes (line {line}; aliases counted expanded): "
                            "refused, as an alias bomb would be")
        if len(stack) + depth > MAX_DEPTH:
            raise YamlError(f"nested deeper than {MAX_DEPTH} levels (line {line}; aliases counted expanded)")
        if not stack:
            result.append(value)
            return
        top = stack[-1]
        top.nodes += nodes
        top.depth = max(top.depth, depth + 1)
        if not top.mapping:
            top.items.append(value)
        elif top.key is _NO_KEY:
            top.key = _key(value, line)
        elif top.key is _MERGE:
            top.merges.extend(_merged(value, line))
            top.key = _NO_KEY
        else:
            top.items.append((top.key, value))
            top.key = _NO_KEY

    while True:
        event = loader.get_event()
        line = event.start_mark.line + 1 if event.start_mark is not None else 0
        if isinstance(event, (StreamStartEvent, DocumentStartEvent)):
            continue
        if isinstance(event, StreamEndEvent):
            return docs
        if isinstance(event, DocumentEndEvent):
            docs.append(result.pop() if result else None)
            anchors.clear()  # anchors are per document
            continue
        if isinstance(event, AliasEvent):
            if event.anchor in open_anchors:
                raise YamlError(f"a recursive alias *{event.anchor} (line {line}): a node that contains itself")
            if event.anchor not in anchors:
                raise YamlError(f"an alias *{event.anchor} to no anchor (line {line})")
            value, nodes, depth = anchors[event.anchor]
            if stack and stack[-1].mapping and stack[-1].key is _NO_KEY and isinstance(value, (dict, list)):
                raise YamlError(f"a mapping key that is not a scalar (line {line})")
            place(value, nodes, nodes, depth, line)  # shared, not copied: nothing here is cyclic
            continue
        if isinstance(event, (SequenceStartEvent, MappingStartEvent)):
            if len(stack) + 1 > MAX_DEPTH:
                raise YamlError(f"nested deeper than {MAX_DEPTH} levels (line {line})")
            if stack and stack[-1].mapping and stack[-1].key is _NO_KEY:
                raise YamlError(f"a mapping key that is not a scalar (line {line})")
            if event.anchor is not None:
                open_anchors.add(event.anchor)
            stack.append(_Frame(isinstance(event, MappingStartEvent), event.anchor, line))
            continue
        if isinstance(event, (SequenceEndEvent, MappingEndEvent)):
            frame = stack.pop()
            if frame.mapping:
                value: object = {}
                for merged in frame.merges:  # `<<: *base`: the mapping's own keys win
                    value.update(merged)
                value.update(frame.items)
            else:
                value = frame.items
            if frame.anchor is not None:
                open_anchors.discard(frame.anchor)
                anchors[frame.anchor] = (value, frame.nodes, frame.depth)
            place(value, 1, frame.nodes, frame.depth, frame.line)
            continue
        if isinstance(event, ScalarEvent):
            tag = event.tag
            if tag is None or tag == "!":
                tag = loader.resolve(ScalarNode, event.value, event.implicit)
            if stack and stack[-1].mapping and stack[-1].key is _NO_KEY and tag == _T + "merge":
                stack[-1].key = _MERGE
                total += 1
                stack[-1].nodes += 1
                continue
            value = _scalar(tag, event.value, line)
            if event.anchor is not None:
                anchors[event.anchor] = (value, 1, 1)
            place(value, 1, 1, 1, line)
            continue
        raise YamlError(f"unexpected YAML event {type(event).__name__} (line {line})")


def _scalar(tag: str, text: str, line: int):
    node = ScalarNode(tag, text)
    try:
        if tag == _T + "null":
            return None
        if tag == _T + "bool":
            return _SCALARS.construct_yaml_bool(node)
        if tag == _T + "int":
            value = _SCALARS.construct_yaml_int(node)
            if INT64[0] <= value <= INT64[1]:
                return value
        if tag == _T + "float":
            value = _SCALARS.construct_yaml_float(node)
            return value if math.isfinite(value) else text  # JSON has no nan/inf: kept as text
    except (ValueError, KeyError, yaml.YAMLError):  # `!!bool maybe`: a KeyError in PyYAML
        raise YamlError(f"the scalar {text[:40]!r} (line {line}) is not a valid {tag.rsplit(':', 1)[-1]}") from None
    if tag == _T + "int":
        raise YamlError(f"the integer {text[:40]} (line {line}) does not fit 64 bits, as a Kubernetes integer must")
    return text  # str, timestamp (kubectl keeps it text), binary (its base64), unknown tags


def _key(value, line: int) -> str:
    """A mapping key as JSON holds it: a string (YAML 1.1 `yes:` is the boolean true -> "true")."""
    if isinstance(value, (dict, list)):
        raise YamlError(f"a mapping key that is not a scalar (line {line})")
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _merged(value, line: int) -> list[dict]:
    if isinstance(value, dict):
        return [value]
    if isinstance(value, list) and all(isinstance(v, dict) for v in value):
        return list(reversed(value))  # the first listed wins: applied last
    raise YamlError(f"a merge key `<<` needs a mapping or a list of mappings (line {line})")
