"""Executors: run one function over many tasks in other processes, yielding results as they finish.

`local` is a process pool on this machine (spawn context, so workers start clean and nothing the
parent imported leaks into them; each worker dies with the sweep process, however that ends, so a
killed sweep leaves no worker running and the pool's resource tracker, which exits when the last
process holding its pipe does, goes with them); `dask` sends the tasks to a Dask distributed cluster, either an
existing one (`scheduler` address, whose workers must see the same filesystem and package) or a
LocalCluster of worker processes started here. Both stop at the first failing task and raise its
error; tasks already finished stay finished.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from typing import Any, Protocol

EXECUTOR_NAMES = ("local", "dask")
CONNECT_TIMEOUT_S = 5.0  # an unreachable scheduler is reported after this, not after Dask's default 30 s
PR_SET_PDEATHSIG = 1  # linux/prctl.h
PARENT_POLL_S = 1.0  # where the kernel cannot signal a parent's death, a worker looks this often
MAX_WORKERS = 1024  # worker processes of one sweep: more than a machine's cores, fewer than its process limit


class ExecutorError(RuntimeError):
    """The executor itself cannot run (an unreachable cluster); no task has run."""


class Executor(Protocol):
    # CPU threads each task may use (cores ÷ concurrent tasks), None when the executor cannot know
    threads_per_task: int | None

    def map_unordered(self, fn: Callable[[Any], Any], tasks: Sequence[Any]) -> Iterator[Any]:
        """Yield fn(task) for every task in completion order; raise the first task error."""
        ...


def default_jobs() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class LocalExecutor:
    """A `concurrent.futures` process pool of `jobs` workers (default: the usable cores), each task
    with `threads_per_task` threads for parallel kernels (default: its share of the cores)."""

    def __init__(self, jobs: int | None = None, threads_per_task: int | None = None) -> None:
        if jobs is not None and not 1 <= jobs <= MAX_WORKERS:
            raise ValueError(f"jobs must be in [1, {MAX_WORKERS}], got {jobs}")
        if threads_per_task is not None and threads_per_task < 1:
            raise ValueError(f"threads_per_task must be >= 1, got {threads_per_task}")
        self.jobs = jobs or default_jobs()
        self.threads_per_task = threads_per_task or max(1, default_jobs() // self.jobs)

    def map_unordered(self, fn: Callable[[Any], Any], tasks: Sequence[Any]) -> Iterator[Any]:
        if not tasks:
            return
        pool = None
        try:
            with signals_deferred(), _spawnable_main():  # workers start during the submits
                pool = ProcessPoolExecutor(max_workers=min(self.jobs, len(tasks)), mp_context=_WorkerContext(),
                                           initializer=start_worker, initargs=(os.getpid(),))
                futures = [pool.submit(fn, task) for task in tasks]
            for future in as_completed(futures):
                yield future.result()
        except KeyboardInterrupt:
            # Ctrl-C reaches the whole process group; the workers ignore it (no tracebacks from them) and
            # are stopped here: their points are abandoned as temporary debris that a resume clears
            for process in list(pool._processes.values()) if pool else ():
                process.terminate()
            raise
        finally:
            if pool is not None:
                try:
                    pool.shutdown(wait=True, cancel_futures=True)
                except RuntimeError:  # interrupted while the pool started its manager thread: none to join
                    pass


class _WorkerProcess(multiprocessing.context.SpawnProcess):
    """A pool worker that holds Ctrl-C from its first instruction. Ctrl-C reaches the whole process group, and
    a worker still importing its modules (before `start_worker` runs) would print a KeyboardInterrupt
    traceback; so the sweep process blocks SIGINT for the spawn call alone (a few milliseconds). Blocked, not
    ignored: a Ctrl-C that arrives meanwhile stays pending for the sweep process and is delivered when the
    call returns, while the new interpreter inherits the mask and holds it until `start_worker` ignores it."""

    @staticmethod
    def _Popen(process_obj):  # noqa: N802 - multiprocessing's name
        if threading.current_thread() is not threading.main_thread():
            return multiprocessing.context.SpawnProcess._Popen(process_obj)
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            return multiprocessing.context.SpawnProcess._Popen(process_obj)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class _WorkerContext(multiprocessing.context.SpawnContext):
    Process = _WorkerProcess


@contextmanager
def _spawnable_main() -> Iterator[None]:
    """While workers start, the caller's `__main__` names neither a file nor a module, so a spawned worker does
    not import it first: a script without an `if __name__ == "__main__":` guard would run its top level again
    in every worker (each trying to start a sweep of its own), and a script read from stdin names a file that
    does not exist. The workers need nothing from it: they run workbench functions (so a `run_fn` must be
    importable from a module, not defined in the caller's script)."""
    main = sys.modules.get("__main__")
    if main is None:
        yield
        return
    path, spec = main.__dict__.pop("__file__", None), getattr(main, "__spec__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        if path is not None:
            main.__file__ = path
        main.__spec__ = spec


class DaskExecutor:
    """Tasks on a Dask cluster: `scheduler` = address of a running one, else a LocalCluster of `workers`."""

    def __init__(self, scheduler: str | None = None, workers: int | None = None) -> None:
        if workers is not None and not 1 <= workers <= MAX_WORKERS:
            raise ValueError(f"workers must be in [1, {MAX_WORKERS}], got {workers}")
        self.scheduler = scheduler
        self.workers = workers or default_jobs()
        self.threads_per_task = None if scheduler else max(1, default_jobs() // self.workers)

    def map_unordered(self, fn: Callable[[Any], Any], tasks: Sequence[Any]) -> Iterator[Any]:
        if not tasks:
            return
        from dask.distributed import Client, LocalCluster, as_completed

        if self.scheduler:
            cluster = None
            try:
                client = Client(self.scheduler, timeout=CONNECT_TIMEOUT_S)
            except (OSError, TimeoutError, ValueError) as exc:
                raise ExecutorError(f"cannot reach the Dask scheduler at {self.scheduler} within "
                                    f"{CONNECT_TIMEOUT_S:g} s: {exc}") from None
        else:
            # one single-threaded process per worker: runs are CPU-bound Python and NumPy
            cluster = LocalCluster(n_workers=self.workers, threads_per_worker=1, processes=True,
                                   dashboard_address=None)
            client = Client(cluster)
        try:
            futures = client.map(fn, list(tasks), pure=False)
            try:
                for future in as_completed(futures):
                    yield future.result()
            finally:
                client.cancel(futures)
        finally:
            client.close()
            if cluster is not None:
                cluster.close()


@contextmanager
def signals_deferred(signums: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM until the block ends, then deliver them to the handlers they had.

    Starting a spawned worker is two steps, the spawn and then writing its start-up data down a pipe; an
    interrupt between them (Python runs handlers right after the spawn call returns) closes the pipe
    unwritten, and the orphaned child prints EOFError's traceback before any of our code runs in it. A
    Python-level handler, unlike a blocked signal mask, is not inherited by the spawned interpreter."""
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return
    caught: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, _frame: caught.append(signum)) for signum in signums}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        for signum in dict.fromkeys(caught):
            signal.raise_signal(signum)


def start_worker(parent_pid: int) -> None:
    """In a new pool worker: ignore Ctrl-C (the parent stops the workers itself, without their tracebacks)
    and die with the parent. On Linux the kernel sends SIGKILL to the worker when the parent dies, even
    by SIGKILL (prctl PR_SET_PDEATHSIG; the pool starts workers from the parent's main thread, whose
    end is what the kernel watches); elsewhere a daemon thread polls. A parent already gone before
    either was set up is caught by comparing the parent pid."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # held since the spawn: a pending one is dropped
    try:
        watched = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL) == 0
    except (OSError, AttributeError):  # no prctl: not Linux
        watched = False
    if not watched:
        threading.Thread(target=_exit_when_orphaned, args=(parent_pid,), daemon=True).start()
    if os.getppid() != parent_pid:
        os._exit(1)


def _exit_when_orphaned(parent_pid: int) -> None:
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    os._exit(1)


def make_executor(name: str, *, jobs: int | None = None, scheduler: str | None = None,
                  workers: int | None = None) -> Executor:
    if name == "local":
        return LocalExecutor(jobs)
    if name == "dask":
        return DaskExecutor(scheduler, workers)
    raise ValueError(f"unknown executor {name!r}; expected one of {', '.join(EXECUTOR_NAMES)}")
