"""The gate's parameters, validated once so the pure step can trust them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from trm_gate._checks import check_count, check_open_interval
from trm_gate.eprocess import DEFAULT_ACCEPT_GRID, DEFAULT_FUTILITY_GRID, check_grid, check_p1
from trm_gate.errors import GateInputError
from trm_gate.guard import exact
from trm_gate.pairing import INFRA_POLICIES, InfraPolicy
from trm_gate.results import check_infra_reasons
from trm_store.vocabulary import INFRA_STOP_REASONS

__all__ = ["GateConfig"]


@dataclass(frozen=True, slots=True)
class GateConfig:
    """alpha: type-I error of `accept`; beta: error of `reject` at P(W) >= p1; p1: the win rate
    a worthwhile candidate reaches; max_pairs: cap on discordant pairs (W + L), None = the pool;
    grids: bets in (0, 1/2].

    infra_policy: what the e-processes do with INFRA units, "bounded" (worst case for each
    claim; valid whatever causes INFRA) or "exclude" (left out; valid only when INFRA is
    independent of the outcomes), see `trm_gate.pairing`. infra_reasons: the stop reasons that
    count as INFRA. infra_max_rate, infra_margin, infra_alpha, infra_min_units: the guard's
    tests, see `trm_gate.guard` (rates are exact: 0.2 is 1/5).
    """

    alpha: float = 0.05
    beta: float = 0.2
    p1: float = 0.6
    block_size: int = 20
    max_pairs: int | None = None
    infra_max_rate: float = 0.2
    infra_min_units: int = 10
    accept_grid: tuple[float, ...] = DEFAULT_ACCEPT_GRID
    futility_grid: tuple[float, ...] = DEFAULT_FUTILITY_GRID
    infra_policy: InfraPolicy = "bounded"
    infra_reasons: frozenset[str] = INFRA_STOP_REASONS
    infra_margin: float = 0.0
    infra_alpha: float = 0.05

    def __post_init__(self) -> None:
        check_open_interval("alpha", self.alpha, 0.0, 1.0)
        check_open_interval("beta", self.beta, 0.0, 1.0)
        check_p1(self.p1)
        check_count("block_size", self.block_size, minimum=1)
        if self.max_pairs is not None:
            check_count("max_pairs", self.max_pairs, minimum=1)
        if not 0 <= exact("infra_max_rate", self.infra_max_rate) <= 1:
            raise GateInputError(f"infra_max_rate must be in [0, 1], got {self.infra_max_rate!r}")
        if not 0 <= exact("infra_margin", self.infra_margin) < 1:
            raise GateInputError(f"infra_margin must be in [0, 1), got {self.infra_margin!r}")
        if not 0 < exact("infra_alpha", self.infra_alpha) < 1:
            raise GateInputError(f"infra_alpha must be in (0, 1), got {self.infra_alpha!r}")
        check_count("infra_min_units", self.infra_min_units, minimum=1)
        if self.infra_policy not in INFRA_POLICIES:
            raise GateInputError(
                f"infra_policy must be one of {INFRA_POLICIES}, got {self.infra_policy!r}"
            )
        object.__setattr__(self, "infra_reasons", check_infra_reasons(self.infra_reasons))
        object.__setattr__(self, "accept_grid", check_grid(self.accept_grid, DEFAULT_ACCEPT_GRID))
        object.__setattr__(
            self, "futility_grid", check_grid(self.futility_grid, DEFAULT_FUTILITY_GRID)
        )

    @property
    def log_accept_threshold(self) -> float:
        """log(1/alpha): accept once log E+ reaches it."""
        return -math.log(self.alpha)

    @property
    def log_futility_threshold(self) -> float:
        """log(1/beta): reject once log E- reaches it."""
        return -math.log(self.beta)

    @property
    def guard_rates(self) -> tuple[Fraction, Fraction, Fraction]:
        """(infra_max_rate, infra_margin, infra_alpha), exactly."""
        return (
            exact("infra_max_rate", self.infra_max_rate),
            exact("infra_margin", self.infra_margin),
            exact("infra_alpha", self.infra_alpha),
        )

    def to_record(self) -> dict[str, Any]:
        """A JSON-ready dict of every parameter (recorded in the gate's `started` event)."""
        return {
            "alpha": self.alpha,
            "beta": self.beta,
            "p1": self.p1,
            "block_size": self.block_size,
            "max_pairs": self.max_pairs,
            "infra_max_rate": self.infra_max_rate,
            "infra_min_units": self.infra_min_units,
            "accept_grid": list(self.accept_grid),
            "futility_grid": list(self.futility_grid),
            "infra_policy": self.infra_policy,
            "infra_reasons": sorted(self.infra_reasons),
            "infra_margin": self.infra_margin,
            "infra_alpha": self.infra_alpha,
        }
