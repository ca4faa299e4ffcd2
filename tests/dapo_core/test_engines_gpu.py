"""Issue 22, the engine side of a first GPU run, caught on a CPU: engines closed and device memory
released after every run (item 1), one GPU per local rank for vLLM (item 2), vLLM's API checked
at engine start and a GPU lock (item 3), and `dapo eval` on the configured engine behind a memory
plan (item 6). vLLM is a stub module in sys.modules and CUDA a monkeypatched torch.cuda."""

from __future__ import annotations

import gc
import json
import os
import re
import sys
import tomllib
import types
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from packaging.specifiers import SpecifierSet
from tiny_policy import EOS, char_tokenizer, tiny_llama

import dapo_core.engines as engines
import dapo_core.train.distributed as distributed
import dapo_core.train.runner as runner
from dapo_common.cli_args import USER_ERRORS
from dapo_common.util import free_port
from dapo_core.engines.base import Completion, SamplingParams
from dapo_core.engines.vllm_engine import TESTED_VLLM, VLLMEngine
from dapo_core.setup.config import ExperimentConfig
from dapo_core.setup.ladders import paper_ladder
from dapo_core.train.runner import TrainResult, release_device_memory, train

ROOT = Path(__file__).resolve().parents[2]
# A few seconds a run on the tiny preset (tests/dapo_core/test_runner.py's sizes).
SMALL = {
    "rollout.group_size": 4,
    "batch.train_batch_size": 4,
    "batch.gen_batch_size": 4,
    "batch.mini_batch_size": 2,
    "data.eval_problems": 8,
    "data.eval_k": 2,
    "run.num_threads": 1,
}


def small(arm: str, **extra: Any) -> ExperimentConfig:
    return paper_ladder().config(arm, "tiny", {**SMALL, **extra})


class ListSink:
    """A MetricsSink that keeps nothing but the steps it saw."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.steps.append(step)

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        pass

    def log_evaluation(self, step: int, result: Mapping[str, Any]) -> None:
        pass


# --- a stub vllm ------------------------------------------------------------------------------
class NewRunner:
    """vLLM >= 0.1x's model runner: reload_weights takes the weights themselves."""

    def __init__(self, log: dict[str, Any]) -> None:
        self.log = log

    def reload_weights(
        self,
        weights_iterator: Any = None,
        weights_path: str | None = None,
        is_checkpoint_format: bool = True,
    ) -> None:
        self.log["reloaded"] = [name for name, _ in weights_iterator]


class NewWorker:
    """vLLM's GPU worker forwards reload_weights(*args, **kwargs) to its model runner."""

    def __init__(self, log: dict[str, Any]) -> None:
        self.model_runner = NewRunner(log)

    def reload_weights(self, *args: Any, **kwargs: Any) -> None:
        self.model_runner.reload_weights(*args, **kwargs)


class OldModel:
    def __init__(self, log: dict[str, Any]) -> None:
        self.log = log

    def load_weights(self, weights: Any) -> None:
        self.log["loaded"] = [name for name, _ in weights]


class OldWorker:
    """Older vLLM: reload_weights() rereads the checkpoint from disk and takes no weights."""

    def __init__(self, log: dict[str, Any], *, model: bool) -> None:
        self.model_runner = types.SimpleNamespace(model=OldModel(log)) if model else None

    def reload_weights(self) -> None:
        raise AssertionError("called with the trainer's weights: TypeError on a real vLLM")


