"""`dapo plan`: the items a first GPU run meets that the plan used to leave out (issue 22), by hand.

NCCL's buffers (workers > 1 on GPU), vLLM's CUDA graphs and sampler scratch (engine vllm), the
margin for one allocator shared by vLLM and training, and the margin line of the plan's output.
"""

from __future__ import annotations

import pytest

from dapo_core.setup.plan import GIB, NCCL_BUFFER_BYTES, Plan, format_plan, plan_memory
from dapo_core.setup.presets import preset_config

NEW = ("nccl", "vllm_graphs", "vllm_sampler", "colocation")


def keys(plan: Plan) -> set[str]:
    return {i.key for i in plan.items}


def test_nccl_buffers_by_hand_only_for_many_workers_on_gpu() -> None:
    # Per channel and peer: Simple 4 MiB = 4,194,304 + LL128 120·640·8·8 = 4,915,200
    # + LL 8·512·8·16 = 524,288 → 9,633,792 B; × 32 channels × 2 ring peers = 616,562,688 B.
    assert NCCL_BUFFER_BYTES == 9_633_792
    cfg = preset_config("qwen2.5-7b")
    eight = plan_memory(cfg, 8, 79.0)
    nccl = eight.item("nccl")
    assert nccl.nbytes == 616_562_688 and nccl.phases == ("resident",)
    assert "nccl" not in keys(plan_memory(cfg, 1, 79.0))  # one worker: no communicator
    assert "nccl" not in keys(plan_memory(cfg, 8, 79.0, device="cpu"))  # gloo, host memory


def test_vllm_graphs_sit_outside_the_share_for_the_whole_run() -> None:
    plan = plan_memory(preset_config("qwen2.5-0.5b"), 1, 79.0)
    graphs = plan.item("vllm_graphs")
    assert graphs.nbytes == 1 * GIB and graphs.phases == ("resident",)
    # The engine's reserved share is what it was: 0.3 × 79 GiB.
    assert plan.item("engine").nbytes == 0.3 * 79 * GIB


def test_vllm_sampler_scratch_by_hand() -> None:
    # qwen2.5-0.5b, one worker: 96 prompts × G 16 = 1,536 rows, capped at vLLM's max_num_seqs
    # 1,024; × vocab 151,936 × 12 B (logits, processed log-probs, probabilities) = 1,866,989,568.
    cfg = preset_config("qwen2.5-0.5b")
    sampler = plan_memory(cfg, 1, 79.0).item("vllm_sampler")
    assert sampler.nbytes == 1_866_989_568 and sampler.phases == ("rollout",)
    # top_p < 1: the sort's values (4 B) and int64 indices (8 B) double it: 3,733,979,136.
    top_p = plan_memory(cfg.with_overrides({"rollout.top_p": 0.9}), 1, 79.0)
    assert top_p.item("vllm_sampler").nbytes == 3_733_979_136
    # qwen2.5-7b on 8 workers: ceil(192 / 8) = 24 prompts × 16 = 384 rows (under the cap);
    # × 152,064 × 12 = 700,710,912 B.
    seven = plan_memory(preset_config("qwen2.5-7b"), 8, 79.0)
    assert seven.item("vllm_sampler").nbytes == 700_710_912


def test_colocation_margin_is_three_percent_of_the_gpu() -> None:
    # 0.03 × 79 GiB = 2,544,768,122.88 B; 0.03 × 139 GiB on an H200.
    cfg = preset_config("qwen2.5-1.5b")
    assert plan_memory(cfg, 1, 79.0).item("colocation").nbytes == pytest.approx(2_544_768_122.88)
    assert plan_memory(cfg, 1, 139.0).item("colocation").nbytes == pytest.approx(0.03 * 139 * GIB)


def test_the_hf_engine_and_cpu_plans_have_none_of_them() -> None:
    hf = preset_config("qwen2.5-0.5b").with_overrides({"rollout.engine": "hf"})
    assert not keys(plan_memory(hf, 1, 79.0)) & set(NEW)
    assert not keys(plan_memory(preset_config("qwen2.5-0.5b"), 1, 79.0, device="cpu")) & set(NEW)


def test_resident_items_add_to_the_peak_and_the_sampler_only_to_the_rollout_phase() -> None:
    plan = plan_memory(preset_config("qwen2.5-7b"), 8, 79.0)
    gpu = plan.gpu_items
    resident = sum(i.nbytes for i in gpu if "resident" in i.phases)
    update = sum(i.nbytes for i in gpu if "update" in i.phases)
    rollout = sum(i.nbytes for i in gpu if "rollout" in i.phases)
    assert rollout == plan.item("vllm_sampler").nbytes < update  # generation is not the peak
    assert plan.peak_bytes == pytest.approx(resident + update)
    # Without the three resident newcomers the peak is what the plan said before issue 22:
    # 73.01 − (0.57 NCCL + 1 graphs + 2.37 margin) = 69.06 GiB (the preset's old "69 of 79").
    added = sum(plan.item(k).nbytes for k in ("nccl", "vllm_graphs", "colocation"))
    assert (plan.peak_bytes - added) / GIB == pytest.approx(69.06, abs=0.01)


