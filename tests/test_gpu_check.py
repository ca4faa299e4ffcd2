"""bench/gpu_check.py (`make gpu-check`): its dry run on this CPU, with the packages a bare GPU
machine lacks made unimportable, writes every section; without CUDA it says so in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from gpu_check_loader import gpu_check

from dapo_common import metric_names as M
from dapo_core.setup.plan import GIB, plan_memory
from dapo_core.setup.presets import preset_config

ROOT = Path(__file__).resolve().parents[1]
ABSENT = ("ray", "prefect", "sqlalchemy", "streamlit", "vllm", "pandas", "alembic", "altair")
"""What the GPU machine does not have. None in sys.modules is how Python spells "not installed"
to both `import` (ModuleNotFoundError) and importlib.util.find_spec (None), which transformers
and torch probe with."""

RUN = """
import runpy, sys
for name in {absent!r}:
    sys.modules[name] = None
try:
    import ray  # noqa: F401
except ModuleNotFoundError:
    pass
else:
    sys.exit("the blocker did not block ray")
sys.argv = ["gpu_check.py", *{argv!r}]
runpy.run_path("bench/gpu_check.py", run_name="__main__")
"""


@pytest.fixture(scope="module")
def module() -> ModuleType:
    return gpu_check()


@pytest.mark.slow
def test_the_dry_run_writes_every_section_without_the_missing_packages(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code = RUN.format(absent=ABSENT, argv=["--dry-run", "--out", str(out)])
    env = dict(os.environ, OMP_NUM_THREADS="2", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    assert set(report) == {"meta", "models", "async", "fsdp", "bf16_head", "errors", "problems"}
    assert report["meta"]["dry_run"] is True and report["problems"] == []
    assert report["errors"] == {}
    # The many-worker code path on one rank (gloo here, NCCL on a GPU): trained, wrote a
    # sharded checkpoint, and a second call resumed it at the last step.
    fsdp = report["fsdp"]
    assert fsdp["model"] == "qwen2.5-0.5b" and set(fsdp["modes"]) == {"gloo"}
    gloo = fsdp["modes"]["gloo"]
    assert gloo["error"] == "" and gloo["backend_seen"] == ["gloo"]
    assert gloo["sharded_checkpoint"] and gloo["resumed"] and gloo["resumed_steps"] == [2]
    assert gloo["update_tokens_per_s"] > 0 and gloo["released"]
    assert set(report["models"]) == {"qwen2.5-0.5b", "qwen2.5-1.5b"}
    for name, m in report["models"].items():
        assert set(m) == {
            "arch", "config", "plan", "tokenizer", "memory", "throughput", "checkpoint", "runs"
        }, name  # fmt: skip
        # The plan counts the parameters torch built from the saved config.json.
        assert m["arch"]["params"] == m["arch"]["plan_params"]
        # Every phase's metric travelled trainer/runner → sink → report, with a plan figure.
        assert set(m["memory"]) == set(M.MEMORY_PHASES)
        for phase, row in m["memory"].items():
            assert row["seen"], phase
            assert row["plan_gib"] > 0 and row["measured_gib"] is None  # no CUDA counter here
        assert m["throughput"]["rollout_tokens_per_s"] > 0
        assert m["throughput"]["update_tokens_per_s"] > 0
        # Run 1 stopped at step 1 with a checkpoint; run 2, same process, resumed at step 2.
        assert m["checkpoint"]["saved"] and m["checkpoint"]["resumed"]
        assert m["checkpoint"]["resumed_steps"] == [2]
        assert m["runs"]["second_started"] and m["runs"]["released"]
    # The async section: the 0.5B shape's run again with rollouts overlapping the update;
    # every phase's metric arrived, it resumed, and no sample lagged past k + 1.
    asyn = report["async"]
    assert asyn["model"] == "qwen2.5-0.5b"
    assert (asyn["config"]["mode"], asyn["config"]["max_staleness"]) == ("async", 1)
    assert all(row["seen"] for row in asyn["memory"].values())
    assert asyn["checkpoint"]["resumed"] and asyn["checkpoint"]["resumed_steps"] == [2]
    assert asyn["throughput"]["step_s"] > 0 and asyn["throughput"]["staleness_max"] <= 2
    assert asyn["throughput"]["trainer_idle_s"] is not None
    sync_update = report["models"]["qwen2.5-0.5b"]["memory"]["update"]["plan_gib"]
    assert asyn["memory"]["update"]["plan_gib"] > sync_update  # generation during the update
    heads = report["bf16_head"]
    assert {h["targets"] for h in heads} == {"uniform", "sampled"}
    assert all(h["within_cpu_bound"] for h in heads)
    md = (out / "gpu_check.md").read_text()
    assert "DRY RUN" in md and "| qwen2.5-1.5b | update | metric arrived |" in md
    assert "Async rollouts (qwen2.5-0.5b shape" in md and "| async | " in md
    assert "Problems: none" in md


def test_without_cuda_it_says_so_and_points_to_the_dry_run(
    module: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(module.torch.cuda, "is_available", lambda: False)
    assert module.main(["--out", "unused"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no CUDA GPU" in err and "--dry-run" in err and "DRY=1" in err
    assert "\n" not in err


def test_plan_phases_compare_tensors_only(module: ModuleType) -> None:
    # One worker, hf engine, on an 80 GB GPU: the context and the fragmentation allowance are not
    # tensors max_memory_allocated sees, so no phase counts them.
    cfg = preset_config("qwen2.5-0.5b").with_overrides({"rollout.engine": "hf"})
    plan = plan_memory(cfg, 1, 79.0)
    phases = module.plan_phases(plan)
    resident = plan.item("masters").nbytes + plan.item("adam").nbytes
    update = sum(plan.item(k).nbytes for k in ("weights", "grads", "activations", "head"))
    update += plan.item("backward").nbytes
    assert phases["update"]["plan_gib"] == pytest.approx((resident + update) / GIB)
    # One worker samples under autocast, which keeps compute-dtype copies of the Linear weights.
    sampling = plan.item("kv_hf").nbytes + plan.item("rollout_weights").nbytes
    assert phases["rollout"]["plan_gib"] == pytest.approx((resident + sampling) / GIB)
    assert phases["load"]["plan_gib"] == pytest.approx(plan.item("masters").nbytes / GIB)
    for row in phases.values():
        assert not {"context", "fragmentation", "colocation"} & set(row["plan_items"])


def test_async_plan_phases_hold_generation_inside_the_update(module: ModuleType) -> None:
    cfg = preset_config("qwen2.5-0.5b").with_overrides(
        {"rollout.engine": "hf", "rollout.mode": "async"}
    )
    plan = plan_memory(cfg, 1, 79.0)
    phases = module.plan_phases(plan)
    resident = sum(plan.item(k).nbytes for k in ("masters", "adam", "async_copy", "snapshot"))
    update = sum(plan.item(k).nbytes for k in ("weights", "grads", "activations", "head"))
    update += plan.item("backward").nbytes
    sampling = plan.item("kv_hf").nbytes + plan.item("rollout_weights").nbytes
    assert phases["update"]["plan_gib"] == pytest.approx((resident + update + sampling) / GIB)
    assert {"kv_hf", "async_copy", "snapshot"} <= set(phases["update"]["plan_items"])
    assert phases["rollout"]["plan_gib"] == pytest.approx((resident + sampling) / GIB)


def test_the_dry_run_shrinks_the_shape_but_keeps_the_family(module: ModuleType) -> None:
    real = module.check_architecture("qwen2.5-1.5b", dry_run=False)
    dry = module.check_architecture("qwen2.5-1.5b", dry_run=True)
    assert (real.layers, real.hidden, real.vocab) == (28, 1536, 151936)
    assert dry.qkv_bias and dry.tie_embeddings == real.tie_embeddings
    assert dry.kv_heads < dry.heads  # grouped-query attention, like Qwen2.5
    assert dry.params < 1e6


def test_a_failing_section_is_reported_and_the_others_still_run(
    module: ModuleType, tmp_path: Path
) -> None:
    # A first GPU run is scarce: one section's error must not cost the rest of the report.
    code = module.main(
        [
            "--dry-run",
            "--out",
            str(tmp_path),
            "--models",
            "no-such-preset",
            "--fsdp-model",
            "",
            "--async-model",
            "",
        ]
    )
    assert code == 1
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert set(report["errors"]) == {"no-such-preset"}
    assert "unknown preset" in report["errors"]["no-such-preset"]["error"]
    assert report["problems"][0].startswith("no-such-preset: ConfigError")
    assert len(report["bf16_head"]) == 2  # the section after it ran


MEASURED = {
    "h200-0.5b": ROOT / "bench" / "gpu" / "h200-2026-11-26.json",
    "h100-1.5b": ROOT / "bench" / "gpu" / "h100-2026-11-26-1.5b.json",
    "h100-0.5b-default": ROOT / "bench" / "gpu" / "h100-2026-11-26-0.5b-default.json",
}
"""`make gpu-check` on a GPU, torch 2.11.0+cu130: the qwen2.5-0.5b shape on an NVIDIA H200 and the
qwen2.5-1.5b shape on an NVIDIA H100, each at 8 prompts × 8 responses of 256 tokens, and the
0.5b shape on the H100 at the check's defaults (16 prompts × 8 responses of 512 tokens);
torch.cuda.max_memory_allocated per phase (bench/RESULTS.md)."""


@pytest.mark.parametrize("card", sorted(MEASURED))
def test_the_plan_covers_each_phase_a_gpu_measured(module: ModuleType, card: str) -> None:
    # Before the autocast copies were planned, the H200's rollout phase measured 1.17x its plan;
    # before the decode attention was, the H100's at the default shapes measured 1.14x.
    report = json.loads(MEASURED[card].read_text())
    rec = report["meta"]["args"]
    args = module.parse_args(
        [
            f"--{k.replace('_', '-')}={rec[k]}"
            for k in ("prompts", "group_size", "prompt_len", "response_len", "steps")
        ]
    )
    for name, m in report["models"].items():
        cfg = module.check_config(name, Path("unused"), args).with_overrides(
            {"model.name_or_path": preset_config(name).model.name_or_path}
        )
        plan = plan_memory(cfg, 1, m["plan"]["gpu_gib"])
        for phase, row in module.plan_phases(plan).items():
            measured = m["memory"][phase]["measured_gib"]
            # 5%: the buffers and cuBLAS workspaces no item models (~0.07 GiB at load).
            assert measured <= 1.05 * row["plan_gib"], (name, phase, measured, row["plan_gib"])
        update = module.plan_phases(plan)["update"]["plan_gib"]
        # ... and the largest phase's plan is not far above what it measured either.
        assert m["memory"]["update"]["measured_gib"] >= 0.9 * update
