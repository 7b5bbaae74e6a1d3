"""How much power *any* test on the model's outputs can have against the Gaussian covariate-shift alternatives of
``bench_label_shift_test.py`` -- an upper bound to read the label-shift test's measured power against.

The Gaussian problem of that benchmark (k = 10 classes x | y ~ N(mu_y, I_10), logits affine in the exact
log-likelihoods) has outputs that are a one-to-one function of the 9 numbers u = D x, D the rows mu_y - mu_0:
softmax outputs (BCTS-calibrated or not, temperature > 0) determine the logit differences and back. So the target's
outputs are distributed as u, a Gaussian mixture in R^9 with covariance D D^T and means D mu_y (label shift: any
class proportions pi) or D mu'_y (the alternative: each mean moved by ``shift`` along its own unit vector, or pulled
towards the centroid). Every test that sees only the outputs sees only u.

For one alternative q1 (a target prior p_t and moved means) and any single null member q0 = sum_y pi_y N(D mu_y,
D D^T), the Neyman-Pearson lemma says no level-0.05 test of "q0" against "q1" on m rows has more power than the
likelihood-ratio test of the two, and a test of the *composite* null (label shift with unknown pi) is a level-0.05
test of each of its members. So

    power of any output-based label-shift test  <=  min over pi of NP power(q0_pi vs q1)  <=  NP power(q0_pi* vs q1),

pi* the class proportions closest to q1 in Kullback-Leibler divergence (what MLLS converges to as m grows; found
here by EM on 200,000 rows of q1 with the exact component densities). The bound knows everything a real test does
not: the alternative itself, the class-conditional output densities (an infinite holdout: n = infinity), and the
closest pi. A real test at n = 500-5,000 has less.

The NP power is computed from the per-row log-likelihood ratio L(u) = log q1(u) - log q0(u): its mean and sd under
q0 and under q1 from 200,000 rows each give the law of the sum over m rows (central limit theorem; L is smooth and
light-tailed here): power = Phi((m mu_1 - m mu_0 - z_0.95 sqrt(m) sd_0) / (sqrt(m) sd_1)). ``--check-mc`` also draws
the sums directly (2,000 sums of m rows under each hypothesis) for the first prior, as a check of the normal
approximation.

Target priors: as in the benchmark's replicates, cycling through p_s, Dirichlet(10), Dirichlet(1) and
Dirichlet(0.3) draws (``--priors`` of them); the table shows the mean bound over the priors and its range.

    python benchmarks/bench_power_bound.py                 # about a minute
    python benchmarks/bench_power_bound.py --write-readme  # also write its section of benchmarks/README.md
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
from scipy.special import logsumexp
from scipy.stats import norm

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_label_shift_test import PRIOR_FAMILIES, Gauss, target_prior  # noqa: E402
from report_utils import cpu_model, publish  # noqa: E402

SECTION = "## Label-shift test: the most power any output-based test can have (Gaussian alternatives)"
README = Path(__file__).resolve().parent / "README.md"
ALPHA = 0.05


class OutputSpace:
    """The Gaussian problem seen through its outputs: u = D x in R^(k-1)."""

    def __init__(self, prob: Gauss):
        self.prob = prob
        self.D = prob.means[1:] - prob.means[0]                       # (k-1, d)
        cov = self.D @ self.D.T
        self.chol = np.linalg.cholesky(cov)
        self.logdet = 2.0 * np.sum(np.log(np.diag(self.chol)))

    def moved_means(self, shift: float = 0.0, contract: float = 1.0) -> np.ndarray:
        means = self.prob.means
        if contract != 1.0:
            centre = means.mean(axis=0)
            means = centre + contract * (means - centre)
        return means + shift * self.prob.moves

    def draw(self, prior, means, size, rng) -> np.ndarray:
        y = rng.choice(self.prob.k, size=size, p=prior)
        x = means[y] + rng.normal(size=(size, self.prob.d))
        return x @ self.D.T

    def log_components(self, u, means) -> np.ndarray:
        """(rows, k): log N(u; D mu_y, D D^T) for each class y."""
        centred = u[:, None, :] - (means @ self.D.T)[None, :, :]      # (rows, k, k-1)
        sol = np.linalg.solve(self.chol, centred.reshape(-1, centred.shape[-1]).T).T
        maha = np.sum(sol ** 2, axis=1).reshape(centred.shape[:2])
        return -0.5 * (maha + self.logdet + self.D.shape[0] * np.log(2 * np.pi))

    def log_mix(self, u, means, prior) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return logsumexp(self.log_components(u, means) + np.log(prior)[None, :], axis=1)


def closest_null(log_comp: np.ndarray, iters: int = 2000, tol: float = 1e-10) -> np.ndarray:
    """pi maximising mean log sum_y pi_y c_y(u) over the rows (EM with fixed components)."""
    k = log_comp.shape[1]
    pi = np.full(k, 1.0 / k)
    comp = np.exp(log_comp - log_comp.max(axis=1, keepdims=True))
    for _ in range(iters):
        post = comp * pi
        post /= post.sum(axis=1, keepdims=True)
        new = post.mean(axis=0)
        if np.max(np.abs(new - pi)) < tol:
            return new
        pi = new
    return pi


def np_bound(space: OutputSpace, prior, means1, m: int, rows: int, rng, check_mc: bool = False) -> dict:
    means0 = space.prob.means
    u1 = space.draw(prior, means1, rows, rng)
    pi = closest_null(space.log_components(u1, means0))
    u0 = space.draw(pi, means0, rows, rng)
    l1 = space.log_mix(u1, means1, prior) - space.log_mix(u1, means0, pi)
    l0 = space.log_mix(u0, means1, prior) - space.log_mix(u0, means0, pi)
    mu1, sd1, mu0, sd0 = l1.mean(), l1.std(), l0.mean(), l0.std()
    crit = m * mu0 + norm.ppf(1 - ALPHA) * np.sqrt(m) * sd0
    power = float(norm.sf((crit - m * mu1) / (np.sqrt(m) * sd1)))
    out = {"power": power, "kl": float(mu1), "pi": pi}
    if check_mc:
        sums0 = np.array([np.sum(space.log_mix(u, means1, prior) - space.log_mix(u, means0, pi))
                          for u in (space.draw(pi, means0, m, rng) for _ in range(2000))])
        sums1 = np.array([np.sum(space.log_mix(u, means1, prior) - space.log_mix(u, means0, pi))
                          for u in (space.draw(prior, means1, m, rng) for _ in range(2000))])
        out["power_mc"] = float(np.mean(sums1 > np.quantile(sums0, 1 - ALPHA)))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", type=int, nargs="+", default=[2000, 20000])
    ap.add_argument("--shift", type=float, nargs="+", default=[1.0, 2.0])
    ap.add_argument("--contract", type=float, nargs="+", default=[0.9, 0.8])
    ap.add_argument("--priors", type=int, default=40, help="target priors per alternative (default 40)")
    ap.add_argument("--rows", type=int, default=200_000, help="Monte Carlo rows per hypothesis (default 200,000)")
    ap.add_argument("--check-mc", action="store_true", help="also simulate the sums directly for the first prior")
    ap.add_argument("--write-readme", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    prob = Gauss()
    space = OutputSpace(prob)
    alternatives = ([(f"class means each moved by {s:g} (random directions)", {"shift": s}) for s in args.shift]
                    + [(f"class means moved to {c:g} x their distance from the centroid", {"contract": c})
                       for c in args.contract])
    rows = []
    for label, kw in alternatives:
        means1 = space.moved_means(**kw)
        visible = None
        if "shift" in kw:
            # share of each move the outputs can see: its component in the row space of D
            proj = np.linalg.pinv(space.D) @ space.D
            visible = float(np.mean(np.linalg.norm(prob.moves @ proj, axis=1)))
        for m in args.m:
            rng = np.random.default_rng([17, m, int(1000 * kw.get("shift", 0)), int(1000 * kw.get("contract", 1))])
            res = [np_bound(space, target_prior(PRIOR_FAMILIES[i % len(PRIOR_FAMILIES)], prob.k,
                                                prob.source_prior, rng),
                            means1, m, args.rows, rng, check_mc=args.check_mc and i == 0)
                   for i in range(args.priors)]
            powers = np.array([r["power"] for r in res])
            kls = np.array([r["kl"] for r in res])
            mc = res[0].get("power_mc")
            rows.append((label, m, powers, kls, visible, (res[0]["power"], mc) if mc is not None else None))
            print(f"{label}, m={m}: bound {powers.mean():.3f} ({time.perf_counter() - t0:.0f}s)", file=sys.stderr)
    lines = [SECTION, "",
             f"`python benchmarks/{Path(__file__).name}{' ' + ' '.join(argv if argv is not None else sys.argv[1:])}`"
             f" on {cpu_model()}, nproc {os.cpu_count()}, Python {platform.python_version()}, numpy "
             f"{np.__version__}; {(time.perf_counter() - t0) / 60:.1f} min. The Neyman-Pearson power at level 5% of the "
             "likelihood-ratio test of the alternative against its closest label-shift member, with the "
             "class-conditional output densities known (an infinite holdout): no test on the outputs can do better "
             f"(argument in the script's docstring). Mean over {args.priors} target priors (p_s, Dirichlet(10), (1), "
             "(0.3), cycled), with the range; KL = the divergence per target row from the closest label-shift "
             "member, in nats.", "",
             "| alternative | m | power bound, mean | range over priors | KL per row (median) |",
             "|---|---|---|---|---|"]
    for label, m, powers, kls, _visible, _ in rows:
        lines.append(f"| {label} | {m:,} | {100 * powers.mean():.1f}% | {100 * powers.min():.1f}-"
                     f"{100 * powers.max():.1f}% | {np.median(kls):.5f} |")
    vis = [v for _, _, _, _, v, _ in rows if v is not None]
    if vis:
        lines += ["", f"The outputs see {100 * vis[0]:.0f}% of each random move on average (its component in the "
                  "9-dimensional row space of D); the rest changes the inputs but not the outputs."]
    checks = [(label, m, c) for label, m, _, _, _, c in rows if c is not None]
    if checks:
        lines += ["", "Check of the normal approximation (first prior, 2,000 simulated sums per hypothesis): "
                  + "; ".join(f"{label}, m = {m:,}: {100 * c[0]:.1f}% (normal) vs {100 * c[1]:.1f}% (simulated)"
                              for label, m, c in checks) + "."]
    publish(SECTION, lines, args.write_readme, README)
    return 0


if __name__ == "__main__":
    sys.exit(main())
