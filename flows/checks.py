"""What a sweep or an arm checks before its first write, without Prefect.

`dapo sweep` / `dapo arm` call these before a Prefect server or Ray is started, and the flows
call them again first thing (a served flow run gets its parameters from a form), so that a
user mistake ends in one line and leaves nothing behind: no sweep row, no run row, no run
directory. The data files are loaded, not only looked for: a malformed row fails here, naming
the file and the row, rather than in the trainer after the sweep was created.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dapo_core import real_model
from dapo_core.setup.ladders import BUILTIN_LADDERS, Ladder, expand_grid, resolve_ladder
from db.store import Store
from flows import plan
from flows.params import SweepParams, validate

# A local model directory must hold at least this (the Hugging Face layout).
MODEL_CONFIG = "config.json"


def prepare_sweep(
    raw: Mapping[str, Any], sweep_id: int | None
) -> tuple[SweepParams, Store, list[plan.ArmJob]]:
    """Validate everything a sweep needs without writing anything (Ray is checked after):
    the parameters, every arm's config, the store, the model path and the data files."""
    params: SweepParams = validate(SweepParams, dict(raw))
    jobs = plan.sweep_jobs(params)  # configs first: a typo needs no store
    store = Store(params.store_url, open_wait_s=0)
    if sweep_id is not None:
        # Running an existing sweep again: its own parameters, with this run's `force`.
        stored = validate(SweepParams, dict(store.get_sweep(sweep_id).get("params") or {}))
        params = stored.model_copy(update={"force": params.force})
        jobs = plan.sweep_jobs(params)
    check_inputs(job.config for job in jobs)
    check_runs_dir(plan.runs_dir())
    return params, store, jobs


def check_runs_dir(runs: Path) -> None:
    """The runs directory must take a file: an arm that cannot write its checkpoints would
    fail inside its actor, after the sweep row exists. (Permission bits alone do not say it:
    root writes through them, a read-only mount refuses root too.)"""
    try:
        runs.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=runs, prefix=".dapo-write-check-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise PermissionError(
            f"the runs directory {runs} ($DAPO_RUNS_DIR) is not writable ({reason}): "
            "point DAPO_RUNS_DIR at a directory this user can write"
        ) from None


def sweep_ladder(
    ladder: str | None, grids: Sequence[str], arms: Sequence[str] | None, preset: str
) -> tuple[str, list[str] | None]:
    """`dapo sweep --ladder NAME_OR_FILE [--arms ...] [--grid key=v1,v2 ...]` as SweepParams'
    (ladder, arms): the ladder file is read and checked here, on the caller's machine (the
    flow may run elsewhere), and a grid is expanded from its base arm (the one --arms names,
    else the ladder's last) into a ladder of its own whose arms all run. A bad file, grid or
    base is one line (ValueError) before anything is written."""
    from dapo_core.setup.config import ExperimentConfig
    from dapo_core.setup.overrides import parse_grid

    validate(SweepParams, {"preset": preset})  # a bad preset first, in its usual words
    name = ladder or "paper"
    resolved: Ladder = resolve_ladder(name, preset)
    if not grids:
        # A built-in travels by name (readable in the flow run's parameters); a file as text.
        return (name if name in BUILTIN_LADDERS else resolved.to_toml()), (
            list(arms) if arms else None
        )
    if arms and len(arms) > 1:
        raise ValueError(
            f"--grid expands one base arm, got --arms {','.join(arms)}: name one (the grid's "
            "points and that arm are the sweep's arms)"
        )
    base = arms[0] if arms else resolved.arms[-1].name
    resolved.arm(base)  # an unknown base names the ladder's arms
    grid = expand_grid(resolved, parse_grid(ExperimentConfig, grids), arm=base, preset=preset)
    return grid.to_toml(), None


# Data sets that loaded in this process, by what would change them (a file's path, size and
# modification time; a built-in set's name): `dapo sweep`, its flow and each of its arms check
# the same configs in one process, and a data file is read once for all of them.
_LOADED: set[tuple[Any, ...]] = set()