def test_the_plan_output_says_the_margin() -> None:
    cfg = preset_config("qwen2.5-0.5b")
    plan = plan_memory(cfg, 1, 79.0)
    assert plan.margin_bytes == 79 * GIB - plan.peak_bytes > 0
    text = format_plan(plan, cfg)
    line = next(x for x in text.splitlines() if x.strip().startswith("margin"))
    assert f"{plan.margin_bytes / GIB:.2f}" in line
    assert f"({plan.margin_bytes / (79 * GIB):.0%} of the GPU)" in line
    # The allowances (estimates of waste, not tensors) are named with their sizes.
    assert f"vLLM + training margin {plan.item('colocation').nbytes / GIB:.2f}" in line
    assert "allocator fragmentation" in line
    for label in ("vLLM CUDA graphs", "vLLM sampler scratch", "vLLM + training margin"):
        assert label in text
    # A plan that does not fit shows a negative margin rather than hiding it.
    tight = plan_memory(cfg, 1, 40.0)
    assert not tight.fits and tight.margin_bytes < 0
    # CPU plans have no margin line: no allocator to share.
    assert "margin" not in format_plan(plan_memory(cfg, 1, 79.0, device="cpu"), cfg)


def test_what_a_cpu_process_measures_leaves_them_out() -> None:
    # training_bytes is the peak without the engine and the GPU runtime: one worker on vLLM and
    # on hf train the same tensors, so the new vLLM items must not leak into it.
    cfg = preset_config("qwen2.5-0.5b")
    vllm = plan_memory(cfg, 1, 79.0)
    hf = plan_memory(cfg.with_overrides({"rollout.engine": "hf"}), 1, 79.0)
    assert {"vllm_graphs", "vllm_sampler", "colocation"} <= keys(vllm)
    assert vllm.training_bytes == hf.training_bytes


# --- the rollout engine on a GPU of its own (`--rollout-actor`) --------------------------------
ENGINE_ITEMS = {"engine", "rollout_copy", "kv_hf", "rollout_weights"} | set(NEW) - {"nccl"}


def test_a_trainer_whose_engine_runs_apart_holds_none_of_the_engines_items() -> None:
    from dapo_core.setup.plan import _fragmentation

    for name, workers in (("qwen2.5-0.5b", 1), ("qwen2.5-7b", 8)):
        for engine in ("vllm", "hf"):
            cfg = preset_config(name).with_overrides({"rollout.engine": engine})
            together = plan_memory(cfg, workers, 79.0)
            apart = plan_memory(cfg, workers, 79.0, engine_apart=True)
            assert keys(together) & ENGINE_ITEMS and not keys(apart) & ENGINE_ITEMS
            # What training holds is the same (training_bytes counts N workers' rollout copy,
            # which the trainer no longer holds); the peak loses what the engine held.
            copy = together.item("rollout_copy").nbytes if "rollout_copy" in keys(together) else 0
            assert apart.training_bytes == together.training_bytes - copy
            assert apart.peak_bytes < together.peak_bytes
            # The rest is the colocated plan less the engine's items, item for item.
            kept = [i for i in together.items if i.key not in ENGINE_ITEMS | {"fragmentation"}]
            assert [i for i in apart.items if i.key not in {"shipped", "fragmentation"}] == kept
            assert apart.item("fragmentation") == _fragmentation(kept)
            # Each update's weights reach the engine through the host: one worker's fp32
            # masters (0.5B: 4 B × 494,032,768), eight workers' bf16 gathers (7B: 2 B × 7.6B).
            shipped = apart.item("shipped")
            assert shipped.on_host and shipped.phases == ("sync",)
            per_param = 4 if workers == 1 else 2
            assert shipped.nbytes == per_param * apart.arch.params


