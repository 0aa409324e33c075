"""What the notebooks under notebooks/ share, so that their cells hold only the experiment.

Importing this module sets display options for a notebook (figures at a readable resolution, tables
that fit a page). The notebooks run at full size; with WORKBENCH_NOTEBOOK_SMALL=1 (the tests set it)
`model()` gives a tiny model and `size()` the small request counts, so each notebook runs in well
under a minute. A notebook names where each sweep goes, `runs_dir() / NAME`: an absolute folder,
$WORKBENCH_RUNS_DIR when set (the tests set it), else the checkout's runs/notebooks. Importing this
module changes no environment variable, so a sweep elsewhere in the process, or a child process, goes
where it would have gone without it.

`python -m workbench.notebook NOTEBOOK...` (`make notebooks`) executes notebooks at full size and
stores their outputs in place, so that they read with figures on a code-hosting site.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from workbench.paths import IN_CHECKOUT, REPO_ROOT, pythonpath_with_package

SMALL = os.environ.get("WORKBENCH_NOTEBOOK_SMALL") == "1"
TINY_MODEL = "custom:layers=2,kv_heads=2,heads=4,head_dim=64,max_model_len=512"
TINY_KV_SLOTS = 3072
FIGURE_DPI = 150  # the inline PNGs: a 7-inch figure is ~1000 px wide

pd.set_option("display.precision", 3)
pd.set_option("display.width", 160)
pd.set_option("display.max_columns", 12)
plt.rcParams["figure.dpi"] = FIGURE_DPI


def model(name: str = "opt-13b", *, kv_gib: float = 12.0) -> dict[str, object]:
    """Run-config keys of the model and its KV capacity: `name` with `kv_gib` GiB, or the tiny model."""
    return {"model": TINY_MODEL, "kv_slots": TINY_KV_SLOTS} if SMALL else {"model": name, "kv_gib": kv_gib}


def size(full, small):
    """`full` normally, `small` when the tests run the notebook."""
    return small if SMALL else full


def runs_dir() -> Path:
    """The absolute folder a notebook's sweeps go into: $WORKBENCH_RUNS_DIR when set, else runs/notebooks of
    the checkout (of the working directory's parent for an installed package: a notebook runs in its
    notebooks/ folder)."""
    if os.environ.get("WORKBENCH_RUNS_DIR"):
        return Path(os.environ["WORKBENCH_RUNS_DIR"]).resolve()
    return ((REPO_ROOT if IN_CHECKOUT else Path.cwd().parent) / "runs" / "notebooks").resolve()


def trace(name: str) -> Path | None:
    """A registry trace's file: fetched (and verified) when missing at full size; at the small size only
    when already here, since tests never use the network. None, with the reason printed, otherwise."""
    from workbench.errors import TraceError
    from workbench.traces import locate, resolve

    try:
        path = locate(name) if SMALL else resolve(name)
    except TraceError as exc:
        print(f"trace {name} is not available: {exc}")
        return None
    if path is None:
        print(f"trace {name} is not here; get it with: python -m workbench.traces fetch {name}")
    return path


def execute(path: Path, *, timeout_s: int = 3600, kernel_name: str = "python3") -> None:
    """Run the notebook top to bottom in its own folder and store the outputs in place (raises, writing
    nothing, on the first failing cell)."""
    import nbformat

    book = nbformat.read(path, as_version=4)
    notebook_client(book, path.parent, timeout_s=timeout_s, kernel_name=kernel_name).execute()
    book.metadata["workbench"] = {"size": "small" if SMALL else "full"}
    nbformat.write(book, path)


REPLY_POLL_S = 2.0  # the longest a cell's finished reply can wait unseen (see notebook_client)


def notebook_client(book, folder: Path, *, timeout_s: int, kernel_name: str = "python3"):
    """An nbclient NotebookClient for `book`, run in `folder`, that waits for each cell's reply in slices.

    nbclient waits for a reply with one `get_msg(timeout=cell timeout)`; after a cell that opens widget
    comms, that wait sometimes misses the reply's arrival and returns it only when the whole timeout has
    passed (jupyter/nbclient#312): a 5-second cell took 300 s. Waiting in REPLY_POLL_S slices up to the
    same deadline sees the reply within one slice."""
    from queue import Empty

    from nbclient import NotebookClient

    class SlicedReplyClient(NotebookClient):
        async def async_start_new_kernel_client(self):
            kernel_client = await super().async_start_new_kernel_client()
            get_msg = kernel_client.shell_channel.get_msg

            async def get_msg_in_slices(timeout: float | None = None, **kwargs):
                deadline_s = None if timeout is None else time.monotonic() + timeout
                while True:
                    left_s = REPLY_POLL_S if deadline_s is None else max(0.0, deadline_s - time.monotonic())
                    try:
                        return await get_msg(timeout=min(REPLY_POLL_S, left_s), **kwargs)
                    except Empty:
                        if deadline_s is not None and time.monotonic() >= deadline_s:
                            raise

            kernel_client.shell_channel.get_msg = get_msg_in_slices
            return kernel_client

    return SlicedReplyClient(book, timeout=timeout_s, kernel_name=kernel_name, record_timing=False,
                             resources={"metadata": {"path": str(folder)}})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workbench.notebook",
                                     description="execute notebooks and store their outputs in place")
    parser.add_argument("notebooks", nargs="+", type=Path, metavar="NOTEBOOK")
    args = parser.parse_args(argv)
    # this environment's kernel, even when a user-level `python3` kernelspec points elsewhere
    os.environ.setdefault("JUPYTER_PATH", str(Path(sys.prefix) / "share" / "jupyter"))
    if IN_CHECKOUT:  # the kernel imports this checkout's package, not another installed copy
        os.environ["PYTHONPATH"] = pythonpath_with_package()
    for path in args.notebooks:
        start_s = time.perf_counter()
        try:
            execute(path)
        except Exception as exc:  # nbclient's CellExecutionError carries the cell and its traceback
            print(f"error: {path}: {exc}", file=sys.stderr)
            return 1
        print(f"{path}: executed and stored ({time.perf_counter() - start_s:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