def stub_vllm(
    monkeypatch: pytest.MonkeyPatch,
    *,
    version: str = TESTED_VLLM,
    api: str = "new",
    generate: Callable[..., Any] | None = None,
) -> dict[str, Any]:
    """Put a `vllm` module in sys.modules whose LLM records what it was given and saw; returns
    the record: `llms` (weak references), `kwargs`, `visible` (CUDA_VISIBLE_DEVICES at start),
    `shutdowns`, and what a weight sync reached."""
    log: dict[str, Any] = {"llms": [], "kwargs": [], "visible": [], "shutdowns": 0}
    tokenizer = char_tokenizer()

    class LLM:
        def __init__(self, **kwargs: Any) -> None:
            log["kwargs"].append(kwargs)
            log["visible"].append(os.environ.get("CUDA_VISIBLE_DEVICES"))
            log["llms"].append(weakref.ref(self))
            if api == "new":
                worker: Any = NewWorker(log)
            else:
                worker = OldWorker(log, model=api == "old")
            self.llm_engine = types.SimpleNamespace(
                model_executor=types.SimpleNamespace(
                    driver_worker=types.SimpleNamespace(worker=worker)
                ),
                engine_core=types.SimpleNamespace(shutdown=self._shutdown),
            )

        def _shutdown(self) -> None:
            log["shutdowns"] += 1

        def get_tokenizer(self) -> Any:
            return tokenizer

        def collective_rpc(self, method: str, kwargs: Mapping[str, Any]) -> None:
            getattr(self.llm_engine.model_executor.driver_worker.worker, method)(**kwargs)

        def generate(self, requests: Sequence[Any], params: Sequence[Any], **_: Any) -> Any:
            if generate is not None:
                return generate(self, requests, params)
            return [
                types.SimpleNamespace(
                    outputs=[
                        types.SimpleNamespace(
                            token_ids=[EOS], finish_reason="stop", logprobs=None, text=""
                        )
                        for _ in range(p.n)
                    ]
                )
                for p in params
            ]

    module = types.ModuleType("vllm")
    module.__file__ = "<stub vllm>"
    module.__version__ = version  # type: ignore[attr-defined]
    module.LLM = LLM  # type: ignore[attr-defined]
    module.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return log


def start_engine() -> VLLMEngine:
    return VLLMEngine("unused", eos_token_ids=[EOS], max_prompt_len=8, max_response_len=8)


