"""Topic configs of Terraform files (``.tf``), read with python-hcl2's parser.

Recognised: ``kafka_topic`` resources of the Mongey/kafka provider (``name``,
``replication_factor``, ``partitions``, ``config = {...}``) and ``confluent_kafka_topic``
of the Confluent provider (``topic_name``, ``partitions_count``, ``config``; Confluent
Cloud fixes the replication factor, so there is none to check). Positions come from the
parse tree; a value that is an expression (``var.rf``, ``each.value``, ``"${local.x}"``) is
dynamic: no rule judges it. python-hcl2 is imported only when a ``.tf`` file is linted.

python-hcl2's parser costs 10-25 ms a file, most of a directory run's time when a repository
holds many ``.tf`` files. Files written in the plain layout topic files nearly always have
(one attribute, block brace or comment per line; literal strings without escapes or
templates, integers, references, one-line lists; ``config = {`` objects with quoted keys) are
read by a strict line scanner instead, giving the same units at the same positions; any
line it does not recognise hands the whole file to python-hcl2, which stays the reference
parser (tests/test_lint_hcl_fastpath.py checks both agree).
"""

from __future__ import annotations

import re
from typing import Any

from kresilient.lint.model import ConfigUnit, Entry, Kind, ParseError, ReadResult

__all__ = ["read_terraform"]

#: resource type -> (name attribute, {attribute: Kafka key})
_TOPIC_RESOURCES: dict[str, tuple[str, dict[str, str]]] = {
    "kafka_topic": (
        "name",
        {"replication_factor": "replication.factor", "partitions": "partitions"},
    ),
    "confluent_kafka_topic": ("topic_name", {"partitions_count": "partitions"}),
}
_DYNAMIC = object()
_CONSTANTS = {"true": True, "false": False, "null": None}


def _data(node: Any) -> str:
    data = getattr(node, "data", None)
    return str(data) if data is not None else ""


def _trees(node: Any) -> list[Any]:
    return [c for c in getattr(node, "children", []) if _data(c)]


def _pos(node: Any) -> tuple[int, int]:
    meta = getattr(node, "meta", None)
    line = getattr(meta, "line", None) or getattr(node, "line", None) or 1
    col = getattr(meta, "column", None) or getattr(node, "column", None) or 1
    return int(line), int(col)


def _value(node: Any) -> object:
    """A literal HCL value (number, plain string, bool, object of literals), else _DYNAMIC."""
    kind = _data(node)
    if kind == "expr_term":
        inner = _trees(node)
        return _value(inner[0]) if len(inner) == 1 else _DYNAMIC
    if kind == "int_lit":
        return int(str(node.children[0]))
    if kind == "float_lit":
        return float(str(node.children[0]))
    if kind == "string":
        parts: list[str] = []
        for child in _trees(node):
            tokens = getattr(child, "children", [])
            if _data(child) != "string_part" or any(_data(t) for t in tokens):
                return _DYNAMIC  # an interpolation: "${var.x}"
            parts.extend(str(t) for t in tokens)
        return "".join(parts)
    if kind in ("identifier", "literal_value"):
        name = str(node.children[0])
        return _CONSTANTS.get(name, _DYNAMIC)
    if kind == "unary_op":
        inner = _trees(node)
        value = _value(inner[0]) if len(inner) == 1 else _DYNAMIC
        sign = str(node.children[0])
        if sign == "-" and isinstance(value, int | float) and not isinstance(value, bool):
            return -value
        return _DYNAMIC
    if kind == "object":
        return {k: v for k, _, _, v in _object(node)}
    return _DYNAMIC


def _object(node: Any) -> list[tuple[str, int, int, object]]:
    """(key, line, col, value) of each element of an HCL object."""
    out: list[tuple[str, int, int, object]] = []
    for elem in _trees(node):
        if _data(elem) != "object_elem":
            continue
        parts = _trees(elem)
        if len(parts) < 2:
            continue
        key = _value(_trees(parts[0])[0] if _trees(parts[0]) else parts[0])
        if not isinstance(key, str):
            continue
        line, col = _pos(parts[0])
        out.append((key, line, col, _value(parts[1])))
    return out


def _entry(key: str, spelled: str, value: object, line: int, col: int) -> Entry:
    if value is _DYNAMIC or isinstance(value, dict):
        return Entry(key=spelled, value="<dynamic>", line=line, col=col, dynamic=True, setting=key)
    return Entry(key=spelled, value=value, line=line, col=col, setting=key)


