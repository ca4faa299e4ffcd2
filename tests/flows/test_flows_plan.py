"""The sweep's decisions as plain functions (flows/plan.py, flows/params.py, flows/checks.py):
no Prefect, no Ray."""

from __future__ import annotations

import inspect
import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from dapo_cli import LADDER_FILE

from dapo_core.setup.ladders import paper_ladder
from dapo_core.train.run_dir import NotOwner, claim
from flows import checks, plan
from flows.params import ArmParams, Resources, SweepParams, takes, validate

HASH = "abc123def456"


# --- parameters ------------------------------------------------------------------------------
def test_sweep_defaults_are_the_whole_ladder_with_one_seed() -> None:
    p = validate(SweepParams, {})
    assert p.arms == list(paper_ladder().names)
    assert p.seeds == [0]
    assert p.preset == "tiny"
    assert p.resources == Resources(cpus=1.0, gpus=0.0)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"arms": ["grpo", "dapo_plus"]}, "arms: unknown arm 'dapo_plus': choose among grpo"),
        ({"arms": ["grpo", "no_std"]}, "arms: unknown arm 'no_std': choose among grpo"),
        ({"ladder": "dr-grpo", "arms": ["dapo"]}, "arms: unknown arm 'dapo': choose among grpo"),
        ({"ladder": "my.toml"}, "ladder: 'my.toml' is neither a built-in ladder (paper, "),
        ({"ladder": 'name = "x"\n[[arms]]\nname = "a"\nfrom = "nope"'}, "ladder: the ladder's"),
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


def test_an_arms_config_is_resolved_once_per_process() -> None:
    # Parameters validated twice (the sweep's, then each arm's from the store) and every step of
    # a sweep's plan share one config per (arm, seed, overrides); another override is another.
    raw = {"arms": ["grpo", "dapo"], "seeds": [0, 1], "overrides": {"run.steps": 3}}
    first, again = validate(SweepParams, raw), validate(SweepParams, dict(raw))
    assert first.arm_config("dapo", 1) is again.arm_config("dapo", 1)
    # ... and it is the config the ladder builds from the overrides directly.
    direct = first.parsed_ladder.config("dapo", "tiny", first.config_overrides(1))
    assert first.arm_config("dapo", 1).to_dict() == direct.to_dict()
    assert [j.config_hash for j in plan.sweep_jobs(first)] == [
        first.arm_config(a, s).config_hash() for a in ("grpo", "dapo") for s in (0, 1)
    ]
    assert first.arm_config("dapo", 0) is not first.arm_config("dapo", 1)
    other = validate(SweepParams, {**raw, "overrides": {"run.steps": 4}})
    assert other.arm_config("dapo", 1) is not first.arm_config("dapo", 1)
    assert other.arm_config("dapo", 1).run.steps == 4


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


def test_arm_params_take_any_arm_name_and_leave_the_ladder_to_the_sweep() -> None:
    # Free text: the sweep's own ladder decides (checks.arm_in_sweep); only a name no ladder
    # could hold is refused here.
    with pytest.raises(ValueError, match=r"^arm: 'No arm!' is not an arm name \(lowercase"):
        validate(ArmParams, {"sweep_id": 1, "arm": "No arm!"})
    assert validate(ArmParams, {"sweep_id": 1, "arm": "dapo-clip_high=0.24"}).seed == 0


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


STORE_A, STORE_B = str(uuid.uuid4()), str(uuid.uuid4())


def test_fresh_run_dirs_never_collide_between_attempts(tmp_path: Path) -> None:
    a = plan.fresh_run_dir(tmp_path, STORE_A, 3, "grpo", 0, HASH, 10)
    b = plan.fresh_run_dir(tmp_path, STORE_A, 3, "grpo", 0, HASH, 11)
    store_dir = tmp_path / STORE_A.replace("-", "")[:8]
    assert a != b and a.parent == b.parent == store_dir / "sweep-3"


def test_fresh_run_dirs_never_collide_between_stores(tmp_path: Path) -> None:
    """Issue 14.1: sweep and run ids restart at 1 in every store; with one runs directory,
    the second store's run 1 used to land in (and resume) the first store's run 1."""
    a = plan.fresh_run_dir(tmp_path, STORE_A, 1, "grpo", 0, HASH, 1)
    b = plan.fresh_run_dir(tmp_path, STORE_B, 1, "grpo", 0, HASH, 1)
    assert a != b
    assert a.name == b.name == f"grpo-s0-{HASH}-run1"


def _job(arm: str = "grpo", seed: int = 0) -> plan.ArmJob:
    return plan.ArmJob(arm=arm, seed=seed, config={}, config_hash=HASH)


