"""The policy: the embedded tiny model (built, warm-started and cached here) or any causal LM.

`load_policy(model_cfg, device)` returns `(model, tokenizer)` ready for the trainer: left
padding, a pad token, the configured dtype, on `device`.

The tiny model (`model.name_or_path = "tiny"`) is a Llama-style decoder built from the sizes in
ModelConfig, with a tokenizer made here with the `tokenizers` library: one token per character
plus `Answer:` as one token. It is warm-started by a deterministic supervised phase on worked
solutions of the synthetic task (dapo_core.data.synthetic) so that RL starts from mixed rewards;
`tiny-explore` is the same model warm-started on the demonstrations of the explore task
(dapo_core.data.explore) instead, `tiny-lookup` on the lookup task's (dapo_core.data.lookup;
TINY_TASKS). The result is cached on disk under
`$DAPO_CACHE_DIR` (default: the user cache directory of `dapo-lab`), keyed by a hash of
everything that determines the weights. A file lock makes concurrent processes (Ray actors
training several arms at once) build it once and share it. The cached model is an ordinary
`save_pretrained` directory, loaded with AutoModelForCausalLM / AutoTokenizer exactly like a
checkpoint.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from dapo_common.util import duration
from dapo_core.cache import cache_root, quiet_progress
from dapo_core.data import explore, lookup, synthetic
from dapo_core.setup.architectures import ANSWER, EOS, PAD, UNK, tiny_vocab
from dapo_core.setup.config import ModelConfig, is_local_path

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, PreTrainedTokenizerFast

log = logging.getLogger(__name__)

TINY = "tiny"
TINY_EXPLORE = "tiny-explore"
TINY_LOOKUP = "tiny-lookup"


class _DemoTask(Protocol):
    """What a warm start needs of an embedded task (a module: dapo_core.data.synthetic, ...)."""

    @property
    def RECIPE(self) -> tuple[object, ...]: ...  # read-only: a module's constant satisfies it

    def demonstrations(self, n: int, seed: int) -> list[tuple[str, str]]: ...


TINY_TASKS: dict[str, _DemoTask] = {TINY: synthetic, TINY_EXPLORE: explore, TINY_LOOKUP: lookup}
"""The tiny models by name, each with the task whose demonstrations warm-start it."""
TINY_BUILD_VERSION = 1
"""Bump when the tiny model's architecture, tokenizer or warm-start recipe changes."""
WARM_START_SEED = 0
"""The warm start does not depend on the run's seed: every arm and seed starts from one model."""
BUILD_LOG = "builds.jsonl"
"""One line per tiny-model build in the cache root (key, seconds, final loss)."""
WARM_START_THREADS = 1
"""torch threads of every tiny-model build, whatever the caller has (see tiny_model_dir)."""
INFO_FILE = "warm_start.json"
Say = Callable[[str], None]
"""Where a one-time phase says how it goes: one line per call."""
WARM_START_REPORT_S = 10.0
"""Seconds between two progress lines of the warm start (its first line comes at once)."""


