"""The planner: an analytical, calibrated cost model of RL post-training, and a search
over device allocations. Pure functions (numpy only in `simulate`); reading and writing
files (profiles, HF configs, the simulation's trace and PNG) is `asyncflow.planner.io`,
which no other planner module imports. See docs/planner.md."""

from asyncflow.planner.calibration import Efficiency, Profile, fit_linear
from asyncflow.planner.cost import RoleCost, StepCost, Workload, async_step, sync_step
from asyncflow.planner.hardware import HARDWARE, Hardware, get_hardware
from asyncflow.planner.models import PRESETS, ModelShape
from asyncflow.planner.online import MoveDecision, OnlinePolicy, RoleWindow, Split, StepObservation, decide, measured_gain
from asyncflow.planner.search import Infeasible, Plan, SearchResult, best_sync, search, speedup

__all__ = [
    "HARDWARE",
    "PRESETS",
    "Efficiency",
    "Hardware",
    "Infeasible",
    "ModelShape",
    "MoveDecision",
    "OnlinePolicy",
    "Plan",
    "Profile",
    "RoleCost",
    "RoleWindow",
    "SearchResult",
    "Split",
    "StepCost",
    "StepObservation",
    "Workload",
    "async_step",
    "best_sync",
    "decide",
    "measured_gain",
    "fit_linear",
    "get_hardware",
    "search",
    "speedup",
    "sync_step",
]