# --- item 1: engines closed, device memory released, success or failure ------------------------
def record_run_end(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every engine make_engine returns records its close(); release_device_memory records
    whether it saw an error. Returns the event list."""
    events: list[Any] = []
    real_make, real_release = engines.make_engine, runner.release_device_memory

    def make_engine(name: str, *args: Any, **kwargs: Any) -> Any:
        engine = real_make(name, *args, **kwargs)
        close = getattr(engine, "close", lambda: None)

        def recording_close() -> None:
            events.append("close")
            close()

        engine.close = recording_close  # type: ignore[method-assign]
        return engine

    def release(error: BaseException | None = None) -> None:
        events.append(("release", type(error).__name__ if error else None))
        real_release(error)

    monkeypatch.setattr(engines, "make_engine", make_engine)
    monkeypatch.setattr(runner, "release_device_memory", release)
    return events


def test_a_run_closes_its_engine_then_releases_memory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    events = record_run_end(monkeypatch)
    result = train(small("grpo", **{"run.steps": 1}), sink=ListSink(), out_dir=tmp_path)
    assert result.steps == 1
    assert events == ["close", ("release", None)]


def test_a_failed_run_closes_its_engine_and_releases_memory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    events = record_run_end(monkeypatch)
    from dapo_core.train.trainer import Trainer

    def step(self: Trainer) -> Any:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(Trainer, "step", step)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        train(small("grpo", **{"run.steps": 1}), sink=ListSink(), out_dir=tmp_path)
    assert events == ["close", ("release", "RuntimeError")]


def test_a_failed_vllm_run_shuts_the_engine_down_and_frees_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The stub LLM stands for vLLM's weights and KV cache on the GPU: after the run it must be
    # shut down and gone, although the failure's traceback holds the frame of the very call
    # that raised (self: the LLM), as a pooled Ray actor's next arm would need.
    def lost(llm: Any, requests: Any, params: Any) -> Any:
        raise RuntimeError("device lost while generating")

    log = stub_vllm(monkeypatch, generate=lost)
    cfg = small("grpo", **{"run.steps": 1, "rollout.engine": "vllm"})
    with pytest.raises(RuntimeError, match="device lost") as failure:
        train(cfg, sink=ListSink(), out_dir=tmp_path)
    assert failure.value.__traceback__ is not None  # the traceback itself is kept
    assert log["shutdowns"] == 1
    assert len(log["llms"]) == 1
    gc.collect()
    assert log["llms"][0]() is None, "the failed run's vLLM engine is still alive"


def test_a_worker_of_n_closes_its_engine_when_it_fails_before_its_first_step(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The many-worker path (a world of one, gloo): the engine exists before the policy is
    # sharded, so a failure there (out of memory while sharding) must close it too, before the
    # process group goes.
    events = record_run_end(monkeypatch)

    def shard_policy(*args: Any, **kwargs: Any) -> Any:
        events.append(("sharding", torch.distributed.is_initialized()))
        raise RuntimeError("CUDA out of memory while sharding")

    monkeypatch.setattr(distributed, "shard_policy", shard_policy)
    init = f"tcp://127.0.0.1:{free_port()}"
    with pytest.raises(RuntimeError, match="while sharding"):
        distributed.train_worker(0, 1, init, small("grpo", **{"run.steps": 1}), tmp_path)
    assert events == [("sharding", True), "close", ("release", "RuntimeError")]
    assert not torch.distributed.is_initialized()


def test_release_device_memory_empties_the_cuda_cache_and_frees_a_failed_runs_frames(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    emptied: list[bool] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))

    class Weights:
        pass

    refs: list[weakref.ref[Weights]] = []

    def failing_run() -> None:
        weights = Weights()
        refs.append(weakref.ref(weights))
        raise RuntimeError("out of memory")

    try:
        failing_run()
    except RuntimeError as exc:
        error = exc
    gc.collect()
    assert refs[0]() is not None  # the traceback keeps the failed frame's locals
    release_device_memory(error)
    assert refs[0]() is None and emptied == [True]


def test_vllm_engine_close_shuts_down_and_drops_the_llm_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = stub_vllm(monkeypatch)
    model, tok = tiny_llama(len(char_tokenizer())), char_tokenizer(padding_side="left")
    engine = engines.make_engine("vllm", model, tok, ExperimentConfig())
    engine.close()
    engine.close()  # idempotent
    assert log["shutdowns"] == 1
    gc.collect()
    assert log["llms"][0]() is None


def test_hf_engine_close_drops_its_model(tmp_path: Path) -> None:
    # On N workers the hf engine alone holds the rank's rollout copy: close must let it go.
    tok = char_tokenizer(padding_side="left")
    model = tiny_llama(len(tok))
    ref = weakref.ref(model)
    engine = engines.make_engine("hf", model, tok, ExperimentConfig())
    del model
    engine.close()
    gc.collect()
    assert ref() is None


# --- item 2: one GPU per local rank for vLLM -----------------------------------------------------
def spawn_in_process(
    monkeypatch: pytest.MonkeyPatch, worker: Callable[..., TrainResult]
) -> list[dict[str, Any]]:
    """launch_local's mp.spawn, run rank after rank in this process on a machine that shows two
    GPUs (CUDA_VISIBLE_DEVICES=3,5): each rank starts from the parent's environment, as a
    spawned process does. Returns what `worker` (train_worker's stand-in) recorded."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    monkeypatch.setattr(distributed, "_exit_with_parent", lambda pid: None)
    monkeypatch.setattr("logging.basicConfig", lambda **kw: None)
    monkeypatch.setattr("transformers.utils.logging.disable_progress_bar", lambda: None)
    monkeypatch.setattr(distributed, "train_worker", worker)

    def spawn(fn: Callable[..., None], args: tuple[Any, ...], nprocs: int, join: bool) -> None:
        for rank in range(nprocs):
            os.environ["CUDA_VISIBLE_DEVICES"] = "3,5"
            fn(rank, *args)

    monkeypatch.setattr("torch.multiprocessing.spawn", spawn)
    return []


def fake_result() -> TrainResult:
    return TrainResult(
        steps=1, grad_updates=1, tokens=1, wall_s=0.0, final_eval=None, checkpoint_dir=""
    )


def test_each_local_rank_starts_its_vllm_engine_on_its_own_gpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    log = stub_vllm(monkeypatch)
    seen: list[tuple[int, int | None]] = []

    def worker(rank: int, *args: Any, local_rank: int | None = None, **kwargs: Any) -> TrainResult:
        seen.append((rank, local_rank))
        start_engine().close()  # what the rank's engine sees when it starts
        return fake_result()

    spawn_in_process(monkeypatch, worker)
    cfg = small("grpo", **{"rollout.engine": "vllm", "run.device": "cuda"})
    distributed.launch_local(cfg, out_dir=tmp_path, workers=2, sink_factory=None)
    # vLLM's single-process executor starts on device 0 of what it sees: each rank sees only
    # its own GPU and uses it as its device 0 (torch.cuda.set_device(0), NCCL's too).
    assert log["visible"] == ["3", "5"]
    assert seen == [(0, 0), (1, 0)]


def test_hf_ranks_keep_every_gpu_visible(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[tuple[int, int | None, str | None]] = []

    def worker(rank: int, *args: Any, local_rank: int | None = None, **kwargs: Any) -> TrainResult:
        seen.append((rank, local_rank, os.environ.get("CUDA_VISIBLE_DEVICES")))
        return fake_result()

    spawn_in_process(monkeypatch, worker)
    cfg = small("grpo", **{"rollout.engine": "hf", "run.device": "cuda"})
    distributed.launch_local(cfg, out_dir=tmp_path, workers=2, sink_factory=None)
    assert seen == [(0, 0, "3,5"), (1, 1, "3,5")]


def test_rank_devices_follow_the_parents_visible_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-aa, GPU-bb,GPU-cc")
    assert distributed.rank_devices(2) == ["GPU-aa", "GPU-bb"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert distributed.rank_devices(3) == ["0", "1", "2"]


# --- item 3: vLLM's API checked at engine start; a GPU lock ---------------------------------------
def test_the_tested_vllm_syncs_weights_through_reload_weights(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = stub_vllm(monkeypatch, api="new")
    engine = start_engine()
    assert engine.sync_method == "reload_weights"
    engine.load_weights({"a.weight": torch.zeros(2), "b.weight": torch.ones(2)})
    assert log["reloaded"] == ["a.weight", "b.weight"]


def test_an_older_vllm_whose_reload_weights_takes_no_weights_syncs_through_the_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Its worker has a reload_weights too (from disk, no arguments): going by the name alone,
    # the first sync, hours into a run, raised TypeError.
    log = stub_vllm(monkeypatch, version="0.10.1", api="old")
    engine = start_engine()
    assert engine.sync_method == "model"
    engine.load_weights({"a.weight": torch.zeros(2)})
    assert log["loaded"] == ["a.weight"]


def test_a_vllm_that_cannot_take_weights_is_refused_at_engine_start_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = stub_vllm(monkeypatch, version="0.7.3", api="old-no-model")
    with pytest.raises(USER_ERRORS) as refused:
        start_engine()
    message = str(refused.value)
    assert "\n" not in message
    assert "vllm 0.7.3" in message and "weights_iterator" in message
    assert f"vllm=={TESTED_VLLM}" in message
    assert log["shutdowns"] == 1  # its share of the GPU went back before the error


def test_the_gpu_lock_pins_the_tested_vllm_within_the_gpu_extra() -> None:
    lock = dict(
        line.split("==")
        for line in (ROOT / "requirements-gpu.lock").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert lock["vllm"] == TESTED_VLLM
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["gpu"]
    (vllm_req,) = [r for r in extra if r.startswith("vllm")]
    assert SpecifierSet(vllm_req.removeprefix("vllm")).contains(lock["vllm"])
    # The lock's torch is the one the CPU environments pin: one torch for both stacks.
    constraints = (ROOT / "constraints.txt").read_text()
    assert re.search(rf"^torch=={re.escape(lock['torch'])}$", constraints, re.M)


# --- item 6: `dapo eval` on the configured engine, behind a memory plan -------------------------
def checkpoint(tmp_path: Path, **overrides: Any) -> Path:
    """A step_3 checkpoint directory holding only its config (enough for `dapo eval` up to the
    model loading, which the tests stub)."""
    ckpt = tmp_path / "run" / "checkpoints" / "step_3"
    ckpt.mkdir(parents=True)
    cfg = small("grpo", **{"data.eval_problems": 2, **overrides})
    (ckpt / "config.json").write_text(json.dumps(cfg.to_dict()))
    (ckpt / "trainer_state.pt").write_bytes(b"")
    return ckpt


class FakeEngine:
    def __init__(self) -> None:
        self.closed = 0

    def generate(self, prompts: Sequence[str], sampling: SamplingParams) -> list[Completion]:
        return [
            Completion(i, [1], [EOS], [0.0], "stop", "Answer: 7")
            for i in range(len(prompts))
            for _ in range(sampling.n)
        ]

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass

    def close(self) -> None:
        self.closed += 1


def stub_eval(monkeypatch: pytest.MonkeyPatch) -> tuple[list[dict[str, Any]], list[str]]:
    """make_engine records its engine name and directories; load_checkpoint_policy records the
    device it loads on."""
    made: list[dict[str, Any]] = []
    loaded: list[str] = []

    def make_engine(name: str, model: Any, tok: Any, cfg: Any, **kwargs: Any) -> FakeEngine:
        engine = FakeEngine()
        made.append({"name": name, "engine": engine, **kwargs})
        return engine

    def load(ckpt: Path, cfg: ExperimentConfig, device: str) -> tuple[Any, Any]:
        loaded.append(device)
        tok = char_tokenizer(padding_side="left")
        return tiny_llama(len(tok)), tok

    monkeypatch.setattr(engines, "make_engine", make_engine)
    monkeypatch.setattr(runner, "load_checkpoint_policy", load)
    return made, loaded


def dapo(*args: str) -> int:
    from dapo_lab.cli import main

    return main(list(args))


def test_eval_samples_with_the_runs_engine(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    made, loaded = stub_eval(monkeypatch)
    ckpt = checkpoint(tmp_path, **{"rollout.engine": "vllm", "run.device": "cpu"})
    assert dapo("eval", "--ckpt", str(ckpt)) == 0
    (call,) = made
    assert call["name"] == "vllm"
    # No HF export in this checkpoint: vLLM starts from the model's weights (make_engine
    # writes their skeleton in a directory of its own, tests/vllm_engine/test_vllm_make_engine).
    assert call["init_dir"] is None
    assert call["engine"].closed == 1
    assert loaded == ["cpu"]
    out = json.loads(capsys.readouterr().out)
    assert out["n_problems"] == 2 and out["avg_at_k"] == 0.0

    assert dapo("eval", "--ckpt", str(ckpt), "--engine", "hf") == 0
    assert made[-1]["name"] == "hf"


def test_eval_that_does_not_fit_the_gpu_is_refused_in_one_line_before_loading(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    made, loaded = stub_eval(monkeypatch)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    half_gib = types.SimpleNamespace(total_memory=1 << 29)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: half_gib)
    ckpt = checkpoint(tmp_path, **{"rollout.engine": "hf", "run.device": "cuda"})
    assert dapo("eval", "--ckpt", str(ckpt)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith(
        "error: evaluating with the hf engine (2 problems × 2 samples) does not fit"
    )
    assert "--engine vllm" in err[0]
    assert loaded == [] and made == []


def test_eval_plan_sizes_the_hf_kv_cache_by_the_evaluations_shapes() -> None:
    from dapo_core.setup.architectures import KNOWN
    from dapo_core.setup.plan import GIB, plan_evaluation

    cfg = small("grpo").with_overrides(
        {
            "data.eval_k": 32,
            "rollout.max_prompt_len": 2048,
            "rollout.max_response_len": 20480,
            "model.dtype": "bfloat16",
        }
    )
    arch = KNOWN["qwen/qwen2.5-7b"]
    hf = plan_evaluation(cfg, 30, 79.0, arch=arch)
    # 512 // 32 = 16 problems a call, 32 samples each: 512 rows of 22528 tokens; Qwen2.5-7B keeps
    # 2 × 28 layers × 512 KV values a token, 2 bytes each: 512 × 22528 × 57344 B = 616 GiB.
    assert hf.item("kv_hf").nbytes > 600 * GIB and not hf.fits
    vllm = plan_evaluation(cfg.with_overrides({"rollout.engine": "vllm"}), 30, 79.0, arch=arch)
    assert vllm.fits and vllm.kv_tokens > 22528


def test_release_is_a_noop_for_cpu_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    # Without CUDA nothing is asked of torch.cuda (a CPU run never initialises it).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: pytest.fail("empty_cache without CUDA"))
    release_device_memory()


# --- item 7: vLLM starts without a copy of the model on disk ------------------------------------
def test_a_vllm_engine_starts_from_a_skeleton_and_the_models_weights_in_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """make_engine wrote the whole float32 model for vLLM's loader (at 7B ~28 GiB per start, on
    every node's rank 0): it now writes config and tokenizer only, in a temporary directory of
    the engine's own (removed when it closes: a hosted engine writes it on its own node),
    starts vLLM on dummy weights and pushes the model's own before the engine is used."""
    log = stub_vllm(monkeypatch)
    tok = char_tokenizer()
    model = tiny_llama(len(tok), 0)
    cfg = small("grpo", **{"rollout.engine": "vllm"})
    engine = engines.make_engine("vllm", model, tok, cfg)
    skeleton = Path(log["kwargs"][0]["model"])
    written = sorted(p.name for p in skeleton.iterdir())
    assert "config.json" in written and "tokenizer.json" in written
    assert not [n for n in written if n.endswith((".safetensors", ".bin"))], written
    assert log["kwargs"][0]["load_format"] == "dummy"
    assert log["reloaded"] == list(model.state_dict())  # every weight, before the first sample
    engine.close()
    assert not skeleton.exists()


def test_a_vllm_engine_on_an_export_loads_it_as_it_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    log = stub_vllm(monkeypatch)
    tok = char_tokenizer()
    model = tiny_llama(len(tok), 0)
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    cfg = small("grpo", **{"rollout.engine": "vllm"})
    engine = engines.make_engine("vllm", model, tok, cfg, init_dir=tmp_path / "model")
    assert "load_format" not in log["kwargs"][0]
    assert "reloaded" not in log  # its weights are the export's: nothing pushed
    engine.close()


def test_n_workers_vllm_engines_start_from_one_skeleton_then_their_gathered_shards(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Rank 0 wrote the whole model for every rank's vLLM; now a skeleton, and each rank's
    engine receives its weights from the shards (sync_first=False: _train_rank pushes them once
    sharded)."""
    log = stub_vllm(monkeypatch)
    tok = char_tokenizer()
    model = tiny_llama(len(tok), 0)
    cfg = small("grpo", **{"rollout.engine": "vllm"})

    class OneRank:
        rank, world_size = 0, 1

        def barrier(self) -> None:
            pass

    engine = distributed._make_rank_engine(
        cfg, model, tok, torch.device("cpu"), OneRank(), tmp_path, seed=0
    )  # type: ignore[arg-type]
    init = tmp_path / distributed.VLLM_INIT_DIR
    assert (init / "config.json").is_file()
    assert not list(init.glob("*.safetensors"))
    assert log["kwargs"][0]["load_format"] == "dummy"
    assert "reloaded" not in log  # the rank pushes its gathered shards itself
    engine.close()
