"""Find Kafka client configs in Python source with :mod:`ast`, keeping real line numbers.

Also the keyword arguments of aiokafka's ``AIOKafkaProducer``/``AIOKafkaConsumer`` and
kafka-python's ``KafkaProducer``/``KafkaConsumer`` (``acks=1``, ``enable_idempotence=False``,
``enable_auto_commit=True``): snake_case names become Kafka's dotted keys, judged by that
library's own defaults (aiokafka: ``acks=1``, no idempotence, background auto-commit;
kafka-python 2.1+: the Java client's).

Recognised: dict literals, names bound to dict literals (plus later ``d["k"] = v`` and
``d.update({...})``), ``{**base, ...}``, ``dict(base, ...)`` and ``base | {...}``, passed to
confluent-kafka ``Producer``/``Consumer``/``AdminClient`` (and the serializing / asyncio
variants, whose keyword arguments are config too), to kresilient ``ResilientProducer``/
``ResilientConsumer`` and to ``kresilient.config.producer_config``/``consumer_config``.
Only names imported from ``confluent_kafka`` or ``kresilient`` count.

A config read from a file (``json.load(open("client.json"))``, ``dict(parser["consumer"])``
after ``parser.read("kafka.ini")``) is followed when the path is a literal naming a file in
the linted tree (:mod:`kresilient.lint.pyfiles`): its keys are checked, reported at the
Python expression that reads them. Otherwise the config is not understood, and KR055 says
which file could not be followed and why.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from kresilient.lint import pyfiles
from kresilient.lint.model import ConfigUnit, Entry, Kind, ParseError, ReadResult

__all__ = ["read_python"]


@dataclass(frozen=True, slots=True)
class _Sink:
    kind: Kind
    kwargs_are_config: bool
    resilient: bool
    #: The library of a keyword-argument client (aiokafka, kafka-python), else None.
    library: str | None = None
    #: A share-group consumer (KIP-932), which takes fewer keys than a consumer.
    share: bool = False


_SINKS: dict[str, _Sink] = {
    "Producer": _Sink("producer", True, False),
    "SerializingProducer": _Sink("producer", True, False),
    "AIOProducer": _Sink("producer", True, False),
    "Consumer": _Sink("consumer", True, False),
    "DeserializingConsumer": _Sink("consumer", True, False),
    "AIOConsumer": _Sink("consumer", True, False),
    "AdminClient": _Sink("admin", True, False),
    "ResilientProducer": _Sink("producer", False, True),
    "ResilientConsumer": _Sink("consumer", False, True),
    "AsyncResilientProducer": _Sink("producer", False, True),
    "AsyncResilientConsumer": _Sink("consumer", False, True),
    "TransactionalProducer": _Sink("producer", False, True),
    # share groups (KIP-932): context["share"], judged by KR071/KR072
    "ShareConsumer": _Sink("consumer", True, False, share=True),
    "DeserializingShareConsumer": _Sink("consumer", True, False, share=True),
    "ResilientShareConsumer": _Sink("consumer", False, True, share=True),
    "share_consumer_config": _Sink("consumer", False, True, share=True),
    "producer_config": _Sink("producer", False, True),
    "consumer_config": _Sink("consumer", False, True),
    "AIOKafkaProducer": _Sink("producer", True, False, "aiokafka"),
    "AIOKafkaConsumer": _Sink("consumer", True, False, "aiokafka"),
    "KafkaProducer": _Sink("producer", True, False, "kafka-python"),
    "KafkaConsumer": _Sink("consumer", True, False, "kafka-python"),
    # aiokafka.helpers.create_ssl_context(password=...): the private key's password.
    "create_ssl_context": _Sink("client", True, False, "aiokafka"),
}
#: Keyword arguments of aiokafka's create_ssl_context that hold a secret, as Kafka keys.
_SSL_CONTEXT_SECRETS = {"password": "ssl.key.password"}
_ROOTS = ("confluent_kafka", "kresilient", "aiokafka", "kafka")
#: The rules run on aiokafka/kafka-python keyword arguments: the ones their options and
#: defaults (modelled below) decide; librdkafka's own constraints and names do not apply.
KEYWORD_CLIENT_RULES = frozenset(
    {"KR001", "KR006", "KR007", "KR008", "KR010", "KR018", "KR021", "KR036", "KR040", "KR041"}
)
#: aiokafka 0.14 defaults (AIOKafkaProducer/AIOKafkaConsumer signatures): acks=1 unless
#: idempotent, no idempotence, auto-commit of fetched positions by a background task.
_AIOKAFKA_DEFAULTS = {
    "acks": "1",
    "enable.idempotence": "false",
    "enable.auto.commit": "true",
    "enable.auto.offset.store": "true",
    "auto.offset.reset": "latest",
}
_CONFIG_KWARGS = ("config", "conf", "configs", "user")
#: Keyword arguments of kresilient constructors that are librdkafka settings.
_KEYWORD_SETTINGS: dict[str, dict[str, str]] = {
    "TransactionalProducer": {"transactional_id": "transactional.id"},
}
#: The rules a raw client given a config built by kresilient is judged by (the callbacks
#: the client call itself must pass; the config's keys are judged as the builder's unit).
_RAW_CLIENT_RULES = frozenset({"KR013", "KR014"})
#: kresilient functions that build a client's config from the user's dict (safe defaults).
_CONFIG_BUILDERS = frozenset({"producer_config", "consumer_config", "share_consumer_config"})
#: The kresilient consumers' own arguments KR073 reads (what ``ordering="key"``/``"none"``
#: combines with; the runtime's refusals are ``_check_ordering`` in
#: ``kresilient.consumer._consumer`` and ``kresilient.aio._consumer``).
_CONSUMER_OPTIONS = frozenset(
    {
        "ordering",
        "batch_handler",
        "retry_topics",
        "trace_spans",
        "max_process_deaths",
        "crash_probe_records",
        "max_concurrency",
        "max_in_flight",
        "max_in_flight_bytes",
        "transactions",
    }
)
#: Calls by which a consumer chooses its own positions (aiokafka, kafka-python).
_SEEKS = frozenset({"seek", "seek_to_beginning", "seek_to_end", "seek_to_committed", "assign"})
# Constructor arguments that are not librdkafka settings (AIOProducer's thread pool ...).
_NOT_CONFIG_KWARGS = frozenset({"allow_unsafe", "max_workers", "executor", "loop"})
#: AIOProducer's own batching arguments (confluent-kafka 2.12 ``AIOProducer(producer_conf,
#: max_workers, executor, batch_size, buffer_timeout)``): not librdkafka's batch.size.
_AIO_PRODUCER_KWARGS = frozenset({"batch_size", "buffer_timeout"})
_MISSING = object()
#: configparser methods that read a file or a string into a parser.
_PARSER_READS = frozenset({"read", "read_file", "readfp", "read_string"})
_OPENERS = frozenset({"open", "io.open", "codecs.open", "Path", "pathlib.Path"})


class _Unknown:
    """Marker for a value the linter cannot evaluate statically."""


class _Visitor(ast.NodeVisitor):
    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}
        self.calls: list[tuple[ast.Call, list[ast.AST]]] = []
        self.assigns: dict[str, list[tuple[int, tuple[ast.AST, ...], ast.expr]]] = {}
        self.mutations: dict[str, list[tuple[int, tuple[ast.AST, ...], ast.AST]]] = {}
        self.methods: set[str] = set()
        self.stack: list[ast.AST] = []
        #: name -> calls that read a file into it (configparser's read/read_file ...)
        self.parser_reads: dict[str, list[tuple[int, ast.Call]]] = {}

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] in _ROOTS:
                self.aliases[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and node.module.split(".")[0] in _ROOTS:
            for alias in node.names:
                self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def _scoped(self, node: ast.AST) -> None:
        self.stack.append(node)
        self.generic_visit(node)
        self.stack.pop()

    visit_FunctionDef = _scoped
    visit_AsyncFunctionDef = _scoped
    visit_ClassDef = _scoped

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._record_target(target, node.value, node)
        self.generic_visit(node)

    def visit_With(self, node: ast.With) -> None:
        # ``with open("client.json") as fh``: fh is bound to the open() call
        for item in node.items:
            if isinstance(item.optional_vars, ast.Name):
                self.assigns.setdefault(item.optional_vars.id, []).append(
                    (node.lineno, tuple(self.stack), item.context_expr)
                )
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self._record_target(node.target, node.value, node)
        self.generic_visit(node)

    def _record_target(self, target: ast.expr, value: ast.expr, node: ast.stmt) -> None:
        scope = tuple(self.stack)
        if isinstance(target, ast.Name):
            self.assigns.setdefault(target.id, []).append((node.lineno, scope, value))
        elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
            self.mutations.setdefault(target.value.id, []).append((node.lineno, scope, node))

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute):
            self.methods.add(func.attr)
            if func.attr == "produce" and any(
                k.arg in ("on_delivery", "callback") for k in node.keywords
            ):
                self.methods.add("produce+on_delivery")
            if func.attr == "update" and isinstance(func.value, ast.Name):
                self.mutations.setdefault(func.value.id, []).append(
                    (node.lineno, tuple(self.stack), node)
                )
            if func.attr in _PARSER_READS and isinstance(func.value, ast.Name):
                self.parser_reads.setdefault(func.value.id, []).append((node.lineno, node))
        if self._sink_name(func) is not None:
            self.calls.append((node, list(self.stack)))
        self.generic_visit(node)

    def _sink_name(self, func: ast.expr) -> str | None:
        dotted = _dotted(func)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        qualified = self.aliases.get(head)
        if qualified is None:
            return None
        full = f"{qualified}.{rest}" if rest else qualified
        name = full.rsplit(".", 1)[-1]
        return name if name in _SINKS and full.split(".")[0] in _ROOTS else None


def _dotted(node: ast.expr) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _join(head: str, tail: str) -> str:
    """A relative path joined the way the program joins it ("" is the source's directory)."""
    return f"{head.rstrip('/')}/{tail}" if head else tail


def _shown(node: ast.AST) -> str:
    """``node``'s source, short enough for a message."""
    text = ast.unparse(node)
    return text if len(text) <= 40 else text[:37] + "..."


def _literal(node: ast.AST) -> object:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.List | ast.Tuple) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
    ):
        return ",".join(e.value for e in node.elts)  # type: ignore[attr-defined]
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub)
        and isinstance(node.operand, ast.Constant)
        and isinstance(node.operand.value, int | float)
    ):
        return -node.operand.value
    return _Unknown()


