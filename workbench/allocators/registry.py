"""Strategies by stable name (docs/strategies.md): one `Registration` per strategy.

A registration says everything the rest of the workbench needs to know about a strategy without
building it or testing its name: how to build it (a lazily imported "module:name" of a class or other
callable), its kernel mode and family, how figures draw it, which run options (`RunConfig` fields) it
consumes, and whether it holds a prefix cache (the generic prefix-cache tests then cover it). A new
strategy is one module plus one `Registration` in `_BUILTIN` (or a `register` call from a plugin).

Every strategy factory takes `capacity_slots`, `block_size`, `max_model_len`, `swap_slots` and
exactly the keyword options its registration declares, plus `geometry` (the model's KV shape) when
the registration says `kv_geometry`, and `shared_tier` (a fleet's one shared pool) when it declares
`shared_tier_gib` and the caller hands one; `create` passes nothing else.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from dataclasses import dataclass
from typing import Any

from workbench.allocators.base import KernelMode, Strategy
from workbench.allocators.prefix.shared_tier import SharedTier, shared_tier_for
from workbench.allocators.state.book import StateSpec
from workbench.allocators.virtual.pages import KVGeometry
from workbench.config import Resolved, RunConfig
from workbench.presets import model_from_name


@dataclass(frozen=True)
class Registration:
    name: str  # stable name: CLI, sweeps, result columns
    factory: str  # "module:name" of what builds it (a class or a callable), imported only when one is built
    kernel_mode: KernelMode  # how the attention kernel addresses the pool
    family: str  # figure grouping, e.g. "contiguous" or "paged"
    label: str  # legend label; a paged family's label gets the block size appended by figures
    tick_label: str  # short label for crowded axes ("\n" allowed)
    color: str  # matplotlib colour
    marker: str  # matplotlib marker
    options: tuple[str, ...] = ()  # RunConfig fields the strategy's constructor takes as keywords
    prefix_cache: bool = False  # the strategy reuses cached prompt blocks (prefix_query/hit counters move)
    prefix_tree: bool = False  # its prefix index is a tree (`Strategy.prefix_match` gives a path): dfs-weight reads it
    kv_geometry: bool = False  # the constructor also takes `geometry` (KVGeometry): it sizes memory in bytes
    # the constructor also takes `state` (allocators.state.book.StateSpec): it holds a recurrent model's state
    # beside the KV blocks (docs/recurrent.md); a strategy without it refuses such a model
    recurrent_state: bool = False

    @property
    def block_sized(self) -> bool:
        """Whether `block_size` means anything to this strategy (paged kernel mode)."""
        return self.kernel_mode == "paged"


# a prefix cache's options: its eviction order, its own host tier and the fleet's shared tier
PREFIX_TIER_OPTIONS = ("eviction", "host_cache_gib", "overlap_load", "shared_tier_gib", "shared_link_gb_s")
_BUILTIN = (
    Registration("contiguous-max", "workbench.allocators.contiguous.max:ContiguousMax", "contiguous",
                 "contiguous", "Contiguous (max)", "Contig.\nmax", "#D55E00", "s", options=("fit",)),
    Registration("contiguous-pow2", "workbench.allocators.contiguous.pow2:ContiguousPow2", "contiguous",
                 "contiguous", "Contiguous (pow2)", "Contig.\npow2", "#E69F00", "^",
                 options=("fit", "pow2_round")),
    Registration("contiguous-oracle", "workbench.allocators.contiguous.oracle:ContiguousOracle", "contiguous",
                 "contiguous", "Contiguous (oracle)", "Contig.\noracle", "#CC79A7", "D", options=("fit",)),
    Registration("paged", "workbench.allocators.paged.strategy:PagedStrategy", "paged", "paged", "Paged", "Paged",
                 "#0072B2", "o", recurrent_state=True),
    Registration("paged-prefix", "workbench.allocators.prefix.prefix_cache:PAGED_PREFIX", "paged", "paged",
                 "Paged + prefix cache", "Paged +\nprefix", "#56B4E9", "v",
                 options=PREFIX_TIER_OPTIONS, prefix_cache=True, kv_geometry=True, recurrent_state=True),
    Registration("radix", "workbench.allocators.prefix.prefix_cache:RADIX", "paged", "paged", "Radix tree (SGLang)",
                 "Radix\ntree", "#009E73", "P", options=PREFIX_TIER_OPTIONS, prefix_cache=True, prefix_tree=True,
                 kv_geometry=True, recurrent_state=True),
    Registration("virtual-contiguous", "workbench.allocators.virtual.contiguous:VirtualContiguous", "contiguous",
                 "virtual", "Virtual contiguous (vAttention)", "vAttn", "#000000", "X",
                 options=("page_kib", "max_batch", "page_reuse", "map_us_per_page", "overlap_map"), kv_geometry=True),
)
_REGISTRY: dict[str, Registration] = {r.name: r for r in _BUILTIN}
HYBRID_FACTORY = "workbench.allocators.paged.hybrid:HybridPaged"  # the per-layer-group form of the paged family
_OPTION_FIELDS = {f.name: f for f in dataclasses.fields(RunConfig)}


def names() -> list[str]:
    """Registered names, in registration order."""
    return list(_REGISTRY)


def registrations() -> list[Registration]:
    return list(_REGISTRY.values())


def get(name: str) -> Registration:
    if name not in _REGISTRY:
        raise ValueError(f"unknown strategy {name!r}; valid: {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def register(registration: Registration) -> None:
    """Mutates the registry. Add a strategy; its name must be new and its options RunConfig fields."""
    if registration.name in _REGISTRY:
        raise ValueError(f"strategy {registration.name!r} is already registered")
    unknown = [o for o in registration.options if o not in _OPTION_FIELDS]
    if unknown:
        raise ValueError(f"strategy {registration.name!r}: options {unknown} are not RunConfig fields")
    _REGISTRY[registration.name] = registration


def unregister(name: str) -> None:
    """Mutates the registry. Remove a strategy registered with `register`."""
    get(name)
    del _REGISTRY[name]


def option_choices(option: str) -> tuple[Any, ...] | None:
    """The valid values of a run option (its RunConfig field's `choices`), or None if unrestricted."""
    return _OPTION_FIELDS[option].metadata.get("choices")


def option_default(option: str) -> Any:
    return _OPTION_FIELDS[option].default


def create(name: str, *, capacity_slots: int, block_size: int = 16, max_model_len: int, swap_slots: int = 0,
           geometry: KVGeometry | None = None, shared_tier: SharedTier | None = None, state: StateSpec | None = None,
           **options: Any) -> Strategy:
    """A fresh strategy instance (its counters, e.g. prefix hits, start at zero). `options` are run
    options the strategy declares (e.g. `fit`); an undeclared or invalid one is a ValueError. `geometry`
    (the model's KV shape) goes to strategies registered with `kv_geometry`; they assume the default
    model's without it. `shared_tier`: the fleet's one pool (`create_shared_tier`), handed to every
    replica's strategy; without it a strategy given `shared_tier_gib` builds a pool of its own."""
    reg = get(name)
    if geometry is not None and not reg.kv_geometry:
        raise ValueError(f"strategy {name!r} takes no KV geometry")
    if state is not None:
        if not reg.recurrent_state:
            raise ValueError(_no_state(name))
        options = {**options, "state": state}
    if shared_tier is not None:
        if "shared_tier_gib" not in reg.options:
            raise ValueError(f"strategy {name!r} takes no shared tier")
        options = {**options, "shared_tier": shared_tier}
    for option, value in options.items():
        if option in ("shared_tier", "state"):
            continue
        if option not in reg.options:
            raise ValueError(f"strategy {name!r} takes no option {option!r} "
                             f"(it takes: {', '.join(reg.options) or 'none'})")
        choices = option_choices(option)
        if choices and value not in choices:
            raise ValueError(f"unknown {option} {value!r}; valid: {', '.join(map(str, choices))}")
    factory = _factory(reg)
    if geometry is not None:
        options = {**options, "geometry": geometry}
    strategy = factory(capacity_slots=capacity_slots, block_size=block_size, max_model_len=max_model_len,
                       swap_slots=swap_slots, **options)
    if not isinstance(strategy, Strategy):  # its optional capabilities would be missing
        raise TypeError(f"strategy {name!r}: {reg.factory} does not subclass workbench.allocators.base.Strategy")
    return strategy


def create_hybrid(name: str, *, capacity_slots: int, block_size: int = 16, max_model_len: int,
                  groups: tuple[tuple[int | None, int], ...], **options: Any) -> Strategy:
    """The per-layer-group form of a paged-family strategy (`allocators.hybrid`): `groups` are
    (window_tokens or None, units) and `capacity_slots` counts unit slots. A prefix cache needs its
    factory to name the index of its hybrid form (`hybrid_prefix_index(**options)`); a contiguous
    registration, or a prefix cache without one, has no hybrid form (docs/hybrid.md): a ValueError says so."""
    reg = get(name)
    if name not in hybrid_names():
        raise ValueError(f"strategy {name!r} has no per-layer-group form; use --hybrid off "
                         f"(hybrid allocation covers: {', '.join(hybrid_names())})")
    taken = hybrid_options(reg)
    for option, value in options.items():
        if option not in taken and value != option_default(option):
            raise ValueError(_not_hybrid(option, value, name))
    index = _factory(reg).hybrid_prefix_index(**{o: options[o] for o in taken if o in options}) \
        if reg.prefix_cache else None
    hybrid = _import_factory(HYBRID_FACTORY)  # by name: the registry stays below every strategy module
    return hybrid(capacity_slots=capacity_slots, block_size=block_size, max_model_len=max_model_len,
                       groups=groups, name=name, prefix_index=index)


def hybrid_options(reg: Registration) -> tuple[str, ...]:
    """The declared options a strategy's per-layer-group form takes: those its prefix index's
    `hybrid_prefix_index` names (a host tier, for one, serves only the one-table form)."""
    if not reg.prefix_cache:
        return ()
    return tuple(p for p in inspect.signature(_factory(reg).hybrid_prefix_index).parameters if p in reg.options)


def _not_hybrid(option: str, value: Any, name: str) -> str:
    return (f"--{option.replace('_', '-')} {value} with --hybrid on: the per-layer-group form of {name!r} "
            f"does not take it (docs/hybrid.md); use --hybrid off")


def hybrid_names() -> list[str]:
    """Registered strategies that have a per-layer-group form: the paged family, prefix caches whose
    index serves a sliding-window group's lookups."""
    return [r.name for r in _REGISTRY.values()
            if r.block_sized and (not r.prefix_cache or getattr(_factory(r), "hybrid_prefix_index", None))]


def _factory(reg: Registration) -> Any:
    return _import_factory(reg.factory)


def _import_factory(factory: str) -> Any:
    """What a "module:name" string names."""
    module, cls = factory.split(":")
    return getattr(importlib.import_module(module), cls)


def create_shared_tier(cfg: RunConfig, resolved: Resolved) -> SharedTier | None:
    """The fleet's shared tier of `cfg.shared_tier_gib` (None for 0), sized at the model's bytes per block:
    build it once and hand it to every replica's `create_from_config`."""
    return shared_tier_for(cfg.shared_tier_gib, cfg.block_size, KVGeometry.of(resolved.model, cfg.kv_dtype))


def create_from_config(cfg: RunConfig, resolved: Resolved, shared_tier: SharedTier | None = None) -> Strategy:
    """The strategy of a run: `cfg.strategy` on the resolved pool, given exactly its declared options (and
    `shared_tier`, the fleet's pool, if given; a strategy builds its own from `cfg.shared_tier_gib` without)."""
    reg = get(cfg.strategy)
    if resolved.layer_groups and reg.block_sized:
        units = sum(u for _, u in resolved.layer_groups)
        return create_hybrid(cfg.strategy, capacity_slots=resolved.capacity_slots * units, block_size=cfg.block_size,
                             max_model_len=resolved.model.max_model_len, groups=resolved.layer_groups,
                             **({option: getattr(cfg, option) for option in reg.options} if reg.prefix_cache else {}))
    geometry = KVGeometry.of(resolved.model, cfg.kv_dtype) if reg.kv_geometry else None
    return create(cfg.strategy, capacity_slots=resolved.capacity_slots, block_size=cfg.block_size,
                  max_model_len=resolved.model.max_model_len, swap_slots=resolved.swap_slots, geometry=geometry,
                  shared_tier=shared_tier, state=state_spec(cfg, resolved),
                  **{option: getattr(cfg, option) for option in reg.options})


def state_spec(cfg: RunConfig, resolved: Resolved) -> StateSpec | None:
    """A recurrent model's state as the strategy holds it (docs/recurrent.md), or None without one."""
    sizes = resolved.state
    if sizes is None:
        return None
    return StateSpec(sizes.blocks_per_state, sizes.state_slots, cfg.state_checkpoints, sizes.cache_blocks,
                     *prefix_flops(resolved.model))


def prefix_flops(model) -> tuple[float, float]:
    """FLOPs to recompute a prefix, as (per token, per pair of tokens): the active parameters' 2 FLOPs per token,
    and causal attention's QK^T and PV over every earlier key in each attention layer."""
    active = model.params_b * 1e9 if not model.is_moe else (
        model.params_b * 1e9 - model.moe_layers * (model.num_experts - model.experts_per_token) * model.expert_params)
    return 2.0 * active, 4.0 * model.attention_layers * model.num_heads * model.head_dim


def _no_state(name: str) -> str:
    takers = ", ".join(r.name for r in _REGISTRY.values() if r.recurrent_state)
    return (f"strategy {name!r} does not hold recurrent state (docs/recurrent.md); the recurrent models run with: "
            f"{takers}")


def check_options(cfg: RunConfig) -> None:
    """Raise ValueError if the run sets an option (to a non-default value) that its strategy does
    not take: `--fit best` with `paged` would otherwise be silently meaningless."""
    reg = get(cfg.strategy)
    model = model_from_name(cfg.model)
    if model.has_state and not reg.recurrent_state:
        raise ValueError(f"model {cfg.model} has recurrent layers: {_no_state(cfg.strategy)}")
    if cfg.state_checkpoints != "none" and not reg.prefix_cache:
        takers = ", ".join(r.name for r in _REGISTRY.values() if r.prefix_cache and r.recurrent_state)
        raise ValueError(f"--state-checkpoints {cfg.state_checkpoints} is a prefix-cache policy: strategy "
                         f"{cfg.strategy!r} has no prefix cache; it is taken by: {takers}")
    hybrid = cfg.hybrid == "on" and reg.block_sized and model.is_hybrid
    _check_schedule(cfg, reg, hybrid)
    if hybrid:
        if cfg.strategy not in hybrid_names():
            raise ValueError(f"strategy {cfg.strategy!r} has no per-layer-group form for the hybrid model "
                             f"{cfg.model!r}: its prefix index cannot serve a sliding-window group's lookups "
                             f"(docs/hybrid.md); use --hybrid off")
        if cfg.n > 1:
            raise ValueError("--n > 1 with --hybrid on: a preempted parallel-sampling group re-appends past its "
                             "window before its prompt KV is rewritten; use --hybrid off")
        if cfg.chunked_prefill:
            raise ValueError("--chunked-prefill with --hybrid on: the per-layer-group pool has no chunked "
                             "admission (extend) yet; use --hybrid off")
        for option in reg.options:
            if option not in hybrid_options(reg) and getattr(cfg, option) != option_default(option):
                raise ValueError(_not_hybrid(option, getattr(cfg, option), cfg.strategy))
    for option in _declared_options():
        if option not in reg.options and getattr(cfg, option) != option_default(option):
            takers = [r.name for r in _REGISTRY.values() if option in r.options]
            raise ValueError(f"--{option.replace('_', '-')} {getattr(cfg, option)} does not apply to strategy "
                             f"{cfg.strategy!r}; it is taken by: {', '.join(takers)}")


# what a cache-aware admission order reads of the strategy (workbench.engine.admission_order): the registration's
# flag and the index it names
_SCHEDULE_READS = {"lpm": ("prefix_cache", "prefix index"), "dfs-weight": ("prefix_tree", "radix-tree prefix index")}


def _check_schedule(cfg: RunConfig, reg: Registration, hybrid: bool) -> None:
    """Raise ValueError when `--schedule` reads an index the strategy lacks, or the in-batch check is set for an
    order that has none."""
    if cfg.in_batch_prefix_tokens != option_default("in_batch_prefix_tokens") and cfg.schedule != "lpm":
        raise ValueError(f"--in-batch-prefix-tokens {cfg.in_batch_prefix_tokens} applies to --schedule lpm only, "
                         f"not {cfg.schedule}")
    if cfg.schedule not in _SCHEDULE_READS:
        return
    flag, index = _SCHEDULE_READS[cfg.schedule]
    if not getattr(reg, flag):
        having = [r.name for r in _REGISTRY.values() if getattr(r, flag)]
        raise ValueError(f"--schedule {cfg.schedule} orders by the strategy's own {index}: strategy {cfg.strategy!r} "
                         f"has none; strategies with one: {', '.join(having)}")
    if hybrid:
        raise ValueError(f"--schedule {cfg.schedule} with --hybrid on: the per-layer-group form of {cfg.strategy!r} "
                         f"answers no prefix match (docs/hybrid.md); use --hybrid off")


def check_strategy(cfg: RunConfig, resolved: Resolved) -> None:
    """Raise ValueError if the run's strategy refuses its options or its pool (e.g. a pool smaller than
    one page): the options checked, then the strategy built on the resolved pool and dropped."""
    check_options(cfg)
    create_from_config(cfg, resolved)


def _declared_options() -> list[str]:
    return sorted({o for r in _REGISTRY.values() for o in r.options})