def test_the_engines_own_gpu_by_hand() -> None:
    from dapo_core.setup.plan import (
        HF_MAX_BATCH_SEQS,
        VLLM_CUDA_GRAPHS_GIB,
        hf_kv_cache,
        plan_rollout_engine,
    )

    # vLLM, Qwen2.5-0.5B, one worker: its 0.3 × 79 GiB share, 1 GiB of graphs and a context,
    # resident; the sampler only while it generates: 64 prompts × 16 samples = 1,024 rows ×
    # 151,936 logits × (12 + 12 for top-p < 1, or 12) B.
    cfg = preset_config("qwen2.5-0.5b")
    plan = plan_rollout_engine(cfg, 1, 79.0)
    assert [i.key for i in plan.items] == ["engine", "vllm_graphs", "vllm_sampler", "context"]
    sampler = plan.item("vllm_sampler")
    rows = min(1024, cfg.batch.gen_batch_size * cfg.rollout.group_size)
    assert sampler.nbytes == rows * 151_936 * (24 if cfg.rollout.top_p < 1 else 12)
    resident = 0.3 * 79 * GIB + VLLM_CUDA_GRAPHS_GIB * GIB + 1 * GIB
    assert plan.peak_bytes == pytest.approx(resident + sampler.nbytes)
    assert plan.fits and plan.kv_tokens > 0

    # hf, one worker in bf16: the shipped fp32 masters (4 B/param), autocast's bf16 copies of
    # the decoder's Linear weights and the LM head, the KV cache of one sampling call.
    hf = cfg.with_overrides({"rollout.engine": "hf"})
    one = plan_rollout_engine(hf, 1, 79.0)
    a = one.arch
    assert [i.key for i in one.items] == ["weights", "rollout_weights", "kv_hf", "context"]
    assert one.item("weights").nbytes == 4 * a.params
    linears = a.layers * (a.layer_params - 2 * a.hidden) + a.vocab * a.hidden
    assert one.item("rollout_weights").nbytes == 2 * linears
    # Two workers: each engine holds its worker's bf16 copy; one sampling call holds at most
    # HF_MAX_BATCH_SEQS rows on either.
    two = plan_rollout_engine(hf, 2, 79.0)
    assert [i.key for i in two.items] == ["weights", "kv_hf", "context"]
    assert two.item("weights").nbytes == 2 * a.params
    assert two.item("kv_hf") == hf_kv_cache(a, HF_MAX_BATCH_SEQS, 5120, 2)


def test_dapo_plan_rollout_actor_plans_both_gpus_and_says_which_does_not_fit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from dapo_lab.cli import main

    assert main(["plan", "--preset", "qwen2.5-7b", "--rollout-actor"]) == 0
    out = capsys.readouterr().out
    assert "the rollout engine in a process of its own (planned below)" in out
    assert "vLLM engine share" in out.split("rollout engine (vllm)")[1]
    assert out.rstrip().splitlines()[-1].startswith("rollout engine fits: ")
    # An engine GPU of 8 GiB cannot hold 7B's 14.19 GiB of bf16 weights in its 0.5 share.
    argv = ["plan", "--preset", "qwen2.5-7b", "--rollout-actor", "--rollout-gpu-memory", "8"]
    assert main(argv) == 2
    out = capsys.readouterr().out.rstrip().splitlines()
    assert [x for x in out if x.startswith("fits: ")]  # the trainer's GPUs still fit
    assert out[-1].startswith("rollout engine does not fit its own 8 GiB GPU: the vLLM engine")
    assert "rollout.gpu_memory_utilization >= " in out[-1]
    assert main(["plan", "--preset", "qwen2.5-7b", "--rollout-gpu-memory", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: --rollout-gpu-memory plans the engine's own GPU: add --rollout-actor"


# --- asynchronous rollouts: generation during the update -------------------------------------
def test_async_holds_the_workers_copy_and_snapshot_and_generates_during_the_update() -> None:
    cfg = preset_config("qwen2.5-0.5b").with_overrides({"rollout.engine": "hf"})
    sync = plan_memory(cfg, 1, 79.0)
    asyn = plan_memory(cfg.with_overrides({"rollout.mode": "async"}), 1, 79.0)
    p = asyn.arch.params
    # One worker: the rollout worker's own fp32 copy and the fp32 snapshot, 4 B/param each.
    assert asyn.item("async_copy").nbytes == asyn.item("snapshot").nbytes == 4 * p
    assert not {"async_copy", "snapshot"} & keys(sync)
    # The update's phase holds the rollout's items too: the peak is resident + update + rollout.
    gpu = asyn.gpu_items
    resident = sum(i.nbytes for i in gpu if "resident" in i.phases)
    update = sum(i.nbytes for i in gpu if "update" in i.phases)
    rollout = sum(i.nbytes for i in gpu if "rollout" in i.phases)
    assert asyn.overlapped and asyn.peak_bytes == pytest.approx(resident + update + rollout)
    assert sync.peak_bytes == pytest.approx(
        sum(i.nbytes for i in sync.gpu_items if "resident" in i.phases)
        + max(sync.phase_bytes(ph) for ph in ("update", "step", "rollout", "sync"))
    )
    # Training itself is the same tensors.
    assert asyn.training_bytes == sync.training_bytes
    # N workers: the snapshot is the gathered bf16 weights; the rollout copy serves the engine.
    eight = plan_memory(
        preset_config("qwen2.5-7b").with_overrides({"rollout.mode": "async"}), 8, 79.0
    )
    assert eight.item("snapshot").nbytes == 2 * eight.arch.params
    assert "async_copy" not in keys(eight)
    # The engine apart: the trainer still snapshots, and nothing generates beside its update.
    apart = plan_memory(cfg.with_overrides({"rollout.mode": "async"}), 1, 79.0, engine_apart=True)
    assert "snapshot" in keys(apart) and "async_copy" not in keys(apart)
    assert not apart.overlapped
    text = format_plan(asyn, cfg.with_overrides({"rollout.mode": "async"}))
    assert "async: generation overlaps the update" in text
