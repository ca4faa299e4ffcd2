"""Issue 22 item 7, on CPU: with the vllm engine, N workers read the policy once.

Rank 0 loads the float32 masters (and a one-worker checkpoint over them); every other rank
builds the same model on the meta device, and after sharding its shards and buffers are filled
from rank 0. Two gloo processes of the tiny preset (tied embeddings, rotary `inv_freq` buffers
that no state dict holds, gradient checkpointing on) must end with exactly the plainly loaded
model's weights and buffers, compute its log-probs, and only rank 0 may have called
`load_masters` / `load_policy` (counted by wrappers installed in each spawned process).

The same through `train_worker` with rollout.engine=vllm (the engine and the trainer stubbed:
the start-up is what is tested): today's start-up loaded the whole model on every rank.
"""

from __future__ import annotations

import collections
import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from dapo_common.util import free_port
from dapo_core.setup.config import ExperimentConfig
from dapo_core.setup.ladders import paper_ladder

pytestmark = pytest.mark.timeout(300)

SETS = {
    "rollout.group_size": 2,
    "rollout.max_response_len": 16,
    "batch.train_batch_size": 2,
    "batch.gen_batch_size": 2,
    "batch.mini_batch_size": 2,
    "model.gradient_checkpointing": True,
    "run.num_threads": 1,
    "run.device": "cpu",
}


def config(engine: str = "hf") -> ExperimentConfig:
    return paper_ladder().config("grpo", "tiny", {**SETS, "rollout.engine": engine})


def batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Two rows of tokens, the second half of each scored as a response."""
    ids = torch.randint(0, vocab, (2, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    response = torch.zeros_like(ids)
    response[:, 5:] = 1
    return ids, mask, response


def count_loads() -> collections.Counter[str]:
    """Count, in this process, every call of the functions that read the whole model."""
    import dapo_core.models as models
    import dapo_core.train.runner as runner

    calls: collections.Counter[str] = collections.Counter()
    for module, name in ((models, "load_policy"), (runner, "load_masters")):
        real = getattr(module, name)

        def counted(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            calls[_name] += 1
            return _real(*args, **kwargs)

        setattr(module, name, counted)
    return calls


def snapshot(model: Any, root: Any) -> dict[str, Any]:
    """What a rank holds after start-up: the gathered full weights, the buffers, log-probs."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    ids, mask, response = batch(model.config.vocab_size)
    with torch.no_grad():
        logprobs, _ = root(ids, mask, response)  # a collective: FSDP2 gathers each layer
    return {
        "state": {k: torch.as_tensor(v).detach().clone() for k, v in state.items()},
        "buffers": {k: v.clone() for k, v in model.named_buffers(remove_duplicate=False)},
        "logprobs": logprobs,
        "tied": model.lm_head.weight is model.model.embed_tokens.weight,
        "checkpointing": bool(model.is_gradient_checkpointing),
        "training": model.training,
    }


