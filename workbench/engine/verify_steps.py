"""Speculative decoding in the scheduler (docs/speculative.md): a step's verify, from the batch's slots to
`Scheduler.complete`.

`VerifySteps` asks the strategy for each decoding sequence's last-token slot and its drafts (all or nothing),
keeps the step's `Verify` until the step completes, then settles the drafts (accepted kept, the rest rolled
back), advances the groups and counts what was drafted and accepted. The acceptance rule itself is
`workbench.engine.speculation`.
"""

from __future__ import annotations

import numpy as np

from workbench.allocators.base import Strategy
from workbench.allocators.values import AppendResult
from workbench.clock.step_cost import StepCost, with_drafts
from workbench.columns import SPEC_STEP_COLUMNS
from workbench.engine.groups import Group
from workbench.engine.plan import Verify
from workbench.engine.request_log import RequestLog
from workbench.engine.scheduler_config import SchedulerConfig
from workbench.engine.speculation import Speculation
from workbench.engine.summary_counters import SPEC_COUNTERS, spec_rates
from workbench.engine.tokens import TokenStore


class VerifySteps:
    """Mutates the strategy, the decode batch's groups and the request log it is given."""

    def __init__(self, strategy: Strategy, tokens: TokenStore, log: RequestLog, batch,
                 config: SchedulerConfig) -> None:
        """`batch`: the scheduler's `workbench.engine.decode_batch.DecodeBatch` (not imported: it sits below the
        scheduler in the import graph, this module beside it)."""
        if not strategy.supports_drafts:
            raise ValueError(f"strategy {strategy.name} ({type(strategy).__name__}) does not support speculative "
                             f"decoding (spec_tokens > 0)")
        self.strategy, self.tokens, self.log, self.batch = strategy, tokens, log, batch
        self.spec = Speculation(config.spec_tokens, config.spec_accept, config.seed)
        self.draft_model = config.spec_draft_model
        self.verify: Verify | None = None  # this step's, from `append` to `settle`
        self._totals = [0, 0, 0]  # request steps verified, drafts written, drafts accepted

    def append(self, ids: list[int], token_ids: np.ndarray | None) -> AppendResult | None:
        """Mutates when the pool has room. The batch's last-token slots and each sequence's drafts, all or
        nothing (`Strategy.append_with_drafts`); the step's `Verify` is kept for `settle`."""
        # the batch's groups (one sequence each, batch order) read once: int64 [6, num_decode]
        generated, outputs, indices, kv_len, prompts, given = np.array(
            [(g.generated, g.request.output_tokens, g.index, g.kv_len, g.request.prompt_tokens, g.request.accepted)
             for g in self.batch.groups], dtype=np.int64).reshape(-1, 6).T
        drafts = self.spec.drafts(outputs - generated)
        appended = self.strategy.append_with_drafts(ids, token_ids, drafts)
        if appended is not None:
            self.verify = Verify(ids, indices, drafts, self.spec.accepted(indices, generated, drafts, given),
                                 kv_len + 1, kv_len + 1 - prompts)
        return appended

    def decode_tokens(self, num_decoding: int) -> int:
        """Query tokens of this step's decode batch of `num_decoding` sequences: each one's last and its drafts."""
        return num_decoding + (0 if self.verify is None else int(self.verify.drafts.sum()))

    def step_parts(self, cost: StepCost, block_size: int, decoded: bool
                   ) -> tuple[StepCost, tuple[tuple[str, int], ...]]:
        """The step's cost as a verify step and its step columns (`decoded`: the batch got its slots)."""
        v = self.verify if decoded else None
        drafts = 0 if v is None else int(v.drafts.sum())
        accepted = 0 if v is None else int(v.accepted.sum())
        if drafts:
            cost = with_drafts(cost, v.ctx, v.drafts, block_size, self.draft_model)
        return cost, tuple(zip(SPEC_STEP_COLUMNS, (drafts, accepted, drafts - accepted), strict=True))

    def settle(self, step: int) -> None:
        """Mutates. The step that completed as `step` verified its drafts: each sequence keeps its accepted
        drafts and rolls back the rest, and its group advances by its accepted drafts + 1 tokens."""
        v, self.verify = self.verify, None
        if v is None:
            return
        token_ids = None
        if self.strategy.wants_token_ids:
            starts = np.repeat(v.first_generated - np.cumsum(v.accepted) + v.accepted, v.accepted)
            offsets = starts + np.arange(int(v.accepted.sum()), dtype=np.int64)
            token_ids = self.tokens.generated(np.repeat(np.asarray(v.ids, dtype=np.int64), v.accepted), offsets)
        self.strategy.settle_drafts(v.ids, v.drafts, v.accepted, token_ids)
        self.log.accepted(v.requests, v.accepted)
        self.batch.advanced(v.accepted, step)
        totals = self._totals
        totals[0] += len(v.ids)
        totals[1] += int(v.drafts.sum())
        totals[2] += int(v.accepted.sum())

    def steps_to_finish(self, g: Group) -> int:
        """Verify steps the group, starting to decode, takes to finish."""
        return self.spec.steps_to_finish(g.index, g.generated, g.request.output_tokens, g.request.accepted)

    def counters(self) -> dict[str, int | float]:
        """The summary's speculative-decoding counters and rates."""
        counters = dict(zip(SPEC_COUNTERS, self._totals, strict=True))
        return {**counters, **spec_rates(counters)}
