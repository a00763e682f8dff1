"""The ``--command-config`` file of every command (``topic create``, ``dlq``, ``audit``,
``doctor``): one reader, so the commands agree on what a file means.

Java's ``Properties.load(InputStream)``, which the Kafka tools use for their
``--command-config``, reads ISO-8859-1 (Latin-1); most files written today are UTF-8. A file
is read as UTF-8 when it is valid UTF-8, and as Latin-1 otherwise (every byte is a Latin-1
character, so a Java-valid file is never refused for its encoding). ``\\uXXXX`` escapes are
decoded by the properties parser either way.
"""

from __future__ import annotations

from kresilient.errors import ConfigError
from kresilient.lint.readers import read_text

__all__ = ["decode_properties", "read_command_config"]


def decode_properties(data: bytes) -> str:
    """``data`` as text: UTF-8 when it is valid UTF-8 (a BOM dropped), Latin-1 otherwise."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def read_command_config(path: str) -> tuple[dict[str, str], str]:
    """The client properties of ``path`` and the text they were read from.

    Java properties (``key=value`` or ``key: value``, ``#``/``!`` comments, ``\\``
    continuations and escapes), with the parser ``kresilient lint`` uses. A malformed file is
    a :class:`ConfigError` naming the file and line, never its values (they may be secrets).
    An unreadable file raises :class:`OSError` (its ``filename`` and ``strerror`` say why).
    A key set twice keeps its last value, as ``Properties.load`` does.
    """
    with open(path, "rb") as fh:
        text = decode_properties(fh.read())
    result = read_text(text, path, "properties", "client")
    if result.error:
        raise ConfigError(f"{path}:{result.error.line}: {result.error.message}", key=None)
    config: dict[str, str] = {}
    for unit in result.units:
        config.update({k: e.text for k, e in unit.entries.items()})
    return config, text
