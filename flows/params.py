"""Typed parameters of the flows: pydantic models that check what a user typed into a form.

These models are the one definition of each flow's parameters: `takes(SweepParams)` gives the
flow function (flows/sweep.py, flows/arm.py) its signature and argument docs, which Prefect
renders as the deployment's form, and `dapo sweep` / `dapo arm` and the dashboard's rerun
button fill the same models. The flows take their parameters as plain JSON and validate them
here, so that a bad value ends the flow run with ONE line naming the field and what to change
(pydantic's own report is a multi-line block). Nothing in this module touches the store, Ray
or Prefect.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from dapo_common.cli_args import USER_ERRORS
from dapo_common.util import first_line
from dapo_core.setup.config import ExperimentConfig
from dapo_core.setup.ladders import (
    BUILTIN_LADDERS,
    NAME_MAX_LEN,
    NAME_RE,
    NAME_RULE,
    Ladder,
    resolve_ladder,
)
from dapo_core.setup.overrides import type_overrides
from dapo_core.setup.presets import PRESETS
from dapo_core.setup.sweep_fields import FIELD_OF_KEY, SWEEP_FIELD, SWEEP_FIELDS, field_overrides

# A Literal type gives the Prefect form a drop-down; validation below repeats the check with a
# message that lists the choices (a served deployment accepts any JSON, see flows/serve.py).
# Arms have no Literal: they are whatever the sweep's ladder names, so the form takes free text.
PresetName = Literal[tuple(PRESETS)]  # type: ignore[valid-type]
# Where each arm × seed runs (flows/ray_jobs.py): Ray actors driven by the flow's own process,
# or one job on the Ray cluster's job server, which outlives the flow's process.
SubmitMode = Literal["actors", "ray-jobs"]
SUBMIT_DOC = (
    "how each arm × seed runs: actors (Ray actors driven by the flow's process) or ray-jobs (one "
    "job on the Ray cluster's job server per arm × seed; a job whose flow run died is adopted "
    "by the next run of the arm, never started twice)"
)

LADDER_DOC = (
    "the ladder to run: a built-in ladder's name ("
    + ", ".join(BUILTIN_LADDERS)
    + ") or a whole ladder file's TOML text pasted in ([[arms]] tables of name, from, adds, set; "
    "`dapo arms --ladder FILE --toml` prints one, and `dapo arms --arm dapo --grid "
    "algo.clip_high=0.24,0.32 --toml` a grid); stored with the sweep as TOML, so that a rerun "
    "of one arm rebuilds its config from the sweep alone"
)
ARMS_DOC = (
    "arms of the ladder to run, by name (free text, checked against the ladder; empty: all of "
    "them, in the ladder's order)"
)


@functools.lru_cache(maxsize=32)
def parse_ladder(ladder: str, preset: str) -> Ladder:
    """A SweepParams `ladder` value (a built-in name or TOML text) as a Ladder validated on
    `preset`; ConfigError (a ValueError) in one line. Cached: a sweep's parameters are validated
    again by each of its arms, and a Ladder is frozen."""
    text = ladder.strip()
    if text in BUILTIN_LADDERS:
        return resolve_ladder(text, preset)
    if "\n" not in text:
        # A ladder's TOML has at least a `name` line and an [[arms]] table: one line is a
        # name or a path, and a path would be read on whichever machine runs the flow.
        raise ValueError(
            f"{text!r} is neither a built-in ladder ({', '.join(BUILTIN_LADDERS)}) nor a "
            "ladder's TOML text: paste the file's text (`dapo sweep --ladder FILE` reads a file)"
        )
    return Ladder.from_toml(ladder, source="the ladder's TOML", preset=preset)


@functools.lru_cache(maxsize=1024)
def _arm_config(ladder: str, preset: str, overrides: str, arm: str) -> ExperimentConfig:
    """One arm's config, resolved once per process for the same ladder, preset and overrides
    (their JSON): a `dapo sweep` process asks for each (arm, seed) while validating its
    parameters, planning its jobs, checking its overrides and planning each arm, and an
    ExperimentConfig is frozen. An error is not cached."""
    return parse_ladder(ladder, preset).config(arm, preset, json.loads(overrides))


def _row(name: str, default_from: str, *, bounded: bool = False) -> Any:
    """The pydantic field of a sweep_fields row, None when not given (`default_from`'s value
    stands). `bounded`: the row's minimum is checked by pydantic (EvalParams); SweepParams
    checks it in a validator of its own, whose message is shorter."""
    row = SWEEP_FIELD[name]
    description = row.describe(default_from)
    if bounded and row.minimum is not None:
        return Field(None, ge=row.minimum, description=description)
    return Field(None, description=description)


class Resources(BaseModel):
    """What one arm asks Ray for. Torch gets as many threads as CPUs granted."""

    model_config = ConfigDict(extra="forbid")

    cpus: float = Field(
        1.0, gt=0, description="CPUs per worker of an arm (torch threads = CPUs granted)"
    )
    gpus: float = Field(
        0.0, ge=0, description="GPUs per worker of an arm (0 on a laptop; 1 on a GPU node)"
    )
    # A resource, not part of the config hash: a run may resume on another number of workers
    # (sharded checkpoints reshard). cpus and gpus are then per worker.
    workers: int = Field(
        1,
        ge=1,
        description="workers per arm: N Ray actors in one placement group joined by "
        "torch.distributed (FSDP2), each with the CPUs and GPUs above; 1 is one process",
    )
    placement: Literal["PACK", "SPREAD"] = Field(
        "PACK",
        description="where an arm's workers go: PACK (as few nodes as possible) or SPREAD "
        "(over as many nodes as possible; best effort)",
    )
    rollout_actor: bool = Field(
        False,
        description="each worker's rollout engine on a Ray actor of its own (its own CPUs or "
        "GPUs below, in the arm's placement group), not in the worker's process; with "
        "rollout.mode=async the generation then runs beside the update on separate devices",
    )
    rollout_cpus: float = Field(
        1.0, gt=0, description="CPUs of each rollout engine's actor (with rollout_actor)"
    )
    rollout_gpus: float = Field(
        0.0, ge=0, description="GPUs of each rollout engine's actor (with rollout_actor)"
    )
    rollout_resource: str = Field(
        "",
        pattern=r"^[A-Za-z0-9_.:-]*$",
        description="a custom Ray resource the rollout engines' node offers (`ray start "
        "--resources '{\"rollout\": 1}'`): the engines go there (with rollout_actor)",
    )


class Adaptive(BaseModel):
    """Seeds added in rounds until the comparisons that matter are decided (db.sequential)."""

    model_config = ConfigDict(extra="forbid")

    until_decided: bool = Field(
        False,
        description="run seeds in rounds and stop each comparison once it is decided (a real "
        "difference, or futile) under a group-sequential design that keeps false positives at "
        "5% over all looks; `seeds` is the first round, filled up to 6 seeds (the fewest the "
        "exact test can decide on)",
    )
    compare: list[str] = Field(
        default_factory=list,
        description="the comparisons that matter, as 'A:B' (A − B); empty: each arm against "
        "its parent, and the last arm against the first",
    )
    max_seeds: int = Field(16, ge=6, le=64, description="the most seeds a comparison may take")
    seeds_per_round: int = Field(2, ge=1, le=32, description="seeds added per round")
    budget_minutes: float | None = Field(
        None,
        gt=0,
        description="no new round starts once this much wall time is spent (none: no limit)",
    )
    spending: Literal["obrien-fleming", "pocock"] = Field(
        "obrien-fleming",
        description="how α is spent over the looks: obrien-fleming (nearly all at the last "
        "look) or pocock (evenly)",
    )
    futility: float = Field(
        0.1,
        ge=0.0,
        lt=1.0,
        description="stop a comparison as futile when the chance that the remaining seeds "
        "decide it (conditional power under its current trend) falls below this; 0: never",
    )


class SweepParams(BaseModel):
    """Everything that defines a sweep; stored with the sweep row so that one arm can be rerun
    later from `(sweep_id, arm, seed)` alone."""

    model_config = ConfigDict(extra="forbid")

    preset: PresetName = Field("tiny", description="base config: " + ", ".join(PRESETS))
    # `ladder` before `arms`: the arms are checked against it (validators see earlier fields).
    ladder: str = Field("paper", validate_default=True, description=LADDER_DOC)
    arms: list[str] = Field(default_factory=list, validate_default=True, description=ARMS_DOC)
    seeds: list[int] = Field(
        default_factory=lambda: [0], description="seeds, one run per arm and seed"
    )
    # The rows of dapo_core/setup/sweep_fields.py, in its order: a test checks that each row is
    # a field here of its type, and config_overrides sets the row's key.
    steps: int | None = _row("steps", "the preset")
    model: str | None = _row("model", "the preset")
    train_data: str | None = _row("train_data", "the preset")
    eval_data: str | None = _row("eval_data", "the preset")
    eval_k: int | None = _row("eval_k", "the preset")
    eval_problems: int | None = _row("eval_problems", "the preset")
    resources: Resources = Field(
        default_factory=Resources, description="CPUs and GPUs each arm's Ray actor asks for"
    )
    overrides: dict[str, Any] = Field(
        default_factory=dict,
        description='dotted config overrides as JSON, e.g. {"batch.train_batch_size": 8, '
        '"algo.clip_high": 0.28}; a value given as text is read as its field\'s type, as '
        'with --set ("0.28" for a number)',
    )
    store_url: str | None = Field(
        None, description="SQLAlchemy URL of the store (default: $DAPO_DB_URL or SQLite)"
    )
    ray_address: str | None = Field(
        None, description="Ray cluster to join (default: $RAY_ADDRESS or a local one)"
    )
    force: bool = Field(False, description="retrain arms already completed with the same config")
    submit: SubmitMode = Field("actors", description=SUBMIT_DOC)
    name: str | None = Field(
        None, max_length=200, description="a name for the sweep (at most 200 characters)"
    )
    adaptive: Adaptive = Field(
        default_factory=Adaptive,
        description="until_decided: add seeds in rounds until the comparisons are decided",
    )

    # "before" validators: they run ahead of the Literal types' own check, so that the message
    # names the choices in words.
    @field_validator("preset", mode="before")
    @classmethod
    def _preset(cls, value: Any) -> Any:
        if value not in PRESETS:
            raise ValueError(f"unknown preset {value!r}: choose one of {', '.join(PRESETS)}")
        return value

    @field_validator("ladder", mode="before")
    @classmethod
    def _ladder_in(cls, value: Any) -> Any:
        # Python callers may pass a Ladder or its to_dict() form; the field keeps TOML text.
        if isinstance(value, Ladder):
            return value.to_toml()
        if isinstance(value, Mapping):
            return Ladder.from_dict(value, source="the ladder").to_toml()
        return value

    @field_validator("ladder")
    @classmethod
    def _ladder(cls, value: str, info: ValidationInfo) -> str:
        preset = info.data.get("preset")
        if preset is None:  # the preset failed: its own error says why
            return value
        # Stored as the ladder's full TOML, not a name: a built-in ladder edited later must
        # not change the configs of a sweep that already ran.
        return parse_ladder(value, preset).to_toml()

    @field_validator("arms", mode="before")
    @classmethod
    def _arms_in(cls, value: Any) -> Any:
        if not isinstance(value, list | tuple):
            raise ValueError(f"arms must be a list of arm names, got {value!r}")
        return list(value)

    @field_validator("arms")
    @classmethod
    def _arms(cls, value: list[str], info: ValidationInfo) -> list[str]:
        if "ladder" not in info.data or "preset" not in info.data:
            return value  # the ladder failed: its own error says why
        ladder = parse_ladder(info.data["ladder"], info.data["preset"])
        if not value:
            return list(ladder.names)
        unknown = [a for a in value if a not in ladder.names]
        if unknown:
            raise ValueError(
                f"unknown arm {unknown[0]!r}: choose among {', '.join(ladder.names)} (the arms "
                f"of ladder {ladder.name!r})"
            )
        # Ladder order, duplicates dropped: the table reads top to bottom like the ladder.
        return [a for a in ladder.names if a in value]

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, value: list[int]) -> list[int]:
        if not value:
            raise ValueError("no seeds given: give at least one seed, e.g. [0]")
        if any(s < 0 for s in value):
            raise ValueError(f"seeds must be >= 0, got {value}")
        if len(set(value)) != len(value):
            raise ValueError(f"seeds repeat: {value}")
        return list(value)

    @field_validator(*(f.name for f in SWEEP_FIELDS if f.minimum is not None))
    @classmethod
    def _at_least(cls, value: int | None, info: ValidationInfo) -> int | None:
        least = SWEEP_FIELD[str(info.field_name)].minimum
        if value is not None and least is not None and value < least:
            raise ValueError(f"must be >= {least}, got {value}")
        return value

    @field_validator(
        *(f.name for f in SWEEP_FIELDS if f.type is str), "store_url", "ray_address", "name"
    )
    @classmethod
    def _blank_is_none(cls, value: str | None) -> str | None:
        # A form leaves an emptied text box as "": that means "use the default".
        return value.strip() or None if value is not None else None

    @field_validator("overrides", mode="before")
    @classmethod
    def _overrides(cls, value: Any) -> Any:
        # Typed here, before anything is written, by the rule --set follows: the form's JSON
        # editor sends {"algo.clip_high": "0.28"} as readily as 0.28.
        if not isinstance(value, Mapping):
            raise ValueError(f"expected a mapping of dotted config keys, got {value!r}")
        return type_overrides(ExperimentConfig, value)

    @model_validator(mode="after")
    def _grid_keys_not_overridden(self) -> SweepParams:
        """A sweep-wide value for a key the ladder's grid sweeps would make every grid point
        the same config under different names: refused, naming where the value came from."""
        swept = {k: a.name for a in self.parsed_ladder.arms for k in a.grid}
        for key in self.config_overrides(0):
            if key in swept:
                where = "overrides" if key in self.overrides else _FIELD_OF.get(key, key)
                raise ValueError(
                    f"{where}: {key} is the key the ladder's grid sweeps (arm {swept[key]!r} "
                    f"sets its own value): drop it (--set / form: overrides), or grid over "
                    "another key"
                )
        return self

    @model_validator(mode="after")
    def _trackers(self) -> SweepParams:
        """A tracker backend its library refuses (MLflow's file store, an unknown URI scheme)
        is one line here, before the sweep exists, not a warning in every arm."""
        from dapo_core.setup.tracker_backends import check_trackers

        for arm in self.arms:
            try:
                config = self.arm_config(arm, self.seeds[0])
            except ValueError:  # the sweep's config checks (plan.sweep_jobs) say it their way
                continue
            check_trackers(config.to_dict())
        return self

    @model_validator(mode="after")
    def _adaptive(self) -> SweepParams:
        """An adaptive sweep's comparisons name two arms of the sweep each, and its plan of
        rounds can decide something (db.sequential.plan_looks)."""
        plan = self.adaptive
        if not plan.until_decided:
            return self
        from db.decisions import parse_pairs
        from db.sequential import plan_looks

        try:
            parse_pairs(plan.compare, self.arms)
        except ValueError as error:
            raise ValueError(str(error).replace("--compare", "compare")) from None
        if len(self.arms) < 2:
            raise ValueError("until_decided needs at least two arms to compare")
        if len(self.seeds) > plan.max_seeds:
            raise ValueError(
                f"until_decided: the first round's {len(self.seeds)} seeds exceed max_seeds "
                f"{plan.max_seeds}"
            )
        plan_looks(max(len(self.seeds), 6), plan.seeds_per_round, plan.max_seeds)
        return self

    @property
    def parsed_ladder(self) -> Ladder:
        """The sweep's ladder (parsed once per text and preset: see parse_ladder)."""
        return parse_ladder(self.ladder, self.preset)

    def arm_config(self, arm: str, seed: int) -> ExperimentConfig:
        """The experiment config of (arm, seed): the sweep's ladder, its preset, then its
        overrides; a bad combination raises ValueError naming the arm and seed."""
        # The cache's key; the overrides are JSON values (the form's, --set's, the fields'), so
        # the config is built from exactly them.
        overrides = json.dumps(self.config_overrides(seed), sort_keys=True)
        try:
            return _arm_config(self.ladder, self.preset, overrides, arm)
        except ValueError as exc:
            raise ValueError(f"{arm} seed {seed}: {exc}") from None

    def config_overrides(self, seed: int) -> dict[str, Any]:
        """Dotted overrides of one (arm, seed) run on top of the preset and the arm's changes."""
        out = field_overrides(self)
        out.update(self.overrides)
        out["run.seed"] = seed
        return out


# The SweepParams field that sets each dotted config key (config_overrides), to name it in
# errors: the table's rows, and the seed each run of `seeds` gets.
_FIELD_OF = {**FIELD_OF_KEY, "run.seed": "seeds"}


# The store and the Ray cluster of a run that belongs to a sweep (ArmParams, EvalParams).
StoreUrl = Annotated[
    str | None,
    Field(description="SQLAlchemy URL of the store (default: $DAPO_DB_URL, else SQLite)"),
]
RayAddress = Annotated[
    str | None,
    Field(description="Ray cluster to join (default: the sweep's, else $RAY_ADDRESS, else local)"),
]


class ArmParams(BaseModel):
    """One (arm, seed) of an existing sweep; what the dashboard's rerun button sends."""

    model_config = ConfigDict(extra="forbid")
    # A served sweep starts its arms with this model's JSON, nulls included: the arm's form
    # (takes) keeps null valid beside its plain defaults.
    FORM_NULLABLE: ClassVar[bool] = True

    sweep_id: int = Field(
        ..., ge=1, description="the sweep this arm belongs to (its parameters define the config)"
    )
    arm: str = Field(
        ...,
        description="the arm to train, by name (free text: an arm of the sweep's ladder)",
    )
    seed: int = Field(0, ge=0, description="the seed of the run")
    force: bool = Field(False, description="retrain even if completed with the same config")
    store_url: StoreUrl = None
    ray_address: RayAddress = None
    resources: Resources | None = Field(
        None, description="CPUs / GPUs for the arm's Ray actor (default: the sweep's)"
    )
    submit: SubmitMode | None = Field(None, description=SUBMIT_DOC + " (default: the sweep's)")
    publish: bool = Field(
        True,
        description="when done, publish the sweep's ablation table and recompute its status "
        "(a sweep's own arms leave both to the sweep)",
    )
    extend: bool = Field(
        False,
        description="add this arm or seed to the sweep when it is not one of the sweep's "
        "(otherwise refused: the table compares arms over the same seeds)",
    )

    @field_validator("arm", mode="before")
    @classmethod
    def _arm(cls, value: Any) -> Any:
        # Whether the sweep's ladder has this arm is checked against the sweep (which this
        # module cannot read: flows/checks.py); here only that it can be an arm's name at all.
        if not isinstance(value, str) or len(value) > NAME_MAX_LEN or not NAME_RE.fullmatch(value):
            raise ValueError(f"{value!r} is not an arm name ({NAME_RULE} characters)")
        return value

    @field_validator("store_url", "ray_address")
    @classmethod
    def _blank_is_none(cls, value: str | None) -> str | None:
        return value.strip() or None if value is not None else None


class EvalParams(BaseModel):
    """Evaluate one stored run's latest checkpoint on an eval set."""

    model_config = ConfigDict(extra="forbid")
    FORM_NULLABLE: ClassVar[bool] = True  # as ArmParams': callers may send its JSON's nulls

    run_id: int = Field(
        ..., ge=1, description="the store's run id (see the dashboard's run page or `dapo table`)"
    )
    # Rows of dapo_core/setup/sweep_fields.py, whose defaults are the run's own config.
    eval_data: str | None = _row("eval_data", "the run")
    eval_k: int | None = _row("eval_k", "the run", bounded=True)
    eval_problems: int | None = _row("eval_problems", "the run", bounded=True)
    store_url: StoreUrl = None
    ray_address: RayAddress = None
    resources: Resources | None = Field(
        None, description="CPUs / GPUs for the evaluation's Ray actor (default: the sweep's)"
    )


F = TypeVar("F", bound=Callable[..., Any])


def takes(
    model: type[BaseModel], *extra: tuple[str, Any, Any, str], nullable: bool = False
) -> Callable[[F], F]:
    """Give a flow function (`def flow(**parameters)`) the fields of `model` as its signature,
    and their descriptions as its docstring's Args, before @flow reads both to build the
    deployment's form. `extra`: further (name, annotation, default, description) parameters.

    The fields are keyword-only, so Prefect passes every value by name into **parameters.

    The form (issue 41.8): a field that is "None: the default" (`int | None = None`, `str |
    None = None`) is a plain integer or text box whose own value means the default (form_unset:
    "" for text, one below the least value for a number), so that nobody must switch a field
    from None to its type before typing; the flow function gets None for it, as before, so a
    sweep's stored parameters and its configs do not change. `nullable` keeps null accepted
    too (the arm's and the evaluation's forms, which a served sweep fills with nulls). What
    passes the form's schema but not the flow's checks ends the flow run in one line (Failed,
    no traceback; USER_ERRORS), as `dapo` does on a terminal.
    """
    nullable = nullable or bool(getattr(model, "FORM_NULLABLE", False))
    parameters = []
    docs = []
    unset: dict[str, Any] = {}
    rows = [
        (
            name,
            field.annotation,
            inspect.Parameter.empty
            if field.is_required()
            else field.get_default(call_default_factory=True),
            field.description or name.replace("_", " "),
            _least(name, field),
        )
        for name, field in model.model_fields.items()
    ]
    rows += [(n, a, d, text, _least(n, None)) for n, a, d, text in extra]
    for name, declared, declared_default, description, least in rows:
        annotation: Any = declared
        default: Any = declared_default
        form = form_unset(declared, declared_default, least)
        if form is not None:
            kind, unset[name] = form
            annotation, default = (kind | None) if nullable else kind, unset[name]
            shown = repr(unset[name]) if isinstance(unset[name], int) else "empty"
            meaning = "means that default" if "default" in description else "means none"
            description = f"{description}; {shown} {meaning}"
        parameters.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
            )
        )
        docs.append((name, description))
    signature = inspect.Signature(parameters)

    def apply(fn: F) -> F:
        summary = inspect.cleandoc(fn.__doc__ or "")
        # One line per argument: griffe keeps a wrapped description's line breaks, and the
        # form would show them.
        args = "\n".join(f"    {name}: {text[0].upper()}{text[1:]}." for name, text in docs)

        @functools.wraps(fn)
        def flow_fn(**given: Any) -> Any:
            for name, value in unset.items():
                if type(given.get(name)) is type(value) and given[name] == value:
                    given[name] = None
            try:
                return fn(**given)
            except USER_ERRORS as exc:
                return user_error(exc)

        flow_fn.__signature__ = signature  # type: ignore[attr-defined]
        flow_fn.__doc__ = f"{summary}\n\nArgs:\n{args}\n"
        flow_fn.form_unset = dict(unset)  # type: ignore[attr-defined]  # what means "not given"
        return flow_fn  # type: ignore[return-value]

    return apply


