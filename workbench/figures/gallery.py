"""The gallery page of the docs: every registered figure, its caption and the command that draws it.

The caption is what the figure shows (its module's docstring) and what was run (its experiment's
`description`); the image is the committed figures/NAME.png, and its provenance sidecar says when and
from which commit it was drawn. `mkdocs_hooks.py` builds the page from this on every docs build, so
a figure registered is a figure in the gallery.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import yaml

from workbench.figures.registry import FIGURE_NAMES, experiment_path


def caption(name: str) -> str:
    """What figure `name` shows and what its sweep runs, as Markdown paragraphs."""
    doc = (importlib.import_module(f"workbench.figures.{name}").__doc__ or "").strip()
    shows = doc.split(":", 1)[1].strip() if doc.startswith(f"{name}:") else doc
    description = " ".join(str(yaml.safe_load(experiment_path(name).read_text()).get("description", "")).split())
    return f"{shows}\n\n**Run:** {description}" if description else shows


def command(name: str) -> str:
    return f"python -m workbench.figures {name}"


def gallery_markdown(figures_dir: Path, image_dir: str = "figures") -> str:
    """The page: a section per figure in registry order, its image from `image_dir/NAME.png` (relative to
    the page), caption, command and provenance (read from `figures_dir/NAME.provenance.json` where present)."""
    parts = ["# Figure gallery", "",
             "Every figure of `python -m workbench.figures`, drawn from its built-in experiment "
             "(`experiments/fig_<name>.yaml`). Each figure's own caption line, under the plot, says "
             "what was measured: model, KV capacity, GPU preset, clock and kernel.", ""]
    for name in FIGURE_NAMES:
        parts += [f"## {name}", "", f"![{name}]({image_dir}/{name}.png)", "", caption(name), "",
                  "**Draw it:**", "", "```", command(name), "```", ""]
        sidecar = Path(figures_dir) / f"{name}.provenance.json"
        if sidecar.is_file():
            record = json.loads(sidecar.read_text())
            parts += [f"*Drawn {record.get('date')} at commit `{str(record.get('git_commit'))[:12]}` from "
                      f"{record.get('num_points')} points (config hash `{record.get('config_hash')}`).*", ""]
    return "\n".join(parts)