def _topic(block: Any, rtype: str, path: str) -> ConfigUnit:
    name_attr, fields = _TOPIC_RESOURCES[rtype]
    entries: dict[str, Entry] = {}
    name: str | None = None
    body = next((c for c in _trees(block) if _data(c) == "body"), None)
    for attr in _trees(body) if body is not None else []:
        if _data(attr) != "attribute":
            continue
        parts = _trees(attr)
        attr_name = str(parts[0].children[0])
        line, col = _pos(parts[0])
        if attr_name == name_attr:
            value = _value(parts[1])
            name = value if isinstance(value, str) else None
        elif attr_name in fields:
            entries[fields[attr_name]] = _entry(
                fields[attr_name], attr_name, _value(parts[1]), line, col
            )
        elif attr_name == "config":
            obj = _trees(parts[1])
            if obj and _data(obj[0]) == "object":
                for key, kline, kcol, value in _object(obj[0]):
                    entries[key] = _entry(key, key, value, kline, kcol)
    line, col = _pos(block)
    return ConfigUnit(
        path=path,
        line=line,
        col=col,
        entries=entries,
        kind="topic",
        kind_forced=True,
        name=name,
        source="terraform",
        context={"tool": "terraform"},
    )


def _labels(block: Any) -> list[object]:
    return [_value(c) for c in _trees(block) if _data(c) == "string"]


# ----------------------------------------------------------------------------- fast path

_ID = r"[A-Za-z_][A-Za-z0-9_-]*"
_STR = r'"[^"\\$%\n\r]*"'  # no escapes, no ${ } or %{ } templates
_NUM = r"-?(?:0|[1-9][0-9]*)"
_REF = rf"{_ID}(?:\.{_ID})*"  # var.x, each.value.y, or a bare word (true, false, null)
_SCALAR = rf"(?:{_STR}|{_NUM}|{_REF})"
_VALUE = rf"(?:{_SCALAR}|\[\s*(?:{_SCALAR}\s*(?:,\s*{_SCALAR}\s*)*,?\s*)?\]|\{{[ \t]*\}})"
_TAIL = r"[ \t]*(?:(?:#|//).*)?$"
_BLANK = re.compile(r"^[ \t]*(?:(?:#|//).*)?$")
_OPEN = re.compile(rf'^[ \t]*({_ID})((?:[ \t]+"[^"\\$%{{}}\n\r]*")*)[ \t]*\{{{_TAIL}')
_CLOSE = re.compile(rf"^[ \t]*\}}{_TAIL}")
_ATTR = re.compile(rf"^([ \t]*)({_ID})[ \t]*=[ \t]*({_VALUE}){_TAIL}")
_OBJ_OPEN = re.compile(rf"^[ \t]*({_ID})[ \t]*=[ \t]*\{{{_TAIL}")
_ELEM = re.compile(rf"^([ \t]*)({_STR}|{_ID})[ \t]*=[ \t]*({_VALUE})[ \t]*,?{_TAIL}")
_ELEM_OPEN = re.compile(rf"^[ \t]*({_STR}|{_ID})[ \t]*=[ \t]*\{{{_TAIL}")
_LABEL = re.compile(r'"([^"]*)"')


def _literal(text: str) -> object:
    """The value python-hcl2's tree gives for a ``_VALUE`` match (see :func:`_value`)."""
    if text.startswith('"'):
        return text[1:-1]
    if text.startswith("["):
        return _DYNAMIC  # a tuple: no rule reads one
    if text.startswith("{"):
        return {}  # an empty object
    if text[0] == "-" or text[0].isdigit():
        return int(text)
    return _CONSTANTS.get(text, _DYNAMIC)


class _Topic:
    """A topic resource being read: its position, name and entries so far."""

    __slots__ = ("col", "entries", "fields", "line", "name", "name_attr")

    def __init__(self, rtype: str, line: int, col: int) -> None:
        self.line, self.col = line, col
        self.name: str | None = None
        self.entries: dict[str, Entry] = {}
        self.name_attr, self.fields = _TOPIC_RESOURCES[rtype]

    def unit(self, path: str) -> ConfigUnit:
        return ConfigUnit(
            path=path,
            line=self.line,
            col=self.col,
            entries=self.entries,
            kind="topic",
            kind_forced=True,
            name=self.name,
            source="terraform",
            context={"tool": "terraform"},
        )