def form_unset(annotation: Any, default: Any, least: int | None) -> tuple[type, Any] | None:
    """(the form's type, the value that means "not given") of an `X | None = None` parameter:
    (str, "") for text; (int, least − 1) for a number whose least accepted value is known.
    None for anything else (kept as it is)."""
    import types
    import typing

    if default is not None or typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return None
    kinds = [a for a in typing.get_args(annotation) if a is not type(None)]
    if len(kinds) != 1 or len(typing.get_args(annotation)) != 2:
        return None
    if kinds[0] is str:
        return str, ""
    if kinds[0] is int and least is not None:
        return int, least - 1
    return None


def _least(name: str, field: Any) -> int | None:
    """The least value an integer parameter accepts: its sweep_fields row's minimum, its
    field's `ge`, or 1 for an id (the store's ids count from 1)."""
    if name in SWEEP_FIELD:
        return SWEEP_FIELD[name].minimum
    for item in getattr(field, "metadata", ()):
        ge = getattr(item, "ge", None)
        if isinstance(ge, int):
            return ge
    return 1 if name.endswith("_id") else None


def user_error(exc: BaseException) -> Any:
    """The flow run's end for a user's mistake that got past the form: Failed with Prefect's
    own message (`Flow run encountered an exception: ValueError: ...`, what every reader of a
    state expects) and one error line in its log, instead of the engine's logged traceback.
    The exception stays the state's result (`dapo arm` re-raises a RunHeld from it)."""
    from prefect.exceptions import MissingContextError
    from prefect.logging import get_run_logger
    from prefect.states import Failed

    line = f"{type(exc).__name__}: {first_line(exc)}"
    with contextlib.suppress(MissingContextError):  # a flow function called outside a run
        get_run_logger().error(line)
    return Failed(message=f"Flow run encountered an exception: {line}", data=exc)


def validate(model: type[BaseModel], values: dict[str, Any]) -> Any:
    """`model(**values)`, with pydantic's report turned into one line a user can act on."""
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        raise ValueError(one_line(exc)) from None


def one_line(exc: ValidationError) -> str:
    """The first problem of a ValidationError as `field: message`."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()) if not isinstance(p, int))
    message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where}: {message}{more}" if where else f"{message}{more}"