def test_a_run_directory_is_owned_by_its_store_sweep_arm_seed_and_config(tmp_path: Path) -> None:
    """The owner the flows hand to train(): another store, arm or seed is refused by the run
    directory's claim before anything in it is read; a retry of the same job is welcome."""
    run_dir = tmp_path / "run"
    mine = plan.run_owner(STORE_A, 1, _job())
    assert mine == {"store": STORE_A, "sweep": 1, "arm": "grpo", "seed": 0, "config_hash": HASH}
    claim(run_dir, mine)
    claim(run_dir, plan.run_owner(STORE_A, 1, _job()))  # a retry, or the next attempt
    assert json.loads((run_dir / "OWNER.json").read_text())["store"] == STORE_A
    for other in (
        plan.run_owner(STORE_B, 1, _job()),
        plan.run_owner(STORE_A, 1, _job(arm="dapo")),
        plan.run_owner(STORE_A, 1, _job(seed=5)),
    ):
        with pytest.raises(NotOwner, match="belongs to another run"):
            claim(run_dir, other)


# --- an arm of a sweep: inside it, or --extend -----------------------------------------------
def _sweep(arms: list[str], seeds: list[int]) -> dict[str, Any]:
    params = validate(SweepParams, {"arms": arms, "seeds": seeds, "steps": 2})
    return {
        "sweep_id": 7,
        "arms": params.arms,
        "seeds": params.seeds,
        "params": params.model_dump(),
    }


def test_an_arm_or_seed_outside_the_sweep_is_refused() -> None:
    """Issue 14.5: `dapo arm --seed 5` on a sweep of seed 0 trained and joined the table."""
    sweep = _sweep(["grpo", "dapo"], [0])
    assert checks.arm_in_sweep(sweep, "grpo", 0, extend=False).seeds == [0]
    with pytest.raises(ValueError) as seed:
        checks.arm_in_sweep(sweep, "grpo", 5, extend=False)
    assert str(seed.value).startswith("sweep 7 has no seed 5 (its seeds: 0)")
    assert "--extend" in str(seed.value) and "\n" not in str(seed.value)
    with pytest.raises(
        ValueError, match=r"sweep 7 has no arm 'clip_higher' \(its arms: grpo, dapo\)"
    ):
        checks.arm_in_sweep(sweep, "clip_higher", 0, extend=False)


def test_extend_widens_the_sweeps_definition() -> None:
    sweep = _sweep(["grpo", "dapo"], [0])
    wider = checks.arm_in_sweep(sweep, "clip_higher", 5, extend=True)
    assert wider.arms == ["grpo", "clip_higher", "dapo"]  # ladder order
    assert wider.seeds == [0, 5] and wider.steps == 2
    # Inside the sweep, extend changes nothing.
    assert checks.arm_in_sweep(sweep, "grpo", 0, extend=True).model_dump() == sweep["params"]


