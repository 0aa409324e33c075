"""A replica's requests in arrival order: the whole workload, or what a fleet's router hands it as they arrive.

Each request is read from the list once, when it is next to arrive, and becomes a `Group` when it arrives. A
disaggregated fleet (docs/fleet.md) marks two kinds: a request whose prompt KV and first token a prefill replica
made (`transferred`: it arrives with them) and one whose KV a link reads after it finishes (`holds_kv`: its
blocks stay allocated until released).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from workbench.engine import rules
from workbench.engine.groups import Group
from workbench.workload.request import Request


class Arrivals:
    """Mutating calls say so."""

    def __init__(self, requests: list[Request]) -> None:
        self.requests = requests
        self.next_index = 0  # the first request not yet arrived
        self._next: Request | None = None  # that request, once read (`_peek`)
        self._transferred: set[int] = set()  # request indexes whose prompt KV arrives with them
        self._holding: set[int] = set()  # request indexes whose blocks outlive them until released

    def add(self, request: Request, *, transferred: bool = False, holds_kv: bool = False) -> None:
        """Mutates. One more request, arriving no earlier than those already given."""
        if self.requests and request.arrival_s < self.requests[-1].arrival_s:
            raise ValueError(f"request {request.request_id} arrives at {request.arrival_s} s, before the last "
                             f"one given ({self.requests[-1].arrival_s} s)")
        self.requests.append(request)
        if transferred:
            self._transferred.add(len(self.requests) - 1)
        if holds_kv:
            self._holding.add(len(self.requests) - 1)

    def arrived(self, now_s: float) -> Iterable[Group]:
        """Mutates (as they are taken). The groups of the requests that arrived by `now_s`, in order (none at most
        steps: then no generator is made)."""
        req = self._next if self._next is not None else self._peek()
        return () if req is None or req.arrival_s > now_s else self._arriving(now_s)

    def _arriving(self, now_s: float) -> Iterator[Group]:
        while (req := self._peek()) is not None and req.arrival_s <= now_s:
            i = self.next_index
            self.next_index += 1
            self._next = None
            group = Group(i, req, final_len=rules.final_kv_len(req.prompt_tokens, req.output_tokens))
            if i in self._transferred:  # it generated its first token on its prefill replica
                self._transferred.discard(i)
                group.generated, group.transferred = 1, True
            if i in self._holding:
                self._holding.discard(i)
                group.holds_kv = True
            yield group

    def next_arrival_s(self) -> float | None:
        req = self._peek()
        return None if req is None else req.arrival_s

    def not_arrived_prompt_tokens(self) -> int:
        """Prompt tokens of the requests given that have not arrived yet."""
        return sum(r.prompt_tokens for r in self.requests[self.next_index:])

    def skip_to(self, index: int) -> None:
        """Mutates. The requests before `index` arrived elsewhere (a compiled step loop)."""
        self.next_index, self._next = index, None

    def any_transferred(self) -> bool:
        return bool(self._transferred)

    def release(self) -> None:
        """Mutates. The run is over: the workload is let go (a long trace's columns are most of what a
        finished run still holds); nothing can be added or arrive after this."""
        self.requests = []
        self._next = None

    def _peek(self) -> Request | None:
        """The first request not yet arrived, read from the list once (None when all have arrived)."""
        if self._next is None and self.next_index < len(self.requests):
            self._next = self.requests[self.next_index]
        return self._next
