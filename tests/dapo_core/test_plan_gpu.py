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