class _Resolver:
    """Evaluates a config expression into entries (key -> Entry), following names and the
    files a config is read from (:mod:`kresilient.lint.pyfiles`)."""

    def __init__(self, visitor: _Visitor, source: str) -> None:
        self.v = visitor
        self.source = source  # the Python file's path: files it reads are found beside it
        self.partial = False  # set when part of a config could not be resolved statically
        self.reasons: list[str] = []  # why a file the config is read from was not followed
        self.followed: list[str] = []  # the files whose keys were checked

    def reset(self) -> None:
        self.partial = False
        self.reasons = []
        self.followed = []

    def _unresolved(self, reason: str) -> _Unknown:
        self.partial = True
        if reason not in self.reasons:
            self.reasons.append(reason)
        return _Unknown()

    def entries(
        self, expr: ast.AST, line: int, scope: tuple[ast.AST, ...], depth: int = 0
    ) -> dict[str, Entry]:
        if depth > 8:
            return {}
        out: dict[str, Entry] = {}
        if isinstance(expr, ast.Dict):
            for key, value in zip(expr.keys, expr.values, strict=True):
                if key is None:
                    out.update(self.entries(value, line, scope, depth + 1))
                elif isinstance(key, ast.Constant) and isinstance(key.value, str):
                    out[key.value] = self._entry(key.value, value, key)
                else:
                    self.partial = True
        elif isinstance(expr, ast.Name):
            out.update(self._name(expr.id, line, scope, depth))
        elif isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.BitOr):
            out.update(self.entries(expr.left, line, scope, depth + 1))
            out.update(self.entries(expr.right, line, scope, depth + 1))
        elif (
            isinstance(expr, ast.Call)
            and isinstance(expr.func, ast.Name)
            and (expr.func.id == "dict" or self.v.aliases.get(expr.func.id, "").endswith("_config"))
        ):
            for arg in expr.args[:1]:
                out.update(self.entries(arg, line, scope, depth + 1))
            for kw in expr.keywords:
                if kw.arg is None:
                    out.update(self.entries(kw.value, line, scope, depth + 1))
                elif expr.func.id == "dict":
                    out[kw.arg] = self._entry(kw.arg, kw.value, kw)
        elif isinstance(expr, ast.Subscript | ast.Call):
            data = self._data(expr, line, scope, depth + 1)
            if isinstance(data, dict):
                for key, value in data.items():
                    if isinstance(value, str | int | float | bool):
                        # reported at the expression that reads the file: that is the line
                        # of this config in this file
                        out[key] = Entry(
                            key=key, value=value, line=expr.lineno, col=expr.col_offset + 1
                        )
            else:
                self.partial = True
        else:
            self.partial = True
        return out

    # ------------------------------------------------------------- configs read from files

    def _assigned(self, name: str, line: int, scope: tuple[ast.AST, ...]) -> ast.expr | None:
        """The expression last bound to ``name`` before ``line``, visible from ``scope``."""
        best: tuple[int, tuple[ast.AST, ...], ast.expr] | None = None
        for candidate in self.v.assigns.get(name, []):
            cline, cscope, _ = candidate
            if (
                cscope == scope[: len(cscope)]
                and cline <= line
                and (best is None or (len(cscope), cline) >= (len(best[1]), best[0]))
            ):
                best = candidate
        return best[2] if best else None

    def _path(self, expr: ast.AST, line: int, scope: tuple[ast.AST, ...], depth: int) -> str | None:
        """The literal path ``expr`` opens or reads ("" is the source's own directory, from
        ``__file__``), or None when it is known only at run time."""
        if depth > 8:
            return None
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return expr.value
        if isinstance(expr, ast.Name):
            if expr.id == "__file__":
                return ""
            bound = self._assigned(expr.id, line, scope)
            return self._path(bound, line, scope, depth + 1) if bound is not None else None
        if isinstance(expr, ast.Attribute) and expr.attr == "parent":
            return "" if self._path(expr.value, line, scope, depth + 1) == "" else None
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div):  # Path(...) / "x"
            left = self._path(expr.left, line, scope, depth + 1)
            right = self._path(expr.right, line, scope, depth + 1)
            return None if left is None or right is None else _join(left, right)
        if not isinstance(expr, ast.Call):
            return None
        name = _dotted(expr.func) or ""
        if name in _OPENERS and expr.args:
            return self._path(expr.args[0], line, scope, depth + 1)
        if name in ("os.path.dirname", "os.path.abspath", "os.path.realpath") and expr.args:
            inner = self._path(expr.args[0], line, scope, depth + 1)
            return "" if inner == "" else None
        if name == "os.path.join" and expr.args:
            parts = [self._path(a, line, scope, depth + 1) for a in expr.args]
            if any(p is None for p in parts):
                return None
            joined = ""
            for part in parts:
                joined = _join(joined, part or "")
            return joined
        if isinstance(expr.func, ast.Attribute) and expr.func.attr in (
            "read",
            "read_text",
            "open",
            "resolve",
            "absolute",
        ):
            return self._path(expr.func.value, line, scope, depth + 1)
        return None

    def _data(self, expr: ast.AST, line: int, scope: tuple[ast.AST, ...], depth: int) -> object:
        """The mapping ``expr`` evaluates to when it reads a config file (a loader call, a
        configparser section, a key of either), or an :class:`_Unknown`."""
        if depth > 8:
            return _Unknown()
        if isinstance(expr, ast.Name):
            bound = self._assigned(expr.id, line, scope)
            if bound is None:
                return _Unknown()
            return self._data(bound, line, scope, depth + 1)
        if isinstance(expr, ast.Subscript):
            key = _literal(expr.slice)
            if not isinstance(key, str):
                return _Unknown()
            parser = self._parser_name(expr.value, line, scope)
            if parser is not None:
                return self._section(parser, key, line, scope)
            base = self._data(expr.value, line, scope, depth + 1)
            if isinstance(base, dict):
                value = base.get(key)
                if isinstance(value, dict):
                    return value
                return self._unresolved(f"no {key!r} mapping in the file it reads")
            return base
        if not isinstance(expr, ast.Call):
            return _Unknown()
        func = expr.func
        if isinstance(func, ast.Attribute) and func.attr == "items" and expr.args:
            parser = self._parser_name(func.value, line, scope)
            section = _literal(expr.args[0])
            if parser is not None and isinstance(section, str):
                return self._section(parser, section, line, scope)
        name = _dotted(func) or ""
        fmt = pyfiles.LOADERS.get(".".join(name.split(".")[-2:]))
        if fmt is None or not expr.args:
            return _Unknown()
        literal = self._path(expr.args[0], line, scope, depth + 1)
        if literal is None:
            return self._unresolved(f"{name} of a file named at run time: {_shown(expr.args[0])}")
        found = pyfiles.find_beside(self.source, literal)
        if found is None:
            return self._unresolved(f"{name} of {literal}, which is not in this tree")
        data = pyfiles.load_mapping(found, fmt)
        if data is None:
            return self._unresolved(f"{name} of {literal}, which holds no {fmt} mapping")
        self.followed.append(literal)
        return data

    def _parser_name(self, expr: ast.AST, line: int, scope: tuple[ast.AST, ...]) -> str | None:
        """``expr``'s name when it is bound to a configparser parser."""
        if not isinstance(expr, ast.Name):
            return None
        bound = self._assigned(expr.id, line, scope)
        if isinstance(bound, ast.Call) and (_dotted(bound.func) or "").endswith("ConfigParser"):
            return expr.id
        return None

    def _section(self, parser: str, section: str, line: int, scope: tuple[ast.AST, ...]) -> object:
        """The keys of ``section`` as ``parser`` holds them at ``line``: every file and
        string read into it before, configparser's [DEFAULT] included."""
        paths: list[str] = []
        texts: list[str] = []
        for rline, call in self.v.parser_reads.get(parser, []):
            if rline > line or not call.args or not isinstance(call.func, ast.Attribute):
                continue
            method, arg = call.func.attr, call.args[0]
            if method == "read_string":
                text = _literal(arg)
                if not isinstance(text, str):
                    return self._unresolved("configparser reads a string built at run time")
                texts.append(text)
                continue
            many = method == "read" and isinstance(arg, ast.List | ast.Tuple)
            names = arg.elts if isinstance(arg, ast.List | ast.Tuple) and many else [arg]
            for one in names:
                literal = self._path(one, line, scope, 0)
                if literal is None:
                    return self._unresolved(
                        f"configparser reads a file named at run time: {_shown(one)}"
                    )
                found = pyfiles.find_beside(self.source, literal)
                if found is None:
                    return self._unresolved(
                        f"configparser reads {literal}, which is not in this tree"
                    )
                paths.append(found)
                if literal not in self.followed:
                    self.followed.append(literal)
        if not paths and not texts:
            return self._unresolved("configparser reads no file lint can see")
        sections = pyfiles.ini_sections(paths, texts)
        if sections is None:
            return self._unresolved("configparser cannot read the file it is given")
        if section not in sections:
            return self._unresolved(f"section [{section}] is not in the file it reads")
        return sections[section]

    @staticmethod
    def _entry(key: str, value: ast.AST, at: ast.AST) -> Entry:
        literal = _literal(value)
        line = getattr(at, "lineno", 1)
        col = getattr(at, "col_offset", 0) + 1
        if isinstance(literal, _Unknown):
            return Entry(key=key, value="<dynamic>", line=line, col=col, dynamic=True)
        return Entry(key=key, value=literal, line=line, col=col)

    def _name(
        self, name: str, line: int, scope: tuple[ast.AST, ...], depth: int
    ) -> dict[str, Entry]:
        best: tuple[int, tuple[ast.AST, ...], ast.expr] | None = None
        for candidate in self.v.assigns.get(name, []):
            cline, cscope, _ = candidate
            visible = cscope == scope[: len(cscope)]
            if (
                visible
                and cline <= line
                and (best is None or (len(cscope), cline) >= (len(best[1]), best[0]))
            ):
                best = candidate
        if best is None:
            self.partial = True
            return {}
        out = self.entries(best[2], best[0], best[1], depth + 1)
        for mline, mscope, node in self.v.mutations.get(name, []):
            if not best[0] < mline <= line or mscope[: len(best[1])] != best[1]:
                continue
            if isinstance(node, ast.Assign):
                target = node.targets[0]
                if isinstance(target, ast.Subscript):
                    key = _literal(target.slice)
                    if isinstance(key, str):
                        out[key] = self._entry(key, node.value, target)
            elif isinstance(node, ast.Call):
                for arg in node.args[:1]:
                    out.update(self.entries(arg, mline, mscope, depth + 1))
        return out