# --- inputs: loaded before anything is written -----------------------------------------------
def test_a_malformed_data_file_is_refused_before_the_sweep_exists(tmp_path: Path) -> None:
    """Issue 14.10: the data file was only read by the trainer, after the sweep row existed."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "1+1?", "answer": "2"}\n{"problem": "no answer"\n')
    jobs = plan.sweep_jobs(validate(SweepParams, {"arms": ["grpo"], "train_data": str(bad)}))
    with pytest.raises(ValueError) as caught:
        checks.check_inputs(job.config for job in jobs)
    assert str(caught.value).startswith("training data: ") and "bad.jsonl" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_model_path_must_be_a_model_directory(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="is not a model directory"):
        checks.check_model(str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        checks.check_model(str(tmp_path / "nope"))
    checks.check_model("Qwen/Qwen2.5-0.5B")  # a hub name is the trainer's to resolve
    checks.check_model("tiny")


# --- one definition of the flows' parameters -------------------------------------------------
def test_the_flow_signature_is_the_models_fields() -> None:
    @takes(SweepParams, ("sweep_id", int | None, None, "an existing sweep"))
    def flow_fn(**parameters: Any) -> dict[str, Any]:
        """Summary line."""
        return parameters

    signature = inspect.signature(flow_fn)
    assert list(signature.parameters) == [*SweepParams.model_fields, "sweep_id"]
    assert all(p.kind is p.KEYWORD_ONLY for p in signature.parameters.values())
    assert signature.parameters["arms"].default == []  # all the ladder's arms
    assert signature.parameters["ladder"].default == "paper"
    assert signature.parameters["resources"].default == Resources()
    doc = flow_fn.__doc__ or ""
    assert doc.startswith("Summary line.\n\nArgs:\n")
    # The description is the sweep_fields row's, naming the key it sets.
    # A number field's default is one value below the least accepted, which the form can hold
    # (no None toggle), and the description says so.
    assert (
        "    steps: Rollout steps per run (default: the preset's run.steps); 0 means that default.\n"
        in doc
    )
    assert "    sweep_id: An existing sweep; 0 means none.\n" in doc
    arm_signature = inspect.signature(takes(ArmParams)(lambda **kw: kw))
    assert "extend" in arm_signature.parameters
    assert arm_signature.parameters["sweep_id"].default is inspect.Parameter.empty


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


# --- any ladder (dapo_cli.LADDER_FILE), grids -------------------------------------------------
def test_a_sweep_runs_its_own_ladder_and_stores_it_whole() -> None:
    p = validate(SweepParams, {"ladder": LADDER_FILE, "steps": 2})
    assert p.arms == ["base", "eps28", "no_std"]  # the file's order
    rows = p.parsed_ladder.rows()
    assert [(r["arm"], r["parent"]) for r in rows] == [
        ("base", None),
        ("eps28", "base"),
        ("no_std", "base"),  # its `from`, not the arm above it
    ]
    jobs = plan.sweep_jobs(p)
    by_arm = {j.arm: j.config for j in jobs}
    assert by_arm["eps28"]["algo"]["clip_high"] == 0.28
    assert by_arm["no_std"]["algo"]["clip_high"] == 0.2  # from base, not from eps28
    assert by_arm["no_std"]["algo"]["scale_adv_by_std"] is False
    # What the store keeps is enough to rebuild every config: a rerun needs nothing else.
    stored = json.loads(json.dumps(p.model_dump()))
    again = validate(SweepParams, stored)
    assert [plan.arm_job(again, j.arm, 0).config_hash for j in jobs] == [
        j.config_hash for j in jobs
    ]


def test_a_built_in_ladder_is_stored_as_its_text_not_its_name() -> None:
    p = validate(SweepParams, {"ladder": "dr-grpo"})
    assert p.ladder.startswith('name = "dr-grpo"') and "[[arms]]" in p.ladder
    assert p.arms == ["grpo", "no_std", "dr_grpo"]
    assert validate(SweepParams, p.model_dump()) == p


def test_a_sweep_stored_before_ladders_is_the_paper_ladder() -> None:
    # Rows written by older versions hold no `ladder`: their arms are the paper's.
    old = {"preset": "tiny", "arms": ["grpo", "dapo"], "seeds": [0], "steps": 2}
    p = validate(SweepParams, old)
    assert p.parsed_ladder.name == "paper" and p.arms == ["grpo", "dapo"]


def test_a_grid_sweep_refuses_an_override_of_its_swept_key() -> None:
    ladder, arms = checks.sweep_ladder(None, ["algo.clip_high=0.24,0.28,0.32"], ["dapo"], "tiny")
    assert arms is None  # all of the grid's arms
    p = validate(SweepParams, {"ladder": ladder})
    assert p.arms == ["dapo", "dapo-clip_high=0.24", "dapo-clip_high=0.32"]
    assert [r["grid"] for r in p.parsed_ladder.rows()] == [
        {"algo.clip_high": v} for v in (0.28, 0.24, 0.32)
    ]
    with pytest.raises(ValueError) as caught:
        validate(SweepParams, {"ladder": ladder, "overrides": {"algo.clip_high": 0.3}})
    assert str(caught.value).startswith(
        "overrides: algo.clip_high is the key the ladder's grid sweeps"
    )
    assert "\n" not in str(caught.value)
    # Another key is fine: it moves every point alike.
    validate(SweepParams, {"ladder": ladder, "overrides": {"optim.lr": 1e-4}})


def test_an_override_that_undoes_an_arm_is_refused() -> None:
    p = validate(SweepParams, {"ladder": "dr-grpo", "overrides": {"algo.scale_adv_by_std": True}})
    with pytest.raises(ValueError) as caught:
        plan.sweep_jobs(p)
    assert str(caught.value) == (
        "the override of algo.scale_adv_by_std undoes what arm 'no_std' adds (advantages r − "
        "mean, not divided by the group std (Dr. GRPO fix 1)): it would train the same config "
        "as its parent 'grpo'; drop the override or the arm"
    )
    # Without that arm in the sweep there is nothing to undo.
    plan.sweep_jobs(p.model_copy(update={"arms": ["grpo"]}))


@pytest.mark.parametrize(
    ("ladder", "grids", "arms", "message"),
    [
        ("nope", [], None, "unknown ladder 'nope': give a built-in ladder"),
        ("missing.toml", [], None, "ladder file missing.toml does not exist"),
        (None, ["algo.nope=1,2"], None, "--grid algo.nope: no such config field (algo has:"),
        (None, ["algo.clip_high"], None, "--grid 'algo.clip_high': expected section.field=v1"),
        (None, ["algo.clip_high=0.3"], ["grpo", "dapo"], "--grid expands one base arm"),
        (None, ["algo.clip_high=0.3"], ["nope"], "unknown arm 'nope': choose one of grpo"),
        (None, [], None, None),
    ],
)
def test_a_bad_ladder_or_grid_is_one_line(
    ladder: str | None, grids: list[str], arms: list[str] | None, message: str | None
) -> None:
    if message is None:
        assert checks.sweep_ladder(ladder, grids, arms, "tiny") == ("paper", None)
        return
    with pytest.raises(ValueError) as caught:
        checks.sweep_ladder(ladder, grids, arms, "tiny")
    assert message in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


def test_a_ladder_file_travels_as_its_text(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(LADDER_FILE)
    ladder, arms = checks.sweep_ladder(str(path), [], ["no_std", "base"], "tiny")
    assert ladder.startswith('name = "mine"') and arms == ["no_std", "base"]
    assert validate(SweepParams, {"ladder": ladder, "arms": arms}).arms == ["base", "no_std"]
    bad = tmp_path / "bad.toml"
    bad.write_text(LADDER_FILE.replace('from = "base"', 'from = "later"'))
    with pytest.raises(ValueError, match=r"^.*bad\.toml: arm 'no_std': from = 'later' is unknown"):
        checks.sweep_ladder(str(bad), [], None, "tiny")


def test_an_arm_is_checked_against_the_sweeps_own_ladder() -> None:
    params = validate(SweepParams, {"ladder": LADDER_FILE, "arms": ["base"]})
    sweep = {"sweep_id": 4, "arms": ["base"], "seeds": [0], "params": params.model_dump()}
    for extend in (False, True):
        with pytest.raises(ValueError) as caught:
            checks.arm_in_sweep(sweep, "dapo", 0, extend=extend)
        assert str(caught.value) == (
            "sweep 4's ladder 'mine' has no arm 'dapo': choose one of base, eps28, no_std"
        )
    with pytest.raises(ValueError, match=r"^sweep 4 has no arm 'no_std' \(its arms: base\)"):
        checks.arm_in_sweep(sweep, "no_std", 0, extend=False)
    wider = checks.arm_in_sweep(sweep, "no_std", 0, extend=True)
    assert wider.arms == ["base", "no_std"] and wider.ladder == params.ladder


def test_longest_arms_start_first_and_ties_keep_the_ladder_order() -> None:
    """Dynamic sampling generates more (1.25× here), so `dapo` starts first; the other arms
    of the paper ladder cost the same and keep their order."""
    params = validate(SweepParams, {"preset": "tiny"})
    jobs = plan.sweep_jobs(params)
    order = [jobs[i].arm for i in plan.longest_first(jobs)]
    assert order == ["dapo", "grpo", "overlong_filter", "clip_higher", "soft_punish", "token_loss"]
    cfg = jobs[1].config  # grpo: no dynamic sampling
    steps, prompts = cfg["run"]["steps"], cfg["batch"]["gen_batch_size"]
    # steps × prompts × G × budget: 150 × 16 × 8 × 44 on the tiny preset
    assert plan.estimated_work(cfg) == steps * prompts * cfg["rollout"]["group_size"] * 44


def test_a_data_file_is_read_once_per_process_and_again_when_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """checks.check_inputs remembers data files that loaded (the sweep, its flow and its arms
    check the same configs), keyed by path, size and modification time: a file edited since
    is read again, so a mistake in it is never hidden."""
    from dapo_core.data import loaders

    reads: list[str] = []
    real = loaders.load_problems

    def counted(value: str) -> Any:
        reads.append(value)
        return real(value)

    monkeypatch.setattr(loaders, "load_problems", counted)
    data = tmp_path / "train.jsonl"
    data.write_text('{"problem": "What is 1+1?", "answer": "2"}\n')
    config = paper_ladder().config("grpo", "tiny", {"data.train": str(data)}).to_dict()
    checks.check_inputs([config, config])
    checks.check_inputs([config])
    assert reads.count(str(data)) == 1
    data.write_text('{"problem": "What is 1+1?", "answer": "2"}\n{"problem": "torn\n')
    with pytest.raises(ValueError, match="training data"):
        checks.check_inputs([config])
    assert reads.count(str(data)) == 2
