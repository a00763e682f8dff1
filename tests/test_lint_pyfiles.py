"""Issue 38: a Python client whose config is read from a file. lint follows a literal
relative path to a file beside the source or in one of its parent directories (never through
`..` or a symbolic link leading out) and
checks its keys at the line that reads them, so a SASL_PLAINTEXT config in client.json or
kafka.ini is found; a path known only at run time, or a file that is not there, leaves the
config "not understood" (KR055) with the file and the reason named."""

from __future__ import annotations

from pathlib import Path

import pytest

from kresilient.lint import lint_paths
from kresilient.lint.model import Finding, LintStats, Severity
from kresilient.lint.settings import Settings

CLIENT_JSON = (
    '{"bootstrap.servers": "k1:9092,k2:9092", "security.protocol": "SASL_PLAINTEXT",\n'
    ' "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "app"}\n'
)
KAFKA_INI = (
    "[DEFAULT]\nbootstrap.servers = k1:9092,k2:9092\nsecurity.protocol = SASL_PLAINTEXT\n"
    "sasl.mechanism = PLAIN\n\n[consumer]\ngroup.id = g\nauto.offset.reset = latest\n"
)


def _lint(root: Path) -> tuple[list[Finding], LintStats]:
    stats = LintStats()
    return lint_paths([str(root)], Settings(), stats=stats), stats


def _in(findings: list[Finding], name: str) -> list[tuple[str, int]]:
    return sorted((f.rule, f.line) for f in findings if f.path.endswith(name))


@pytest.mark.parametrize(
    "load",
    [
        'json.load(open("client.json"))',
        'json.loads(Path("client.json").read_text())',
        'json.loads((Path(__file__).parent / "client.json").read_text())',
        'json.load(open(os.path.join(os.path.dirname(__file__), "client.json")))',
    ],
)
def test_a_json_config_beside_the_source_is_followed(tmp_path: Path, load: str) -> None:
    (tmp_path / "producer.py").write_text(
        "import json, os\nfrom pathlib import Path\nfrom confluent_kafka import Producer\n"
        f"conf = {load}\nproducer = Producer(conf, error_cb=print)\n"
    )
    (tmp_path / "client.json").write_text(CLIENT_JSON)
    findings, stats = _lint(tmp_path)
    assert ("KR040", 4) in _in(findings, "producer.py")  # SASL_PLAINTEXT, at the load line
    assert not stats.not_understood
    # negative control: without the file the config is not understood, saying why
    (tmp_path / "client.json").unlink()
    findings, stats = _lint(tmp_path)
    assert "KR040" not in {r for r, _ in _in(findings, "producer.py")}
    [(_, line, reason)] = stats.not_understood
    assert line == 5 and "client.json, which is not in this tree" in reason, reason


def test_a_with_block_and_a_configparser_file_in_a_parent_directory_are_followed(
    tmp_path: Path,
) -> None:
    """A script in src/app run from the project root opens config/kafka.ini: the file is
    found in a parent directory; configparser's [DEFAULT] keys are in [consumer]."""
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "kafka.ini").write_text(KAFKA_INI)
    (tmp_path / "client.json").write_text(CLIENT_JSON)
    app = tmp_path / "src" / "app"
    app.mkdir(parents=True)
    (app / "consumer.py").write_text(
        "import json\nfrom configparser import ConfigParser\n"
        "from confluent_kafka import Consumer, Producer\n"
        "parser = ConfigParser()\nparser.read('config/kafka.ini')\n"
        "consumer = Consumer(dict(parser['consumer']), error_cb=print)\n"
        "with open('client.json') as fh:\n    conf = json.load(fh)\n"
        "producer = Producer(conf, error_cb=print)\n"
    )
    findings, stats = _lint(tmp_path)
    found = _in(findings, "consumer.py")
    assert ("KR040", 6) in found and ("KR021", 6) in found  # from [DEFAULT] and [consumer]
    assert ("KR040", 8) in found  # client.json through the with block
    kr040 = [f for f in findings if f.rule == "KR040" and f.path.endswith("consumer.py")]
    assert all(f.severity == Severity.ERROR for f in kr040)
    assert not stats.not_understood


@pytest.mark.parametrize(
    ("source", "why"),
    [
        (
            "from argparse import ArgumentParser, FileType\n"
            "from configparser import ConfigParser\nfrom confluent_kafka import Consumer\n"
            "args = ArgumentParser().parse_args()\nparser = ConfigParser()\n"
            "parser.read_file(args.config_file)\nconfig = dict(parser['default'])\n"
            "config.update(parser['consumer'])\nconsumer = Consumer(config)\n",
            "configparser reads a file named at run time: args.config_file",
        ),
        (
            "import json, sys\nfrom confluent_kafka import Producer\n"
            "producer = Producer(json.load(open(sys.argv[1])))\n",
            "json.load of a file named at run time: open(sys.argv[1])",
        ),
        (
            "import json\nfrom confluent_kafka import Producer\n"
            "producer = Producer(json.load(open('/etc/kafka/client.json')))\n",
            "/etc/kafka/client.json, which is not in this tree",
        ),
        (
            "from configparser import ConfigParser\nfrom confluent_kafka import Consumer\n"
            "parser = ConfigParser()\nparser.read('kafka.ini')\n"
            "consumer = Consumer(dict(parser['kafka']))\n",
            "section [kafka] is not in the file it reads",
        ),
    ],
)
def test_a_file_lint_cannot_follow_is_named_in_kr055(tmp_path: Path, source: str, why: str) -> None:
    (tmp_path / "kafka.ini").write_text(KAFKA_INI)  # has no [kafka] section
    (tmp_path / "app.py").write_text(source)
    findings, stats = _lint(tmp_path)
    [kr055] = [f for f in findings if f.rule == "KR055"]
    assert why in kr055.message and "read from a file at run time" in kr055.message
    assert [(p, m) for p, _, m in stats.not_understood] == [(kr055.path, kr055.message)]


@pytest.mark.parametrize("way", ["dotdot", "symlink"])
def test_a_path_leading_out_of_the_source_directories_is_not_read(tmp_path: Path, way: str) -> None:
    """Review of issue 38: `../outside/client.json` and a symbolic link to a file elsewhere
    were followed, and lint echoed what that file held (a broker address). Neither is read
    now: the config is not understood, and nothing of the outside file is in the findings."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "client.json").write_text(CLIENT_JSON.replace("k1:9092", "secret-host:9092"))
    project = tmp_path / "a" / "b" / "c" / "d" / "project"
    project.mkdir(parents=True)
    if way == "dotdot":
        literal = "../../../../../outside/client.json"
    else:
        (project / "client.json").symlink_to(outside / "client.json")
        literal = "client.json"
    (project / "producer.py").write_text(
        "import json\nfrom confluent_kafka import Producer\n"
        f"producer = Producer(json.load(open({literal!r})))\n"
    )
    findings, stats = _lint(project)
    from_source = [f for f in findings if f.path.endswith("producer.py")]
    assert "KR040" not in {f.rule for f in from_source}
    assert not any("secret-host" in f.message for f in from_source)
    assert [line for p, line, _ in stats.not_understood if p.endswith("producer.py")] == [3]
    # control: the same file copied beside the source is followed
    if way == "symlink":
        (project / "client.json").unlink()
    (project / "client.json").write_text((outside / "client.json").read_text())
    (project / "producer.py").write_text(
        "import json\nfrom confluent_kafka import Producer\n"
        "producer = Producer(json.load(open('client.json')))\n"
    )
    findings, stats = _lint(project)
    assert ("KR040", 3) in _in(findings, "producer.py")
