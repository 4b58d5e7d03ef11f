"""Plans: which kernel variant a call runs, resolved once per call signature, kept on the Graph.

Each kernel family has one function per pass that decides everything about which variant
runs (``plan_forward`` / ``plan_backward`` in ``cuda/<family>.py``): the ``GNN_FASTPATH_*``
settings, the family's rule (``backward_mode``, ``rule_chunks``, ...), the tensor-core offer,
the tuner, the work-list chunk length and the instantiation (vector width, lanes). It returns a
:class:`Plan`, a small frozen record naming the variant and its parameters. The launchers take
the plan and only allocate and launch.

Where plans live: in the Graph's memo (:meth:`~gnn_fastpath.graph.Graph.memo_get`; they die
with the graph, which :mod:`gnn_fastpath.graph.cache` bounds), under
``("plan", op, key)``. ``key`` is the call's signature: the shapes and dtypes that the
decision reads, the rows' alignment (base address mod 16: the vector width depends on it), a
snapshot of the family's settings (so that a changed variable takes effect at the next call:
a new key, a new plan) and the graph's own changing state that a rule reads (whether it
outlived a training step; whether it is a static graph). Everything else a rule reads is a
fixed fact of the graph. A call whose plan is cached costs the key and one dictionary lookup.

The tuner: where ``GNN_FASTPATH_TUNE=1`` may time the variants, the plan carries a
:class:`Tune` (the tuner's key, its candidates and how to name its size class) and the rule's
pick as its variant. :func:`run` asks the tuner (:func:`gnn_fastpath.tuning.choice_on_graph`)
with the call's own trial runs; once the tuner's choice is final (measured, remembered, or the
rule for the rest of the process) the cached plan is replaced by the settled one (its variant
the choice, no Tune), so later calls of that signature do not ask again.

Why one module for the mechanism and the plan functions in each family's module: a family's
rule reads that family's constants and instantiation helpers, and the launchers import their
plan function; a central module holding every family's plans would import every family and
every family would import it back.

Debug view: :func:`report` (also ``gnn_fastpath.stats(plans=True)["plans"]``) lists the plans
that ran per family, with their keys and calls; :data:`build_counts` counts plan builds (rule
evaluations) per op.
"""
from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Dict, Optional, Tuple

from .. import config, tuning

#: Plans built (a rule evaluation each), by op ("gat_attention.backward"): a call whose plan is
#: cached builds none.
build_counts: Counter = Counter()
#: Distinct (op, key) signatures the report keeps (oldest dropped first).
REPORT_ENTRIES = 256

_lock = threading.Lock()
# (op, key) -> [latest plan that ran, calls, plans built for it]
_ran: "OrderedDict[tuple, list]" = OrderedDict()


@dataclass(frozen=True)
class Tune:
    """A choice the tuner may still make for a plan: ``key`` (the tuner's per-graph key, as the
    launchers passed it to ``tuning.choose_on_graph``), the candidate ``variants``, and the size
    class as ``klass(graph, *klass_args)`` (a module-level function: a plan kept in the
    graph's memo holds no reference to the graph)."""

    key: tuple
    variants: Tuple[str, ...]
    klass: Callable[..., str]
    klass_args: tuple = ()


@dataclass(frozen=True)
class Plan:
    """Which variant a call runs, and with what.

    ``op``: family and pass (``"gat_attention.backward"``); ``variant``: the kernel variant
    (``"atomic"``, ``"block"``, a chunk count, ...); ``decided_by``: ``"setting"`` (a
    ``GNN_FASTPATH_*`` variable forced it), ``"rule"`` (the family's rule), ``"tuner"`` (the
    tuner's final choice), ``"caller"`` (the launcher was given the variant) or ``"fixed"``
    (the pass has one variant); ``rule``: what the setting or rule picked (the tuner's
    default); ``params``: the variant's parameters as (name, value) pairs, also readable as
    attributes (``plan.cfg``); ``tune``: a pending tuner choice, or None; ``key``: the
    signature the plan is cached under."""

    op: str
    variant: str
    decided_by: str
    rule: Optional[str] = None
    params: Tuple[Tuple[str, Any], ...] = ()
    tune: Optional[Tune] = field(default=None, compare=False)
    key: tuple = field(default=(), compare=False)

    def __post_init__(self):
        # the parameters as plain instance attributes: a launcher reads them on every call, and
        # an attribute found in __dict__ skips the failed lookup that reaches __getattr__
        for k, v in self.params:
            if not hasattr(type(self), k) and k not in _PLAN_FIELDS:
                object.__setattr__(self, k, v)

    def __getattr__(self, name: str):
        try:
            params = object.__getattribute__(self, "params")
        except AttributeError:
            raise AttributeError(name) from None
        for k, v in params:
            if k == name:
                return v
        raise AttributeError(f"plan of {self.op} has no parameter {name!r}")

    def pick(self, variant: str, decided_by: str) -> "Plan":
        """This plan with ``variant`` (settled: no pending tuner choice)."""
        return replace(self, variant=str(variant), decided_by=decided_by, tune=None)

    def describe(self) -> dict:
        """Plain data: op, variant, decided_by, rule, params (values as text), tuning pending."""
        return {"op": self.op, "variant": self.variant, "decided_by": self.decided_by, "rule": self.rule,
                "params": {k: v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)
                           for k, v in self.params},
                "tuning": None if self.tune is None else list(self.tune.variants)}


