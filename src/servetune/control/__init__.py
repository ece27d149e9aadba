"""The online controller (docs/controller.md): per model, a fitted service time, the control law that moves batch
size, delay and workers within bounds as the load moves, admission control (shed what cannot make its deadline) and
the decision log; the baselines it is compared with are sibling policies behind the same interface, chosen by name.

Backend-neutral: a backend gives each controlled model an :class:`Actuator` (its in-place changes) and tells its
:class:`Controller` of arrivals and batches; the native server does (``server/model.py``).
"""

from __future__ import annotations

from servetune.control.controller import REASONS, Actuator, Controller
from servetune.control.law import Cost, LawResult, completion_ms, decide
from servetune.control.policy import POLICIES, BatchSeen, Decision, Policy, View, make_policy
from servetune.control.settings import POLICY_NAMES, ControlSettings, Knobs, Phase, parse_settings

__all__ = [
    "POLICIES",
    "POLICY_NAMES",
    "REASONS",
    "Actuator",
    "BatchSeen",
    "ControlSettings",
    "Controller",
    "Cost",
    "Decision",
    "Knobs",
    "LawResult",
    "Phase",
    "Policy",
    "View",
    "completion_ms",
    "decide",
    "make_policy",
    "parse_settings",
]
