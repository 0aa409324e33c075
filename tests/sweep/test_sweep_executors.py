"""The local executor's start-up is not interruptible half-way: a Ctrl-C or SIGTERM that arrives while workers
are being spawned waits until every spawned worker has its start-up data, then reaches the usual handler."""

from __future__ import annotations

import os
import signal
from contextlib import nullcontext

import pytest

from workbench.sweep.executors import signals_deferred


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_inside_the_block_is_delivered_when_it_ends(signum):
    seen: list[int] = []
    ran_to_the_end = False
    previous = signal.signal(signal.SIGTERM, lambda n, _f: seen.append(n))
    # Python's own SIGINT handler, even where the test process inherited SIGINT ignored (a background job)
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt) if signum == signal.SIGINT else nullcontext():
            with signals_deferred():
                os.kill(os.getpid(), signum)
                os.kill(os.getpid(), signum)  # twice: delivered once
                assert seen == []  # held: the block runs to its end
                ran_to_the_end = True
        assert ran_to_the_end
        assert seen == ([] if signum == signal.SIGINT else [signal.SIGTERM])
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


def test_the_handlers_are_restored_and_nothing_is_delivered_without_a_signal():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with signals_deferred():
        pass
    assert {s: signal.getsignal(s) for s in before} == before


def report_sigint(queue) -> None:
    """In a spawned worker, before anything of the pool's runs: whether SIGINT is held (blocked)."""
    queue.put(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))


@pytest.mark.parametrize("parent_handler", [signal.default_int_handler, lambda n, f: None, signal.SIG_DFL],
                         ids=["python's", "a function", "default"])
def test_a_worker_ignores_ctrl_c_from_its_first_instruction_and_the_parent_keeps_its_handler(parent_handler):
    from workbench.sweep.executors import _WorkerContext

    context = _WorkerContext()
    previous = signal.signal(signal.SIGINT, parent_handler)
    try:
        queue = context.SimpleQueue()
        worker = context.Process(target=report_sigint, args=(queue,))
        worker.start()
        assert signal.getsignal(signal.SIGINT) is parent_handler  # held for the spawn call alone
        assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
        assert queue.get() is True  # a Ctrl-C to the group while it imports is held: no traceback
        worker.join(timeout=120)
        assert worker.exitcode == 0
    finally:
        signal.signal(signal.SIGINT, previous)
