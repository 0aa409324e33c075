"""The docs: the gallery holds every registered figure with its caption and command, and the site builds
with --strict (no broken link, anchor or API reference) wherever mkdocs is installed (`make docs`)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys

import pytest

from workbench.figures.gallery import caption, command, gallery_markdown
from workbench.figures.registry import FIGURE_NAMES
from workbench.paths import REPO_ROOT


def test_the_gallery_shows_every_figure_with_its_caption_and_command():
    page = gallery_markdown(REPO_ROOT / "figures")
    sections = page.split("\n## ")[1:]
    assert [s.split("\n", 1)[0] for s in sections] == list(FIGURE_NAMES)
    for name, section in zip(FIGURE_NAMES, sections, strict=True):
        assert f"![{name}](figures/{name}.png)" in section and (REPO_ROOT / "figures" / f"{name}.png").is_file()
        assert caption(name) in section and len(caption(name)) > 40
        assert f"```\n{command(name)}\n```" in section
        assert "Drawn " in section  # from the figure's provenance sidecar


@pytest.mark.skipif(importlib.util.find_spec("mkdocstrings") is None, reason="mkdocs is not installed: make docs")
def test_the_site_builds_strictly(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    api = (site / "api.html").read_text()
    for name in ("workbench.api.run", "workbench.api.Result", "workbench.sweep.runner.sweep", "workbench.plot.memory"):
        assert f'id="{name}"' in api, name
    assert all((site / "figures" / f"{name}.png").is_file() for name in FIGURE_NAMES)
    # a reference to something that does not exist fails the build
    docs = tmp_path / "docs"
    shutil.copytree(REPO_ROOT / "docs", docs)
    (docs / "api.md").write_text((docs / "api.md").read_text() + "\n::: workbench.api.no_such_function\n")
    config = (REPO_ROOT / "mkdocs.yml").read_text().replace("docs_dir: docs", f"docs_dir: {docs}")
    config = config.replace("  - mkdocs_hooks.py", f"  - {REPO_ROOT / 'mkdocs_hooks.py'}")
    (tmp_path / "mkdocs.yml").write_text(config.replace("paths: [.]", f"paths: [{REPO_ROOT}]"))
    broken = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(tmp_path / "mkdocs.yml"),
                             "--site-dir", str(tmp_path / "broken")], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=600)
    assert broken.returncode != 0 and "no_such_function" in broken.stderr
