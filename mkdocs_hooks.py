"""MkDocs hook: links from a docs page to a file of the repository outside docs/.

A page may link ``../examples/asyncio_service.py`` (which works when reading the sources on
the forge). The site has no such file, so the link becomes the file's address in the source
repository (``repo_url``, branch ``main``). A target that does not exist in the checkout is a
warning, which ``mkdocs build --strict`` turns into a failure, as for any broken link.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

_LOG = logging.getLogger("mkdocs.hooks.repo_links")
# [text](target) whose target climbs out of docs/ (../something), with an optional #fragment.
_LINK = re.compile(r"\]\((\.\./[^)\s#]+)(#[^)\s]*)?\)")


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    docs_dir = Path(config["docs_dir"]).resolve()
    repo_root = docs_dir.parent
    repo_url = str(config["repo_url"]).rstrip("/")
    page_dir = (docs_dir / page.file.src_path).parent

    def rewrite(match: re.Match[str]) -> str:
        target = (page_dir / match.group(1)).resolve()
        try:
            rel = target.relative_to(repo_root)
        except ValueError:
            _LOG.warning(
                "Doc file '%s' links %s, outside the repository", page.file.src_path, match.group(1)
            )
            return match.group(0)
        if target.is_relative_to(docs_dir):
            return match.group(0)  # a docs page: MkDocs validates it
        if not target.exists():
            _LOG.warning(
                "Doc file '%s' links %s, which does not exist in the repository",
                page.file.src_path,
                match.group(1),
            )
            return match.group(0)
        kind = "tree" if target.is_dir() else "blob"
        return f"]({repo_url}/{kind}/main/{rel.as_posix()}{match.group(2) or ''})"

    return _LINK.sub(rewrite, markdown)
