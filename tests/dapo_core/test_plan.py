"""`dapo plan`: the memory model's arithmetic by hand, the estimate against the measured peak of
real training updates on CPU, the check before a GPU run, and every preset on its own GPUs.

Run as a script (`python tests/dapo_core/test_plan.py SPEC_JSON`) this file is the measuring
subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dapo_core.setup.architectures import resolve_architecture
from dapo_core.setup.config import ExperimentConfig, ModelConfig
from dapo_core.setup.plan import (
    GIB,
    VLLM_OVERHEAD_GIB,
    PlanError,
    activations,
    check_fits,
    layer_activation_bytes,
    min_workers,
    plan_memory,
)
from dapo_core.setup.presets import HARDWARE, PRESETS, preset_config

ROOT = Path(__file__).resolve().parents[2]


def qwen(name: str, **overrides: Any) -> ExperimentConfig:
    return preset_config("qwen2.5-7b").with_overrides({"model.name_or_path": name, **overrides})


# --- architectures ------------------------------------------------------------------------------
def test_known_qwen25_parameter_counts_by_hand() -> None:
    a7 = resolve_architecture(ModelConfig(name_or_path="Qwen/Qwen2.5-7B-Instruct"))
    # Qwen2.5-7B: embedding 152064·3584 = 544,997,376, and an untied head of the same size.
    # One layer: q 3584·3584 + 3584 = 12,848,640; k and v 3584·512 + 512 = 1,835,520 each;
    # o 12,845,056; MLP 3·3584·18944 = 203,685,888; two norms 7,168 → 233,057,792.
    # 28 layers 6,525,618,176 + 2 · 544,997,376 + final norm 3,584 = 7,615,616,512.
    assert a7.layer_params == 233_057_792
    assert a7.params == 7_615_616_512
    # Qwen2.5-0.5B (tied): 24 · 14,912,384 + 151936·896 (136,134,656) + 896 = 494,032,768.
    assert resolve_architecture(ModelConfig(name_or_path="Qwen/Qwen2.5-0.5B")).params == (
        494_032_768
    )
    # Qwen2.5-32B: 64 · 487,605,248 + 2 · 152064·5120 + 5120 = 32,763,876,352.
    assert resolve_architecture(ModelConfig(name_or_path="Qwen/Qwen2.5-32B")).params == (
        32_763_876_352
    )
    assert a7.name == "Qwen/Qwen2.5-7B-Instruct"  # the user's spelling, not the table's key


def write_config(directory: Path, **values: Any) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(values))
    return directory


def test_a_model_directory_config_json_wins(tmp_path: Path) -> None:
    d = write_config(
        tmp_path / "m",
        model_type="llama",
        num_hidden_layers=3,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
        tie_word_embeddings=True,
    )
    a = resolve_architecture(ModelConfig(name_or_path=str(d)))
    assert (a.layers, a.hidden, a.kv_heads, a.vocab, a.tie_embeddings) == (3, 64, 2, 1000, True)
    assert not a.qkv_bias and a.source.endswith("config.json")
    # Per layer: q 64·64 = 4,096, k and v 64·32 = 2,048 each, o 4,096, MLP 3·64·128 = 24,576,
    # norms 128 → 36,992; 3 layers 110,976 + embedding 64,000 (tied) + final norm 64 = 175,040.
    assert a.layer_params == 36_992
    assert a.params == 175_040


def test_the_hub_cache_is_read_before_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants

    repo = tmp_path / "models--Qwen--Qwen2.5-0.5B"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    write_config(
        repo / "snapshots" / "abc123",
        model_type="qwen2",
        num_hidden_layers=2,  # not the real 24: proves the cache was read
        hidden_size=896,
        intermediate_size=4864,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    )
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    a = resolve_architecture(ModelConfig(name_or_path="Qwen/Qwen2.5-0.5B"))
    assert a.layers == 2 and a.qkv_bias and "snapshots" in a.source


def test_unknown_models_and_tiny() -> None:
    with pytest.raises(ValueError, match="architecture is unknown offline") as info:
        resolve_architecture(ModelConfig(name_or_path="nobody/no-such-model-xyz"))
    assert "\n" not in str(info.value)
    with pytest.raises(FileNotFoundError, match=r"model path \./no/such/dir does not exist"):
        resolve_architecture(ModelConfig(name_or_path="./no/such/dir"))
    tiny = resolve_architecture(preset_config("tiny").model)
    # The tiny model: 4 special tokens + 96 characters, multi-head, tied (dapo_core.models).
    assert (tiny.vocab, tiny.kv_heads, tiny.heads, tiny.tie_embeddings) == (100, 4, 4, True)


# --- the arithmetic -----------------------------------------------------------------------------
def test_full_finetuning_is_16_bytes_per_parameter_before_activations() -> None:
    cfg = preset_config("qwen2.5-7b")
    one = plan_memory(cfg, 1, 79.0)
    p = 7_615_616_512
    # fp32 masters 4 B + fp32 gradients 4 B + AdamW's two fp32 moments 8 B = 16 B per parameter:
    # 16 · 7,615,616,512 = 121,849,864,192 B = 113.5 GiB > one 80 GB GPU before anything else.
    state = sum(one.item(k).nbytes for k in ("masters", "grads", "adam"))
    assert state == 16 * p == 121_849_864_192
    assert not one.fits
    # Eight workers shard it: 121,849,864,192 / 8 = 15,231,233,024 B = 14.2 GiB each.
    eight = plan_memory(cfg, 8, 79.0)
    assert sum(eight.item(k).nbytes for k in ("masters", "grads", "adam")) == 15_231_233_024
    assert eight.fits
    # What the preset's doc quotes (5 before NCCL buffers and vLLM's graphs were counted).
    assert min_workers(cfg, 79.0) == 6


def test_layer_activations_by_hand() -> None:
    a7 = resolve_architecture(ModelConfig(name_or_path="Qwen/Qwen2.5-7B"))
    # FSDP2 bf16, one unpadded sequence, per token: norms 2·(4·3584 + 2·3584) = 43,008;
    # Linear inputs 2·2·3584 = 14,336; attention 2·(2·3584 + 2·512) + 4·28 = 16,496 (k, v at
    # the 4 KV heads); MLP 4·2·18944 = 151,552 → 225,392 bytes.
    assert layer_activation_bytes(a7, "fsdp", 2, padded=False, seq_len=10240) == 225_392
    a05 = resolve_architecture(ModelConfig(name_or_path="Qwen/Qwen2.5-0.5B"))
    # Autocast bf16, padded micro-batch of 5120 tokens: norms 2·(4·896 + 4·896) = 14,336;
    # 5 casts of the norm output 5·2·896 = 8,960; attention 2·(4·896) + 4·14 + mask 2·5120 =
    # 17,464 (k, v repeated to 14 heads); MLP 8·4864 = 38,912 → 79,672 bytes.
    assert layer_activation_bytes(a05, "autocast", 2, padded=True, seq_len=5120) == 79_672
    # Checkpointed, each layer keeps only its input: 28 layers · 2 B · 3584 per token, and the
    # final norm's 8 + 4·3584 + 2·3584 = 21,512; over 10,240 tokens.
    act = activations(a7, "fsdp", 2, 1, 10240, 8192, checkpointing=True)
    assert act.saved == 10240 * (28 * 2 * 3584 + 21_512)


def test_vllm_share_is_reserved_and_its_kv_cache_counted() -> None:
    plan = plan_memory(preset_config("qwen2.5-7b"), 8, 79.0)
    share = 0.5 * 79 * GIB  # gpu_memory_utilization 0.5 of the GPU, for the whole run
    assert plan.item("engine").nbytes == share
    # KV cache: the share less bf16 weights 2 · 7,615,616,512 and vLLM's 2 GiB of overhead;
    # per token K and V of 28 layers · 4 heads · 128 dims in bf16: 2·28·512·2 = 57,344 B.
    kv = share - 15_231_233_024 - VLLM_OVERHEAD_GIB * GIB
    assert plan.kv_tokens == pytest.approx(kv / 57_344)
    assert round(plan.kv_tokens) == 436_560  # 42.6 sequences of 2048 + 8192 tokens
    small = plan_memory(
        qwen("Qwen/Qwen2.5-7B-Instruct", **{"rollout.gpu_memory_utilization": 0.15}), 8, 79.0
    )
    # Needed: (15,231,233,024 + 2 GiB + 10,240 · 57,344) / 79 GiB = 0.2118 → 0.22.
    assert not small.fits
    assert "rollout.gpu_memory_utilization >= 0.22" in small.problems[-1]


def test_advice_names_workers_gpu_and_biggest_items() -> None:
    from dapo_core.setup.plan import advice

    cfg = preset_config("qwen2.5-7b")
    line = advice(plan_memory(cfg, 2, 79.0), cfg)
    assert line.startswith("does not fit: needs at least 6 workers of 79 GiB (biggest items")
    assert "vLLM engine share" in line
    # The 32B paper preset: no count of 80 GB GPUs holds a worker's unsharded 61 GiB engine.
    paper = preset_config("paper")
    line = advice(plan_memory(paper, 8, 79.0), paper)
    assert line.startswith("does not fit: needs at least 45 workers of 139 GiB (141 GB H200)")
    assert "gpu_memory_utilization" in line and "\n" not in line


def test_cpu_offload_moves_the_sharded_state_to_the_host() -> None:
    cfg = qwen("Qwen/Qwen2.5-7B-Instruct", **{"model.cpu_offload": True})
    plan = plan_memory(cfg, 2, 79.0)
    on_host = {i.key for i in plan.items if i.on_host}
    assert {"masters", "grads", "adam"} <= on_host
    assert plan.item("step").nbytes == 0  # the optimizer steps on the host
    # Host per worker: the larger of the offloaded 16 B · P / 2 and the whole fp32 model while
    # loading, 4 B · P: 60,924,932,096 B.
    assert plan.host_bytes == 8 * 7_615_616_512


def test_check_fits_refuses_a_gpu_run_in_one_line() -> None:
    cfg = preset_config("qwen2.5-7b")
    with pytest.raises(PlanError) as info:
        check_fits(cfg, workers=1, gpu_memory_gib=79.0)
    message = str(info.value)
    assert "\n" not in message
    assert "qwen2.5-7b/grpo on 1 worker(s): does not fit: needs at least 6 workers" in message
    assert check_fits(cfg, workers=8, gpu_memory_gib=79.0) is not None
    # Not a GPU run: nothing to check.
    assert check_fits(cfg.with_overrides({"run.device": "cpu"}), workers=1) is None


def test_dapo_train_refuses_a_gpu_run_that_cannot_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from dapo_core.setup import plan
    from dapo_lab.cli import main

    monkeypatch.setattr(plan, "_cuda_memory_gib", lambda: 79.0)  # as on one 80 GB GPU
    out = tmp_path / "run"
    assert main(["train", "--preset", "qwen2.5-7b", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: qwen2.5-7b/dapo on 1 worker(s): does not fit: needs at least 6")
    assert "\n" not in err
    assert not out.exists()  # refused before anything was written


def test_constants_match_the_code_they_describe() -> None:
    import inspect

    from dapo_core.engines import hf
    from dapo_core.setup import plan

    default = inspect.signature(hf.HFEngine.__init__).parameters["max_batch_seqs"].default
    assert default == plan.HF_MAX_BATCH_SEQS


# --- presets --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(HARDWARE))
def test_every_preset_fits_the_gpus_its_doc_names(name: str) -> None:
    hw = HARDWARE[name]
    plan = plan_memory(preset_config(name, "dapo"), hw.workers, hw.gpu_memory_gib)
    assert plan.fits, plan.problems


def test_every_gpu_preset_names_its_gpus() -> None:
    gpu_presets = {n for n in PRESETS if preset_config(n).run.device == "cuda"}
    assert gpu_presets == set(HARDWARE)
    # The six-arm ladder of each small model on one 8-GPU node: one GPU per arm.
    assert HARDWARE["qwen2.5-0.5b"].workers == HARDWARE["qwen2.5-1.5b"].workers == 1
    assert HARDWARE["qwen2.5-0.5b"].gpu_memory_gib == 79.0


def test_dapo_plan_answers_for_every_preset(capsys: pytest.CaptureFixture[str]) -> None:
    from dapo_lab.cli import main

    for name in PRESETS:
        assert main(["plan", "--preset", name]) == 0, name
        out = capsys.readouterr().out
        assert out.rstrip().splitlines()[-1].startswith("fits: ")
        assert "activations, one micro-batch" in out and "log-prob head (chunked)" in out
    assert main(["plan", "--preset", "qwen2.5-7b", "--workers", "1"]) == 2
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert last.startswith("does not fit: needs at least 6 workers of 79 GiB")


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--gpu-memory", "-3"], "not a positive number"),
        (["--workers", "0"], "not a positive integer"),
    ],
)
def test_dapo_plan_bad_flags_are_one_line(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from dapo_lab.cli import main

    with pytest.raises(SystemExit) as info:
        main(["plan", "--preset", "qwen2.5-7b", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--set", "batch.micro_batch_size=two"], "expected an integer"),
        (["--model", "nobody/no-such-model-xyz"], "architecture is unknown offline"),
    ],
)
def test_dapo_plan_bad_values_are_one_line(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from dapo_lab.cli import main

    assert main(["plan", "--preset", "qwen2.5-7b", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err


# --- the estimate against measured peaks ----------------------------------------------------------
# Small real models, one real training update each (two micro-batches accumulated, then clip
# and AdamW, as dapo_core.train.update does), measured in a subprocess. The measurement is the
# process's peak resident memory (VmHWM, reset through /proc/self/clear_refs) above a baseline:
#   - glibc serves every allocation of 64 KiB or more with its own mmap (MALLOC_MMAP_THRESHOLD_,
#     which also stops the threshold from adapting), so freed tensors leave RSS at once and the
#     high-water mark follows the bytes of live tensors;
#   - a throwaway one-layer copy of the model runs one update on short sequences first, so the
#     code pages of the kernels are resident before the baseline and the delta counts tensors;
#   - one update creates AdamW's states, then the high-water mark is reset and the next update
#     is measured: the plan's masters + AdamW states + its largest phase.
# Compared with Plan.training_bytes (no engine, no CUDA context) on device "cpu" (AdamW steps
# one tensor at a time there). Each spec is a config.json the plan reads like a model directory.
SPECS: list[dict[str, Any]] = [
    # Qwen2 with GQA and an untied head, float32, no checkpointing: activations dominate.
    dict(
        config=dict(
            model_type="qwen2",
            num_hidden_layers=4,
            hidden_size=256,
            intermediate_size=704,
            num_attention_heads=8,
            num_key_value_heads=2,
            vocab_size=8192,
            tie_word_embeddings=False,
        ),
        dtype="float32",
        checkpointing=False,
        seqs=4,
        prompt=64,
        response=192,
    ),
    # Llama, multi-head, tied, gradient checkpointing: the recomputed layer dominates.
    dict(
        config=dict(
            model_type="llama",
            num_hidden_layers=4,
            hidden_size=384,
            intermediate_size=1024,
            num_attention_heads=6,
            num_key_value_heads=6,
            vocab_size=4096,
            tie_word_embeddings=True,
        ),
        dtype="float32",
        checkpointing=True,
        seqs=2,
        prompt=64,
        response=256,
    ),
    # Qwen2 tied, bfloat16 autocast over float32 masters (one worker's mixed precision).
    dict(
        config=dict(
            model_type="qwen2",
            num_hidden_layers=4,
            hidden_size=256,
            intermediate_size=768,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=16384,
            tie_word_embeddings=True,
        ),
        dtype="bfloat16",
        checkpointing=False,
        seqs=8,
        prompt=32,
        response=96,
    ),
]


def spec_config(spec: dict[str, Any], model_dir: Path) -> ExperimentConfig:
    return ExperimentConfig().with_overrides(
        {
            "model.name_or_path": str(model_dir),
            "model.dtype": spec["dtype"],
            "model.gradient_checkpointing": spec["checkpointing"],
            "rollout.max_prompt_len": spec["prompt"],
            "rollout.max_response_len": spec["response"],
            "algo.overlong_cache_len": 8,
            "batch.micro_batch_size": spec["seqs"],
            "optim.weight_decay": 0.1,
        }
    )


def test_estimate_matches_measured_peak_of_real_updates(tmp_path: Path) -> None:
    jobs = []
    for i, spec in enumerate(SPECS):
        model_dir = write_config(tmp_path / f"m{i}", **spec["config"])
        jobs.append({**spec, "dir": str(model_dir)})
    env = dict(
        os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="65536", MALLOC_ARENA_MAX="1"
    )
    proc = subprocess.run(
        [sys.executable, __file__, json.dumps(jobs)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    measured = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(measured) == len(SPECS)
    report = []
    for spec, job, m in zip(SPECS, jobs, measured, strict=True):
        plan = plan_memory(spec_config(spec, Path(job["dir"])), 1, 80.0, device="cpu")
        assert plan.arch.params == m["params"]  # the plan counts the parameters torch builds
        ratio = plan.training_bytes / m["peak"]
        report.append(
            f"{spec['config']['model_type']} {spec['dtype']} ckpt={spec['checkpointing']}: "
            f"estimated {plan.training_bytes / 2**20:.1f} MiB, measured {m['peak'] / 2**20:.1f} "
            f"MiB ({ratio:.2f})"
        )
        assert 0.75 <= ratio <= 1.25, report[-1]
    print("\n".join(report))


# --- the measuring subprocess ---------------------------------------------------------------------
def _rss(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _measure(job: dict[str, Any]) -> dict[str, Any]:
    import gc

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from dapo_core.algo.losses import policy_loss
    from dapo_core.train.batching import Seq, pack
    from dapo_core.train.policy import PolicyForward, compute_dtype
    from dapo_core.train.update import make_optimizer

    torch.manual_seed(0)
    cfg = spec_config(job, Path(job["dir"]))
    b, prompt, response = job["seqs"], job["prompt"], job["response"]
    gen = torch.Generator().manual_seed(0)
    seqs = []
    for i in range(2 * b):
        # Every sequence at the full budget but one a token short: padded, the plan's worst case.
        r = response - 1 if i % b == b - 1 else response
        ids = torch.randint(3, job["config"]["vocab_size"], (prompt + r,), generator=gen).tolist()
        seqs.append(Seq(0, ids[:prompt], ids[prompt:], False, 1.0 if i % 2 else -1.0))
    hf_config = AutoConfig.from_pretrained(job["dir"])

    def build(layers: int | None = None) -> tuple[Any, Any, Any]:
        config = hf_config
        if layers is not None:
            config = AutoConfig.from_pretrained(job["dir"], num_hidden_layers=layers)
        model = AutoModelForCausalLM.from_config(config).float().train()
        if job["checkpointing"]:
            model.gradient_checkpointing_enable()
        optimizer, _ = make_optimizer(cfg, model)
        return (
            model,
            optimizer,
            PolicyForward(model, compute_dtype=compute_dtype(job["dtype"]), temperature=1.0),
        )

    def update(model: Any, optimizer: Any, fwd: Any, batch: list[Seq] = seqs) -> None:
        for m in range(2):  # two micro-batches: the second runs with every gradient allocated
            packed = pack(batch[m * b : (m + 1) * b], 0, "cpu")
            lp, _ = fwd(packed)
            loss, _ = policy_loss(
                lp,
                lp.detach(),
                torch.ones(b),
                packed.response_mask,
                clip_low=0.2,
                clip_high=0.28,
                agg="token-mean",
                num_tokens=float(2 * packed.response_mask.sum()),
            )
            loss.backward()
            del lp, loss
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    # A throwaway one-layer copy on short, padded sequences runs the same kernels first.
    short = [
        Seq(0, x.prompt_ids[:8], x.response_ids[: 16 - i % 2], False, 1.0)
        for i, x in enumerate(seqs)
    ]
    update(*build(layers=1), batch=short)
    gc.collect()
    base = _rss("VmRSS")
    model, optimizer, fwd = build()
    update(model, optimizer, fwd)  # AdamW's states now exist
    gc.collect()
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # the high-water mark restarts from the current RSS
    update(model, optimizer, fwd)
    peak = _rss("VmHWM") - base
    params = sum(p.numel() for p in model.parameters())
    del model, optimizer, fwd
    gc.collect()
    return {"peak": peak, "params": params}


if __name__ == "__main__":
    for job in json.loads(sys.argv[1]):
        print(json.dumps(_measure(job)), flush=True)
