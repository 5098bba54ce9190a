"""The statistical tests §7 and the R3 feeds need, in plain Python (no scipy)."""

from __future__ import annotations

import math

# Above this many trials the normal approximation (with continuity correction) is used:
# n*p*(1-p) is then large enough for it and the exact sum would cost O(n) per call.
EXACT_MAX_N = 400


def _log_pmf(i: int, n: int, log_p: float, log_q: float, log_n_fact: float) -> float:
    return log_n_fact - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q


def binomial_two_sided_p(k: int, n: int, p: float) -> float:
    """P-value of observing k successes in n trials under Binomial(n, p), two-sided.

    Exact (the "sum of outcomes no more likely than the observed one" rule, as in
    R's binom.test and scipy's binomtest) for n <= EXACT_MAX_N, else the normal
    approximation with continuity correction.
    """
    if n <= 0:
        return 1.0
    if p <= 0.0:
        return 1.0 if k == 0 else 0.0
    if p >= 1.0:
        return 1.0 if k == n else 0.0
    if n > EXACT_MAX_N:
        mean = n * p
        sd = math.sqrt(n * p * (1.0 - p))
        z = max(abs(k - mean) - 0.5, 0.0) / sd
        return math.erfc(z / math.sqrt(2.0))
    log_p, log_q, log_n_fact = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    observed = _log_pmf(k, n, log_p, log_q, log_n_fact)
    bound = observed + math.log1p(1e-7)  # ties within rounding count as "as extreme"
    total = 0.0
    for i in range(n + 1):
        log_pmf = _log_pmf(i, n, log_p, log_q, log_n_fact)
        if log_pmf <= bound:
            total += math.exp(log_pmf)
    return min(1.0, total)


def z_score(k: int, n: int, p: float) -> float:
    """|k - np| / sqrt(np(1-p)): a cheap screen before the exact test (inf when p is 0 or 1)."""
    variance = n * p * (1.0 - p)
    if variance <= 0.0:
        return 0.0 if k == n * p else math.inf
    return abs(k - n * p) / math.sqrt(variance)


def binomial_upper_p(k: int, n: int, p: float) -> float:
    """P(X >= k) under Binomial(n, p): exact for n <= EXACT_MAX_N, else the normal
    approximation with continuity correction (one-sided: a burst, not a lull)."""
    if k <= 0:
        return 1.0
    if k > n or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    if n > EXACT_MAX_N:
        mean = n * p
        sd = math.sqrt(n * p * (1.0 - p))
        return 0.5 * math.erfc((k - 0.5 - mean) / sd / math.sqrt(2.0))
    log_p, log_q, log_n_fact = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    return min(1.0, sum(math.exp(_log_pmf(i, n, log_p, log_q, log_n_fact)) for i in range(k, n + 1)))
