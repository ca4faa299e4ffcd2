"""Typed parameters of the flows: pydantic models that check what a user typed into a form.

Prefect renders the flows' signatures (flows/sweep.py, flows/arm.py) as forms; the flows take
their parameters as plain JSON and validate them here, so that a bad value ends the flow run
with ONE line naming the field and what to change (pydantic's own report is a multi-line
block). Nothing in this module touches the store, Ray or Prefect.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from dapo_core.arms import ARM_NAMES
from dapo_core.presets import PRESETS

# Literal types give the Prefect form drop-downs; validation below repeats the check with a
# message that lists the choices (a served deployment accepts any JSON, see flows/serve.py).
ArmName = Literal[ARM_NAMES]  # type: ignore[valid-type]
PresetName = Literal[tuple(PRESETS)]  # type: ignore[valid-type]


class Resources(BaseModel):
    """What one arm asks Ray for. Torch gets as many threads as CPUs granted."""

    model_config = ConfigDict(extra="forbid")

    cpus: float = Field(1.0, gt=0, description="CPUs per arm (torch threads = CPUs granted)")
    gpus: float = Field(
        0.0, ge=0, description="GPUs per arm (0 on a laptop; 1 per arm on a GPU node)"
    )


class SweepParams(BaseModel):
    """Everything that defines a sweep; stored with the sweep row so that one arm can be rerun
    later from `(sweep_id, arm, seed)` alone."""

    model_config = ConfigDict(extra="forbid")

    preset: str = Field("tiny", description="base config: " + ", ".join(PRESETS))
    arms: list[str] = Field(
        default_factory=lambda: list(ARM_NAMES), description="ladder arms to run"
    )
    seeds: list[int] = Field(
        default_factory=lambda: [0], description="seeds, one run per arm and seed"
    )
    steps: int | None = Field(None, description="rollout steps per arm (default: the preset's)")
    model: str | None = Field(None, description="`tiny`, a local model directory or a hub name")
    train_data: str | None = Field(None, description="training data: a data set name or a path")
    eval_data: str | None = Field(None, description="evaluation set: a data set name or a path")
    eval_k: int | None = Field(None, description="samples per eval problem (avg@k, pass@k)")
    eval_problems: int | None = Field(None, description="evaluate on the first N problems (0: all)")
    resources: Resources = Field(default_factory=Resources)
    overrides: dict[str, Any] = Field(
        default_factory=dict,
        description="dotted config overrides, e.g. {'batch.train_batch_size': 8}",
    )
    store_url: str | None = Field(
        None, description="SQLAlchemy URL of the store (default: $DAPO_DB_URL or SQLite)"
    )
    ray_address: str | None = Field(
        None, description="Ray cluster to join (default: $RAY_ADDRESS or a local one)"
    )
    force: bool = Field(False, description="retrain arms already completed with the same config")
    name: str | None = Field(None, description="a name for the sweep")

    @field_validator("preset")
    @classmethod
    def _preset(cls, value: str) -> str:
        if value not in PRESETS:
            raise ValueError(f"unknown preset {value!r}: choose one of {', '.join(PRESETS)}")
        return value

    @field_validator("arms")
    @classmethod
    def _arms(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError(f"no arms given: choose some of {', '.join(ARM_NAMES)}")
        unknown = [a for a in value if a not in ARM_NAMES]
        if unknown:
            raise ValueError(f"unknown arm {unknown[0]!r}: choose among {', '.join(ARM_NAMES)}")
        # Ladder order, duplicates dropped: the table reads top to bottom like the paper's.
        return [a for a in ARM_NAMES if a in value]

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

    @field_validator("steps", "eval_k")
    @classmethod
    def _positive(cls, value: int | None) -> int | None:
        if value is not None and value < 1:
            raise ValueError(f"must be >= 1, got {value}")
        return value

    @field_validator("eval_problems")
    @classmethod
    def _non_negative(cls, value: int | None) -> int | None:
        if value is not None and value < 0:
            raise ValueError(f"must be >= 0, got {value}")
        return value

    @field_validator("model", "train_data", "eval_data", "store_url", "ray_address", "name")
    @classmethod
    def _blank_is_none(cls, value: str | None) -> str | None:
        # A form leaves an emptied text box as "": that means "use the default".
        return value.strip() or None if value is not None else None

    def config_overrides(self, seed: int) -> dict[str, Any]:
        """Dotted overrides of one (arm, seed) run on top of the preset and the arm's changes."""
        out: dict[str, Any] = {}
        for value, key in (
            (self.steps, "run.steps"),
            (self.model, "model.name_or_path"),
            (self.train_data, "data.train"),
            (self.eval_data, "data.eval"),
            (self.eval_k, "data.eval_k"),
            (self.eval_problems, "data.eval_problems"),
        ):
            if value is not None:
                out[key] = value
        out.update(self.overrides)
        out["run.seed"] = seed
        return out


class ArmParams(BaseModel):
    """One (arm, seed) of an existing sweep; what the dashboard's rerun button sends."""

    model_config = ConfigDict(extra="forbid")

    sweep_id: int = Field(..., ge=1)
    arm: str
    seed: int = Field(0, ge=0)
    force: bool = False
    store_url: str | None = None
    ray_address: str | None = None
    resources: Resources | None = None
    publish: bool = True

    @field_validator("arm")
    @classmethod
    def _arm(cls, value: str) -> str:
        if value not in ARM_NAMES:
            raise ValueError(f"unknown arm {value!r}: choose one of {', '.join(ARM_NAMES)}")
        return value

    @field_validator("store_url", "ray_address")
    @classmethod
    def _blank_is_none(cls, value: str | None) -> str | None:
        return value.strip() or None if value is not None else None


class EvalParams(BaseModel):
    """Evaluate one stored run's latest checkpoint on an eval set."""

    model_config = ConfigDict(extra="forbid")

    run_id: int = Field(..., ge=1)
    eval_data: str | None = None
    eval_k: int | None = Field(None, ge=1)
    eval_problems: int | None = Field(None, ge=0)
    store_url: str | None = None
    ray_address: str | None = None
    resources: Resources | None = None


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