# --- public entry point ---------------------------------------------------------------------
def load_policy(
    model_cfg: ModelConfig, device: str, *, dtype: str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The policy model and its tokenizer on `device` (`cpu`, `cuda`, ...), its parameters in
    `dtype` (default model.dtype; training asks for float32 masters)."""
    model, tokenizer = _from_pretrained(policy_source(model_cfg), dtype or model_cfg.dtype)
    model.to(torch.device(device))  # type: ignore[arg-type]
    return model, tokenizer


def load_policy_skeleton(
    model_cfg: ModelConfig, *, dtype: str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The policy `load_policy` gives, built from its config on the meta device (no weights
    read, no memory taken), with the same tokenizer and generation config: what a worker needs
    whose shards are then sent from rank 0 (FSDP2), instead of every worker reading the whole
    model into host memory."""
    return _from_pretrained(policy_source(model_cfg), dtype or model_cfg.dtype, meta=True)


def policy_source(model_cfg: ModelConfig) -> str:
    """Where model.name_or_path is read from: a local directory, else a hub name."""
    from dapo_core import real_model

    name = model_cfg.name_or_path
    if name in TINY_TASKS:
        path = tiny_model_dir(model_cfg)
    elif name == real_model.NAME:  # converted once per machine, on first use
        path = real_model.ensure_converted()
    else:
        path = Path(name).expanduser()
        if is_local_path(name) and not path.exists():
            raise FileNotFoundError(f"model path {name} does not exist")
    return str(path) if path.exists() else name


def _from_pretrained(
    name_or_path: str, dtype: str, *, meta: bool = False
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model and tokenizer; `meta`: the model built from its config on the meta device."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # A hub name is tried from the local Hugging Face cache first; the network only when the
    # hub answers at all (otherwise huggingface_hub retries for half a minute per file).
    local_only = not Path(name_or_path).exists() and not _hub_reachable()
    try:
        with quiet_progress():
            tokenizer = AutoTokenizer.from_pretrained(name_or_path, local_files_only=local_only)
            if meta:
                model = _on_meta(name_or_path, getattr(torch, dtype), local_only=local_only)
            else:
                model = AutoModelForCausalLM.from_pretrained(
                    name_or_path, dtype=getattr(torch, dtype), local_files_only=local_only
                )
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if local_only:
            first = f"not in the local Hugging Face cache and the hub cannot be reached ({first})"
        raise ValueError(
            f"could not load model {name_or_path!r} from the hub or a local path: {first}"
        ) from exc
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def _on_meta(name_or_path: str, dtype: torch.dtype, *, local_only: bool) -> PreTrainedModel:
    """The model of `name_or_path`'s config, every parameter and buffer on the meta device,
    as from_pretrained leaves it otherwise (eval mode, the saved generation config: it names
    the EOS tokens an engine stops on)."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(name_or_path, local_files_only=local_only)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with contextlib.suppress(OSError):  # no generation_config.json: the one from the config
        model.generation_config = GenerationConfig.from_pretrained(
            name_or_path, local_files_only=local_only
        )
    return model.eval()  # type: ignore[no-any-return]


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face endpoint resolves and accepts a TCP connection (offline mode
    set in the environment counts as unreachable)."""
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on"):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = (
        url.hostname or "huggingface.co",
        url.port or (443 if url.scheme == "https" else 80),
    )
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


# --- the tiny model ----------------------------------------------------------------------------
def tiny_cache_key(model_cfg: ModelConfig) -> str:
    """Hash of everything that determines the warm-started weights (not dtype or device)."""
    blob = {
        "build": TINY_BUILD_VERSION,
        "task": list(_task(model_cfg).RECIPE),
        "seed": WARM_START_SEED,
        "vocab": tiny_vocab(),
        "hidden_size": model_cfg.hidden_size,
        "num_layers": model_cfg.num_layers,
        "num_heads": model_cfg.num_heads,
        "intermediate_size": model_cfg.intermediate_size,
        "warm_start_steps": model_cfg.warm_start_steps,
        "recipe": WarmStartRecipe().__dict__,
        "torch": torch.__version__.split("+")[0],
    }
    text = json.dumps(blob, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _task(model_cfg: ModelConfig) -> _DemoTask:
    return TINY_TASKS[model_cfg.name_or_path]


def prepare_policy(
    model_cfg: ModelConfig, say: Say | None = None, *, threads: int | None = None
) -> bool:
    """Make the model's files on this machine once, before a run starts: the tiny model built
    and warm-started (tiny_model_dir), the pinned real model converted
    (dapo_core.real_model.ensure_converted); a hub or local model needs nothing. Progress
    lines go to `say` (default: the log). Returns whether anything was made (False: it was
    there). Callers run it before they start their clocks, so that an arm's time never counts
    this one-time phase.

    `threads`: torch's threads while it converts the real model (then restored), the count the
    run's own process would have used (an arm's granted CPUs, run.num_threads): more threads
    than the cores this user gets make each step wait for the slowest one. The tiny model's
    warm start always runs on one thread (tiny_model_dir), so that its weights do not depend on
    who built it."""
    from dapo_core import real_model

    name = model_cfg.name_or_path
    if name in TINY_TASKS:
        if is_tiny_cached(model_cfg):
            return False
        tiny_model_dir(model_cfg, say=say)
        return True
    if name == real_model.NAME:
        if real_model.is_converted():
            return False
        with torch_threads(threads):
            real_model.ensure_converted(say=say)
        return True
    return False


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """torch's intra-op threads set to `threads` inside (None: left as they are)."""
    if not threads:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def is_tiny_cached(model_cfg: ModelConfig) -> bool:
    """Whether this machine has the tiny model of `model_cfg` built already (no lock taken)."""
    return (cache_root() / "tiny" / tiny_cache_key(model_cfg) / INFO_FILE).exists()


def tiny_model_dir(model_cfg: ModelConfig, *, say: Say | None = None) -> Path:
    """The cached warm-started tiny model's directory, built first if missing.

    Under a file lock: the first process builds it into a temporary sibling and renames it into
    place; the others wait on the lock and then find it there. The build says what it does
    (steps done, loss, ETA; every WARM_START_REPORT_S) to `say`, else to the log.
    """
    from filelock import FileLock

    report: Say = say if say is not None else log.warning
    root = cache_root() / "tiny"
    root.mkdir(parents=True, exist_ok=True)
    key = tiny_cache_key(model_cfg)
    final = root / key
    if (final / INFO_FILE).exists():
        return final
    lock = FileLock(str(root / f"{key}.lock"))
    try:
        lock.acquire(timeout=0)
    except TimeoutError:  # filelock's Timeout is a TimeoutError
        report(f"warm start: another process is building the tiny model ({final}); waiting")
        lock.acquire()
    try:
        if (final / INFO_FILE).exists():  # another process built it while we waited
            return final
        report(
            f"warm start: building the {model_cfg.name_or_path} model "
            f"({model_cfg.warm_start_steps} steps; once per machine, cached in {final})"
        )
        t0 = time.perf_counter()
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
        try:
            # One thread, whatever the caller has: the weights must be a function of the cache
            # key, and two threads sum differently from one (a 600-step build ended at a loss
            # of 0.2315 against 0.2382 on one CPU, 2026-11-29); whichever process builds first
            # fills the machine's cache for every later run.
            with torch_threads(WARM_START_THREADS):
                info = build_tiny_model(model_cfg, tmp, on_step=warm_start_reporter(report))
            if not (tmp / "config.json").is_file():
                # transformers' save_pretrained writes only on rank 0 of an initialised
                # torch.distributed group; a cache without weights must never be published.
                raise RuntimeError(
                    "the tiny model was built on a torch.distributed rank other than 0, where "
                    "save_pretrained writes nothing; build it on rank 0 first"
                )
            info["key"] = key
            (tmp / INFO_FILE).write_text(json.dumps(info, indent=2, sort_keys=True))
            if final.exists():  # a half-written leftover of a killed build
                shutil.rmtree(final)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        with (root / BUILD_LOG).open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(info, sort_keys=True) + "\n")
        report(
            f"warm start: done in {duration(time.perf_counter() - t0)}"
            + (f" (final loss {info['final_loss']:.3f})" if info.get("final_loss") else "")
        )
    finally:
        lock.release()
    return final


def warm_start_reporter(
    say: Say, every_s: float = WARM_START_REPORT_S
) -> Callable[[int, int, float], None]:
    """warm_start's on_step: a line `warm start: step 120/600  loss 1.234  0:25 elapsed  ETA
    1:40` after the first step, then every `every_s` seconds, and at the last step."""
    t0 = time.perf_counter()
    last = [-float("inf")]

    def on_step(step: int, steps: int, loss: float) -> None:
        now = time.perf_counter()
        if step != 1 and step != steps and now - last[0] < every_s:
            return
        last[0] = now
        elapsed = now - t0
        eta = elapsed / step * (steps - step)
        say(
            f"warm start: step {step}/{steps}  loss {loss:.3f}  {duration(elapsed)} elapsed"
            f"  ETA {duration(eta)}"
        )

    return on_step


def build_tiny_tokenizer(
    vocab: int | None = None, *, max_length: int = 512
) -> PreTrainedTokenizerFast:
    """Characters as tokens, `Answer:` as one (so the answer line costs 4 tokens, not 10).

    `vocab`: fill the table with filler tokens `<tN>` up to exactly that many ids, so that every
    id a randomly initialised model of that vocabulary samples decodes (bench/gpu_check.py's
    Qwen-shaped models). Needs only `tokenizers` and transformers: no hub."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    table = tiny_vocab()
    if vocab is not None:
        if vocab < len(table):
            raise ValueError(f"vocab {vocab} < the {len(table)} characters the prompts need")
        table.update({f"<t{i}>": i for i in range(len(table), vocab)})
    tok = Tokenizer(models.WordLevel(table, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(rf"{ANSWER}|[\s\S]"), "isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        model_max_length=max_length,
    )


def build_tiny_model(
    model_cfg: ModelConfig,
    out: Path,
    *,
    on_step: Callable[[int, int, float], None] | None = None,
) -> dict[str, Any]:
    """Build, warm-start and save the tiny model and tokenizer to `out`; returns build info
    (with the building process's id: tests check where it was built). `on_step(step, steps,
    loss)` after each warm-start step."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tiny_tokenizer()
    vocab = tiny_vocab()
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=model_cfg.hidden_size,
        num_hidden_layers=model_cfg.num_layers,
        num_attention_heads=model_cfg.num_heads,
        num_key_value_heads=model_cfg.num_heads,
        intermediate_size=model_cfg.intermediate_size,
        max_position_embeddings=512,
        bos_token_id=None,
        eos_token_id=vocab[EOS],
        pad_token_id=vocab[PAD],
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(WARM_START_SEED)
        model = LlamaForCausalLM(config)
        t0 = time.perf_counter()
        stats = warm_start(
            model,
            tokenizer,
            model_cfg.warm_start_steps,
            WarmStartRecipe(),
            _task(model_cfg),
            on_step=on_step,
        )
    stats["seconds"] = round(time.perf_counter() - t0, 2)
    stats["pid"] = os.getpid()
    stats["params"] = sum(p.numel() for p in model.parameters())
    model.generation_config.eos_token_id = vocab[EOS]
    model.generation_config.pad_token_id = vocab[PAD]
    model.generation_config.bos_token_id = None
    with quiet_progress():  # transformers' "Writing model shards" bar would cut the lines
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    return stats


class WarmStartRecipe:
    """Supervised phase hyperparameters (part of the cache key)."""

    def __init__(self) -> None:
        self.batch_size = 64
        self.lr = 3e-3
        self.warmup = 20
        self.min_lr_ratio = 0.1
        self.weight_decay = 0.0


def warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    steps: int,
    recipe: WarmStartRecipe,
    task: _DemoTask = synthetic,
    *,
    on_step: Callable[[int, int, float], None] | None = None,
) -> dict[str, Any]:
    """Teacher-forced next-token loss on the task's demonstrations, read in order (prompt tokens
    masked), AdamW with linear warm-up and cosine decay. Deterministic: fixed data seed, torch
    seeded by the caller. `on_step(step, steps, loss)` after each step (1-based)."""
    if steps == 0:
        return {"steps": 0, "final_loss": None}
    examples = task.demonstrations(steps * recipe.batch_size, WARM_START_SEED)
    eos = int(tokenizer.eos_token_id)  # type: ignore[arg-type]
    pad = int(tokenizer.pad_token_id)  # type: ignore[arg-type]
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)

    def lr_at(u: int) -> float:
        if u < recipe.warmup:
            return (u + 1) / recipe.warmup
        progress = (u - recipe.warmup) / max(1, steps - recipe.warmup)
        return recipe.min_lr_ratio + (1 - recipe.min_lr_ratio) * 0.5 * (
            1 + math.cos(math.pi * progress)
        )

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    model.train()
    losses: list[float] = []
    for step in range(steps):
        batch = examples[step * recipe.batch_size : (step + 1) * recipe.batch_size]
        ids, labels = [], []
        for prompt, solution in batch:
            p = tokenizer(prompt)["input_ids"]
            s = tokenizer(solution)["input_ids"] + [eos]
            ids.append(p + s)
            labels.append([-100] * len(p) + s)
        width = max(len(x) for x in ids)
        input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
        label_t = torch.full((len(ids), width), -100, dtype=torch.long)
        attn = torch.zeros((len(ids), width), dtype=torch.long)
        for i, (x, y) in enumerate(zip(ids, labels, strict=True)):
            input_ids[i, : len(x)] = torch.tensor(x)
            label_t[i, : len(y)] = torch.tensor(y)
            attn[i, : len(x)] = 1
        out = model(input_ids=input_ids, attention_mask=attn, labels=label_t)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(out.loss.detach()))
        if on_step is not None:
            on_step(step + 1, steps, losses[-1])
    model.eval()
    tail = losses[-10:]
    return {"steps": steps, "final_loss": round(sum(tail) / len(tail), 4)}
