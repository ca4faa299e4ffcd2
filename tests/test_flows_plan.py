"""The sweep's decisions as plain functions (flows/plan.py, flows/params.py): no Prefect, no Ray."""

from __future__ import annotations

from pathlib import Path

import pytest

from dapo_core.arms import ARM_NAMES
from flows import plan
from flows.params import ArmParams, Resources, SweepParams, validate

HASH = "abc123def456"


# --- parameters ------------------------------------------------------------------------------
def test_sweep_defaults_are_the_whole_ladder_with_one_seed() -> None:
    p = validate(SweepParams, {})
    assert p.arms == list(ARM_NAMES)
    assert p.seeds == [0]
    assert p.preset == "tiny"
    assert p.resources == Resources(cpus=1.0, gpus=0.0)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"arms": ["grpo", "dapo_plus"]}, "arms: unknown arm 'dapo_plus': choose among grpo"),
        ({"arms": []}, "arms: no arms given"),
        ({"seeds": []}, "seeds: no seeds given"),
        ({"seeds": [0, 0]}, "seeds: seeds repeat"),
        ({"seeds": [-1]}, "seeds: seeds must be >= 0"),
        ({"preset": "huge"}, "preset: unknown preset 'huge': choose one of tiny"),
        ({"steps": 0}, "steps: must be >= 1, got 0"),
        ({"resources": {"cpus": 0}}, "resources.cpus: Input should be greater than 0"),
        ({"colour": "red"}, "colour: Extra inputs are not permitted"),
    ],
)
def test_bad_sweep_parameters_fail_with_one_line(values: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        validate(SweepParams, values)
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith(message), text


def test_arms_come_back_in_ladder_order_without_duplicates() -> None:
    p = validate(SweepParams, {"arms": ["dapo", "grpo", "dapo"]})
    assert p.arms == ["grpo", "dapo"]


def test_blank_form_fields_mean_the_default() -> None:
    p = validate(SweepParams, {"model": "  ", "store_url": "", "ray_address": None})
    assert p.model is None and p.store_url is None and p.ray_address is None


def test_config_overrides_put_the_seed_last_and_skip_unset_values() -> None:
    p = validate(
        SweepParams, {"steps": 3, "eval_k": 2, "overrides": {"run.seed": 99, "optim.lr": 1e-3}}
    )
    assert p.config_overrides(7) == {
        "run.steps": 3,
        "data.eval_k": 2,
        "optim.lr": 1e-3,
        "run.seed": 7,  # the sweep's seed wins over an override
    }


def test_arm_params_check_the_arm() -> None:
    with pytest.raises(ValueError, match=r"^arm: unknown arm 'nope': choose one of grpo"):
        validate(ArmParams, {"sweep_id": 1, "arm": "nope"})
    assert validate(ArmParams, {"sweep_id": 1, "arm": "dapo"}).seed == 0


# --- jobs and configs ------------------------------------------------------------------------
def test_sweep_jobs_cover_arms_times_seeds_with_distinct_hashes() -> None:
    p = validate(SweepParams, {"arms": ["grpo", "clip_higher"], "seeds": [0, 1], "steps": 2})
    jobs = plan.sweep_jobs(p)
    assert [(j.arm, j.seed) for j in jobs] == [
        ("grpo", 0),
        ("grpo", 1),
        ("clip_higher", 0),
        ("clip_higher", 1),
    ]
    assert len({j.config_hash for j in jobs}) == 4
    assert all(j.config["run"]["steps"] == 2 for j in jobs)
    assert jobs[2].config["algo"]["clip_high"] == 0.28
    assert jobs[1].config["run"]["seed"] == 1
    # The same parameters give the same hashes: what lets a rerun recognise a completed arm.
    assert [j.config_hash for j in plan.sweep_jobs(p)] == [j.config_hash for j in jobs]


def test_a_bad_override_names_the_arm_and_the_field() -> None:
    p = validate(SweepParams, {"arms": ["grpo"], "overrides": {"optim.lr": -1.0}})
    with pytest.raises(ValueError, match=r"^grpo seed 0: optim.lr=-1.0 must be > 0"):
        plan.sweep_jobs(p)


def test_a_missing_local_path_is_refused(tmp_path: Path) -> None:
    p = validate(SweepParams, {"arms": ["grpo"], "train_data": str(tmp_path / "missing.jsonl")})
    with pytest.raises(
        FileNotFoundError, match=r"training data path .*missing\.jsonl does not exist"
    ):
        plan.sweep_jobs(p)
    # Data set names and hub ids are not paths: the trainer resolves them.
    assert not plan.looks_like_path("dapo-math-17k")
    assert not plan.looks_like_path("Qwen/Qwen2.5-7B-Instruct")
    assert plan.looks_like_path("./model") and plan.looks_like_path("data/train.parquet")


# --- resources -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("cluster", "cpus", "gpus", "jobs", "expected"),
    [
        ({"CPU": 2.0}, 1.0, 0.0, 6, 2),  # this machine: two arms at a time
        ({"CPU": 2.0}, 1.0, 0.0, 1, 1),  # never more than there are jobs
        ({"CPU": 16.0, "GPU": 4.0}, 2.0, 1.0, 12, 4),  # GPUs are the limit
        ({"CPU": 3.0}, 2.0, 0.0, 6, 1),
        ({"CPU": 0.5}, 1.0, 0.0, 6, 1),  # at least one: Ray waits for resources
    ],
)
def test_concurrency_follows_the_scarcest_resource(
    cluster: dict, cpus: float, gpus: float, jobs: int, expected: int
) -> None:
    assert plan.concurrency(cluster, Resources(cpus=cpus, gpus=gpus), jobs) == expected