def _units(tree: ast.Module, path: str) -> Iterator[ConfigUnit]:
    functions = _functions_only(tree)
    visitor = _Visitor()
    visitor.visit(tree)
    resolver = _Resolver(visitor, path)
    for call, stack in visitor.calls:
        sink_name = visitor._sink_name(call.func)
        assert sink_name is not None
        sink = _SINKS[sink_name]
        scope = tuple(stack)
        if sink_name == "create_ssl_context":
            yield _ssl_context_unit(call, path)
            continue
        if sink.library is not None:
            yield _keyword_unit(call, sink, sink_name, path, visitor)
            continue
        config_expr: ast.AST | None = call.args[0] if call.args else None
        for kw in call.keywords:
            if kw.arg in _CONFIG_KWARGS and config_expr is None:
                config_expr = kw.value
        built = isinstance(config_expr, ast.Call) and (
            visitor._sink_name(config_expr.func) in _CONFIG_BUILDERS
        )
        options = (
            _consumer_options(call, functions)
            if sink_name in ("ResilientConsumer", "AsyncResilientConsumer")
            else {}
        )
        if built and sink.resilient:
            # ResilientConsumer(consumer_config({...})): the config is the inner call's unit;
            # this one is judged only on the consumer's own arguments (KR073)
            if options.keys() & {
                "ordering",
                "max_in_flight",
                "max_in_flight_bytes",
                "transactions",
            }:
                yield ConfigUnit(
                    path=path,
                    line=call.lineno,
                    col=call.col_offset + 1,
                    entries={},
                    kind=sink.kind,
                    kind_forced=True,
                    source="python",
                    context={
                        "constructor": sink_name,
                        "resilient": True,
                        "options": options,
                        "rules": frozenset({"KR073"}),
                    },
                )
            continue
        entries: dict[str, Entry] = {}
        resolver.reset()
        if config_expr is not None:
            entries.update(resolver.entries(config_expr, call.lineno, scope))
        for kw in call.keywords:
            # TransactionalProducer(config, transactional_id="orders-1"): a librdkafka key
            key = _KEYWORD_SETTINGS.get(sink_name, {}).get(kw.arg or "")
            if key is not None:
                entries[key] = resolver._entry(key, kw.value, kw)
        if sink.kwargs_are_config:
            for kw in call.keywords:
                if kw.arg is None:
                    entries.update(resolver.entries(kw.value, call.lineno, scope))
                elif (
                    kw.arg not in _CONFIG_KWARGS
                    and kw.arg not in _NOT_CONFIG_KWARGS
                    and not (sink_name == "AIOProducer" and kw.arg in _AIO_PRODUCER_KWARGS)
                ):
                    entries[kw.arg] = resolver._entry(kw.arg, kw.value, kw)
        where = config_expr if isinstance(config_expr, ast.Dict) else call
        context: dict[str, object] = {
            "constructor": sink_name,
            "resilient": sink.resilient,
            "config_known": not resolver.partial,
            "share": sink.share,
            "methods": frozenset(visitor.methods),
        }
        if options:
            context["options"] = options  # the consumer's own arguments (KR073)
        if built:
            # Consumer(consumer_config({...})): the config is what kresilient builds (its
            # defaults, its refusals: judged as the inner call's unit); this unit is judged
            # only for what the raw client itself lacks (delivery callback, error_cb)
            context["rules"] = _RAW_CLIENT_RULES
        if resolver.reasons:
            context["unresolved"] = tuple(resolver.reasons)  # why KR055 (engine)
        if resolver.followed:
            context["config_files"] = tuple(resolver.followed)
        allow = _allow_unsafe(call)
        if allow:
            context["allow_unsafe"] = allow  # the runtime's opt-out (kresilient.lint.parity)
        yield ConfigUnit(
            path=path,
            line=getattr(where, "lineno", call.lineno),
            col=getattr(where, "col_offset", call.col_offset) + 1,
            entries=entries,
            kind=sink.kind,
            kind_forced=True,
            source="python",
            context=context,
        )


