"""Issue 36, build 5 and acceptance 5: the docs site builds from docs/ with no warning, and every
README link resolves from the wheel's metadata alone.

``mkdocs build --strict`` turns every warning into a failure; mkdocs.yml's ``validation``
makes a warning of each broken link (a page that does not exist, an anchor no heading
defines, a page left out of the nav) and mkdocs_hooks.py of a link to a repository file that
does not exist. The negative controls break one link each in a copy of the docs and check
that the build fails naming it, so a build that passes is not one that checks nothing.

The README is the PyPI page: its links are absolute (tests/test_readme.py), and here each one
that points into the docs site is found in the built site (page and anchor), and each one that
points into the source repository names a file or directory of this checkout. The site and
repository addresses are the ones mkdocs.yml names (``site_url``, ``repo_url``); the package's
Project-URLs repeat them.
"""

from __future__ import annotations

import html.parser
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CONFIG: dict[str, Any] = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
SITE_URL: str = CONFIG["site_url"]
REPO_URL: str = CONFIG["repo_url"]

pytest.importorskip("mkdocs", reason="mkdocs is in the dev extra: pip install -e '.[dev]'")


def _build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # Material's end-of-life banner
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.fixture(scope="module", name="site")
def _site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("site")
    out = _build(ROOT, site)
    log = out.stdout + out.stderr
    assert out.returncode == 0, f"mkdocs build --strict failed:\n{log[-5000:]}"
    warnings = [line for line in log.splitlines() if "WARNING" in line]
    assert not warnings, warnings
    return site


def test_docs_site_builds_strict_with_no_warning(site: Path) -> None:
    assert (site / "index.html").is_file()
    assert (site / "guarantees" / "index.html").is_file()
    # Every page of docs/ is in the nav (validation.nav.omitted_files would warn otherwise)
    # and was built.
    for page in (ROOT / "docs").glob("*.md"):
        built = site / ("index.html" if page.stem == "index" else f"{page.stem}/index.html")
        assert built.is_file(), page.name


_BROKEN = {  # link appended to a copy of docs/index.md -> what the failed build must name
    "[a page](no-such-page.md)": "no-such-page.md",
    "[an anchor](guarantees.md#no-such-anchor)": "#no-such-anchor",
    "[a repository file](../examples/no_such_example.py)": "no_such_example.py",
}


def test_broken_links_and_a_page_left_out_of_the_nav_fail_the_build_negative_control(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    for entry in ROOT.iterdir():  # the checkout, with a copy of docs/ to break
        if entry.name not in ("docs", "site", ".git"):
            (project / entry.name).symlink_to(entry)
    shutil.copytree(ROOT / "docs", project / "docs")
    with (project / "docs" / "index.md").open("a", encoding="utf-8") as page:
        page.write("\n" + "\n".join(_BROKEN) + "\n")
    (project / "docs" / "orphan.md").write_text("# Orphan\n", encoding="utf-8")
    out = _build(project, tmp_path / "site")
    log = out.stdout + out.stderr
    assert out.returncode != 0, f"the broken copy built:\n{log}"
    for named in [*_BROKEN.values(), "orphan.md"]:
        assert named in log, f"{named} not reported:\n{log}"


class _Ids(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.ids.update(value for name, value in attrs if name == "id" and value)


def _readme_links() -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", README.read_text(encoding="utf-8"))


def test_every_readme_link_into_the_site_lands_on_a_built_page_and_anchor(site: Path) -> None:
    links = [link for link in _readme_links() if link.startswith(SITE_URL)]
    assert len(links) >= 10, links
    for link in links:
        path, _, anchor = link[len(SITE_URL) :].partition("#")
        page = site / path / "index.html"
        assert page.is_file(), f"{link}: the site has no {path or 'home'} page"
        if anchor:
            ids = _Ids()
            ids.feed(page.read_text(encoding="utf-8"))
            assert anchor in ids.ids, f"{link}: no #{anchor} on the page"


def test_every_readme_link_into_the_repository_names_a_file_of_this_checkout() -> None:
    links = [link for link in _readme_links() if link.startswith(REPO_URL)]
    assert links
    for link in links:
        rest = link[len(REPO_URL) :].strip("/")
        if rest in ("", "issues"):
            continue
        match = re.fullmatch(r"(blob|tree)/main/([^#]+)(#.*)?", rest)
        assert match, f"{link}: not a blob/ or tree/ link on main"
        target = ROOT / match.group(2)
        if match.group(1) == "blob":
            assert target.is_file(), f"{link}: {match.group(2)} is not a file of the checkout"
        else:
            assert target.is_dir(), f"{link}: {match.group(2)} is not a directory"


def test_readme_links_elsewhere_only_to_the_site_the_repository_or_confluent_kafka() -> None:
    allowed = (SITE_URL, REPO_URL, "https://github.com/confluentinc/confluent-kafka-python")
    strays = [link for link in _readme_links() if not link.startswith(allowed)]
    assert not strays, strays


def test_package_metadata_lists_the_project_urls() -> None:
    # `pip show kresilient` prints these; PyPI shows them beside the README. The addresses are
    # mkdocs.yml's (assumed: no public hosting is known yet).
    urls = dict(
        entry.split(", ", 1)
        for entry in metadata.metadata("kresilient").get_all("Project-URL") or []
    )
    assert urls.get("Documentation") == SITE_URL, urls
    assert urls.get("Source") == REPO_URL, urls
    assert urls.get("Homepage") in (SITE_URL, REPO_URL), urls
    assert urls.get("Issues") == f"{REPO_URL}/issues", urls
    assert urls.get("Changelog") == f"{REPO_URL}/blob/main/CHANGELOG.md", urls