def test_an_arm_bigger_than_the_cluster_is_refused() -> None:
    plan.check_fits({"CPU": 2.0}, Resources(cpus=2.0))
    with pytest.raises(ValueError, match=r"asks for 1 GPU\(s\) but the Ray cluster has 0"):
        plan.check_fits({"CPU": 2.0}, Resources(cpus=1.0, gpus=1.0))


# --- skip, resume, fresh ---------------------------------------------------------------------
def _attempt(
    status: str, *, run_id: int = 5, config_hash: str = HASH, ckpt: str | None = "/runs/x"
) -> dict:
    return {"run_id": run_id, "status": status, "config_hash": config_hash, "checkpoint_dir": ckpt}


def test_first_attempt_starts_fresh() -> None:
    d = plan.decide_arm(
        config_hash=HASH,
        force=False,
        completed_run_id=None,
        latest=None,
        latest_checkpoint_step=None,
    )
    assert d.action == "fresh" and d.reason == "first attempt"


def test_completed_with_the_same_hash_is_skipped_unless_forced() -> None:
    latest = _attempt("completed")
    d = plan.decide_arm(
        config_hash=HASH, force=False, completed_run_id=5, latest=latest, latest_checkpoint_step=12
    )
    assert (d.action, d.run_id) == ("skip", 5)
    forced = plan.decide_arm(
        config_hash=HASH, force=True, completed_run_id=5, latest=latest, latest_checkpoint_step=12
    )
    assert forced.action == "fresh" and "starting over" in forced.reason


@pytest.mark.parametrize("status", ["failed", "cancelled", "running"])
@pytest.mark.parametrize("force", [False, True])
def test_an_unfinished_attempt_with_a_checkpoint_is_resumed(status: str, force: bool) -> None:
    # The dashboard's rerun is always forced: force never throws away an unfinished run's work.
    d = plan.decide_arm(
        config_hash=HASH,
        force=force,
        completed_run_id=None,
        latest=_attempt(status),
        latest_checkpoint_step=4,
    )
    assert (d.action, d.run_id, d.checkpoint_dir, d.resume_step) == ("resume", 5, "/runs/x", 4)