# --- the two functions -------------------------------------------------------------------------
def _load_once_worker(rank: int, init: str, ckpt: str, out: str) -> None:
    import torch.distributed as dist

    from dapo_core.engines.hf import eos_token_ids
    from dapo_core.train.collective import open_collective
    from dapo_core.train.distributed import init_distributed, load_policy_once, shard_from_rank0

    torch.set_num_threads(1)
    init_distributed(rank, 2, init, device="cpu")
    try:
        coll = open_collective(120.0)
        calls = count_loads()
        report: dict[str, Any] = {}
        for case, weights in (("fresh", None), ("one-worker checkpoint", Path(ckpt))):
            model, tokenizer, full = load_policy_once(config("vllm"), coll, weights=weights)
            meta = all(p.is_meta for p in model.parameters())
            root = shard_from_rank0(
                model, full, coll, dtype=torch.float32, device=torch.device("cpu")
            )
            del full
            report[case] = {
                **snapshot(model, root),
                "meta": meta,
                "eos": eos_token_ids(model, tokenizer),
                "pad": tokenizer.pad_token_id,
                "calls": dict(calls),
            }
        torch.save(report, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The plainly loaded model (what one worker trains), its log-probs, and a one-worker
    checkpoint whose weights differ from it (every parameter moved)."""
    from dapo_core.cache import quiet_progress
    from dapo_core.engines.hf import eos_token_ids
    from dapo_core.train.checkpoint import MODEL_DIR
    from dapo_core.train.policy import LogprobModel
    from dapo_core.train.runner import load_masters

    model, tokenizer = load_masters(config(), "cpu")  # builds the tiny model once, here
    ckpt = tmp_path_factory.mktemp("one-worker") / "step_1"
    moved, _ = load_masters(config(), "cpu")
    with torch.no_grad():
        for i, p in enumerate(moved.parameters()):
            p.add_(0.01 * (i + 1))
    with quiet_progress():
        moved.save_pretrained(ckpt / MODEL_DIR)

    def expect(m: Any) -> dict[str, Any]:
        ids, mask, response = batch(m.config.vocab_size)
        with torch.no_grad():
            logprobs, _ = LogprobModel(m)(ids, mask, response)
        return {
            "state": m.state_dict(),
            "buffers": dict(m.named_buffers(remove_duplicate=False)),
            "logprobs": logprobs,
            "checkpointing": bool(m.is_gradient_checkpointing),
            "training": m.training,
        }

    return {
        "fresh": expect(model),
        "one-worker checkpoint": expect(moved),
        "eos": eos_token_ids(model, tokenizer),
        "pad": tokenizer.pad_token_id,
        "ckpt": ckpt,
    }


@pytest.fixture(scope="module")
def ranks(plain: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    out = tmp_path_factory.mktemp("load-once")
    init = f"tcp://127.0.0.1:{free_port()}"
    mp.spawn(_load_once_worker, args=(init, str(plain["ckpt"]), str(out)), nprocs=2)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


def test_the_tiny_model_ties_its_embeddings_and_has_non_persistent_buffers(
    plain: dict[str, Any],
) -> None:
    """What makes the copy hard: a parameter used twice, buffers no state dict holds."""
    fresh = plain["fresh"]
    assert "lm_head.weight" in fresh["state"]
    head, embed = fresh["state"]["lm_head.weight"], fresh["state"]["model.embed_tokens.weight"]
    assert head.data_ptr() == embed.data_ptr()
    not_saved = set(fresh["buffers"]) - set(fresh["state"])
    assert any(name.endswith("inv_freq") for name in not_saved)


def test_only_rank_0_reads_the_model(ranks: list[Any]) -> None:
    """Two start-ups: rank 0 loaded twice, rank 1 never (it built the model on meta)."""
    r0, r1 = (r["one-worker checkpoint"] for r in ranks)
    assert r0["calls"] == {"load_masters": 2, "load_policy": 2}
    assert r1["calls"] == {}
    assert [r["fresh"]["meta"] for r in ranks] == [False, True]


@pytest.mark.parametrize("case", ["fresh", "one-worker checkpoint"])
def test_every_rank_holds_the_plainly_loaded_model(
    ranks: list[Any], plain: dict[str, Any], case: str
) -> None:
    expected = plain[case]
    for rank, report in enumerate(ranks):
        got = report[case]
        assert set(got["state"]) == set(expected["state"]), rank
        for name, value in expected["state"].items():
            assert got["state"][name].dtype == torch.float32, (rank, name)
            assert torch.equal(got["state"][name], value), (rank, name)
        assert set(got["buffers"]) == set(expected["buffers"]), rank
        for name, value in expected["buffers"].items():
            assert got["buffers"][name].dtype == value.dtype, (rank, name)
            assert torch.equal(got["buffers"][name], value), (rank, name)
        # The shards compute what the whole model does (FSDP2's lazy init took the shards).
        assert torch.allclose(got["logprobs"], expected["logprobs"], atol=1e-5), rank
        assert got["tied"], rank
        assert got["checkpointing"] == expected["checkpointing"] is True, rank
        assert got["training"] == expected["training"], rank


def test_every_rank_has_the_tokenizer_and_eos(ranks: list[Any], plain: dict[str, Any]) -> None:
    """The meta-built rank's engine stops on the same tokens (its generation config too)."""
    for report in ranks:
        assert report["fresh"]["eos"] == plain["eos"]
        assert report["fresh"]["pad"] == plain["pad"]


# --- through train_worker (the vllm start-up of _train_rank) ------------------------------------
class _Stop(Exception):
    """Raised by the stub trainer: start-up is over."""


def _train_worker_entry(rank: int, init: str, run_dir: str, out: str) -> None:
    import dapo_core.train.distributed as distributed
    import dapo_core.train.trainer as trainer_module

    calls = count_loads()
    seen: dict[str, Any] = {}

    class StubEngine:
        def close(self) -> None:
            pass

    def make_engine(cfg: Any, model: Any, *args: Any, **kwargs: Any) -> StubEngine:
        seen["meta_at_engine"] = all(p.is_meta for p in model.parameters())
        return StubEngine()

    class StubTrainer:
        def __init__(self, cfg: Any, root: Any, *args: Any, **kwargs: Any) -> None:
            seen.update(snapshot(root.policy, root))
            raise _Stop

    distributed._make_rank_engine = make_engine  # type: ignore[assignment]
    trainer_module.Trainer = StubTrainer  # type: ignore[assignment,misc]
    with contextlib.suppress(_Stop):  # the stub trainer ends the run after start-up
        distributed.train_worker(rank, 2, init, config("vllm"), run_dir, num_threads=1)
    torch.save({**seen, "calls": dict(calls)}, Path(out) / f"rank{rank}.pt")


def test_train_worker_with_vllm_reads_the_model_on_rank_0_only(
    plain: dict[str, Any], tmp_path: Path
) -> None:
    init = f"tcp://127.0.0.1:{free_port()}"
    mp.spawn(_train_worker_entry, args=(init, str(tmp_path / "run"), str(tmp_path)), nprocs=2)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2))
    assert r0["calls"] == {"load_masters": 1, "load_policy": 1}
    assert r1["calls"] == {}, "rank 1 read the whole model"
    assert (r0["meta_at_engine"], r1["meta_at_engine"]) == (False, True)
    expected = plain["fresh"]
    for got in (r0, r1):
        for name, value in expected["state"].items():
            assert torch.equal(got["state"][name], value), name
        for name, value in expected["buffers"].items():
            assert torch.equal(got["buffers"][name], value), name
        assert torch.allclose(got["logprobs"], expected["logprobs"], atol=1e-5)