_PLAN_FIELDS = frozenset(f.name for f in fields(Plan))


def snapshot(*names: str) -> tuple:
    """The parsed values of settings ``names`` now (part of a plan's key)."""
    return config.settings(names)


#: The settings every tuned decision reads: whether the tuner runs, and its choices file.
TUNE_SETTINGS = ("GNN_FASTPATH_TUNE", "GNN_FASTPATH_TUNE_CACHE")


def layout(*tensors) -> tuple:
    """(dtype, base address mod 16) per tensor (None for an absent one): what a vector-width
    choice reads of the call's rows (part of a plan's key)."""
    return tuple([None if t is None else (t.dtype, t.data_ptr() % 16) for t in tensors])


def resolve(graph, op: str, key: tuple, build: Callable[[], Plan]) -> Plan:
    """The plan cached on ``graph`` for ``op`` and ``key``, or ``build()``'s (counted in
    :data:`build_counts`), kept there."""
    memo_key = ("plan", op, key)
    plan = graph.memo_get(memo_key)
    if plan is None:
        plan = replace(build(), key=key)
        graph.memo_set(memo_key, plan)
        with _lock:
            build_counts[op] += 1
            entry = _ran.get((op, key))
            if entry is not None:
                entry[2] += 1
    return plan


def run(graph, plan: Plan, device=None, trial: Optional[Callable[[str], object]] = None) -> Plan:
    """The plan this call runs: ``plan`` itself, or with a pending tuner choice the tuner's
    variant for this call (``trial(variant)`` runs the call with that variant, for timing).
    A final choice replaces the cached plan. Counted in :func:`report`."""
    t = plan.tune
    if t is not None:
        chosen, final = tuning.choice_on_graph(graph, t.key, lambda: t.klass(graph, *t.klass_args), device,
                                               trial, t.variants, plan.variant)
        if final:
            settled = plan.pick(chosen, "tuner")
            graph.memo_set(("plan", plan.op, plan.key), settled)
            plan = settled
        elif chosen != plan.variant:
            plan = replace(plan, variant=chosen, decided_by="tuner")
    _note(plan)
    return plan


def _note(plan: Plan) -> None:
    k = (plan.op, plan.key)
    with _lock:
        entry = _ran.get(k)
        if entry is None:
            entry = _ran[k] = [plan, 0, 1]
            while len(_ran) > REPORT_ENTRIES:
                _ran.popitem(last=False)
        entry[0] = plan
        entry[1] += 1


def report() -> Dict[str, list]:
    """The plans that ran since :func:`reset_report`, per family: ``{"gat_attention":
    [{"pass": "backward", "key": (...), "calls": n, "built": plans built for that key (one
    per graph), "plan": Plan.describe() of the latest}]}``."""
    out: Dict[str, list] = {}
    with _lock:
        for (op, key), (plan, calls, built) in _ran.items():
            family, _, pass_ = op.partition(".")
            out.setdefault(family, []).append({"pass": pass_, "key": key, "calls": calls, "built": built,
                                               "plan": plan.describe()})
    return out


def reset_report() -> None:
    """Restart :func:`report` (``gnn_fastpath.reset_stats()`` does); cached plans stay."""
    with _lock:
        _ran.clear()
