"""What a first GPU minute should prove (issue 22), in one script: `make gpu-check`.

For each of the Qwen2.5-0.5B and -1.5B presets' shapes, a random-initialised model (no hub: the
sizes come from dapo_core.setup.architectures, the weights from a seed) trains a few steps on one
worker with the hf engine through the same `dapo_core.train.runner.train` a real run calls, and
this measures:
- peak memory per phase (torch.cuda.max_memory_allocated, reset when each phase starts: load,
  rollout, logprob (the old log-prob pass), update, sync, checkpoint) next to `dapo plan`'s
  tensors for that phase;
- rollout and update tokens/s;
- a checkpoint saved and resumed (a second `train` call continues the first one's run);
- two runs in one process: the second starts, and what the first held is released (failure 1);
- the bf16 log-prob head's gradient against a float32 reference on the device (item 4), beside
  plain bf16 logits' error, at 32k and 152k vocabularies;
- the 0.5B shape as one FSDP2 rank (distributed.train_worker: what each of N workers runs) on
  NCCL, then NCCL with gloo for CPU-offloaded shards: trained, sharded checkpoint, resumed;
- asynchronous rollouts (`rollout.mode = async`, max_staleness 1) on the 0.5B shape, one GPU, the
  hf engine colocated: the same run as its sync section, so the overlap is the two runs' median
  step times side by side, with the idle seconds of each side, the staleness, the memory of
  both sides per phase against `dapo plan`'s async plan, and a resume.
It writes gpu_check.json and gpu_check.md to --out after every section (a run stopped at a time
limit keeps what it measured); a section that fails is recorded and the others still run.

It needs only torch and transformers (tokenizers, safetensors): no vLLM, Ray, Prefect, SQLAlchemy
or Streamlit, no model hub, no `pip install` of this project (it puts the repository on sys.path).
`--dry-run` runs the same steps on the CPU with shrunk Qwen-shaped models (tests/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import math
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # a bare GPU machine runs the working tree, not an install

import torch  # noqa: E402
from torch import nn  # noqa: E402

from dapo_common import metric_names as M  # noqa: E402
from dapo_core.setup.architectures import Architecture, resolve_architecture  # noqa: E402
from dapo_core.setup.config import ExperimentConfig  # noqa: E402
from dapo_core.setup.plan import GIB, MARGIN_ITEMS, Plan, plan_memory  # noqa: E402
from dapo_core.setup.presets import preset_config  # noqa: E402

PRESETS = ("qwen2.5-0.5b", "qwen2.5-1.5b")
PHASES = M.MEMORY_PHASES
NOT_TENSORS = {"context", *MARGIN_ITEMS}
"""Plan items max_memory_allocated cannot see: the CUDA context and the allowances for waste."""
HEAD_BOUND = {"max_rel_error": 1e-3, "max_ratio_to_plain_bf16": 0.1}
"""Item 4 of issue 22: under bf16 autocast the head's backward recomputes its logits in float32
and normalises them by their own log-sum-exp, so its gradient (w.r.t. the hidden states and the
weight, for a given upstream gradient) is float32's: 0 error on the CPU
(tests/dapo_core/test_bf16_head.py) against 0.9-1.5% for plain bf16 logits at logits up to ~30.
Before that fix it normalised by the forward's bf16 log-sum-exp: 1.6-3.3%. On CUDA the check
reports against this bound."""
LEAK_TOLERANCE_GIB = 0.25
"""What may stay allocated after a run ends (cached kernels' workspaces, the RNG state)."""


# --- a random-initialised model at a preset's shape ------------------------------------------------
def check_architecture(preset: str, dry_run: bool) -> Architecture:
    """The preset's architecture (from the table; no hub), or on a dry run a shrunk copy that
    keeps its family: Qwen2 with q/k/v biases, grouped-query attention, tied embeddings."""
    arch = resolve_architecture(preset_config(preset).model)
    if not dry_run:
        return arch
    return dataclasses.replace(
        arch, layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, vocab=2048, head_dim=0
    )


def build_model_dir(arch: Architecture, out: Path, device: str, seed: int = 0) -> int:
    """Save a random-initialised Qwen2 model of `arch` (bfloat16 on disk, as the hub's are) and
    its tokenizer to `out`; returns the parameter count."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from dapo_core.models import build_tiny_tokenizer, quiet_progress

    # The tiny model's tokenizer (characters, `Answer:`) filled to the shape's vocabulary.
    tokenizer = build_tiny_tokenizer(arch.vocab, max_length=1 << 20)
    config = Qwen2Config(
        vocab_size=arch.vocab,
        hidden_size=arch.hidden,
        intermediate_size=arch.intermediate,
        num_hidden_layers=arch.layers,
        num_attention_heads=arch.heads,
        num_key_value_heads=arch.kv_heads,
        tie_word_embeddings=arch.tie_embeddings,
        max_position_embeddings=32768,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    # Built on the device: initialising 1.5B parameters on the host takes a minute.
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    model.to(torch.bfloat16)  # type: ignore[arg-type]
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    with quiet_progress():
        model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    n = sum(p.numel() for p in model.parameters())
    del model
    _release()
    return n


def check_config(preset: str, model_dir: Path, args: argparse.Namespace) -> ExperimentConfig:
    """The preset (arm grpo: no dynamic sampling, so a random model's all-wrong groups still
    train) with its micro-batch, dtype and gradient checkpointing, on the hf engine, with short
    prompts and responses and a small batch so that a step takes seconds."""
    base = preset_config(preset, "grpo")
    mb = base.batch.micro_batch_size if not args.dry_run else 4
    return base.with_overrides(
        {
            "model.name_or_path": str(model_dir),
            "rollout.engine": "hf",
            "rollout.group_size": args.group_size,
            "rollout.max_prompt_len": args.prompt_len,
            "rollout.max_response_len": args.response_len,
            "algo.overlong_cache_len": max(1, args.response_len // 4),
            "batch.train_batch_size": args.prompts,
            "batch.gen_batch_size": args.prompts,
            "batch.mini_batch_size": max(1, args.prompts // 2),
            "batch.micro_batch_size": mb,
            "optim.warmup_updates": 0,
            "data.train": "synthetic",
            "data.eval": "synthetic-eval",
            "data.eval_problems": 4,
            "data.eval_k": 1,
            "data.eval_every": 0,
            "data.prompt_template": "raw",
            "run.steps": args.steps,
            "run.checkpoint_every": 0,
            "run.device": "cpu" if args.dry_run else "cuda",
            "run.num_threads": 2 if args.dry_run else 0,
        }
    )


# --- measuring --------------------------------------------------------------------------------------
class Recorder:
    """A metrics sink (dapo_core.train.protocols.MetricsSink) that keeps everything in memory."""

    def __init__(self) -> None:
        self.metrics: dict[int, dict[str, float]] = {}
        self.evaluations: list[tuple[int, Mapping[str, Any]]] = []

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.metrics[step] = dict(metrics)
        # One line a step on stderr: where a run stopped at a time limit spent its time.
        shown = {k.removeprefix("time/"): v for k, v in metrics.items() if k.startswith("time/")}
        shown |= {k.split("/")[-1] + "_gib": v for k, v in metrics.items() if "peak_mem" in k}
        text = ", ".join(f"{k} {v:.2f}" for k, v in sorted(shown.items()))
        print(f"gpu-check:   step {step}: {text}", file=sys.stderr, flush=True)

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        pass

    def log_evaluation(self, step: int, result: Mapping[str, Any]) -> None:
        self.evaluations.append((step, result))

    def close(self) -> None:
        pass


class DryCuda:
    """torch.cuda's memory calls where there is no CUDA: the dry run sends every phase through
    the same wiring (the trainer's PhaseMemory, the runner's phases, the sink, the report), so a
    phase whose metric never arrives fails here, not on the first GPU; it has no numbers."""

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        pass

    def max_memory_allocated(self, device: Any = None) -> int:
        return 0

    def synchronize(self, device: Any = None) -> None:
        pass


@contextlib.contextmanager
def dry_trainer_memory(cuda_api: Any) -> Iterator[None]:
    """Dry run: the trainer measures its phases as if its device were CUDA, through `cuda_api`."""
    from dapo_core.train import trainer
    from dapo_core.train.memory import PhaseMemory

    original = trainer.PhaseMemory
    trainer.PhaseMemory = lambda device: PhaseMemory(torch.device("cuda"), cuda=cuda_api)  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        trainer.PhaseMemory = original  # type: ignore[misc]


class RunnerPhases:
    """Peaks of the two phases the runner owns (loading the masters, writing a checkpoint),
    measured by wrapping the runner's own functions for the length of one `train` call."""

    def __init__(self, cuda_api: Any) -> None:
        self.cuda = cuda_api
        self.peaks: dict[str, float] = {}
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def around(self, phase: str) -> Iterator[None]:
        self.cuda.synchronize()
        self.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.cuda.synchronize()
            peak = self.cuda.max_memory_allocated() / GIB
            self.peaks[phase] = max(self.peaks.get(phase, 0.0), peak)
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - t0

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        from dapo_core.train import runner

        originals = {name: getattr(runner, name) for name in ("load_masters", "save_checkpoint")}

        def wrap(phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            def measured(*a: Any, **kw: Any) -> Any:
                with self.around(phase):
                    return fn(*a, **kw)

            return measured

        runner.load_masters = wrap("load", originals["load_masters"])  # type: ignore[assignment]
        runner.save_checkpoint = wrap("checkpoint", originals["save_checkpoint"])  # type: ignore[assignment]
        try:
            yield
        finally:
            for name, fn in originals.items():
                setattr(runner, name, fn)


def plan_phases(plan: Plan) -> dict[str, dict[str, Any]]:
    """`dapo plan`'s tensors per phase (what max_memory_allocated can see: no context, no
    allowances): the resident items plus the phase's own, and which items they are."""
    tensors = [i for i in plan.gpu_items if i.key not in NOT_TENSORS]
    resident = [i for i in tensors if "resident" in i.phases]
    masters = [i for i in resident if i.key == "masters"]

    def total(items: Sequence[Any], note: str = "") -> dict[str, Any]:
        return {
            "plan_gib": sum(i.nbytes for i in items) / GIB,
            "plan_items": sorted({i.key for i in items}),
            "note": note,
        }

    update = [i for i in tensors if "update" in i.phases]
    step = [i for i in tensors if "step" in i.phases]
    rollout = [i for i in tensors if "rollout" in i.phases]
    if plan.overlapped:  # async: the worker generates while the trainer updates and steps
        update, step = update + rollout, step + rollout
    return {
        "load": total(masters, "the fp32 masters"),
        "rollout": total(resident + rollout),
        # No plan item: a no-grad forward holds far less than the update; its bound is that.
        "logprob": total(resident + update, "not modelled: the update's items are its bound"),
        "update": total(resident + max(update, step, key=lambda xs: sum(i.nbytes for i in xs))),
        "sync": total(resident + [i for i in tensors if "sync" in i.phases]),
        "checkpoint": total(resident, "not modelled: resident state only"),
    }


def _reloaded_tokenizer(model_dir: Path) -> dict[str, Any]:
    """How the run's tokenizer comes back: transformers maps a Qwen2 config to its own tokenizer
    class, whose pre-tokenizer drops the spaces of our word-level vocabulary (the prompts lose
    their spaces; a random model's memory and speed do not care, but the report says so)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    text = "What is 12 + 30?"
    back = tok.decode(tok(text)["input_ids"])
    return {"class": type(tok).__name__, "round_trip": back == text, "decoded": back}


def _release() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _allocated_gib() -> float:
    return torch.cuda.memory_allocated() / GIB if torch.cuda.is_available() else 0.0


ASYNC = {"rollout.mode": "async", "rollout.max_staleness": 1}
"""The async section's change to its model's section: everything else is the same run."""


def check_model(
    preset: str,
    args: argparse.Namespace,
    work: Path,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Build, train, checkpoint, resume: one preset's section of the report (with `overrides`
    on its config: the async section)."""
    from dapo_core.train.runner import train

    cuda = not args.dry_run
    device = "cuda" if cuda else "cpu"
    cuda_api: Any = torch.cuda if cuda else DryCuda()
    spy = dry_trainer_memory(cuda_api) if args.dry_run else contextlib.nullcontext()
    arch = check_architecture(preset, args.dry_run)
    tag = "-async" if overrides else ""
    model_dir = work / f"{preset}{tag}-random"
    t0 = time.perf_counter()
    params = build_model_dir(arch, model_dir, device)
    build_s = time.perf_counter() - t0
    print(
        f"gpu-check:   built and saved {params / 1e6:.0f}M parameters: {build_s:.1f} s",
        file=sys.stderr,
    )
    cfg = check_config(preset, model_dir, args).with_overrides(dict(overrides or {}))
    planned_arch = resolve_architecture(cfg.model)  # read back from the saved config.json
    tokenizer = _reloaded_tokenizer(model_dir)
    gpu_gib = torch.cuda.get_device_properties(0).total_memory / GIB if cuda else 80.0
    plan = plan_memory(cfg, 1, gpu_gib, device=device)
    out_dir = work / f"{preset}{tag}-run"
    before = _allocated_gib()

    # Run 1: all but the last step, ending with a checkpoint.
    first_steps = max(1, args.steps - 1)
    sink1, phases1 = Recorder(), RunnerPhases(cuda_api)
    with phases1.installed(), spy:
        r1 = train(cfg.with_overrides({"run.steps": first_steps}), sink=sink1, out_dir=out_dir)
    _release()
    after_first = _allocated_gib()

    # Run 2, same process, same directory: it must start (the first released what it held) and
    # resume from the first's checkpoint.
    sink2, phases2 = Recorder(), RunnerPhases(cuda_api)
    second_error = ""
    spy = dry_trainer_memory(cuda_api) if args.dry_run else contextlib.nullcontext()
    try:
        with phases2.installed(), spy:
            r2 = train(cfg, sink=sink2, out_dir=out_dir)
    except Exception as exc:  # reported, not raised: the rest of the check still runs
        second_error = _one_line(exc)
        r2 = None
    _release()
    after_second = _allocated_gib()

    steps = {**sink1.metrics, **sink2.metrics}
    measured: dict[str, float] = {}
    for phase in PHASES:
        key = M.peak_mem(phase)
        values = [m[key] for m in steps.values() if key in m]
        values += [p.peaks[phase] for p in (phases1, phases2) if phase in p.peaks]
        if values:
            measured[phase] = max(values)
    memory: dict[str, Any] = {}
    for phase, planned in plan_phases(plan).items():
        got = measured.get(phase) if cuda else None  # the dry run's stand-in reads 0
        memory[phase] = {
            **planned,
            "seen": phase in measured,
            "measured_gib": got,
            "ratio": got / planned["plan_gib"] if got is not None and planned["plan_gib"] else None,
        }

    resumed_steps = sorted(sink2.metrics)
    return {
        "arch": {
            "name": arch.name,
            "layers": arch.layers,
            "hidden": arch.hidden,
            "intermediate": arch.intermediate,
            "heads": arch.heads,
            "kv_heads": arch.kv_heads,
            "vocab": arch.vocab,
            "params": params,
            "plan_params": planned_arch.params,
        },
        "config": {
            "micro_batch_size": cfg.batch.micro_batch_size,
            "dtype": cfg.model.dtype,
            "gradient_checkpointing": cfg.model.gradient_checkpointing,
            "prompts": cfg.batch.gen_batch_size,
            "group_size": cfg.rollout.group_size,
            "max_prompt_len": cfg.rollout.max_prompt_len,
            "max_response_len": cfg.rollout.max_response_len,
            "steps": cfg.run.steps,
            "mode": cfg.rollout.mode,
            "max_staleness": cfg.rollout.max_staleness,
        },
        "plan": {
            "gpu_gib": gpu_gib,
            "peak_gib": plan.peak_bytes / GIB,
            "items_gib": {i.key: i.nbytes / GIB for i in plan.items},
        },
        "tokenizer": tokenizer,
        "memory": memory,
        "throughput": {
            "rollout_tokens_per_s": _median(steps, M.TOKENS_PER_S),
            "update_tokens_per_s": _median(steps, M.UPDATE_TOKENS_PER_S),
            # Async: what the overlap saves is the step's time; the idle seconds say which
            # side waited on the other.
            "step_s": _median(steps, M.STEP_S),
            "rollout_idle_s": _median(steps, M.ROLLOUT_IDLE_S, positive=False),
            "trainer_idle_s": _median(steps, M.TRAINER_IDLE_S, positive=False),
            "staleness_max": max(
                (m.get(M.STALENESS_MAX, 0.0) for m in steps.values()), default=None
            ),
            "build_s": build_s,
            "load_s": phases1.seconds.get("load"),
            "checkpoint_s": phases1.seconds.get("checkpoint"),
        },
        "checkpoint": {
            "saved": bool(r1.checkpoint_dir) and Path(r1.checkpoint_dir).is_dir(),
            "first_run_steps": r1.steps,
            "resumed": r2 is not None
            and resumed_steps == list(range(first_steps + 1, cfg.run.steps + 1)),
            "resumed_steps": resumed_steps,
            "grad_updates": [r1.grad_updates, r2.grad_updates if r2 else None],
        },
        "runs": {
            "second_started": r2 is not None,
            "second_error": second_error,
            "allocated_gib": {
                "before": before,
                "after_first": after_first,
                "after_second": after_second,
            },
            "released": after_first - before <= LEAK_TOLERANCE_GIB,
        },
    }


# --- the many-worker path on one GPU: FSDP2 over a process group of one NCCL rank -----------------
def check_fsdp(preset: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The code `dapo train --workers N` and a Ray arm run on each rank (distributed.train_worker:
    process group, FSDP2 sharding with bf16 compute over float32 masters, gathered weights pushed
    to the rank's rollout copy, sharded checkpoint, resharded resume), as one rank on this one
    GPU: NCCL, then NCCL for CUDA tensors with gloo for the CPU-offloaded shards. One rank sends
    nothing between GPUs, but every collective the trainer calls runs through NCCL's kernels.
    Dry run: gloo on the CPU, no offload. Each mode trains steps-1 steps, then resumes for one."""
    import torch.distributed as dist

    from dapo_common.util import free_port
    from dapo_core.train.checkpoint import SHARDS_DIR
    from dapo_core.train.distributed import process_group_backend, train_worker

    cuda = not args.dry_run
    device = "cuda" if cuda else "cpu"
    cuda_api: Any = torch.cuda if cuda else DryCuda()
    model_dir = work / f"{preset}-fsdp-random"
    build_model_dir(check_architecture(preset, args.dry_run), model_dir, device)
    cfg = check_config(preset, model_dir, args)
    first_steps = max(1, args.steps - 1)
    modes = {"nccl": False, "nccl+offload": True} if cuda else {"gloo": False}
    out: dict[str, Any] = {}
    for mode, offload in modes.items():
        mode_cfg = cfg.with_overrides({"model.cpu_offload": offload})
        run_dir = work / f"{preset}-fsdp-{mode.replace('+', '-')}"
        seen_backend: list[str] = []

        def progress(_: dict[str, Any], seen: list[str] = seen_backend) -> None:
            if dist.is_initialized():
                seen.append(str(dist.get_backend()))

        sinks: list[Recorder] = []

        def factory(sinks: list[Recorder] = sinks) -> Recorder:
            sinks.append(Recorder())
            return sinks[-1]

        before = _allocated_gib()
        row: dict[str, Any] = {
            "backend_asked": process_group_backend(device, cpu_offload=offload),
            "error": "",
        }
        try:
            t0 = time.perf_counter()
            spy = dry_trainer_memory(cuda_api) if args.dry_run else contextlib.nullcontext()
            with spy:
                r1 = train_worker(
                    0,
                    1,
                    f"tcp://127.0.0.1:{free_port()}",
                    mode_cfg.with_overrides({"run.steps": first_steps}),
                    run_dir,
                    factory,
                    progress=progress,
                )
            _release()
            after_first = _allocated_gib()
            spy = dry_trainer_memory(cuda_api) if args.dry_run else contextlib.nullcontext()
            with spy:
                r2 = train_worker(
                    0, 1, f"tcp://127.0.0.1:{free_port()}", mode_cfg, run_dir, factory,
                    progress=progress,
                )  # fmt: skip
            _release()
            steps = {s: m for sink in sinks for s, m in sink.metrics.items()}
            resumed = sorted(sinks[-1].metrics) if len(sinks) > 1 else []
            row.update(
                {
                    "backend_seen": sorted(set(seen_backend)),
                    "wall_s": time.perf_counter() - t0,
                    "sharded_checkpoint": bool(r1.checkpoint_dir)
                    and (Path(r1.checkpoint_dir) / SHARDS_DIR / ".metadata").is_file(),
                    "resumed_steps": resumed,
                    "resumed": resumed == list(range(first_steps + 1, cfg.run.steps + 1)),
                    "grad_updates": [r1.grad_updates, r2.grad_updates],
                    "rollout_tokens_per_s": _median(steps, M.TOKENS_PER_S),
                    "update_tokens_per_s": _median(steps, M.UPDATE_TOKENS_PER_S),
                    "peak_gib": {
                        phase: max(
                            m[M.peak_mem(phase)] for m in steps.values() if M.peak_mem(phase) in m
                        )
                        for phase in PHASES
                        if any(M.peak_mem(phase) in m for m in steps.values())
                    },
                    "released": after_first - before <= LEAK_TOLERANCE_GIB,
                    "left_gib": after_first - before,
                }
            )
        except Exception as exc:  # reported, not raised: the other mode and sections still run
            row["error"] = _one_line(exc)
            row["traceback"] = traceback.format_exc()[-4000:]
            if dist.is_initialized():
                dist.destroy_process_group()
            _release()
        out[mode] = row
    return out


def _median(
    steps: Mapping[int, Mapping[str, float]], name: str, *, positive: bool = True
) -> float | None:
    """Median of a metric over the steps, the first left out if we can: it pays for kernel
    selection and the allocator's growth. `positive`: rates (a 0 is a step without the
    phase); idle seconds may be 0."""
    values = [m[name] for s, m in sorted(steps.items()) if name in m]
    values = [v for v in values if v > 0] if positive else values
    values = values[1:] if len(values) > 1 else values
    return statistics.median(values) if values else None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


# --- item 4: the bf16 head's gradient ----------------------------------------------------------------
def head_gradient_error(
    device: str,
    vocab: int,
    tokens: int,
    hidden: int,
    *,
    logit_scale: float = 6.0,
    sampled_targets: bool = False,
    seed: int = 0,
) -> dict[str, float]:
    """Relative error (‖g − g_ref‖ / ‖g_ref‖) of the gradients w.r.t. the hidden states and the
    head weight, against float32, for the one-worker head under bfloat16 autocast (forward
    logits in bf16, backward recomputed in float32 against the forward's log-sum-exp) and for
    plain bf16 logits through log_softmax. Logits have standard deviation `logit_scale`
    (6 puts the largest near 30, like a trained LM's); targets uniform or sampled from the
    policy; the upstream gradient random, like advantages of both signs."""
    from dapo_core.train.logprobs import linear_logprobs_and_entropy, naive_logprobs_and_entropy

    gen = torch.Generator(device="cpu").manual_seed(seed)
    h = torch.randn(1, tokens, hidden, generator=gen).to(device)
    head = nn.Linear(hidden, vocab, bias=False).to(device)
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, hidden, generator=gen) * logit_scale / hidden**0.5)
        z = h[0] @ head.weight.t()
        if sampled_targets:
            targets = torch.multinomial(torch.softmax(z, -1).cpu(), 1, generator=gen).T
        else:
            targets = torch.randint(0, vocab, (1, tokens), generator=gen)
        max_logit = float(z.abs().max())
        del z
    targets = targets.to(device)
    upstream = torch.randn(1, tokens, generator=gen).to(device)
    kind = torch.device(device).type

    def grads(mode: str) -> tuple[torch.Tensor, torch.Tensor]:
        x = h.clone().requires_grad_(True)
        head.zero_grad()
        if mode == "fp32":
            lp, _ = linear_logprobs_and_entropy(x, head, targets)
        elif mode == "head":
            with torch.autocast(kind, dtype=torch.bfloat16):
                lp, _ = linear_logprobs_and_entropy(x, head, targets)
        else:
            with torch.autocast(kind, dtype=torch.bfloat16):
                logits = head(x)
            lp, _ = naive_logprobs_and_entropy(logits, targets)
        # Backward outside autocast, as the trainer's update calls it.
        (lp * upstream).sum().backward()
        assert x.grad is not None and head.weight.grad is not None
        return x.grad.clone(), head.weight.grad.clone()

    ref = grads("fp32")
    out: dict[str, float] = {"max_logit": max_logit}
    for mode in ("head", "plain"):
        got = grads(mode)
        for name, g, r in zip(("hidden", "weight"), got, ref, strict=True):
            out[f"{mode}_{name}"] = float((g - r).norm() / r.norm())
    out["ratio"] = max(
        out["head_hidden"] / out["plain_hidden"], out["head_weight"] / out["plain_weight"]
    )
    out["head_max"] = max(out["head_hidden"], out["head_weight"])
    return out


def check_head(device: str, dry_run: bool) -> list[dict[str, Any]]:
    shapes = [(8192, 64, 64)] if dry_run else [(32768, 1024, 896), (151936, 512, 1536)]
    rows = []
    for vocab, tokens, hidden in shapes:
        for sampled in (False, True):
            e = head_gradient_error(device, vocab, tokens, hidden, sampled_targets=sampled)
            within = (
                e["head_max"] <= HEAD_BOUND["max_rel_error"]
                and e["ratio"] <= HEAD_BOUND["max_ratio_to_plain_bf16"]
            )
            rows.append(
                {
                    "vocab": vocab,
                    "tokens": tokens,
                    "hidden": hidden,
                    "targets": "sampled" if sampled else "uniform",
                    **e,
                    "within_cpu_bound": within,
                }
            )
    return rows


# --- the report -----------------------------------------------------------------------------------
def _f(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def markdown(report: Mapping[str, Any]) -> str:
    meta = report["meta"]
    unit, scale = ("MiB", 1024.0) if meta["dry_run"] else ("GiB", 1.0)
    lines = [
        f"# GPU check: {meta['device_name']}"
        + (" (DRY RUN: CPU, shrunk shapes)" if meta["dry_run"] else ""),
        "",
        f"torch {meta['torch']}, transformers {meta['transformers']}, Python {meta['python']}; "
        f"{meta['wall_s']:.0f} s in all.",
        "",
        # The dry run's models are a few MiB: GiB would print zeros.
        f"| model | phase | measured peak {unit} | plan {unit} | measured / plan | plan items |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in report["models"].items():
        for phase, row in m["memory"].items():
            items = ", ".join(row["plan_items"]) + (f" ({row['note']})" if row["note"] else "")
            got = (
                _f(row["measured_gib"] * scale if row["measured_gib"] is not None else None)
                if not meta["dry_run"]
                else ("metric arrived" if row["seen"] else "MISSING")
            )
            lines.append(
                f"| {name} | {phase} | {got} | {_f(row['plan_gib'] * scale)} | "
                f"{_f(row['ratio'])} | {items} |"
            )
    lines += [
        "",
        "| model | params | rollout tok/s | update tok/s | checkpoint saved / resumed | second run started | released after run 1 |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, m in report["models"].items():
        t, c, r = m["throughput"], m["checkpoint"], m["runs"]
        lines.append(
            f"| {name} | {m['arch']['params'] / 1e6:.1f}M | {_f(t['rollout_tokens_per_s'], 0)} | "
            f"{_f(t['update_tokens_per_s'], 0)} | {c['saved']} / {c['resumed']} | "
            f"{r['second_started']} | {r['released']} "
            f"({_f(r['allocated_gib']['after_first'] - r['allocated_gib']['before'], 3)} GiB left) |"
        )
    lines += async_markdown(report, unit, scale)
    fsdp = report.get("fsdp") or {}
    if fsdp:
        lines += [
            "",
            f"FSDP2 on one rank ({fsdp['model']} shape; `distributed.train_worker`, as each "
            "worker of `dapo train --workers N` or a Ray arm runs it):",
            "",
            f"| mode | backend | rollout tok/s | update tok/s | peak {unit} (update) | sharded checkpoint / resumed | released | error |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for mode, row in fsdp["modes"].items():
            if row["error"]:
                lines.append(
                    f"| {mode} | {row['backend_asked']} | – | – | – | – | – | {row['error']} |"
                )
                continue
            peak = row["peak_gib"].get("update")
            lines.append(
                f"| {mode} | {', '.join(row['backend_seen']) or row['backend_asked']} | "
                f"{_f(row['rollout_tokens_per_s'], 0)} | {_f(row['update_tokens_per_s'], 0)} | "
                f"{_f(peak * scale if peak is not None and not meta['dry_run'] else None)} | "
                f"{row['sharded_checkpoint']} / {row['resumed']} | {row['released']} | |"
            )
    lines += [
        "",
        "bf16 log-prob head vs float32 (relative gradient error; item 4):",
        "",
        "| vocab | tokens × hidden | targets | max logit | head: hidden / weight | plain bf16: hidden / weight | ratio | within CPU bound |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for h in report["bf16_head"]:
        lines.append(
            f"| {h['vocab']} | {h['tokens']} × {h['hidden']} | {h['targets']} | {h['max_logit']:.1f} | "
            f"{h['head_hidden']:.2%} / {h['head_weight']:.2%} | {h['plain_hidden']:.2%} / "
            f"{h['plain_weight']:.2%} | {h['ratio']:.2f} | {h['within_cpu_bound']} |"
        )
    problems = report["problems"]
    lines += ["", "Problems: " + ("; ".join(problems) if problems else "none")]
    return "\n".join(lines) + "\n"


def async_markdown(report: Mapping[str, Any], unit: str, scale: float) -> list[str]:
    """The async section beside its model's sync one: step times, idle seconds, memory."""
    a = report.get("async") or {}
    sync = report["models"].get(a.get("model", ""))
    if not a or not sync:
        return []
    ts, ta = sync["throughput"], a["throughput"]
    ratio = ta["step_s"] / ts["step_s"] if ta["step_s"] and ts["step_s"] else None
    lines = [
        "",
        f"Async rollouts ({a['model']} shape, hf engine colocated, max_staleness "
        f"{a['config']['max_staleness']}) against the same run in sync (median step, the first "
        "left out):",
        "",
        "| mode | step s | async / sync | rollout tok/s | update tok/s | rollout idle s | trainer idle s | staleness max | checkpoint resumed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, m, r in (("sync", sync, None), ("async", a, ratio)):
        t = m["throughput"]
        lines.append(
            f"| {mode} | {_f(t['step_s'])} | {_f(r)} | {_f(t['rollout_tokens_per_s'], 0)} | "
            f"{_f(t['update_tokens_per_s'], 0)} | {_f(t.get('rollout_idle_s'))} | "
            f"{_f(t.get('trainer_idle_s'))} | {_f(t.get('staleness_max'), 0)} | "
            f"{m['checkpoint']['resumed']} |"
        )
    lines += [
        "",
        f"| async phase | measured peak {unit} | plan {unit} (async: generation inside the update) | measured / plan |",
        "|---|---|---|---|",
    ]
    dry = report["meta"]["dry_run"]
    for phase, row in a["memory"].items():
        got = (
            ("metric arrived" if row["seen"] else "MISSING")
            if dry
            else _f(row["measured_gib"] * scale if row["measured_gib"] is not None else None)
        )
        lines.append(f"| {phase} | {got} | {_f(row['plan_gib'] * scale)} | {_f(row['ratio'])} |")
    return lines


def problems_of(report: Mapping[str, Any]) -> list[str]:
    out = [f"{name}: {e['error']}" for name, e in report.get("errors", {}).items()]
    for mode, row in report.get("fsdp", {}).get("modes", {}).items():
        if row["error"]:
            out.append(f"fsdp {mode}: {row['error']}")
            continue
        if not row["sharded_checkpoint"]:
            out.append(f"fsdp {mode}: no sharded checkpoint written")
        if not row["resumed"]:
            out.append(f"fsdp {mode}: the second run resumed steps {row['resumed_steps']}")
        if not row["released"]:
            out.append(f"fsdp {mode}: the first run left {row['left_gib']:.2f} GiB allocated")
    sections = dict(report["models"])
    if report.get("async"):
        sections[f"async {report['async']['model']}"] = report["async"]
    for name, m in sections.items():
        if m["arch"]["params"] != m["arch"]["plan_params"]:
            out.append(
                f"{name}: the plan counts {m['arch']['plan_params']} parameters, torch built {m['arch']['params']}"
            )
        if not m["checkpoint"]["saved"]:
            out.append(f"{name}: no checkpoint written")
        if not m["runs"]["second_started"]:
            out.append(
                f"{name}: the second run in this process failed: {m['runs']['second_error']}"
            )
        elif not m["checkpoint"]["resumed"]:
            out.append(
                f"{name}: the second run did not resume at step {m['checkpoint']['first_run_steps'] + 1}"
            )
        missing = [p for p, row in m["memory"].items() if not row["seen"]]
        if missing:
            out.append(f"{name}: no peak-memory metric for {', '.join(missing)}")
        if not m["runs"]["released"]:
            out.append(f"{name}: the first run left memory allocated")
        bound = m["config"].get("max_staleness", 0) + 1  # a carried group: one more
        stale = m["throughput"].get("staleness_max")
        if m["config"].get("mode") == "async" and (stale is None or stale > bound):
            out.append(f"{name}: staleness {stale} past max_staleness + 1 = {bound}")
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument(
        "--out",
        type=Path,
        default=ROOT / ".cache" / "gpu_check",
        help="where the JSON and Markdown go",
    )
    p.add_argument(
        "--work",
        type=Path,
        default=None,
        help="where the models and checkpoints are written, then deleted (default: --out)",
    )
    p.add_argument("--dry-run", action="store_true", help="everything but CUDA: CPU, shrunk shapes")
    p.add_argument("--models", default=",".join(PRESETS), help="presets whose shapes to check")
    p.add_argument(
        "--steps", type=int, default=None, help="train steps per model (default 3; dry run 2)"
    )
    p.add_argument(
        "--prompts", type=int, default=None, help="prompts per step (default 16; dry run 2)"
    )
    p.add_argument(
        "--group-size", type=int, default=None, help="responses per prompt (default 8; dry run 2)"
    )
    p.add_argument(
        "--prompt-len", type=int, default=None, help="rollout.max_prompt_len (default 128)"
    )
    p.add_argument(
        "--response-len",
        type=int,
        default=None,
        help="rollout.max_response_len (default 512; dry run 8)",
    )
    p.add_argument("--skip-head", action="store_true", help="leave out the bf16 head probe")
    p.add_argument(
        "--async-model",
        default=PRESETS[0],
        help="preset whose shape trains with async rollouts (max_staleness 1) beside its sync "
        "section, to measure the overlap; '' skips",
    )
    p.add_argument(
        "--fsdp-model",
        default=PRESETS[0],
        help="preset whose shape trains on one FSDP2 rank (NCCL; NCCL + CPU offload); '' skips",
    )
    args = p.parse_args(argv)
    small = args.dry_run
    defaults = {
        "steps": (3, 2),
        "prompts": (16, 2),
        "group_size": (8, 2),
        "prompt_len": (128, 64),
        "response_len": (512, 8),
    }
    for name, (full, dry) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, dry if small else full)
    if args.steps < 2:
        p.error("--steps must be >= 2: the last step is the resumed run's")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print(
            "gpu-check: no CUDA GPU visible here. Run `make gpu-check DRY=1` (or "
            "`python bench/gpu_check.py --dry-run`) to exercise everything but CUDA.",
            file=sys.stderr,
        )
        return 2
    import transformers

    t0 = time.perf_counter()
    device = "cpu" if args.dry_run else "cuda"
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "meta": {
            "dry_run": args.dry_run,
            "device_name": torch.cuda.get_device_name(0)
            if device == "cuda"
            else f"CPU ({platform.processor() or platform.machine()})",
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
            # A float32 reference computed with TF32 matmuls would not be float32.
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "gpu_total_gib": (
                torch.cuda.get_device_properties(0).total_memory / GIB if device == "cuda" else None
            ),
            "args": {k: str(v) for k, v in vars(args).items()},
        },
        "models": {},
        "async": {},
        "fsdp": {},
        "bf16_head": [],
        "errors": {},
    }

    def section(name: str, fn: Callable[[], Any], store: Callable[[Any], None]) -> None:
        # A first GPU run must report every section it can: one that fails is recorded with its
        # traceback (in the JSON and on stderr) and the others still run.
        print(f"gpu-check: {name} ...", file=sys.stderr, flush=True)
        t = time.perf_counter()
        try:
            store(fn())
        except Exception as exc:
            report["errors"][name] = {
                "error": _one_line(exc),
                "traceback": traceback.format_exc()[-4000:],
            }
            traceback.print_exc()
        finally:
            _release()
            print(
                f"gpu-check: {name}: {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True
            )
            write()

    def write() -> None:
        # After every section, so that a run stopped at a time limit leaves what it measured.
        report["meta"]["wall_s"] = time.perf_counter() - t0
        report["problems"] = problems_of(report)
        (args.out / "gpu_check.json").write_text(
            json.dumps(report, indent=2, sort_keys=True, default=_json)
        )
        (args.out / "gpu_check.md").write_text(markdown(report))

    with tempfile.TemporaryDirectory(prefix="gpu_check.", dir=args.work or args.out) as tmp:
        for preset in [m.strip() for m in args.models.split(",") if m.strip()]:
            section(
                preset,
                lambda p=preset: check_model(p, args, Path(tmp)),
                lambda got, p=preset: report["models"].__setitem__(p, got),
            )
        if args.async_model:
            section(
                f"async {args.async_model}",
                lambda: check_model(args.async_model, args, Path(tmp), ASYNC),
                lambda got: report.__setitem__("async", {"model": args.async_model, **got}),
            )
        if args.fsdp_model:
            section(
                f"fsdp {args.fsdp_model}",
                lambda: check_fsdp(args.fsdp_model, args, Path(tmp)),
                lambda got: report.__setitem__("fsdp", {"model": args.fsdp_model, "modes": got}),
            )
    if not args.skip_head:
        section(
            "bf16 head",
            lambda: check_head(device, args.dry_run),
            lambda got: report.__setitem__("bf16_head", got),
        )
    write()
    print(markdown(report))
    print(f"gpu-check: wrote {args.out / 'gpu_check.json'} and gpu_check.md", file=sys.stderr)
    return 1 if report["problems"] else 0


def _json(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return str(x)


if __name__ == "__main__":
    sys.exit(main())
