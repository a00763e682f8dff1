"""The files a Python client's config is read from: ``json.load(open("client.json"))``, a
``configparser`` section, ``yaml.safe_load``, ``tomllib.load``.

lint follows a literal relative path to a file beside the source, or in one of its three
parent directories (as a script run from the project root opens it); a path that climbs with
``..``, or a symbolic link leading out of the directory it was found in, is not followed and checks
what the file holds as the client's config. A path known only at run time
(``args.config_file``) or a file that is not there leaves the config "not understood",
saying why (issue 38). Only the standard library's parsers (and PyYAML, which the YAML reader
uses) read the file, with the semantics the program gets: configparser's ``[DEFAULT]``
section is in every section, as ``dict(parser["consumer"])`` sees it.
"""

from __future__ import annotations

import configparser
import json
import os
import tomllib

import yaml

__all__ = ["LOADERS", "MAX_BYTES", "find_beside", "ini_sections", "load_mapping"]

#: Calls that parse a config file (the dotted name as written) -> its format.
LOADERS: dict[str, str] = {
    "json.load": "json",
    "json.loads": "json",
    "yaml.safe_load": "yaml",
    "yaml.load": "yaml",
    "yaml.full_load": "yaml",
    "tomllib.load": "toml",
    "tomllib.loads": "toml",
    "tomli.load": "toml",
    "tomli.loads": "toml",
    "toml.load": "toml",
    "toml.loads": "toml",
}
#: A config file larger than this is not followed (lint's own file limit is larger; a client
#: config is small, and a huge file named by a script is not one).
MAX_BYTES = 1 << 20
#: Parent directories searched above the source's own (src/app/consumer.py run from the
#: project root opens "config/kafka.ini" relative to the root).
_PARENTS = 3


def find_beside(source: str, literal: str) -> str | None:
    """The file ``literal`` (a relative path written in ``source``) names: in ``source``'s
    directory or one of its ``_PARENTS`` parents, the nearest first; None when it is not
    there, is absolute, climbs with ``..`` or resolves (through a symbolic link) outside the
    directory it was found in: lint never reads, and so never echoes, a file the path
    does not plainly place under the source's own project directories."""
    if not literal or "\0" in literal or os.path.isabs(literal):
        return None
    if ".." in literal.replace("\\", "/").split("/"):
        return None
    base = os.path.dirname(os.path.abspath(source))
    for _ in range(_PARENTS + 1):
        candidate = os.path.normpath(os.path.join(base, literal))
        if os.path.isfile(candidate):
            real_base = os.path.realpath(base)
            if os.path.commonpath([real_base, os.path.realpath(candidate)]) != real_base:
                return None
            return candidate
        parent = os.path.dirname(base)
        if parent == base:
            break
        base = parent
    return None


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_BYTES:
        return None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None


def load_mapping(path: str, fmt: str) -> dict[str, object] | None:
    """The top-level mapping of the JSON/YAML/TOML file ``path``, or None when it cannot be
    read or holds no mapping."""
    text = _read(path)
    if text is None:
        return None
    try:
        if fmt == "json":
            data: object = json.loads(text)
        elif fmt == "yaml":
            data = yaml.safe_load(text)
        else:
            data = tomllib.loads(text)
    except (ValueError, yaml.YAMLError, RecursionError):  # JSON/TOML errors are ValueErrors
        return None
    if not isinstance(data, dict):
        return None
    return {str(k): v for k, v in data.items()}


def ini_sections(paths: list[str], texts: list[str]) -> dict[str, dict[str, object]] | None:
    """The sections configparser reads from the files ``paths`` and the strings ``texts``
    (in that order), each with the ``[DEFAULT]`` keys it inherits; None on a parse error or
    an unreadable file. Interpolation is off: a ``%`` in a value is kept as written."""
    parser = configparser.ConfigParser(interpolation=None)
    try:
        for path in paths:
            text = _read(path)
            if text is None:
                return None
            parser.read_string(text, source=path)
        for text in texts:
            parser.read_string(text)
    except configparser.Error:
        return None
    out: dict[str, dict[str, object]] = {name: dict(parser[name]) for name in parser.sections()}
    out["DEFAULT"] = dict(parser.defaults())
    return out
