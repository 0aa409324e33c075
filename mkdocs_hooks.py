"""mkdocs hooks: heading anchors as GitHub makes them (the pages link to each other's sections by those),
and the gallery page built from the figure registry with the committed figures/ images (outside docs/)."""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.structure.files import File

from workbench.figures.gallery import gallery_markdown
from workbench.figures.registry import FIGURE_NAMES

FIGURES_DIR = Path(__file__).parent / "figures"


def on_files(files, config):
    files.append(File.generated(config, "gallery.md", content=gallery_markdown(FIGURES_DIR)))
    for name in FIGURE_NAMES:
        files.append(File.generated(config, f"figures/{name}.png", abs_src_path=str(FIGURES_DIR / f"{name}.png")))
    return files


def github_slug(value: str, separator: str) -> str:
    """A heading's anchor as GitHub writes it: lower case, punctuation but `-` and `_` dropped, each space a
    separator (so `(--host-cache-gib, ...)` keeps its runs of hyphens)."""
    return re.sub(r"[^\w\- ]", "", value.strip().lower()).replace(" ", separator)


def on_config(config):
    config.mdx_configs.setdefault("toc", {})["slugify"] = github_slug
    return config
