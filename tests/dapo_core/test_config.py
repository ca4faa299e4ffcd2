"""Configs: validation messages a user can act on, serialisation, and a stable hash."""

from __future__ import annotations

import pytest

from dapo_common.util import flatten
from dapo_core.setup.config import (
    AlgoConfig,
    BatchConfig,
    ConfigError,
    ExperimentConfig,
    RolloutConfig,
)
from dapo_core.setup.presets import PRESETS, preset_config


@pytest.mark.parametrize(
    ("build", "needle"),
    [
        (lambda: AlgoConfig(clip_low=0.3, clip_high=0.2), "clip_high=0.2 < clip_low=0.3"),
        (lambda: AlgoConfig(clip_c=0.5), "dual-clip bound must be > 1"),
        (lambda: AlgoConfig(loss_agg="sum"), "algo.loss_agg='sum'"),
        (lambda: RolloutConfig(group_size=1), "G >= 2"),
        (lambda: RolloutConfig(engine="tgi"), "rollout.engine='tgi'"),
        (lambda: BatchConfig(train_batch_size=10, mini_batch_size=4), "not divisible"),
        (
            lambda: ExperimentConfig(
                rollout=RolloutConfig(max_response_len=16), algo=AlgoConfig(overlong_cache_len=16)
            ),
            "L_cache < L_max",
        ),
        (
            lambda: ExperimentConfig(batch=BatchConfig(train_batch_size=16, gen_batch_size=8)),
            "without dynamic sampling",
        ),
    ],
)
def test_invalid_configs_name_the_field(build, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        build()
    assert needle in str(info.value)
    assert "\n" not in str(info.value)  # one line for the CLI


def test_dynamic_sampling_may_generate_smaller_batches() -> None:
    cfg = ExperimentConfig(
        algo=AlgoConfig(dynamic_sampling=True),
        batch=BatchConfig(train_batch_size=16, gen_batch_size=8),
    )
    assert cfg.batch.gen_batch_size == 8


def test_round_trip_and_hash_is_stable() -> None:
    cfg = preset_config("tiny")
    again = ExperimentConfig.from_dict(cfg.to_dict())
    assert again == cfg
    assert again.config_hash() == cfg.config_hash()
    assert len(cfg.config_hash()) == 12
    # Any change of any field changes the hash.
    assert cfg.with_overrides({"algo.clip_high": 0.28}).config_hash() != cfg.config_hash()
    assert cfg.with_overrides({"run.seed": 1}).config_hash() != cfg.config_hash()


def test_hash_depends_on_content_only() -> None:
    # The hash keys runs in the store: if it changes silently, every completed run is re-trained.
    # Built from defaults only, so it changes only when the schema or its defaults change.
    assert (
        ExperimentConfig().config_hash()
        == ExperimentConfig.from_dict(ExperimentConfig().to_dict()).config_hash()
    )
    assert ExperimentConfig().config_hash() != ExperimentConfig(arm="dapo").config_hash()


def test_overrides_reject_unknown_fields() -> None:
    cfg = ExperimentConfig()
    with pytest.raises(ConfigError, match=r"algo.clip_hi: no such config field \(algo has:"):
        cfg.with_overrides({"algo.clip_hi": 0.3})
    with pytest.raises(ConfigError, match="unknown section 'algorithm'"):
        cfg.with_overrides({"algorithm.clip_high": 0.3})
    with pytest.raises(ConfigError, match="unknown config section"):
        ExperimentConfig.from_dict({"nonsense": {}})


def test_every_preset_is_valid() -> None:
    for name in PRESETS:
        cfg = preset_config(name)
        assert cfg.preset == name
    with pytest.raises(ConfigError, match="unknown preset 'huge'"):
        preset_config("huge")


def test_paper_preset_is_the_papers_recipe() -> None:
    # §4.1: Qwen2.5-32B base, 512 prompts × 16 responses per step, mini-batch 512 responses
    # (32 prompts: 16 updates per step), AdamW lr 1e-6 warmed up over 20 rollout steps
    # (20 · 16 = 320 updates), L_max 20480 with L_cache 4096 (16384 + 4096), weight decay 0.1.
    cfg = preset_config("paper")
    assert cfg.model.name_or_path == "Qwen/Qwen2.5-32B"
    assert (cfg.batch.train_batch_size, cfg.rollout.group_size) == (512, 16)
    assert cfg.batch.mini_batch_size * cfg.rollout.group_size == 512
    assert cfg.batch.train_batch_size // cfg.batch.mini_batch_size == 16
    assert (cfg.optim.lr, cfg.optim.warmup_updates, cfg.optim.weight_decay) == (1e-6, 320, 0.1)
    assert (cfg.rollout.max_response_len, cfg.algo.overlong_cache_len) == (20480, 4096)
    assert (cfg.data.eval, cfg.data.eval_k) == ("aime2024", 32)


@pytest.mark.parametrize("name", ["qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b"])
def test_real_presets_warm_up_over_20_rollout_steps(name: str) -> None:
    # The paper's warm-up (20 rollout steps) in gradient updates: 20 · train / mini.
    cfg = preset_config(name)
    updates_per_step = cfg.batch.train_batch_size // cfg.batch.mini_batch_size
    assert cfg.optim.warmup_updates == 20 * updates_per_step
    assert cfg.algo.overlong_cache_len < cfg.rollout.max_response_len


def test_flatten() -> None:
    assert flatten({"a": {"b": 1, "c": {"d": 2}}, "e": 3}) == {"a.b": 1, "a.c.d": 2, "e": 3}


def test_how_a_run_reports_and_keeps_house_leaves_its_hash_alone() -> None:
    """A run's hash names it in the store and its directory: a tracker added, more checkpoints
    kept or a longer collective timeout must not make a completed run look new, and a config
    stored before those fields existed must hash as it did."""
    from dapo_core.setup.config import REPORTING_FIELDS
    from dapo_core.setup.ladders import paper_ladder

    cfg = paper_ladder().config("grpo", "tiny")
    changed = cfg.with_overrides(
        {
            "run.loggers": ["tensorboard"],
            "run.mlflow_uri": "file:///tmp/mlruns",
            "run.keep_checkpoints": 7,
            "run.collective_timeout_s": 60.0,
        }
    )
    assert changed.config_hash() == cfg.config_hash()
    old = cfg.to_dict()
    for name in REPORTING_FIELDS:
        del old["run"][name]
    assert ExperimentConfig.from_dict(old).config_hash() == cfg.config_hash()
    # ... while what a run computes does change it.
    assert cfg.with_overrides({"run.steps": cfg.run.steps + 1}).config_hash() != cfg.config_hash()