def _fast(text: str, path: str) -> ReadResult | None:
    """The topics of ``text`` when every line is of the plain layout, else None."""
    if "\r" in text or "/*" in text or "<<" in text:
        return None
    units: list[ConfigUnit] = []
    # Open blocks and objects: (is_object, the topic whose body or config it is, or None).
    frames: list[tuple[bool, _Topic | None]] = []
    for number, line in enumerate(text.split("\n"), 1):
        if _BLANK.match(line):
            continue
        if frames and frames[-1][0]:  # inside an object: quoted-key elements only
            elem = _ELEM.match(line)
            owner = frames[-1][1]
            if elem is not None:
                # python-hcl2's tree gives an unquoted key as an expression: not read.
                if owner is not None and elem.group(2).startswith('"'):
                    key = elem.group(2)[1:-1]
                    value = _literal(elem.group(3))
                    owner.entries[key] = _entry(key, key, value, number, len(elem.group(1)) + 1)
                continue
            if _CLOSE.match(line):
                frames.pop()
                continue
            if owner is None and _ELEM_OPEN.match(line):  # nested object outside a config
                frames.append((True, None))
                continue
            return None
        if _CLOSE.match(line):
            if not frames:
                return None
            _, topic = frames.pop()
            if topic is not None and not frames:
                units.append(topic.unit(path))
            continue
        topic = frames[0][1] if len(frames) == 1 else None  # attributes of a topic's body
        attr = _ATTR.match(line)
        if attr is not None:
            if topic is not None:
                name, value = attr.group(2), _literal(attr.group(3))
                if name == topic.name_attr:
                    topic.name = value if isinstance(value, str) else None
                elif name in topic.fields:
                    setting = topic.fields[name]
                    col = len(attr.group(1)) + 1
                    topic.entries[setting] = _entry(setting, name, value, number, col)
            continue
        obj = _OBJ_OPEN.match(line)
        if obj is not None:
            frames.append((True, topic if obj.group(1) == "config" else None))
            continue
        block = _OPEN.match(line)
        if block is not None:
            labels = _LABEL.findall(block.group(2))
            new: _Topic | None = None
            if (
                not frames
                and block.group(1) == "resource"
                and labels
                and labels[0] in _TOPIC_RESOURCES
            ):
                new = _Topic(labels[0], number, line.index("resource") + 1)
            frames.append((False, new))
            continue
        return None
    return ReadResult(units=units) if not frames else None


def read_terraform(text: str, path: str, kind: Kind | None = None) -> ReadResult:
    """The topics of the Kafka topic resources in Terraform ``text`` (``kind`` unused)."""
    result = ReadResult()
    if "kafka_topic" not in text:
        return result
    fast = _fast(text, path)
    if fast is not None:
        return fast
    return _read_hcl2(text, path)


def _read_hcl2(text: str, path: str) -> ReadResult:
    """:func:`read_terraform` with python-hcl2's parser (the reference reader)."""
    result = ReadResult()
    try:
        import hcl2  # a soft dependency: only .tf files need it
        from lark.exceptions import LarkError, UnexpectedInput
    except ImportError:
        result.error = ParseError(
            line=1,
            col=1,
            message="Terraform: the reader needs python-hcl2 (pip install python-hcl2)",
        )
        return result
    try:
        tree = hcl2.parses_to_tree(text)
    except UnexpectedInput as exc:
        result.error = ParseError(
            line=max(int(getattr(exc, "line", 1) or 1), 1),
            col=max(int(getattr(exc, "column", 1) or 1), 1),
            message="Terraform: not valid HCL (unexpected input)",
        )
        return result
    except (LarkError, RecursionError, ValueError) as exc:
        result.error = ParseError(line=1, col=1, message=f"Terraform: {type(exc).__name__}")
        return result
    try:
        for body in _trees(tree):
            for block in _trees(body):
                if _data(block) != "block":
                    continue
                ident = _trees(block)[0]
                labels = _labels(block)
                if (
                    str(ident.children[0]) == "resource"
                    and labels
                    and labels[0] in _TOPIC_RESOURCES
                ):
                    result.units.append(_topic(block, str(labels[0]), path))
    except RecursionError:
        result.units.clear()
        result.error = ParseError(line=1, col=1, message="Terraform: nested too deeply")
    return result
