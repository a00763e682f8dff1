"""Every ``--help`` of the ``kresilient`` command line: whole, and light (issue 36).

- ``doctor --help`` stopped mid-sentence ("...as a cause of an incident:"): the list of checks
  and the exit codes were missing. Every help screen is checked for a cut text and for its
  exit codes.
- Every ``--help`` took 0.7-1.5 s because building the parser imported confluent-kafka, the
  lint engine, structlog, YAML and HCL readers... The tests here check WHAT is imported, never
  how long it takes (timings belong to ``benchmarks/cli_help.py``): each help screen is run in
  a fresh interpreter that then lists the heavy modules it loaded.

The CLI's own part is checked with the root package's ``__init__`` left unexecuted, and the
console script's whole path with it (``kresilient/__init__.py`` loads its exports lazily).
"""

from __future__ import annotations

import argparse
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

import kresilient.cli as cli

ROOT = Path(cli.__file__).resolve().parent
#: Third-party packages a help screen must not import (each costs 0.05-0.6 s).
HEAVY = ("confluent_kafka", "pyspark", "opentelemetry", "yaml", "hcl2", "structlog", "tenacity")
#: kresilient modules a help screen may import (plus the contributed parser of the command
#: named, checked separately for lint and audit).
LIGHT_OWN = {"kresilient", "kresilient.cli", "kresilient._version"}

HELP_ARGVS = [
    [],
    ["cluster"],
    ["demo"],
    ["topic"],
    ["topic", "create"],
    ["dlq"],
    ["dlq", "inspect"],
    ["dlq", "replay"],
    ["doctor"],
]
CONTRIBUTED_ARGVS = [["lint"], ["audit"]]

# Runs `kresilient <argv> --help` in this interpreter, output discarded, then prints the
# heavy modules and the kresilient modules it imported, as JSON. With STUB_ROOT the root
# package is registered without running its __init__ (what a lazy __init__ gives).
_WRAPPER = """
import contextlib, io, json, sys
argv = json.loads(sys.argv[1])
if sys.argv[2] == "stub":
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "kresilient", sys.argv[3] + "/__init__.py", submodule_search_locations=[sys.argv[3]]
    )
    sys.modules["kresilient"] = importlib.util.module_from_spec(spec)
if sys.argv[4]:
    __import__(sys.argv[4])  # the negative control: a module known to be heavy
from kresilient.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    code = main(argv + ["--help"])
heavy = sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in HEAVY})
own = sorted(m for m in sys.modules if m == "kresilient" or m.startswith("kresilient."))
print(json.dumps({"code": code, "heavy": heavy, "own": own, "help": out.getvalue()}))
"""


def _imports(argv: list[str], *, stub_root: bool, also: str = "") -> dict[str, object]:
    code = f"HEAVY = {HEAVY!r}\n" + _WRAPPER
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            json.dumps(argv),
            "stub" if stub_root else "",
            str(ROOT),
            also,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout)
    assert result["code"] == 0 and "usage: kresilient" in str(result["help"]), result
    return result


@pytest.mark.parametrize("argv", HELP_ARGVS, ids=lambda a: " ".join(a) or "top")
def test_help_imports_only_the_parser(argv: list[str]) -> None:
    """Building the parser of these commands imports the standard library and kresilient.cli
    only: each command's implementation is imported when it runs."""
    seen = _imports(argv, stub_root=True)
    assert seen["heavy"] == [], seen["heavy"]
    assert set(seen["own"]) <= LIGHT_OWN, sorted(set(seen["own"]) - LIGHT_OWN)  # type: ignore[call-overload]


def test_the_import_check_sees_a_heavy_module() -> None:
    # Negative control: the same wrapper, after importing a module that loads confluent-kafka,
    # reports it; an empty list above is a finding, not a blind check.
    seen = _imports(["doctor"], stub_root=True, also="kresilient.errors")
    assert "confluent_kafka" in seen["heavy"]  # type: ignore[operator]
    assert "kresilient.errors" in seen["own"]  # type: ignore[operator]


@pytest.mark.parametrize("argv", CONTRIBUTED_ARGVS, ids=lambda a: " ".join(a))
def test_lint_and_audit_help_import_only_their_parser(argv: list[str]) -> None:
    seen = _imports(argv, stub_root=True)
    assert seen["heavy"] == [], seen["heavy"]
    assert not [m for m in seen["own"] if m.startswith("kresilient.lint.engine")]  # type: ignore[attr-defined]


@pytest.mark.parametrize("argv", HELP_ARGVS, ids=lambda a: " ".join(a) or "top")
def test_help_as_the_console_script_runs_it_imports_no_heavy_module(argv: list[str]) -> None:
    """What a user's `kresilient ... --help` does: the real package, __init__ included."""
    seen = _imports(argv, stub_root=False)
    assert seen["heavy"] == [], seen["heavy"]


# --------------------------------------------------------------------------- whole texts


def _all_parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    found = [("kresilient", cli.build_parser())]
    todo = list(found)
    while todo:
        name, parser = todo.pop()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    found.append((f"{name} {sub_name}", sub))
                    todo.append((f"{name} {sub_name}", sub))
    return found