def _data_key(value: str) -> tuple[Any, ...]:
    path = Path(value).expanduser()
    if path.is_file():
        stat = path.stat()
        return (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    return (value,)


def check_inputs(configs: Iterable[Mapping[str, Any]]) -> None:
    """Load every data set the configs name (once each per process, again if the file changed)
    and check every model (check_model): ValueError / FileNotFoundError in one line naming the
    file (and the row)."""
    from dapo_core.data.loaders import load_problems

    for config in configs:
        plan.check_local_paths(config)
        data = config["data"]
        check_model(
            str(config["model"]["name_or_path"]),
            chat=real_model.needs_chat_template(str(data.get("prompt_template", "dapo"))),
        )
        for what, value in (("training data", data["train"]), ("eval data", data["eval"])):
            key = _data_key(str(value))
            if key in _LOADED:
                continue
            try:
                problems = load_problems(str(value))
            except (ValueError, FileNotFoundError) as exc:
                raise type(exc)(f"{what}: {exc}") from None
            if not problems:
                raise ValueError(f"{what} {value} holds no problems")
            _LOADED.add(key)


def check_model(name_or_path: str, *, chat: bool = False) -> None:
    """A model given as a local path must be a model directory, and then every check `dapo
    train` makes (dapo_core.real_model.check_model, the one function for all commands): the
    pinned real model converted, a GGUF file missing, corrupt or not converted, a directory
    without tokenizer files, without a chat template when `chat` (the prompt template needs
    one), or whose tokenizer does not fit its vocabulary. A hub name is left to the trainer:
    whether it downloads depends on the machine that trains. Each (model, chat) is checked
    once per process while its files stay as they were (a sweep checks arms × seeds configs)."""
    if plan.looks_like_path(name_or_path):
        path = Path(name_or_path).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"model path {name_or_path} does not exist")
        # A GGUF file is real_model's to explain (missing, corrupt, or how to convert it).
        is_gguf = path.suffix.lower() == real_model.GGUF_SUFFIX
        if not is_gguf and not (path / MODEL_CONFIG).is_file():
            raise ValueError(
                f"model path {name_or_path} is not a model directory (no {MODEL_CONFIG} in it)"
            )
    key = (_model_key(name_or_path), chat)
    if key in _CHECKED_MODELS:
        return
    real_model.check_model(name_or_path, chat=chat)
    _CHECKED_MODELS.add(key)


# Models that passed check_model in this process, keyed like the data sets (_data_key): reading
# a 49k-token tokenizer.json for every arm × seed of a sweep would cost a second each.
_CHECKED_MODELS: set[tuple[tuple[Any, ...], bool]] = set()


def _model_key(name_or_path: str) -> tuple[Any, ...]:
    """What would change a model's check: the pinned name's directory, or a local path's files
    (name, size, modification time); a hub name is its name."""
    if name_or_path == real_model.NAME:
        path = real_model.converted_dir(real_model.GGUF_SHA256)
    else:
        path = Path(name_or_path).expanduser()
    if not path.exists():
        return (name_or_path,)
    files = [path] if path.is_file() else sorted(path.iterdir())
    stats = [(f.name, *_size_and_mtime(f)) for f in files]
    return (str(path.resolve()), tuple(stats))


def _size_and_mtime(path: Path) -> tuple[int, int]:
    try:
        stat = path.stat()
    except OSError:  # a dangling link: never equal to a later, whole file
        return (-1, -1)
    return (stat.st_size, stat.st_mtime_ns)


def arm_in_sweep(sweep: Mapping[str, Any], arm: str, seed: int, *, extend: bool) -> SweepParams:
    """The sweep's parameters for running (arm, seed) in it.

    An arm or seed the sweep does not have is refused: the table compares arms over the same
    seeds, so one extra seed in one arm would shift its mean alone. `extend` widens the sweep
    instead; the returned parameters then hold the new arm or seed (the caller stores them).
    """
    params: SweepParams = validate(SweepParams, dict(sweep.get("params") or {}))
    arms = [str(a) for a in sweep.get("arms") or params.arms]
    seeds = [int(s) for s in sweep.get("seeds") or params.seeds]
    sweep_id = sweep.get("sweep_id", sweep.get("id"))
    ladder = params.parsed_ladder
    if arm not in ladder.names:
        # Not even --extend can add it: the sweep's ladder (stored with it) defines its arms.
        raise ValueError(
            f"sweep {sweep_id}'s ladder {ladder.name!r} has no arm {arm!r}: choose one of "
            f"{', '.join(ladder.names)}"
        )
    missing = []
    if arm not in arms:
        missing.append(f"arm {arm!r} (its arms: {', '.join(arms)})")
    if seed not in seeds:
        missing.append(f"seed {seed} (its seeds: {', '.join(map(str, seeds))})")
    if not missing:
        return params
    if not extend:
        raise ValueError(
            f"sweep {sweep_id} has no {' and no '.join(missing)}: choose one of its own, or "
            "pass --extend (form: extend) to add it to the sweep"
        )
    if params.adaptive.until_decided:
        raise ValueError(
            f"sweep {sweep_id} adds its own seeds until its comparisons are decided; "
            f"--extend would change its plan: continue it with `dapo sweep --sweep {sweep_id}`"
        )
    return validate(
        SweepParams,
        {
            **params.model_dump(),
            "arms": [*arms, arm] if arm not in arms else arms,
            "seeds": [*seeds, seed] if seed not in seeds else seeds,
        },
    )
