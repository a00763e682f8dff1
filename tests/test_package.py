"""Packaging: the public API, the typed marker, soft optional imports, the console script."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata, resources

import kresilient
from kresilient.cli import main


def test_all_is_sorted_and_complete() -> None:
    public = {
        name
        for name in dir(kresilient)
        if not name.startswith("_") and not isinstance(getattr(kresilient, name), type(sys))
    }
    assert kresilient.__all__ == sorted(kresilient.__all__)
    assert public - {"annotations"} <= set(kresilient.__all__), public - set(kresilient.__all__)
    for name in kresilient.__all__:
        assert hasattr(kresilient, name), name


def test_py_typed_and_broker_pom_are_package_data() -> None:
    files = resources.files("kresilient")
    assert files.joinpath("py.typed").is_file()
    assert "kafka_2.13" in files.joinpath("_data/kafka-pom.xml").read_text()


def test_import_needs_only_the_core_dependencies() -> None:
    # Block the optional extras: importing kresilient (and its CLI) must still work, and
    # must not import them behind the user's back.
    code = (
        "import sys\n"
        "for mod in ('pyspark', 'pyarrow', 'pandas', 'opentelemetry.sdk', 'jsonschema',"
        " 'hypothesis', 'pytest'):\n"
        "    sys.modules[mod] = None\n"
        "import kresilient, kresilient.cli\n"
        "kresilient.cli.build_parser()\n"
        "assert 'pyspark' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_console_script_is_declared_and_runs() -> None:
    scripts = {ep.name: ep.value for ep in metadata.entry_points(group="console_scripts")}
    assert scripts.get("kresilient") == "kresilient.cli:main"
    out = subprocess.run(
        [sys.executable, "-m", "kresilient.cli", "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0 and kresilient.__version__ in out.stdout


def test_cli_without_a_command_is_a_usage_error(capsys: object) -> None:
    assert main([]) == 2
    assert main(["no-such-command"]) == 2


def test_pytest_plugin_is_registered() -> None:
    plugins = {ep.name: ep.value for ep in metadata.entry_points(group="pytest11")}
    assert plugins.get("kresilient") == "kresilient.pytest_plugin"