def _allow_unsafe(call: ast.Call) -> tuple[str, ...]:
    """The literal key names of a call's ``allow_unsafe=`` (a string or a tuple/list/set
    of strings); a non-literal one allows nothing the linter can see."""
    for kw in call.keywords:
        if kw.arg != "allow_unsafe":
            continue
        value = kw.value
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            return (value.value,)
        if isinstance(value, ast.Tuple | ast.List | ast.Set):
            return tuple(
                e.value
                for e in value.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            )
    return ()


def _ssl_context_unit(call: ast.Call, path: str) -> ConfigUnit:
    """The secrets passed to aiokafka's ``create_ssl_context`` (only the credential rule
    judges them: the rest are file names)."""
    entries: dict[str, Entry] = {}
    for kw in call.keywords:
        if kw.arg in _SSL_CONTEXT_SECRETS:
            key = _SSL_CONTEXT_SECRETS[kw.arg]
            entry = _Resolver._entry(key, kw.value, kw)
            entries[key] = Entry(
                key=kw.arg,
                value=entry.value,
                line=entry.line,
                col=entry.col,
                dynamic=entry.dynamic,
                setting=key,
            )
    return ConfigUnit(
        path=path,
        line=call.lineno,
        col=call.col_offset + 1,
        entries=entries,
        kind="client",
        kind_forced=True,
        source="python",
        context={"constructor": "create_ssl_context", "rules": frozenset({"KR041"})},
    )