def test_an_older_completed_attempt_does_not_block_resuming_a_newer_failed_one() -> None:
    d = plan.decide_arm(
        config_hash=HASH,
        force=True,
        completed_run_id=3,
        latest=_attempt("failed", run_id=9),
        latest_checkpoint_step=2,
    )
    assert (d.action, d.run_id) == ("resume", 9)


def test_nothing_to_resume_starts_fresh() -> None:
    no_ckpt = plan.decide_arm(
        config_hash=HASH,
        force=False,
        completed_run_id=None,
        latest=_attempt("failed"),
        latest_checkpoint_step=None,
    )
    assert no_ckpt.action == "fresh" and "left no checkpoint" in no_ckpt.reason
    changed = plan.decide_arm(
        config_hash=HASH,
        force=False,
        completed_run_id=None,
        latest=_attempt("failed", config_hash="000000000000"),
        latest_checkpoint_step=4,
    )
    assert changed.action == "fresh" and "config changed" in changed.reason


def test_checkpoint_step_reads_the_latest_pointer(tmp_path: Path) -> None:
    assert plan.checkpoint_step(tmp_path) is None
    assert plan.checkpoint_step(None) is None
    ckpts = tmp_path / "checkpoints"
    (ckpts / "step_4").mkdir(parents=True)
    (ckpts / "latest").write_text("step_4")
    assert plan.checkpoint_step(tmp_path) is None  # named but incomplete: no trainer state
    (ckpts / "step_4" / "trainer_state.pt").write_bytes(b"x")
    assert plan.checkpoint_step(tmp_path) == 4


def test_fresh_run_dirs_never_collide_between_attempts(tmp_path: Path) -> None:
    a = plan.fresh_run_dir(tmp_path, 3, "grpo", 0, HASH, 10)
    b = plan.fresh_run_dir(tmp_path, 3, "grpo", 0, HASH, 11)
    assert a != b and a.parent == b.parent == tmp_path / "sweep-3"


def test_runs_dir_follows_the_environment(tmp_path: Path) -> None:
    assert plan.runs_dir({"DAPO_RUNS_DIR": str(tmp_path)}) == tmp_path.resolve()
    assert plan.runs_dir({}) == plan.default_runs_dir()
    assert plan.default_runs_dir().name == "runs"


# --- outcomes --------------------------------------------------------------------------------
def test_sweep_outcome() -> None:
    ok = [{"label": "grpo s0", "status": "completed"}, {"label": "dapo s0", "status": "skipped"}]
    assert plan.sweep_outcome(ok) == ("completed", None)
    bad = [*ok, {"label": "clip_higher s0", "status": "failed", "error": "RuntimeError: boom"}]
    assert plan.sweep_outcome(bad) == (
        "failed",
        "1 of 3 arm runs failed: clip_higher s0: RuntimeError: boom",
    )


def test_error_text_is_one_line_then_the_traceback() -> None:
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError as exc:
        text = plan.error_text(exc)
    first, rest = text.split("\n", 1)
    assert first == "RuntimeError: boom"
    assert "Traceback (most recent call last)" in rest


def test_artifact_keys_are_valid_prefect_keys() -> None:
    key = plan.artifact_key("ablation-table", 12)
    assert key == "ablation-table-sweep-12"
    assert all(c.islower() or c.isdigit() or c == "-" for c in key)


def test_a_stop_is_recognised_even_when_wrapped() -> None:
    class TerminationSignal(BaseException):  # Prefect's, matched by name
        pass

    try:
        try:
            raise TerminationSignal()
        except TerminationSignal:
            raise SystemError("returned a result with an exception set") from None
    except SystemError as exc:
        wrapped = exc
    assert plan.is_stop(wrapped)
    assert plan.is_stop(KeyboardInterrupt())
    assert not plan.is_stop(RuntimeError("boom"))
