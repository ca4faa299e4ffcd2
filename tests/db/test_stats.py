"""db.stats pinned by hand (the arithmetic in the comments), plus invariants by hypothesis; and
how db.table_format writes its records (an interval, n=1, the significance mark, the headline).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from db import stats, table_format

# --- Student's t ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("df", "expected"),
    # printed tables of t(0.975, df); df = 10^7 is the normal's 1.959964
    [(1, 12.7062), (2, 4.3027), (3, 3.1824), (4, 2.7764), (9, 2.2622), (30, 2.0423), (1e7, 1.96)],
)
def test_t_quantile_matches_the_printed_table(df: float, expected: float) -> None:
    assert stats.t_quantile(0.975, df) == pytest.approx(expected, abs=1e-4)


def test_t_cdf_against_closed_forms() -> None:
    # df = 1 is Cauchy: F(t) = 1/2 + atan(t) / π; df = 2: F(t) = 1/2 + t / (2 √(2 + t²))
    for t in (-3.0, -0.5, 0.0, 0.7, 4.3):
        assert stats.t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-10)
        assert stats.t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-10)
    # so t(0.975, 2) solves t / (2 √(2 + t²)) = 0.475: t² = 0.9025 · 2 / (1 − 0.9025) = 18.513
    assert stats.t_quantile(0.975, 2) == pytest.approx(math.sqrt(0.9025 * 2 / 0.0975), abs=1e-8)
    assert stats.t_quantile(0.025, 2) == pytest.approx(-stats.t_quantile(0.975, 2))
    with pytest.raises(ValueError, match="p must be in"):
        stats.t_quantile(1.0, 3)
    with pytest.raises(ValueError, match="degrees of freedom"):
        stats.t_cdf(1.0, 0)


@settings(max_examples=60, deadline=None)
@given(st.floats(0.51, 0.999), st.integers(1, 200))
def test_t_quantile_inverts_the_cdf(p: float, df: int) -> None:
    assert stats.t_cdf(stats.t_quantile(p, df), df) == pytest.approx(p, abs=1e-9)


# --- intervals --------------------------------------------------------------------------------


def test_t_interval_of_three_seeds_by_hand() -> None:
    # (0.40, 0.50, 0.60): mean 0.5; s² = (0.01 + 0 + 0.01) / 2 = 0.01, s = 0.1;
    # s / √3 = 0.057735; t(0.975, 2) = 4.302653 -> half width 0.248414 -> [0.251586, 0.748414]
    estimate = stats.t_interval([0.40, 0.50, 0.60])
    assert estimate.n == 3 and estimate.mean == pytest.approx(0.5)
    assert estimate.low == pytest.approx(0.251586, abs=1e-6)
    assert estimate.high == pytest.approx(0.748414, abs=1e-6)
    assert estimate.has_interval and estimate.excludes_zero


def test_two_seeds_use_t_with_one_degree_of_freedom() -> None:
    # (0.30, 0.34): mean 0.32, s = 0.04 / √2, s / √2 = 0.02; t(0.975, 1) = 12.7062
    # -> 0.32 ± 0.254124 = [0.065876, 0.574124]: two seeds say little
    estimate = stats.t_interval([0.30, 0.34])
    assert (estimate.low, estimate.high) == pytest.approx((0.065876, 0.574124), abs=1e-6)


def test_one_seed_has_no_interval_and_none_has_no_mean() -> None:
    one = stats.t_interval([0.44])
    assert (one.n, one.mean) == (1, 0.44)
    assert not one.has_interval and not one.excludes_zero
    assert math.isnan(one.low) and math.isnan(one.high)
    none = stats.t_interval([])
    assert none.n == 0 and math.isnan(none.mean)
    with pytest.raises(ValueError, match="NaN"):
        stats.t_interval([0.1, math.nan])


def test_pairing_finds_a_difference_the_unpaired_interval_cannot() -> None:
    a = {0: 0.40, 1: 0.50, 2: 0.60}
    b = {0: 0.43, 1: 0.54, 2: 0.65}  # b beats a on every seed, by 3, 4 and 5 points
    # paired: d = (0.03, 0.04, 0.05), mean 0.04, s = 0.01, s / √3 = 0.0057735
    # -> 0.04 ± 4.302653 · 0.0057735 = 0.04 ± 0.024841 = [0.015159, 0.064841]: above 0
    delta = stats.paired(b, a)
    assert delta.keys == (0, 1, 2) and delta.mean == pytest.approx(0.04)
    assert (delta.low, delta.high) == pytest.approx((0.015159, 0.064841), abs=1e-6)
    assert delta.excludes_zero
    # unpaired (Welch): s_a² = 0.01, s_b² = (0.11² + 0 + 0.11²) / 2 = 0.0121;
    # se = √(0.01/3 + 0.0121/3) = 0.085829; df = se⁴ / ((0.01/3)²/2 + (0.0121/3)²/2) = 3.964;
    # t(0.975, 3.964) = 2.78 -> 0.04 ± 0.239: [-0.199, 0.279] holds 0 (seed luck swamps it)
    # The quantile at a fractional df is the one piece of this db.stats runs. Tables give
    # t(0.975, 4) = 2.7764 and t(0.975, 3) = 3.1824; linear in 1/df between them, df 3.964
    # gives 2.7875, an upper bound (the quantile is convex in 1/df there).
    q = stats.t_quantile(0.975, 3.964206)
    assert 2.7764 < q < 2.7875
    half = q * math.sqrt(0.01 / 3 + 0.0121 / 3)
    assert 0.04 - half == pytest.approx(-0.199, abs=1e-3) and 0.04 - half < 0 < 0.04 + half


def test_paired_uses_only_the_seeds_both_arms_have() -> None:
    # seed 1 of b is missing (failed): the pairs are seeds 0 and 2, d = (0.10, 0.06)
    # mean 0.08, s = 0.04 / √2, s / √2 = 0.02 -> 0.08 ± 12.7062 · 0.02 = [-0.174124, 0.334124]
    delta = stats.paired({0: 0.5, 1: 0.9, 2: 0.6}, {0: 0.4, 2: 0.54})
    assert delta.keys == (0, 2) and delta.n == 2 and delta.mean == pytest.approx(0.08)
    assert (delta.low, delta.high) == pytest.approx((-0.174124, 0.334124), abs=1e-6)
    assert not delta.excludes_zero
    only = stats.paired({0: 0.5, 1: 0.6}, {1: 0.4})  # one common seed: no interval
    assert (only.n, only.keys, only.has_interval) == (1, (1,), False)
    assert only.mean == pytest.approx(0.2)
    assert stats.paired({0: 0.5}, {1: 0.4}).n == 0


def test_paired_problems_by_hand() -> None:
    # k = 4; correct a = (4, 3, 2, 1), b = (3, 3, 1, 1) -> d = (0.25, 0, 0.25, 0), mean 0.125
    # s² = 4 · 0.125² / 3 = 0.0208333, s = 0.1443376, s / √4 = 0.0721688;
    # t(0.975, 3) = 3.182446 -> 0.125 ± 0.229673 = [-0.104673, 0.354673]
    delta = stats.paired_problems([4, 3, 2, 1], [3, 3, 1, 1], 4)
    assert delta.n == 4 and delta.mean == pytest.approx(0.125)
    assert (delta.low, delta.high) == pytest.approx((-0.104673, 0.354673), abs=1e-6)
    assert delta.method == stats.OVER_PROBLEMS
    with pytest.raises(ValueError, match="same eval set"):
        stats.paired_problems([1, 2], [1], 4)


seeds_scores = st.dictionaries(
    st.integers(0, 20), st.floats(0.0, 1.0, allow_nan=False), min_size=2, max_size=8
)


@settings(max_examples=80, deadline=None)
@given(seeds_scores, st.floats(-0.3, 0.3), st.data())
def test_paired_difference_invariants(
    a: dict[int, float], shift: float, data: st.DataObject
) -> None:
    luck = {s: data.draw(st.floats(-0.2, 0.2), label=f"luck{s}") for s in a}
    noise = {s: data.draw(st.floats(-0.1, 0.1), label=f"noise{s}") for s in a}
    b = {s: v + shift + noise[s] for s, v in a.items()}
    # the paired difference is the mean of b − a over seeds, with its spread ...
    plain = stats.paired(b, a)
    assert plain.mean == pytest.approx(shift + sum(noise.values()) / len(noise), abs=1e-9)
    # ... and a seed's luck, shared by both arms of that seed, cancels out of it
    lucky = stats.paired(
        {s: v + luck[s] for s, v in b.items()}, {s: v + luck[s] for s, v in a.items()}
    )
    assert lucky.mean == pytest.approx(plain.mean, abs=1e-9)
    assert lucky.high - lucky.low == pytest.approx(plain.high - plain.low, abs=1e-9)
    # swapping the arms mirrors the interval
    mirrored = stats.paired(a, b)
    assert mirrored.low == pytest.approx(-plain.high, abs=1e-9)
    assert mirrored.high == pytest.approx(-plain.low, abs=1e-9)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=2, max_size=10), st.floats(-1, 1))
def test_interval_holds_its_mean_and_moves_with_a_shift(values: list[float], shift: float) -> None:
    estimate = stats.t_interval(values)
    assert estimate.low <= estimate.mean <= estimate.high
    assert estimate.mean - estimate.low == pytest.approx(estimate.high - estimate.mean, abs=1e-9)
    moved = stats.t_interval([v + shift for v in values])
    assert moved.low == pytest.approx(estimate.low + shift, abs=1e-9)
    # a lone value never has one
    assert not stats.t_interval(values[:1]).has_interval


# --- the leader -------------------------------------------------------------------------------


# Six seeds: the fewest at which the exact test can reach 5% (every difference of one sign gives
# p = 2/2^6 = 0.03125). b beats a on every seed by 3, 4, 5, 3, 4, 5 points: d has mean 0.04,
# s² = 4 · 0.01² / 5 = 0.00008, s = 0.0089443, s/√6 = 0.0036515; t(0.975, 5) = 2.570582
# -> 0.04 ± 0.0093866 = [0.030613, 0.049387].
A6 = {0: 0.40, 1: 0.50, 2: 0.60, 3: 0.45, 4: 0.55, 5: 0.50}
B6 = {s: v + (0.03, 0.04, 0.05)[s % 3] for s, v in A6.items()}


def test_the_leader_is_named_only_when_the_exact_test_calls_its_lead_real() -> None:
    c = {s: v - 0.3 for s, v in A6.items()}
    lead = stats.leader({"a": A6, "b": B6, "c": c, "none": {}})
    assert (lead.best, lead.runner_up, lead.significant) == ("b", "a", True)
    assert lead.best_mean == pytest.approx(0.54)
    assert lead.lead.low == pytest.approx(0.030613, abs=1e-6)
    assert lead.lead.p == pytest.approx(2 / 64)
    # The same lead over three seeds: the t-interval [0.0152, 0.0648] excludes 0, but the
    # exact test's smallest p at n = 3 is 2/8 = 0.25: no lead.
    a3 = {s: A6[s] for s in range(3)}
    b3 = {s: B6[s] for s in range(3)}
    three = stats.leader({"a": a3, "b": b3})
    assert three.lead.excludes_zero and three.lead.p == pytest.approx(0.25)
    assert (three.best, three.significant) == ("b", False)
    # b2 − a = (0.05, −0.02, 0.09): mean 0.04, s² = (0.01² + 0.06² + 0.05²) / 2 = 0.0031,
    # s / √3 = 0.0321455 -> 0.04 ± 0.138311 = [-0.098311, 0.178311]
    b2 = {0: 0.45, 1: 0.48, 2: 0.69}
    loose = stats.leader({"a": a3, "b2": b2})
    assert (loose.best, loose.runner_up, loose.significant) == ("b2", "a", False)
    assert (loose.lead.low, loose.lead.high) == pytest.approx((-0.098311, 0.178311), abs=1e-6)
    one_seed = stats.leader({"x": {0: 0.5}, "y": {0: 0.6}})
    assert (one_seed.best, one_seed.lead.n, one_seed.significant) == ("y", 1, False)
    alone = stats.leader({"x": {0: 0.5, 1: 0.7}})
    assert (alone.best, alone.runner_up, alone.significant) == ("x", None, False)
    assert stats.leader({}).best is None
    assert stats.leader({"p": {0: 0.5}, "q": {0: 0.5}}).best == "p"  # a tie keeps ladder order


# --- the exact paired test ---------------------------------------------------------------------


def test_sign_flip_p_counted_by_hand() -> None:
    # d = (1, 2, 3): |Σ| = 6; of the 8 sign assignments only (+,+,+) and (−,−,−) reach 6
    assert stats.sign_flip_p([1.0, 2.0, 3.0]) == (pytest.approx(2 / 8), True)
    # d = (1, −2, 3): |Σ| = 2; flipped sums ±6, ±4 (flip 1: −1−2+3... ) — list all eight:
    # (+−+) 2, (−−+) 0, (++ +) 6, (−++) 4, (+−−) −4, (−−−) −6, (++−) 0, (−+−) −2 -> |s| >= 2: 6
    assert stats.sign_flip_p([1.0, -2.0, 3.0])[0] == pytest.approx(6 / 8)
    # all zero: every flip reaches 0: p = 1; one value: its flip is its mirror: p = 1
    assert stats.sign_flip_p([0.0, 0.0])[0] == 1.0
    assert stats.sign_flip_p([0.3])[0] == 1.0
    assert math.isnan(stats.sign_flip_p([])[0])
    # the headline: dapo − grpo on explore over 8 seeds, 16 of 256 flips reach it
    d = [4.3, -2.0, 10.1, 9.8, -2.3, 12.9, 1.2, 5.3]
    assert stats.sign_flip_p(d)[0] == pytest.approx(0.0625)
    with pytest.raises(ValueError, match="NaN"):
        stats.sign_flip_p([0.1, math.nan])


def test_smallest_p_and_why_six_seeds() -> None:
    assert [stats.smallest_p(n) for n in (1, 2, 3, 5, 6)] == [1.0, 0.5, 0.25, 0.0625, 0.03125]
    assert stats.smallest_p(0) == 1.0
    # every difference of one sign gives exactly the smallest p
    for n in range(1, 9):
        assert stats.sign_flip_p([0.01 * (i + 1) for i in range(n)])[0] == stats.smallest_p(n)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1.0, 1.0, allow_nan=False), min_size=2, max_size=9))
def test_sign_flip_p_equals_scipys_permutation_test(values: list[float]) -> None:
    import numpy as np
    from scipy.stats import permutation_test

    values = [round(v, 3) for v in values]  # few distinct sums, so ties are exercised
    ours, exact = stats.sign_flip_p(values)
    theirs = permutation_test(
        (np.array(values),),
        lambda x, axis: np.sum(x, axis=axis),
        permutation_type="samples",
        n_resamples=np.inf,
        alternative="two-sided",
        vectorized=True,
    ).pvalue
    assert exact and ours == pytest.approx(float(theirs), abs=1e-12)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-1.0, 1.0, allow_nan=False), min_size=1, max_size=10), st.data())
def test_sign_flip_p_invariants(values: list[float], data: st.DataObject) -> None:
    p = stats.sign_flip_p(values)[0]
    assert stats.smallest_p(len(values)) - 1e-12 <= p <= 1.0
    # the test is about signs and scale only: mirrored, rescaled or reordered, the same p
    assert stats.sign_flip_p([-v for v in values])[0] == pytest.approx(p)
    assert stats.sign_flip_p([3.0 * v for v in values])[0] == pytest.approx(p)
    order = data.draw(st.permutations(values))
    assert stats.sign_flip_p(order)[0] == pytest.approx(p)


def test_beyond_sixteen_seeds_the_p_is_monte_carlo_and_fixed() -> None:
    d = [0.01 * ((i % 5) - 1) for i in range(20)]  # mean 0.01
    p1, exact = stats.sign_flip_p(d)
    assert not exact and 0.0 < p1 < 1.0
    assert stats.sign_flip_p(d)[0] == p1  # seeded: a table reads the same every time
    assert stats.paired(dict(enumerate(d)), dict.fromkeys(range(20), 0.0)).exact is False


def test_paired_carries_the_exact_p_and_the_star_follows_it() -> None:
    delta = stats.paired(B6, A6)
    assert delta.p == pytest.approx(2 / 64) and delta.exact and delta.significant
    assert delta.sd == pytest.approx(0.0089443, abs=1e-6)
    three = stats.paired({s: B6[s] for s in range(3)}, {s: A6[s] for s in range(3)})
    assert three.excludes_zero and not three.significant  # the interval is not the test
    mean = stats.t_interval([0.3, 0.4, 0.5])  # a score, not a difference: no test
    assert not mean.tested and mean.significant  # falls back on its interval


# --- how the table writes them ----------------------------------------------------------------


def test_estimate_text() -> None:
    text = table_format.estimate_text
    assert text(stats.t_interval([0.40, 0.50, 0.60])) == "50.0 [25.2, 74.8]"
    three = stats.paired({0: 0.43, 1: 0.54, 2: 0.65}, {0: 0.40, 1: 0.50, 2: 0.60})
    assert text(three, signed=True) == "+4.0 [+1.5, +6.5]"  # p = 0.25 at 3 seeds: no star
    delta = stats.paired(B6, A6)
    assert text(delta, signed=True) == "+4.0 [+3.1, +4.9] *"
    assert text(delta, signed=True, n_expected=7) == "+4.0 [+3.1, +4.9] * (n=6)"
    loose = stats.paired({0: 0.45, 1: 0.48, 2: 0.69}, {0: 0.40, 1: 0.50, 2: 0.60})
    assert text(loose, signed=True) == "+4.0 [-9.8, +17.8]"
    assert text(stats.t_interval([0.44])) == "44.0 (n=1, no interval)"
    assert text(stats.paired({0: 0.5}, {0: 0.43}), signed=True) == "+7.0 (n=1, no interval)"
    assert text(stats.EMPTY) == "—" and text(None) == "—"


def test_headline_says_when_no_arm_leads() -> None:
    assert table_format.headline(stats.leader({"a": A6, "b": B6})) == (
        "Best arm: b (54.0%), ahead of a by +4.0 pp [+3.1, +4.9] "
        "(paired over 6 seeds, exact p = 0.031)."
    )
    a, b = {0: 0.40, 1: 0.50, 2: 0.60}, {0: 0.43, 1: 0.54, 2: 0.65}
    assert table_format.headline(stats.leader({"a": a, "b": b})) == (
        "No arm leads significantly: b − a = +4.0 pp [+1.5, +6.5] "
        "(paired over 3 seeds, exact p = 0.25, the smallest 3 seeds allow)."
    )
    loose = stats.leader({"a": a, "b2": {0: 0.45, 1: 0.48, 2: 0.69}})
    assert table_format.headline(loose) == (
        "No arm leads significantly: b2 − a = +4.0 pp [-9.8, +17.8] "
        "(paired over 3 seeds, exact p = 0.5)."
    )
    one = stats.leader({"clip_higher": {0: 0.371}, "grpo": {0: 0.370}})
    assert table_format.headline(one) == (
        "No arm leads significantly: clip_higher − grpo = +0.1 pp (n=1, no interval)."
    )
    apart = stats.leader({"x": {0: 0.5}, "y": {1: 0.6}})
    assert table_format.headline(apart).startswith("No arm leads significantly: y has the")
    assert table_format.headline(stats.leader({})) == "No arm has a score yet."