def _functions_only(tree: ast.Module) -> frozenset[str]:
    """Names the file binds with ``def`` and with nothing else (never None: KR073)."""
    defined: set[str] = set()
    other: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            other.add(node.id)
        elif isinstance(node, ast.arg):
            other.add(node.arg)
    return frozenset(defined - other)


#: ``ordered=`` of the ``RetryTopicPolicy(...)`` built in a consumer's ``retry_topics=`` (KR073).
RETRY_TOPICS_ORDERED: Final = "retry_topics.ordered"
#: A ``**`` argument lint cannot read: the options it may carry are unknown (KR073).
SPLAT: Final = "**"
#: The value of an option given as an object built on the spot (a call, a lambda): not None.
BUILT: Final = object()


def _consumer_options(call: ast.Call, functions: frozenset[str]) -> dict[str, Entry]:
    """The arguments of ``_CONSUMER_OPTIONS`` given to a kresilient consumer: a literal's
    value, an object built in the call (``RetryTopicPolicy()``, a lambda) as :data:`BUILT`,
    a name the file binds only with ``def`` as :data:`BUILT` too, anything else (another name, an
    attribute) ``dynamic``: not known before run time. The keys of a
    ``**{...}`` literal are read too; any other ``**`` argument is recorded as :data:`SPLAT`
    (it may carry any option)."""
    options: dict[str, Entry] = {}

    def add(name: str, node: ast.expr) -> None:
        value: object = None
        dynamic = False
        if isinstance(node, ast.Constant):
            value = node.value
        elif (
            isinstance(node, ast.UnaryOp)
            and isinstance(node.op, ast.USub)
            and isinstance(node.operand, ast.Constant)
            and isinstance(node.operand.value, int | float)
            and not isinstance(node.operand.value, bool)
        ):
            value = -node.operand.value  # max_in_flight=-1 is a literal too
        elif isinstance(node, (ast.Call, ast.Lambda)) or (
            isinstance(node, ast.Name) and node.id in functions
        ):
            value = BUILT
        else:
            dynamic = True
        options[name] = Entry(
            key=name, value=value, line=node.lineno, col=node.col_offset + 1, dynamic=dynamic
        )
        # RetryTopicPolicy(ordered=True), also through .replace(...) on it (the outermost
        # ordered= wins, as at run time): refused beside transactions= (KR073)
        chain: ast.expr | None = node if name == "retry_topics" else None
        while isinstance(chain, ast.Call):
            ordered = next((a for a in chain.keywords if a.arg == "ordered"), None)
            if ordered is not None:
                if isinstance(ordered.value, ast.Constant):
                    options[RETRY_TOPICS_ORDERED] = Entry(
                        key=RETRY_TOPICS_ORDERED,
                        value=bool(ordered.value.value),
                        line=ordered.value.lineno,
                        col=ordered.value.col_offset + 1,
                    )
                break
            func = chain.func
            replaced = isinstance(func, ast.Attribute) and func.attr == "replace"
            chain = func.value if replaced and isinstance(func, ast.Attribute) else None

    for kw in call.keywords:
        if kw.arg is None:
            literal = kw.value
            if isinstance(literal, ast.Dict) and all(
                isinstance(k, ast.Constant) and isinstance(k.value, str) for k in literal.keys
            ):
                for k, v in zip(literal.keys, literal.values, strict=True):
                    assert isinstance(k, ast.Constant)
                    if k.value in _CONSUMER_OPTIONS:
                        add(k.value, v)
            else:
                add(SPLAT, kw.value)
        elif kw.arg in _CONSUMER_OPTIONS:
            add(kw.arg, kw.value)
    return options


