"""The decision's knobs (margins, dwell, caps, grids), in one frozen record.

Defined once, in the settings tree (`contract.settings.DecisionSettings`,
reachable as `controller.decision` in YAML and `SPECGATE_CONTROLLER__DECISION__*`
in the environment); the stages read it under the name they always used.
"""

from __future__ import annotations

from contract.settings import DecisionSettings as DecisionConfig

__all__ = ["DecisionConfig"]
