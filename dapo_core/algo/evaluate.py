"""Evaluation metrics over k sampled answers per problem: avg@k, pass@k, cons@k.

The paper reports AIME 2024 avg@32: 32 samples per problem, accuracy averaged over samples and
problems. pass@k (at least one of k correct) and cons@k (majority vote) are the usual companions.
Everything here is plain Python over per-sample judgements; nothing imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021, "Evaluating Large
    Language Models Trained on Code"):

        pass@k = 1 − C(n − c, k) / C(n, k) = 1 − Π_{i = n−c+1}^{n} (1 − k / i)

    The product form avoids the huge binomials. Needs 0 ≤ c ≤ n and 1 ≤ k ≤ n.
    """
    if n < 1:
        raise ValueError(f"pass@k needs n >= 1 samples, got n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n, got c={c}, n={n}")
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    miss = 1.0  # probability that a random k-subset holds no correct sample
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def _check_problems(correct_per_problem: Sequence[Sequence[bool]]) -> None:
    if len(correct_per_problem) == 0:
        raise ValueError("no problems to evaluate")
    for i, samples in enumerate(correct_per_problem):
        if len(samples) == 0:
            raise ValueError(f"problem {i} has no samples")


def avg_at_k(correct_per_problem: Sequence[Sequence[bool]]) -> float:
    """avg@k: accuracy over the k samples of each problem, averaged over problems.

    `correct_per_problem[p][j]` is True when sample j of problem p was judged correct.
    Problems weigh the same whatever their number of samples.
    """
    _check_problems(correct_per_problem)
    per_problem = [sum(map(bool, s)) / len(s) for s in correct_per_problem]
    return sum(per_problem) / len(per_problem)


def majority_vote(preds: Sequence[str | None]) -> str | None:
    """Most frequent non-None prediction, ties broken by first occurrence; None if none voted."""
    counts: dict[str, int] = {}  # insertion order = first occurrence
    for p in preds:
        if p is not None:
            counts[p] = counts.get(p, 0) + 1
    if not counts:
        return None
    return max(counts, key=counts.__getitem__)  # max keeps the first of equal counts


def cons_at_k(
    preds_per_problem: Sequence[Sequence[str | None]],
    correct_per_problem: Sequence[Sequence[bool]],
) -> float:
    """cons@k (majority vote): fraction of problems whose most frequent prediction is correct.

    `preds_per_problem[p][j]` is the extracted (normalised) answer of sample j, None when no
    answer could be extracted; None never votes. The majority answer is correct iff a sample
    giving that answer was judged correct, so the vote reuses the reward's own judgement instead
    of comparing strings a second time. A problem where no sample produced an answer counts as
    wrong.
    """
    _check_problems(correct_per_problem)
    if len(preds_per_problem) != len(correct_per_problem):
        raise ValueError(
            f"{len(preds_per_problem)} prediction lists for {len(correct_per_problem)} problems"
        )
    hits = 0
    for i, (preds, correct) in enumerate(zip(preds_per_problem, correct_per_problem, strict=True)):
        if len(preds) != len(correct):
            raise ValueError(f"problem {i}: {len(preds)} predictions but {len(correct)} judgements")
        winner = majority_vote(preds)
        if winner is not None and any(
            ok for p, ok in zip(preds, correct, strict=True) if p == winner
        ):
            hits += 1
    return hits / len(correct_per_problem)


def summarize(
    correct_per_problem: Sequence[Sequence[bool]],
    preds_per_problem: Sequence[Sequence[str | None]],
    answers: Sequence[str] | None = None,
    k: int | None = None,
) -> dict[str, float | int]:
    """avg@k, pass@k and cons@k of one evaluation, plus the number of problems.

    Args:
        correct_per_problem: `[problems][samples]` judgements.
        preds_per_problem: `[problems][samples]` extracted answers (None: no answer).
        answers: the reference answer per problem; optional, only checked for its count (the
            judgements already hold the comparison with it).
        k: pass@k's k, 1 ≤ k ≤ the samples of every problem; None uses each problem's number of
            samples (pass@n). avg@k and cons@k always use every sample.

    Returns:
        {"avg_at_k", "pass_at_k", "cons_at_k"} as floats in [0, 1] and "n_problems".
    """
    _check_problems(correct_per_problem)
    n_problems = len(correct_per_problem)
    if answers is not None and len(answers) != n_problems:
        raise ValueError(f"{len(answers)} reference answers for {n_problems} problems")
    pass_k = [
        pass_at_k(len(s), sum(map(bool, s)), len(s) if k is None else k)
        for s in correct_per_problem
    ]
    return {
        "avg_at_k": avg_at_k(correct_per_problem),
        "pass_at_k": sum(pass_k) / n_problems,
        "cons_at_k": cons_at_k(preds_per_problem, correct_per_problem),
        "n_problems": n_problems,
    }
