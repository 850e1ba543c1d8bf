"""Fit the decode efficiency and the per-step overhead on the 16k row of Figure 4, and nothing
else: minimise the sum of squared log errors over its eight points with Nelder-Mead.

    python -m areal_hpc.sim.fit     # prints the values to store in calibration.FITTED
"""

from __future__ import annotations

import math
from collections.abc import Callable

from areal_hpc.sim.calibration import A_PRIORI_MFU, FITTED
from areal_hpc.sim.cost_model import Efficiency
from areal_hpc.sim.paper_numbers import CALIBRATION_CONTEXT, FIG4_1P5B
from areal_hpc.sim.predict import DEFAULT, Fidelity, scaling


def calibration_errors(eff: Efficiency, fidelity: Fidelity = DEFAULT) -> list[tuple[str, int, float, float]]:
    """(system, gpus, predicted tokens/s, paper tokens/s) for every point of the calibration row."""
    out = []
    for system, points in FIG4_1P5B[CALIBRATION_CONTEXT].items():
        gpus = sorted(points)
        for n, pred in zip(gpus, scaling("1.5b", CALIBRATION_CONTEXT, gpus, system, eff=eff, fidelity=fidelity),
                           strict=True):
            out.append((system, n, pred.tokens_per_s, points[n]))
    return out


def loss(eff: Efficiency, fidelity: Fidelity = DEFAULT) -> float:
    return sum(math.log(pred / paper) ** 2 for _, _, pred, paper in calibration_errors(eff, fidelity))


def _toward(centroid: list[float], worst: list[float], t: float) -> list[float]:
    """The point centroid + t (worst - centroid): t = -1 reflects, -2 expands, 0.5 contracts."""
    return [c + t * (w - c) for c, w in zip(centroid, worst, strict=True)]


def nelder_mead(f: Callable[[list[float]], float], x0: list[float], step: float, iterations: int,
                tol: float = 1e-4) -> tuple[list[float], float]:
    """Minimise f from x0 with the standard reflection / expansion / contraction / shrink moves."""
    dim = len(x0)
    simplex = [list(x0)] + [[x + (step if i == j else 0.0) for j, x in enumerate(x0)] for i in range(dim)]
    values = [f(x) for x in simplex]
    for _ in range(iterations):
        order = sorted(range(dim + 1), key=values.__getitem__)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if values[-1] - values[0] < tol:
            break
        centroid = [sum(p[j] for p in simplex[:-1]) / dim for j in range(dim)]
        worst = simplex[-1]
        reflected = _toward(centroid, worst, -1.0)
        fr = f(reflected)
        if fr < values[0]:
            expanded = _toward(centroid, worst, -2.0)
            fe = f(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = _toward(centroid, worst, 0.5)
            fc = f(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                best = simplex[0]
                simplex = [best] + [[b + 0.5 * (p - b) for b, p in zip(best, q, strict=True)] for q in simplex[1:]]
                values = [values[0]] + [f(p) for p in simplex[1:]]
    i = min(range(dim + 1), key=values.__getitem__)
    return simplex[i], values[i]


def fit(start: Efficiency = FITTED, iterations: int = 40, fidelity: Fidelity = DEFAULT) -> tuple[Efficiency, float]:
    """Best (decode efficiency, step overhead) in log space, MFU held at its a-priori value."""

    def unpack(x: list[float]) -> Efficiency:
        return Efficiency(decode=min(1.0, math.exp(x[0])), step_overhead_s=math.exp(x[1]), mfu=A_PRIORI_MFU)

    x, value = nelder_mead(lambda x: loss(unpack(x), fidelity),
                           [math.log(start.decode), math.log(start.step_overhead_s)], 0.3, iterations)
    return unpack(x), value


def main() -> None:
    eff, value = fit()
    print(f"FITTED = Efficiency(decode={eff.decode:.4f}, step_overhead_s={eff.step_overhead_s:.4f}, "
          f"mfu=A_PRIORI_MFU)  # loss {value:.4f}")
    for system, gpus, pred, paper in calibration_errors(eff):
        print(f"{system:6s} {gpus:4d} GPUs  {pred / 1e3:7.1f}k  paper {paper / 1e3:6.1f}k  {pred / paper - 1:+.1%}")


if __name__ == "__main__":
    main()