LEAVES = (
    "kresilient cluster",
    "kresilient demo",
    "kresilient topic create",
    "kresilient lint",
    "kresilient audit",
    "kresilient dlq inspect",
    "kresilient dlq replay",
    "kresilient doctor",
)


def test_every_help_screen_is_whole_with_its_exit_codes() -> None:
    """No description or epilog ends mid-sentence, and every command says its exit codes."""
    parsers = dict(_all_parsers())
    assert set(LEAVES) <= set(parsers), sorted(set(LEAVES) - set(parsers))
    for name, parser in parsers.items():
        for what in ("description", "epilog"):
            text = (getattr(parser, what) or "").rstrip()
            if text:
                assert text.endswith((".", ")")), f"{name} {what} is cut: ...{text[-60:]!r}"
        if name in LEAVES:
            assert "Exit codes:" in parser.format_help(), f"{name}: no exit codes"


def test_doctor_help_lists_every_check_and_the_exit_codes() -> None:
    text = dict(_all_parsers())["kresilient doctor"].format_help()
    for n, section in enumerate(
        ("config", "connectivity", "metadata", "topics", "groups", "probe"), 1
    ):
        assert f"  {n}. {section}:" in text, section  # the list, one item per line
    assert "Exit codes: 0 healthy, 1 a finding at error level" in text
    assert "2 the cluster cannot be reached" in text
    assert "--topic and --group" in text  # what the report always shows


def test_help_lines_are_sentences() -> None:
    """The options of the commands this module defines: capitalised, ending with a stop."""
    for name, parser in _all_parsers():
        if name.startswith(("kresilient lint", "kresilient audit")):
            continue  # tests/test_lint_cli.py
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction | argparse._VersionAction):
                continue
            if isinstance(action, argparse._SubParsersAction):
                helps = [choice.help or "" for choice in action._choices_actions]
            else:
                helps = [action.help or ""]
            for text in helps:
                assert text[:1].isupper() and text.rstrip().endswith((".", ")")), (
                    f"{name} {action.dest}: {text!r}"
                )


def test_the_light_top_level_help_is_the_full_one() -> None:
    """`kresilient --help` lists lint and audit from cli._CONTRIBUTED without importing
    kresilient.lint.cli: the lines must be the ones that module registers."""
    assert cli.build_parser([]).format_help() == cli.build_parser().format_help()
    for command in ("lint", "audit"):  # the named command's module registers all its commands
        assert cli.build_parser([command]).format_help() == cli.build_parser().format_help()


@pytest.mark.parametrize("argv", HELP_ARGVS + CONTRIBUTED_ARGVS, ids=lambda a: " ".join(a) or "top")
def test_every_help_screen_runs(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([*argv, "--help"]) == 0
    assert capsys.readouterr().out.startswith(f"usage: kresilient {' '.join(argv)}".rstrip())


def test_help_defaults_are_the_implementations() -> None:
    """Defaults the parser shows without importing their module are the module's own."""
    from kresilient import clusterinfo, deadletter_cli, doctor

    assert cli._DLQ_TIMEOUT == deadletter_cli.DEFAULT_TIMEOUT
    assert cli._DLQ_MAX_REPLAYS == deadletter_cli.DEFAULT_MAX_REPLAYS
    assert cli._DLQ_REPLAY_COUNT == deadletter_cli.REPLAY_COUNT
    assert cli._DLQ_FIELDS == deadletter_cli._FIELDS
    assert cli._DOCTOR_DISK_THRESHOLD == clusterinfo.DISK_USAGE_THRESHOLD
    assert inspect.signature(doctor.diagnose).parameters["timeout"].default == cli._DOCTOR_TIMEOUT


@pytest.mark.parametrize(
    ("argv", "module", "function"),
    [
        (["doctor", "-b", "h:1"], "kresilient.doctor", "main"),
        (["dlq", "inspect", "t"], "kresilient.deadletter_cli", "main_inspect"),
        (["dlq", "replay", "--from", "t"], "kresilient.deadletter_cli", "main_replay"),
    ],
)
def test_each_command_runs_its_implementation(argv: list[str], module: str, function: str) -> None:
    """The parsers live in kresilient.cli; the command still reaches its module's function."""
    args = cli.build_parser(argv).parse_args(argv)
    assert args.func.__qualname__ == f"{module}.{function}"
    assert callable(getattr(__import__(module, fromlist=[function]), function))


def test_lint_parser_choices_are_copies_of_their_sources() -> None:
    """kresilient.lint.cli offers the lint engine's values without importing it: the copies
    are the engine's own."""
    from kresilient import clusterinfo
    from kresilient.lint import cli as lint_cli
    from kresilient.lint.model import KINDS
    from kresilient.lint.output import FORMATS
    from kresilient.lint.registry import CLIENTS

    assert tuple(sorted(FORMATS)) == lint_cli.FORMAT_CHOICES
    assert tuple(KINDS) == lint_cli.KIND_CHOICES
    assert tuple(CLIENTS) == lint_cli.CLIENT_CHOICES
    assert lint_cli.DISK_USAGE_THRESHOLD == clusterinfo.DISK_USAGE_THRESHOLD
    assert lint_cli.FUTURE_TOLERANCE_MS == clusterinfo.FUTURE_TOLERANCE_MS
