"""The reference implementations, loaded from .venv-verl (scripts/setup_verl.sh, `make
test-reference`) without importing verl as a package: its `__init__` pulls in Ray and tensordict.

* `math_dapo`: verl/utils/reward_score/math_dapo.py imports only `re` and `typing`, so the file is
  loaded by path as a module of its own.
* `verl_core`: verl/trainer/ppo/core_algos.py imports verl's configs, omegaconf and more at the
  top. The functions under test are taken out of the file's syntax tree instead (their
  decorators dropped, their annotations left unevaluated) and run in a namespace that holds
  torch, numpy, verl's own `masked_sum`, `masked_mean`, `masked_var` and `masked_whiten` (taken
  out of verl/utils/torch_functional.py the same way) and two stand-ins for verl's config classes,
  used only by the functions' `isinstance` checks and attribute reads.

Every test here skips when .venv-verl is missing.
"""

from __future__ import annotations
import __future__

import ast
import importlib.util
import os
import types
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
VERL_VENV = ROOT / ".venv-verl"
VERL_VERSION = "0.9.1"
# What scripts/setup_verl.sh writes into .venv-verl/.installed: verl, and TRL beside it.
STAMP = f"{VERL_VERSION} trl 1.16.0"

CORE_FUNCTIONS = (
    "agg_loss",
    "compute_policy_loss_vanilla",
    "compute_policy_loss_gspo",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_sapo",
    "compute_policy_loss_dppo_tv",
    "compute_policy_loss_dppo_kl",
    "compute_policy_loss_dro",
    "compute_policy_loss_gpg",
    "compute_grpo_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_gpg_outcome_advantage",
    "compute_gdpo_outcome_advantage",
    "compute_optimal_token_baseline_advantage",
    "compute_multi_turn_optimal_token_baseline_advantage",
)


def _verl_site() -> Path | None:
    stamp = VERL_VENV / ".installed"
    if not stamp.is_file() or stamp.read_text().strip() != STAMP:
        return None
    for site in sorted(VERL_VENV.glob("lib/python3*/site-packages")):
        if (site / "verl").is_dir():
            return site
    return None


@pytest.fixture(scope="session")
def verl_site() -> Path:
    site = _verl_site()
    if site is None:
        message = (
            f".venv-verl with verl {VERL_VERSION} is missing: `make test-reference` builds it "
            "(scripts/setup_verl.sh)"
        )
        # `make test-reference` exists to run these: there a missing reference is a failure.
        if os.environ.get("DAPO_REQUIRE_REFERENCE"):
            pytest.fail(message)
        pytest.skip(message)
    return site


@pytest.fixture(scope="session")
def math_dapo(verl_site: Path) -> types.ModuleType:
    path = verl_site / "verl" / "utils" / "reward_score" / "math_dapo.py"
    spec = importlib.util.spec_from_file_location("reference_math_dapo", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def extract_functions(path: Path, names: tuple[str, ...], namespace: dict[str, Any]) -> None:
    """Define the named top-level functions of a source file in `namespace`, without running
    the rest of the file: decorators dropped, annotations kept as strings (never evaluated)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: dict[str, ast.FunctionDef] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            node.decorator_list = []
            found[node.name] = node
    missing = set(names) - set(found)
    assert not missing, f"{path} has no {sorted(missing)}"
    module = ast.Module(body=[found[n] for n in names], type_ignores=[])
    code = compile(module, str(path), "exec", flags=__future__.annotations.compiler_flag)
    exec(code, namespace)


class ActorConfig:
    """Stand-in for verl.workers.config.ActorConfig: the fields the policy losses read."""

    def __init__(self, clip_low: float, clip_high: float, clip_c: float = 3.0) -> None:
        self.clip_ratio = clip_low
        self.clip_ratio_low = clip_low
        self.clip_ratio_high = clip_high
        self.clip_ratio_c = clip_c
        self.global_batch_info: dict[str, Any] = {}  # local counts: one micro-batch, one rank

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)


class AlgoConfig:
    """Stand-in for verl.trainer.config.AlgoConfig (only `isinstance` checks see it)."""


@pytest.fixture(scope="session")
def verl_core(verl_site: Path) -> Iterator[dict[str, Any]]:
    import numpy as np
    import torch

    helpers: dict[str, Any] = {"torch": torch}
    extract_functions(
        verl_site / "verl" / "utils" / "torch_functional.py",
        ("masked_sum", "masked_mean", "masked_var", "masked_whiten"),
        helpers,
    )
    namespace: dict[str, Any] = {
        "torch": torch,
        "np": np,
        "defaultdict": defaultdict,
        "Any": Any,
        "Optional": Optional,
        "verl_F": types.SimpleNamespace(**helpers),
        "ActorConfig": ActorConfig,
        "AlgoConfig": AlgoConfig,
    }
    extract_functions(
        verl_site / "verl" / "trainer" / "ppo" / "core_algos.py", CORE_FUNCTIONS, namespace
    )
    yield namespace
