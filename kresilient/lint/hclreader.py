"""Topic configs of Terraform files (``.tf``), read with python-hcl2's parser.

Recognised: ``kafka_topic`` resources of the Mongey/kafka provider (``name``,
``replication_factor``, ``partitions``, ``config = {...}``) and ``confluent_kafka_topic``
of the Confluent provider (``topic_name``, ``partitions_count``, ``config``; Confluent
Cloud fixes the replication factor, so there is none to check). Positions come from the
parse tree; a value that is an expression (``var.rf``, ``each.value``, ``"${local.x}"``) is
dynamic: no rule judges it. python-hcl2 is imported only when a ``.tf`` file is linted.
"""

from __future__ import annotations

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


def read_terraform(text: str, path: str, kind: Kind | None = None) -> ReadResult:
    """The topics of the Kafka topic resources in Terraform ``text`` (``kind`` unused)."""
    result = ReadResult()
    if "kafka_topic" not in text:
        return result
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