def _keyword_unit(
    call: ast.Call, sink: _Sink, name: str, path: str, visitor: _Visitor
) -> ConfigUnit:
    """The config of an aiokafka/kafka-python constructor: its keyword arguments
    (positional arguments are topics), snake_case names mapped to Kafka's dotted keys."""
    entries: dict[str, Entry] = {}
    partial = False
    for kw in call.keywords:
        if kw.arg is None:
            partial = True  # **options: unknown here
            continue
        key = kw.arg.replace("_", ".")
        entry = _Resolver._entry(key, kw.value, kw)
        entries[key] = Entry(
            key=kw.arg,
            value=entry.value,
            line=entry.line,
            col=entry.col,
            dynamic=entry.dynamic,
            setting=key,
        )
    rules = KEYWORD_CLIENT_RULES
    if sink.kind == "consumer" and not partial:
        seeks = visitor.methods & _SEEKS
        if "group.id" not in entries or seeks:
            # No group: nothing is ever committed; an explicit seek/assign decides where it
            # starts. Commit and reset advice does not apply (issue 38 #2).
            rules = rules - {"KR018", "KR021"}
    context: dict[str, object] = {
        "constructor": name,
        "resilient": False,
        "config_known": not partial,
        "methods": frozenset(visitor.methods),
        "rules": rules,
        "assumed": sink.library,
    }
    if sink.library == "aiokafka":
        defaults = dict(_AIOKAFKA_DEFAULTS)
        idem = entries.get("enable.idempotence")
        if "transactional.id" in entries or (idem is not None and idem.value is True):
            defaults["acks"] = "all"  # aiokafka: acks defaults to all when idempotent
        context["defaults"] = defaults
    else:
        context["client"] = "java"  # kafka-python 2.1+ follows the Java client's defaults
    return ConfigUnit(
        path=path,
        line=call.lineno,
        col=call.col_offset + 1,
        entries=entries,
        kind=sink.kind,
        kind_forced=True,
        source="python",
        context=context,
    )


def read_python(text: str, path: str, kind: Kind | None = None) -> ReadResult:
    """Config units of the Kafka client constructors in Python ``text`` (``kind`` unused)."""
    result = ReadResult()
    if not any(root in text for root in _ROOTS):
        return result
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as exc:
        result.error = ParseError(
            line=exc.lineno or 1, col=max(exc.offset or 1, 1), message=f"Python: {exc.msg}"
        )
        return result
    except (ValueError, RecursionError, MemoryError) as exc:
        result.error = ParseError(line=1, col=1, message=f"Python: {type(exc).__name__}")
        return result
    try:
        result.units.extend(_units(tree, path))
    except RecursionError:
        result.error = ParseError(line=1, col=1, message="Python: nested too deeply")
    return result
