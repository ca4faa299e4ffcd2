"""The rollout group view's per-token record and its colouring.

The record (dapo_core.train.observers.token_trace → rollout.token_record) is pinned to a tiny
batch worked out by hand; one tiny `dapo train` step stores it for the kept rollouts, with one
entry per response token, eligibility by its definition, and metrics equal to a run that
records nothing; dashboard.token_colours turns it into escaped, coloured HTML.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from test_runner import ListSink, small

import dapo_core.train.trainer as trainer_mod
from dapo_common.util import free_port
from dapo_core.algo.losses import policy_loss
from dapo_core.train.collective import LOCAL, Collective, TorchCollective
from dapo_core.train.observers import TokenTrace, TraceObserver, token_trace
from dapo_core.train.rollout import significant, token_record
from dapo_core.train.runner import train
from dapo_core.train.trackers import sample_rows
from dapo_core.train.update import Updater, make_optimizer
from dashboard import token_colours as tc

EPS_LOW, EPS_HIGH = 0.2, 0.28


# --- the per-token record, by hand -------------------------------------------------------------
def hand_batch() -> dict[str, Any]:
    """Three responses, T = 3 (ε_low 0.2, ε_high 0.28: r is clipped below 0.8 where A < 0 and
    above 1.28 where A > 0; a token is eligible where A > 0 and p_old < 1 / 1.28 = 0.78125).

      row 0, A = +1: p_old 0.1, 0.5, 0.9 → p 0.2, 0.55, 0.5: r = 2, 1.1, 0.5556
          clip +1 (2 > 1.28), 0, 0 (r < 0.8 but A > 0: the clipped term is not the max)
          eligible 1, 1, 0 (0.9 > 0.78125)
      row 1, A = −1: p_old 0.5, 0.4, 0.3 → p 0.3, 0.36, 0.45: r = 0.6, 0.9, 1.5
          clip −1 (0.6 < 0.8), 0, 0 (r > 1.28 but A < 0: the upper bound does not bind)
          eligible 0, 0, 0 (A < 0)
      row 2, A = −1, two tokens, the second masked out of the loss (as MIS would):
          p_old 0.5, 0.5 → p 0.3, 0.3: r = 0.6 (clip −1), then no ratio and no clip.
    """
    p_old = torch.tensor([[0.1, 0.5, 0.9], [0.5, 0.4, 0.3], [0.5, 0.5, 1.0]])
    p_new = torch.tensor([[0.2, 0.55, 0.5], [0.3, 0.36, 0.45], [0.3, 0.3, 1.0]])
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 1], [1, 0, 0]])
    entropy = torch.tensor([[0.5, 1.25, 0.0], [2.0, 0.125, 0.75], [1.0, 1.5, 0.0]])
    return {
        "lp": p_new.log(),
        "old": p_old.log(),
        "adv": torch.tensor([1.0, -1.0, -1.0]),
        "mask": mask,
        "entropy": entropy,
    }


def traces_of(
    b: dict[str, Any], rows: list[int], lengths: list[int], mode: str = "vanilla"
) -> list[TokenTrace]:
    return token_trace(
        b["lp"],
        b["old"],
        b["adv"],
        b["mask"],
        b["entropy"],
        rows,
        lengths,
        loss_mode=mode,
        clip_low=EPS_LOW,
        clip_high=EPS_HIGH,
        clip_c=None,
    )


def test_token_trace_hand_computed() -> None:
    b = hand_batch()
    t0, t1, t2 = traces_of(b, [0, 1, 2], [3, 3, 2])
    assert t0.ratio == pytest.approx([2.0, 1.1, 0.5 / 0.9], rel=1e-5)
    assert t0.clip == [1, 0, 0]
    assert t0.eligible == [True, True, False]
    assert [math.exp(x) for x in t0.logprob_old] == pytest.approx([0.1, 0.5, 0.9])
    assert t0.entropy == [0.5, 1.25, 0.0]
    assert t1.ratio == pytest.approx([0.6, 0.9, 1.5], rel=1e-5)
    assert t1.clip == [-1, 0, 0]
    assert t1.eligible == [False, False, False]
    # Row 2: its length (2) cuts the padding; the masked-out token has no ratio, no clip.
    assert len(t2.clip) == 2 and t2.clip == [-1, 0]
    assert t2.ratio[0] == pytest.approx(0.6, rel=1e-5) and t2.ratio[1] is None
    assert t2.entropy == [1.0, 1.5]


def test_token_trace_counts_agree_with_the_loss() -> None:
    # The flags are the loss's own: their sums over the loss mask are policy_loss's counts.
    b = hand_batch()
    traces = traces_of(b, [0, 1, 2], [3, 3, 2])
    _, metrics = policy_loss(
        b["lp"], b["old"], b["adv"], b["mask"], clip_low=EPS_LOW, clip_high=EPS_HIGH
    )
    counts = metrics.counts
    flags = [c for t in traces for c, r in zip(t.clip, t.ratio, strict=True) if r is not None]
    assert counts.clip_high == flags.count(1) == 1
    assert counts.clip_low == flags.count(-1) == 2
    assert counts.clip_eligible == sum(sum(t.eligible) for t in traces) == 2


def test_token_trace_reads_only_the_rows_asked_for() -> None:
    b = hand_batch()
    (only,) = traces_of(b, [1], [3])
    assert only == traces_of(b, [0, 1, 2], [3, 3, 2])[1]


def test_cispo_clips_whatever_the_sign_of_the_advantage() -> None:
    # cispo's weight is clip(r) for every token: row 0's r = 0.5556 < 0.8 is clipped low
    # even with A > 0, and row 1's r = 1.5 > 1.28 high even with A < 0.
    t0, t1, _ = traces_of(hand_batch(), [0, 1, 2], [3, 3, 2], mode="cispo")
    assert t0.clip == [1, 0, -1]
    assert t1.clip == [-1, 0, 1]


def test_token_record_rounds_to_four_significant_digits() -> None:
    rec = token_record(
        ["a", "b"],
        [math.log(0.123456), math.log(0.5)],
        [1.234567, None],
        [1, 0],
        [0.000123456, None],
        [True, False],
    )
    assert rec == {
        "text": ["a", "b"],
        "p_old": [0.1235, 0.5],
        "ratio": [1.235, None],
        "clip": [1, 0],
        "entropy": [0.0001235, None],
        "eligible": [1, 0],
    }
    assert significant(123456.0) == 123500.0
    with pytest.raises(ValueError, match="one entry per response token"):
        token_record(["a"], [0.0, 0.0], [1.0], [0], [0.0], [False])


# --- one tiny training step ----------------------------------------------------------------
@pytest.fixture(scope="module")
def one_step(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ListSink, ListSink]:
    """One step of the dapo arm on the tiny preset, recorded, and the same step with the
    per-token record switched off (no kept rollout watched)."""
    cfg = small("dapo", **{"run.steps": 1, "data.eval_problems": 2, "data.eval_k": 1})
    recorded, plain = ListSink(), ListSink()
    train(cfg, sink=recorded, out_dir=tmp_path_factory.mktemp("recorded"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trainer_mod, "batch_rows", lambda *args: {})
        train(cfg, sink=plain, out_dir=tmp_path_factory.mktemp("plain"))
    return cfg, recorded, plain


def test_a_tiny_step_stores_a_record_per_response_token(
    one_step: tuple[Any, ListSink, ListSink],
) -> None:
    cfg, recorded, _ = one_step
    samples = recorded.samples[1]
    traced = [s for s in samples if "tokens" in s]
    assert traced, "at least one kept rollout was trained and traced"
    bound = 1 / (1 + cfg.algo.clip_high)  # 0.78125
    for s in samples:
        # A kept rollout has a record exactly when its group was trained (has an advantage).
        assert ("tokens" in s) == (s["advantage"] is not None)
    for s in traced:
        tok = s["tokens"]
        assert set(tok) == {"text", "p_old", "ratio", "clip", "entropy", "eligible"}
        assert {len(v) for v in tok.values()} == {s["length"]}
        assert s["response"] in "".join(tok["text"])  # the pieces spell the response (+ EOS)
        for p, e, c, r in zip(
            tok["p_old"], tok["eligible"], tok["clip"], tok["ratio"], strict=True
        ):
            assert 0 < p <= 1
            if abs(p - bound) > 1e-3:  # p_old is stored to 4 digits: leave the boundary out
                assert e == int(s["advantage"] > 0 and p < bound)
            if c == 1:  # clipped high: A > 0, r > 1 + ε_high, so eligible (r ≤ 1 / p_old)
                assert s["advantage"] > 0 and r >= 1 + cfg.algo.clip_high and e == 1
            if c == -1:
                assert s["advantage"] < 0 and r <= 1 - cfg.algo.clip_low
            assert r is None or r > 0
        if not s["truncated"] or not cfg.algo.overlong_filter:
            assert None not in tok["ratio"] and None not in tok["entropy"]


def test_recording_changes_no_metric(one_step: tuple[Any, ListSink, ListSink]) -> None:
    # Same seed, record on and off: every metric but the timings is bit for bit the same, and
    # so is every kept rollout but its `tokens`.
    _, recorded, plain = one_step
    a, b = recorded.metrics[1], plain.metrics[1]
    compared = [k for k in a if not k.startswith(("time/", "perf/"))]
    assert set(compared) == {k for k in b if not k.startswith(("time/", "perf/"))}
    assert {k: a[k] for k in compared} == {k: b[k] for k in compared}
    assert [{k: v for k, v in s.items() if k != "tokens"} for s in recorded.samples[1]] == (
        plain.samples[1]
    )
    assert not any("tokens" in s for s in plain.samples[1])
    assert recorded.evaluations == plain.evaluations


def test_trackers_leave_the_record_out(one_step: tuple[Any, ListSink, ListSink]) -> None:
    # The trackers' sample tables have fixed columns: a kept rollout's `tokens` is not one.
    _, recorded, plain = one_step
    assert sample_rows(1, recorded.samples[1]) == sample_rows(1, plain.samples[1])


# --- two gloo workers --------------------------------------------------------------------------
# test_distributed's batch: 5 groups of 2, rows 1, 4 and 8 truncated (the overlong filter
# drops them: their trace has old log-probs and eligibility, no ratio); one mini-batch, so
# the ratio is 1 up to float rounding, on 2 ranks as on one.
WATCH = {0, 1, 3, 6, 9}


def traced_update(dist: Collective) -> dict[int, TokenTrace]:
    from test_distributed import make_batch, make_cfg, make_model

    from dapo_core.train.distributed import shard_policy
    from dapo_core.train.policy import PolicyForward

    cfg = make_cfg("token-mean", 2)
    model: torch.nn.Module = make_model()
    if dist.world_size > 1:
        model = shard_policy(
            model,
            dtype=torch.float32,
            device=torch.device("cpu"),
            group=getattr(dist, "group", None),
        )
    fwd = PolicyForward(
        model, compute_dtype=torch.float32, temperature=1.0, autocast=dist.world_size == 1
    )
    optimizer, scheduler = make_optimizer(cfg, model)
    updater = Updater(
        cfg, fwd, optimizer, scheduler, pad_id=0, device=torch.device("cpu"), dist=dist
    )
    seqs = make_batch()
    updater.old_logprobs(seqs)
    traced = TraceObserver(WATCH, cfg.algo)
    updater.update(seqs, 5, torch.Generator().manual_seed(3), observers=[traced])
    return traced.traces


def _traced_worker(rank: int, init: str, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        traces = traced_update(TorchCollective())
        # The update's last collective may still be sending to the other rank when this one
        # returns: a rank that tore its group down then cut the other's receive (SIGABRT).
        dist.barrier()
    finally:
        dist.destroy_process_group()
    torch.save({k: vars(t) for k, t in traces.items()}, f"{out}.{rank}")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_gloo_workers_trace_what_one_worker_does(tmp_path: Path) -> None:
    want = {k: vars(t) for k, t in traced_update(LOCAL).items()}
    assert sorted(want) == sorted(WATCH)
    assert want[1]["ratio"] == [None] * len(want[1]["ratio"])  # truncated: not in the loss
    assert all(r == pytest.approx(1.0, abs=1e-5) for r in want[0]["ratio"])
    out = tmp_path / "traces"
    mp.spawn(_traced_worker, args=(f"tcp://127.0.0.1:{free_port()}", str(out)), nprocs=2)
    for rank in range(2):  # every rank ends with every watched row's trace
        got = torch.load(f"{out}.{rank}", weights_only=True)
        assert sorted(got) == sorted(WATCH)
        for k in WATCH:
            assert got[k]["clip"] == want[k]["clip"] and got[k]["eligible"] == want[k]["eligible"]
            assert got[k]["logprob_old"] == pytest.approx(want[k]["logprob_old"], abs=1e-5)
            for key in ("ratio", "entropy"):
                assert [x is None for x in got[k][key]] == [x is None for x in want[k][key]]
                assert [x for x in got[k][key] if x is not None] == pytest.approx(
                    [x for x in want[k][key] if x is not None], abs=1e-5
                )


# --- colours and HTML ------------------------------------------------------------------------
RECORD: dict[str, list[Any]] = {
    "text": ["<b>", " & ", "*x*\n", "$1"],
    "p_old": [0.1, 0.5, 0.9, 0.25],
    "ratio": [1.5, 1.0, 1 / 1.5, None],
    "clip": [1, 0, -1, 0],
    "entropy": [2.0, 0.0, 1.0, None],
    "eligible": [1, 0, 0, 1],
}


def test_colours_of_each_mode() -> None:
    # Ratio: white at 1, full red at 1.5, full blue at 1 / 1.5 (|log r| = log 1.5), grey
    # without one; half way in log space (r = √1.5) is half strength: red 255 + (178 − 255)/2 = 216.5 → 217 = d9,
    # green 255 + (24 − 255)/2 = 139.5 → 140 = 8c, blue 255 + (43 − 255)/2 = 149 = 95.
    assert [tc.token_colour(RECORD, i, "ratio") for i in range(4)] == [
        "#b2182b",
        "#ffffff",
        "#2166ac",
        tc.NOT_IN_LOSS,
    ]
    assert tc.ratio_colour(math.sqrt(1.5)) == tc.mix(tc.RATIO_ABOVE, 0.5) == "#d98c95"
    # Clip: the upper bound's colour, plain, the lower bound's.
    assert [tc.token_colour(RECORD, i, "clip") for i in range(3)] == [
        tc.CLIP_HIGH,
        None,
        tc.CLIP_LOW,
    ]
    # Entropy on a scale of 2 nats: full, white, half.
    scale = tc.entropy_scale([RECORD])
    assert scale == 2.0
    assert tc.token_colour(RECORD, 0, "entropy", entropy_scale=scale) == "#54278f"
    assert tc.token_colour(RECORD, 1, "entropy", entropy_scale=scale) == "#ffffff"
    assert tc.token_colour(RECORD, 2, "entropy", entropy_scale=scale) == tc.mix(
        tc.ENTROPY_HIGH, 0.5
    )
    assert tc.token_colour(RECORD, 3, "entropy", entropy_scale=scale) is None
    assert [tc.token_colour(RECORD, i, "eligible") for i in range(4)] == [
        tc.ELIGIBLE,
        None,
        None,
        tc.ELIGIBLE,
    ]
    assert tc.entropy_scale([{"text": []}, None]) == 1.0
    with pytest.raises(ValueError, match="colouring 'nope'"):
        tc.token_colour(RECORD, 0, "nope")


def test_response_html_escapes_and_titles_every_token() -> None:
    out = tc.response_html(RECORD, "clip")
    assert "<b>" not in out.replace('<span class="dapo-token"', "")  # the token's tag is text
    assert "&lt;b&gt;" in out and "&amp;" in out
    assert "&#42;x&#42;↵<br>" in out  # Markdown's * as references, the newline shown
    assert "&#36;1" in out  # no LaTeX from a $
    assert out.count('class="dapo-token"') == 4
    assert f'style="background-color:{tc.CLIP_HIGH}"' in out
    assert f'style="background-color:{tc.CLIP_LOW}"' in out
    # The hover title holds every value, on lines of their own (&#10;), quotes escaped.
    assert (
        'title="token 0: &#x27;&lt;b&gt;&#x27;&#10;p_old 0.1&#10;ratio 1.5 · clipped at the high '
        'bound&#10;entropy 2 nats&#10;clip-eligible yes"' in out
    )
    assert "ratio — (not in the loss)" in out
    assert "\n" not in out  # one line: a blank line would end Markdown's HTML block


def test_legend_names_each_colouring() -> None:
    assert "low bound: A&lt;0" in tc.legend_html("clip") and tc.CLIP_HIGH in tc.legend_html("clip")
    assert "not in the loss" in tc.legend_html("ratio")
    assert "2 nats" not in tc.legend_html("entropy", entropy_scale=2.0)  # values, then the unit
    assert ">2<" in tc.legend_html("entropy", entropy_scale=2.0)
    assert "A&gt;0 and p&#95;old&lt;1/(1+ε&#95;high)" in tc.legend_html("eligible")
    with pytest.raises(ValueError):
        tc.legend_html("nope")


def test_has_tokens_wants_every_list_of_one_length() -> None:
    assert tc.has_tokens(RECORD)
    assert not tc.has_tokens(None) and not tc.has_tokens({"text": ["a"]})
    assert not tc.has_tokens({**RECORD, "clip": [0]})


@pytest.mark.parametrize("epochs", [1, 2])
def test_the_stored_trace_is_the_last_epochs(epochs: int, tmp_path: Path) -> None:
    # One mini-batch per epoch: the first epoch's forward is on-policy (its old log-probs are
    # that forward's), so its ratios are all exactly 1; after one update the second epoch's are
    # not. The stored ratios tell the two apart only if the last epoch's trace replaced the first.
    cfg = small(
        "token_loss",
        **{
            "run.steps": 1,
            "data.eval_problems": 2,
            "data.eval_k": 1,
            "algo.ppo_epochs": epochs,
            "batch.mini_batch_size": 4,
            "batch.train_batch_size": 4,
            "batch.gen_batch_size": 4,
        },
    )
    sink = ListSink()
    train(cfg, sink=sink, out_dir=tmp_path)
    ratios = [
        r for s in sink.samples[1] if "tokens" in s for r in s["tokens"]["ratio"] if r is not None
    ]
    assert ratios
    if epochs == 1:
        assert set(ratios) == {1.0}
    else:
        assert any(r != 1.0 for r in ratios)
