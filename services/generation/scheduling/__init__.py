"""Skewness-aware scheduling for the SGS: pure policies over plain dataclasses (no I/O).

- ``dispatch`` — which instance generates each sequence (baselines, global LPT, StreamRL
  Algorithm 2 and its refinement), behind a registry;
- ``admission`` — the order sequences enter an instance's engine (FCFS or LPT);
- ``instance_model`` — an event-driven model of one continuous-batching instance, used by the
  refined dispatch and by the simulator (``allocator.simulator``);
- ``cost`` — the per-step cost model (StaleFlow App. B form) and instance limits;
- ``lengths`` — the recent length distribution and rank calibration of estimates.

The live router (``services.generation.router``) and SGS core, and the simulator, call these
same objects. See ``docs/scheduling.md``.
"""

from services.generation.scheduling.admission import ORDERS, AdmissionQueue, Order
from services.generation.scheduling.cost import InstanceSpec, StepCost
from services.generation.scheduling.dispatch import (
    NEEDS_COST,
    NEEDS_ESTIMATES,
    DispatchContext,
    dispatch,
    policy_names,
    register_dispatch,
)
from services.generation.scheduling.instance_model import InstanceRun, Job, run_instance
from services.generation.scheduling.lengths import EstimateErrorModel, LengthDistribution, LengthWindow, calibrate
from services.generation.scheduling.types import DispatchPlan, InstanceLoad, SeqRequest

__all__ = [
    "NEEDS_COST",
    "NEEDS_ESTIMATES",
    "ORDERS",
    "AdmissionQueue",
    "DispatchContext",
    "DispatchPlan",
    "EstimateErrorModel",
    "InstanceLoad",
    "InstanceRun",
    "InstanceSpec",
    "Job",
    "LengthDistribution",
    "LengthWindow",
    "Order",
    "SeqRequest",
    "StepCost",
    "calibrate",
    "dispatch",
    "policy_names",
    "register_dispatch",
    "run_instance",
]
