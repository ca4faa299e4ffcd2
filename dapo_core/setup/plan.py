"""`dapo plan`: the GPU memory one worker of an arm needs, item by item, and whether it fits.

The model of memory (per worker; P parameters, N workers, c bytes of the compute dtype:
2 for bfloat16/float16, 4 for float32):

Sharded by FSDP2 across the N workers (one worker holds 1/N; N = 1 holds all):
- fp32 master shard           4P / N   (the optimizer's parameters, model.dtype is compute only)
- gradients (fp32 shard)      4P / N   (reduced in float32; freed after every update)
- AdamW states                8P / N   (exp_avg and exp_avg_sq, float32)
- optimizer step scratch      4P / N   (torch's foreach AdamW makes one float32 copy, √v, per step)
With `model.cpu_offload` (N > 1 only) the first three live in host memory and the step runs there.
Before activations that is 16 bytes per parameter: 7.6B parameters → 122 GB, so one 80 GB GPU
cannot hold a 7B model's training state and eight can (15 GB each).

Not sharded (every worker holds its own):
- compute-dtype weights: N = 1 runs forward and backward under autocast, which keeps a c-byte copy
  of every decoder Linear weight alive until its backward (c · layer params). N > 1: FSDP2 with
  `MixedPrecisionPolicy(param_dtype=c)`, one unit per decoder layer plus the root (embedding, final
  norm, LM head; dapo_core.train.distributed.shard_policy): the root's unsharded weights stay
  gathered through forward and backward, two layers at a time (the current one and the prefetched).
- gradient buffers (N > 1): a layer's unsharded gradient in c bytes plus its float32 copy for the
  reduce-scatter, and the LM head's gradient, which the root unit reduces only at the end.
- activations of one micro-batch (`batch.micro_batch_size` sequences of max_prompt_len +
  max_response_len tokens, the worst case): counted tensor by tensor from what autograd saves in
  a Llama/Qwen2 decoder layer (see `layer_activation_bytes`); with gradient checkpointing only each
  layer's input is kept and one layer is recomputed at a time.
- the log-prob head (dapo_core.train.logprobs): the response positions' hidden states, and the
  larger of its forward scratch (two chunks of about 2^24 float32 logits) and its backward's (a
  chunk, the float32 weight-gradient sum over V × H and one chunk's product). That scratch is freed
  before the first layer's backward, so of a layer's backward only the excess over it is added.
- the rollout engine. vLLM (colocated, one engine per worker, no tensor parallelism): its
  `rollout.gpu_memory_utilization` share of the GPU is RESERVED for the whole run: vLLM allocates
  it when it starts (the engine never sleeps), and it holds the compute-dtype weights (cP, not
  sharded), its own non-KV overhead, and the KV cache in the rest. Training must fit in what is left,
  and the KV cache must hold at least one full-length sequence or vLLM refuses to start. The hf
  engine (our sampling loop over the transformers model) samples with the training model; its KV
  cache and one step's logits exist only while it generates, when activations do not; on N > 1
  it samples with an unsharded c-byte copy.
- N > 1: after each update the weights reach the engine gathered one parameter at a time (the
  largest parameter, in the compute dtype, is the buffer); every worker first loads the whole
  fp32 model in host memory (4P) to shard it.
- CUDA context and workspaces (1 GiB) and allocator fragmentation (10% of the update's working set).
- What a first GPU run would meet beyond that (estimates, each a named item of TRAINING_ITEMS):
  NCCL's channel buffers (N > 1), vLLM's CUDA graphs (captured outside its share) and its sampler's
  scratch (while generating), and a margin for one allocator shared by vLLM and training (3% of the
  GPU). The plan's output prints what is left of the GPU and which of its items are allowances.

The engine on a process of its own (the flows' `--rollout-actor`: a Ray actor per worker, on
its own GPU or CPUs): the trainer's plan then has none of the engine's items (its share, copy,
KV cache, CUDA graphs, sampler, the colocation margin); each update's weights go to it through
host memory (an item of the host's); and `plan_rollout_engine` plans the engine's own GPU: the
weights it samples with (the one-worker recipe ships the fp32 masters, N workers' their
compute-dtype copy), vLLM's share, graphs and sampler or the hf engine's KV cache, a CUDA context.

Asynchronous rollouts (`rollout.mode = async`, docs/async.md): the rollout worker generates while
the trainer updates, so the rollout phase's items are held during the update and the optimizer
step (the peak adds them); after each update the trainer snapshots the weights for the worker
(one worker: a clone of the fp32 state dict, 4P; N workers: the gathered compute-dtype weights,
cP), held until the worker loads them, at worst through the next update; and one worker's hf
engine samples from a copy of the fp32 masters of its own (4P), not the trainer's model.

Phases: the peak is the resident items (masters, AdamW states, the engine's share, context) plus
the largest of: the update (weights, gradients, activations, head), the optimizer step (gradients,
scratch), the rollout (hf KV cache) and the weight sync. Gradient accumulation over several micro-batches makes the
update's peak real: the second micro-batch runs with every gradient already allocated.

Pure arithmetic: no torch, no GPU. `check_fits` is what training entry points call before a GPU run.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from dapo_core.setup.architectures import Architecture, resolve_architecture
from dapo_core.setup.config import ExperimentConfig

GIB = 1 << 30
DEFAULT_GPU_GIB = 79.0
"""An 80 GB A100/H100 as torch.cuda reports its total memory, rounded down."""
GPU_SIZES: tuple[tuple[str, float], ...] = (("80 GB A100/H100", 79.0), ("141 GB H200", 139.0))
"""Sizes the advice may name when no worker count fits the GPU asked about."""
MAX_WORKERS = 1024

CUDA_CONTEXT_GIB = 1.0
"""Per GPU process: CUDA context and cuBLAS workspaces (an estimate; NCCL's buffers are their own
item)."""
FRAGMENTATION = 0.10
"""The caching allocator's waste on the update's changing tensor sizes (an estimate)."""
VLLM_OVERHEAD_GIB = 2.0
"""vLLM's share that is not KV cache or weights: what its profiling run measures (activations,
the sampler at its dummy batch) (an estimate). CUDA graphs come after it: VLLM_CUDA_GRAPHS_GIB."""
VLLM_CUDA_GRAPHS_GIB = 1.0
"""vLLM captures its decode CUDA graphs after it has sized the KV cache from
`gpu_memory_utilization`, so their private memory pools come on top of the share (vLLM logs
"Graph capturing finished ..., took X GiB": a few tenths of a GiB to about 1 GiB at 0.5-32B)."""
VLLM_MAX_NUM_SEQS = 1024
"""vLLM V1's default `max_num_seqs` for the offline `LLM` on a GPU of 70 GiB or more: the most
rows its sampler holds at once."""
VLLM_SAMPLER_BYTES = 12
"""Sampler bytes per logit of one decode step: float32 logits, the processed log-probs we ask
for, the probabilities it draws from (4 B each)."""
VLLM_TOP_P_BYTES = 12
"""With top_p < 1 the sort keeps sorted values (4 B) and their int64 indices (8 B) as well."""
COLOCATION_MARGIN = 0.03
"""Share of the GPU kept free when vLLM and training share one caching allocator: blocks freed
by one side are cached in sizes the other side rarely asks for (an estimate; the GPU check's
`reserved - allocated` is the number to replace it with)."""
NCCL_CHANNELS = 32
"""NCCL's channel count on NVLink nodes (NCCL_MAX_NCHANNELS' default ceiling)."""
NCCL_PEERS = 2
"""Ring: each channel sends to one peer and receives from another."""
NCCL_BUFFER_BYTES = (1 << 22) + 120 * 640 * 8 * 8 + 8 * 512 * 8 * 16
"""Per channel and peer: the Simple protocol's NCCL_BUFFSIZE (4 MiB), LL128's (4.69 MiB) and
LL's (0.5 MiB), from NCCL's defaults (src/include/device.h)."""
MARGIN_ITEMS = ("fragmentation", "colocation")
"""Items that are allowances for waste, not tensors: `dapo plan` prints them as the margin."""
CHUNK_LOGITS = 1 << 24
"""Logits per chunk of the log-prob head (dapo_core.train.logprobs computes in chunks of
auto_chunk_size tokens)."""


def auto_chunk_size(vocab_size: int) -> int:
    """Tokens per chunk so that one chunk's logits hold about CHUNK_LOGITS values."""
    return max(16, min(4096, CHUNK_LOGITS // max(vocab_size, 1)))


HF_MAX_BATCH_SEQS = 512
"""HFEngine's default max_batch_seqs: sequences per generate call (a test keeps them equal)."""
HF_DECODE_ATTENTION_COPIES = 4
"""The hf engine's decode attention, in units of one layer's keys and values expanded to every
query head (2 × rows × heads × tokens × head_dim values in the cache's dtype). With a padding
mask, transformers' sdpa path on CUDA expands GQA's keys and values to every head (repeat_kv)
for each layer it runs, and the kernel's working set comes on top. Measured on GPUs as the
rollout phase's peak beyond the KV cache, the sampler and the weights (bench/RESULTS.md): 2.9x
(Qwen2.5-0.5B, 64 rows × 384 tokens, H200), 3.5x (1.5B, 64 × 384, H100) and 4.0x (0.5B,
128 × 640, H100). Planned at the largest; which kernel holds what was not profiled."""

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


class PlanError(ValueError):
    """A configuration that cannot fit the GPUs granted; the message is the plan's advice."""


@dataclass(frozen=True)
class Item:
    """One line of the plan: bytes per worker, when they are held, and where."""

    key: str
    label: str
    nbytes: float
    phases: tuple[str, ...]
    """`resident` (the whole run), `startup` (host, while loading) or some of `update`, `step`,
    `rollout`, `sync` (held only then)."""
    sharded: bool = False
    on_host: bool = False
    detail: str = ""


@dataclass(frozen=True)
class Plan:
    arch: Architecture
    workers: int
    gpu_bytes: float
    device: str
    regime: str
    """`fp32`, `autocast` (one worker: fp32 masters, autocast) or `fsdp` (FSDP2 mixed precision)."""
    items: tuple[Item, ...]
    kv_tokens: float = 0.0
    """vLLM: tokens its KV cache holds (0 for the hf engine)."""
    seq_len: int = 0
    problems: tuple[str, ...] = field(default=())
    """Why it does not fit (empty when it does)."""
    engine_apart: bool = False
    """A trainer's plan whose rollout engine runs in a process of its own."""
    overlapped: bool = False
    """Async rollouts: generation (the rollout phase) runs during the update and the step."""

    @property
    def gpu_items(self) -> tuple[Item, ...]:
        return tuple(i for i in self.items if not i.on_host)

    def phase_bytes(self, phase: str) -> float:
        """GPU bytes held only in `phase` (with async overlap, the update's and the step's
        include the rollout's: generation runs meanwhile)."""
        own = sum(i.nbytes for i in self.gpu_items if phase in i.phases)
        if self.overlapped and phase in ("update", "step"):
            own += self.phase_bytes("rollout")
        return own

    @property
    def peak_bytes(self) -> float:
        """Resident items plus the largest phase (update, step, rollout or sync), GPU only."""
        resident = sum(i.nbytes for i in self.gpu_items if "resident" in i.phases)
        return resident + max(self.phase_bytes(p) for p in ("update", "step", "rollout", "sync"))

    @property
    def training_bytes(self) -> float:
        """The peak without the engine and the GPU runtime: what a CPU process measures."""
        skip = {"engine", "context", "fragmentation", "kv_hf", "nccl", "vllm_graphs"}
        skip |= {"vllm_sampler", "colocation", "async_copy", "snapshot"}
        kept = [i for i in self.gpu_items if i.key not in skip]
        resident = sum(i.nbytes for i in kept if "resident" in i.phases)
        return resident + max(
            sum(i.nbytes for i in kept if p in i.phases) for p in ("update", "step")
        )

    @property
    def host_bytes(self) -> float:
        """Host memory per worker: the offloaded shards, or the whole model while loading."""
        host = [i for i in self.items if i.on_host]
        loading = sum(i.nbytes for i in host if "startup" in i.phases)
        return max(loading, sum(i.nbytes for i in host if "startup" not in i.phases))

    @property
    def margin_bytes(self) -> float:
        """What is left of the GPU after the peak (negative when it does not fit)."""
        return self.gpu_bytes - self.peak_bytes

    @property
    def fits(self) -> bool:
        return not self.problems

    def item(self, key: str) -> Item:
        for i in self.items:
            if i.key == key:
                return i
        raise KeyError(key)

    def biggest(self, k: int = 3) -> list[Item]:
        return sorted(self.gpu_items, key=lambda i: -i.nbytes)[:k]


# --- activations --------------------------------------------------------------------------------
def regime(dtype: str, workers: int) -> str:
    if DTYPE_BYTES[dtype] == 4:
        return "fp32"
    return "autocast" if workers == 1 else "fsdp"


def layer_activation_bytes(
    a: Architecture, regime_: str, c: int, padded: bool, seq_len: int
) -> int:
    """Bytes autograd saves per token in one decoder layer (transformers' Llama/Qwen2 with SDPA).

    Checked against `torch.autograd.graph.saved_tensors_hooks` on transformers 5.19 (H hidden,
    I intermediate, q = heads·head_dim, kv as repeated below):
    - two RMSNorms, each: its float32 input and x·rsqrt(var) (fsdp: the float32 upcast 4H and the
      normalised value cast back, cH);
    - the Linear inputs: the norm's output, shared by q/k/v and by gate/up (4H each in fp32, cH in
      fsdp) — but autocast casts it once per Linear: 5 copies of cH (q, k, v, gate, up);
    - attention: q, k, v and the output (c bytes each) and a float32 logsumexp per head; with a
      padding mask transformers repeats k and v to every head and SDPA converts the [b, 1, T, T]
      mask to a float copy per layer (c·T per token); without one (a micro-batch of one sequence)
      k and v stay at kv_heads (GQA in SDPA) and there is no mask;
    - the SwiGLU MLP: gate, up, silu(gate) and their product, cI each.
    """
    H, I = a.hidden, a.intermediate
    kv = a.q_dim if padded else a.kv_dim
    if regime_ == "fsdp":
        norms = 2 * (4 * H + c * H)
        inputs = 2 * c * H
    elif regime_ == "autocast":
        norms = 2 * (4 * H + 4 * H)
        inputs = 5 * c * H
    else:
        norms = 2 * (4 * H + 4 * H)
        inputs = 2 * 4 * H
    attention = c * (2 * a.q_dim + 2 * kv) + 4 * a.heads + (c * seq_len if padded else 0)
    mlp = 4 * c * I
    return norms + inputs + attention + mlp


@dataclass(frozen=True)
class Activations:
    """One micro-batch's activation memory, in the pieces that are held at different times.

    The update's peak is `saved + head_saved + max(head_transient, layer_backward)`: the head's
    forward/backward scratch is freed before the first decoder layer's backward starts.
    """

    saved: float
    """Saved by the decoder for backward: every layer's tensors, or with gradient checkpointing
    only each layer's input; plus the final norm's."""
    layer_backward: float
    """A layer's backward in flight: its gradients (and, checkpointed, its recomputed tensors)."""
    head_saved: float
    """The response positions' final hidden states, saved by the chunked head."""
    head_transient: float
    """The head's larger scratch: forward (two chunks of logits) or backward (a chunk, the V × H
    weight-gradient accumulator and product, the hidden states' gradients)."""

    @property
    def decoder(self) -> float:
        """The decoder's own footprint (saved + a layer's backward): the with/without figure."""
        return self.saved + self.layer_backward


def activations(
    a: Architecture,
    regime_: str,
    c: int,
    seqs: int,
    seq_len: int,
    response_len: int,
    checkpointing: bool,
) -> Activations:
    """Activations of one micro-batch: `seqs` sequences of `seq_len` tokens (the worst case: every
    sequence at the full budget, one of them a token shorter so the micro-batch is padded)."""
    n = seqs * seq_len
    n_resp = seqs * response_len
    padded = seqs > 1
    r = c if regime_ == "fsdp" else 4  # the residual stream: float32 unless FSDP casts the weights
    per_layer = layer_activation_bytes(a, regime_, c, padded, seq_len)
    # Outside the layers: input ids (int64), the final RMSNorm (its float32 input and normalised
    # value), the boolean [b, 1, T, T] mask transformers builds once for a padded micro-batch.
    yb = c if regime_ == "fsdp" else 4
    base = n * (8 + 4 * a.hidden + yb * a.hidden + (seq_len if padded else 0))
    # A layer's backward: the gradients flowing through it (the MLP's three cI-wide ones at once,
    # two of the residual stream's), and its largest Linear's weight gradient before it is added
    # into the float32 .grad (autocast: computed in c bytes, then cast; fsdp: the buffers item).
    big_linear = a.hidden * a.intermediate
    workspace = n * (3 * c * a.intermediate + 2 * r * a.hidden)
    workspace += {"autocast": (c + 4) * big_linear, "fp32": 4 * big_linear}.get(regime_, 0)
    if checkpointing:
        saved = n * a.layers * r * a.hidden + base  # each layer keeps its input
        layer_backward = n * per_layer + workspace  # backward recomputes one layer at a time
    else:
        saved = n * a.layers * per_layer + base
        layer_backward = workspace

    # The chunked head (dapo_core.train.logprobs). Hidden states reach it in float32 unless FSDP
    # casts the weights; the weight it sees is the float32 master on one worker.
    zb = wb = c if regime_ == "fsdp" else 4
    chunk = min(n_resp, auto_chunk_size(a.vocab))
    vh = a.vocab * a.hidden
    logits = chunk * a.vocab
    # Forward: the chunk's float32 logits, turned into log p in place, and exp(log p) for the
    # entropy. Under autocast the matmul first casts the head weight (for each chunk: a view is
    # not cached) and returns c-byte logits; both are freed before exp(log p) is made.
    forward = max(8 * logits, (c * vh + c * logits) if regime_ == "autocast" else 0)
    # Backward: the chunk's log p, reused in place for the gradient (plus its cast to the weight's
    # dtype), the float32 weight-gradient sum and one chunk's product (V × H in the weight's dtype,
    # and its float32 copy when that is not float32), and the hidden states' gradient (at the
    # response positions, then scattered back into [b, T, H] twice).
    backward = (
        4 * logits
        + (wb * logits if wb != 4 else 0)
        + 4 * vh
        + wb * vh
        + (4 * vh if wb != 4 else 0)
        + zb * a.hidden * (n_resp + 2 * n)
    )
    return Activations(
        saved=saved,
        layer_backward=layer_backward,
        head_saved=n_resp * a.hidden * zb,
        head_transient=max(forward, backward),
    )


# --- the plan: a table of items -------------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    """What the items of a training plan read: the config and the numbers derived from it."""

    cfg: ExperimentConfig
    a: Architecture
    workers: int
    gpu_memory_gib: float
    device: str
    """`cuda`, or `cpu` for one CPU process (no CUDA context, AdamW's per-tensor step)."""
    engine_apart: bool = False
    """The rollout engine runs in a process of its own (plan_rollout_engine plans it)."""

    @property
    def c(self) -> int:
        """Bytes of the compute dtype."""
        return DTYPE_BYTES[self.cfg.model.dtype]

    @property
    def regime(self) -> str:
        return regime(self.cfg.model.dtype, self.workers)

    @property
    def seq_len(self) -> int:
        return self.cfg.rollout.max_prompt_len + self.cfg.rollout.max_response_len

    @property
    def whole_weight_bytes(self) -> int:
        """Bytes per parameter of the weights handed on whole (async snapshot, a hosted
        engine's recipe and updates): one worker's fp32 masters, N workers' gathered
        compute-dtype weights."""
        return 4 if self.workers == 1 else self.c

    @property
    def overlapped(self) -> bool:
        """Async rollouts: generation runs while the trainer updates."""
        return self.cfg.rollout.mode == "async"

    @property
    def offload(self) -> bool:
        return self.cfg.model.cpu_offload and self.workers > 1

    @property
    def gpu(self) -> float:
        return self.gpu_memory_gib * GIB

    @property
    def vllm(self) -> bool:
        return self.cfg.rollout.engine == "vllm"

    @property
    def sharded_text(self) -> str:
        """` ÷ N` after a sharded item's bytes per parameter (nothing on one worker)."""
        return f" ÷ {self.workers}" if self.workers > 1 else ""

    @functools.cached_property
    def activations(self) -> dict[bool, Activations]:
        """One micro-batch's activations, with gradient checkpointing (True) and without."""
        cfg = self.cfg
        return {
            ck: activations(
                self.a,
                self.regime,
                self.c,
                cfg.batch.micro_batch_size,
                self.seq_len,
                cfg.rollout.max_response_len,
                checkpointing=ck,
            )
            for ck in (False, True)
        }

    @property
    def act(self) -> Activations:
        """The activations of the run as configured (model.gradient_checkpointing)."""
        return self.activations[self.cfg.model.gradient_checkpointing]

    @functools.cached_property
    def vllm_share(self) -> tuple[Item, float, str | None]:
        """_vllm_share of this run: the item, its KV cache in tokens, a problem or None."""
        return _vllm_share(
            self.cfg, self.a, self.c * self.a.params, self.gpu_memory_gib, self.seq_len
        )


def _decoder_linears(a: Architecture) -> int:
    """The decoder's Linear parameters (each layer's, less its two norms' weights): what
    autocast casts and caches on one worker."""
    return a.layers * (a.layer_params - 2 * a.hidden)


def _weights(s: Setting) -> Item:
    a, N, c = s.a, s.workers, s.c
    if N == 1 and s.regime == "fp32":
        weights, wnote = 0.0, "the fp32 masters are the compute weights"
    elif N == 1:
        weights = c * _decoder_linears(a)
        wnote = f"autocast's {c}-byte copies of the decoder's Linear weights"
    else:
        cw = c if s.regime == "fsdp" else 4
        weights = cw * (a.root_params + 2 * a.layer_params)
        wnote = "FSDP2 units gathered: root (embedding, norm, head) + 2 decoder layers"
    return Item("weights", f"{s.cfg.model.dtype} weights", weights, ("update",), detail=wnote)


def _sharded_state(
    s: Setting,
    key: str,
    label: str,
    per_param: int,
    phases: tuple[str, ...],
    detail: str,
    *,
    offloaded: bool = True,
) -> Item:
    """A float32 state of `per_param` bytes a parameter that FSDP2 shards: 1/N on each worker,
    in host memory with model.cpu_offload when `offloaded`."""
    return Item(
        key,
        label,
        per_param * s.a.params / s.workers,
        phases,
        sharded=True,
        on_host=offloaded and s.offload,
        detail=detail,
    )


def _masters(s: Setting) -> Item:
    detail = f"4 B × {_count(s.a.params)} params{s.sharded_text}"
    return _sharded_state(s, "masters", "fp32 master shard", 4, ("resident",), detail)


def _grads(s: Setting) -> Item:
    detail = f"4 B/param{s.sharded_text}; freed after each update"
    return _sharded_state(s, "grads", "gradients (fp32)", 4, ("update", "step"), detail)


def _grad_buffers(s: Setting) -> Item:
    a = s.a
    cw = s.c if s.regime == "fsdp" else 4
    buffers = (cw + (4 if cw != 4 else 0)) * a.layer_params + cw * a.vocab * a.hidden
    return Item(
        "grad_buffers",
        "gradient buffers (unsharded)",
        buffers,
        ("update",),
        detail="one layer's gradient + its fp32 copy for reduce-scatter, the LM head's",
    )


def _adam(s: Setting) -> Item:
    detail = f"exp_avg + exp_avg_sq, 8 B/param{s.sharded_text}"
    return _sharded_state(s, "adam", "AdamW states (fp32)", 8, ("resident",), detail)


def _reference(s: Setting) -> Item:
    detail = "algo.kl_coef > 0 keeps a frozen copy"
    label = "reference model (fp32)"
    return _sharded_state(s, "ref", label, 4, ("resident",), detail, offloaded=False)


def _activations(s: Setting) -> Item:
    use_ckpt = s.cfg.model.gradient_checkpointing
    acts = s.activations
    return Item(
        "activations",
        "activations, one micro-batch",
        s.act.saved,
        ("update",),
        detail=f"{s.cfg.batch.micro_batch_size} × {s.seq_len} tokens saved for backward, "
        "gradient checkpointing "
        + ("on" if use_ckpt else "off")
        + f" (decoder with a layer's backward — on: {_g(acts[True].decoder)} GiB, "
        f"off: {_g(acts[False].decoder)} GiB)",
    )


def _logprob_head(s: Setting) -> Item:
    tokens = s.cfg.batch.micro_batch_size * s.cfg.rollout.max_response_len
    chunk = min(tokens, auto_chunk_size(s.a.vocab))
    return Item(
        "head",
        "log-prob head (chunked)",
        s.act.head_saved + s.act.head_transient,
        ("update",),
        detail=f"chunks of {chunk} tokens × {s.a.vocab} logits; V × H fp32 weight-gradient sum",
    )


def _layer_backward(s: Setting) -> Item:
    act = s.act
    return Item(
        "backward",
        "layer backward, beyond the head",
        max(0.0, act.layer_backward - act.head_transient),
        ("update",),
        detail=f"{_g(act.layer_backward)} GiB in flight"
        + (" with its recomputed tensors" if s.cfg.model.gradient_checkpointing else "")
        + ", after the head's scratch is freed: only the excess counts",
    )


def _step_scratch(s: Setting) -> Item:
    a = s.a
    if s.offload:
        scratch, snote = 0.0, "the step runs on the host (cpu_offload)"
    elif s.device == "cuda":
        scratch, snote = 4 * a.params / s.workers, f"foreach AdamW's fp32 √v copy{s.sharded_text}"
    else:
        # torch picks the per-tensor AdamW on CPU: √v and its division for one tensor at a time.
        largest = max(a.embedding_params, a.hidden * a.intermediate)
        scratch, snote = 8 * largest, "per-tensor AdamW: two temporaries of the largest tensor"
    return Item(
        "step",
        "optimizer step scratch",
        scratch,
        ("step",),
        sharded=s.device == "cuda",
        detail=snote,
    )


def _vllm_engine(s: Setting) -> Item:
    return s.vllm_share[0]


def _rollout_copy(s: Setting) -> Item:
    return Item(
        "rollout_copy",
        "hf engine's rollout copy",
        s.c * s.a.params,
        ("resident",),
        detail=f"an unsharded {s.cfg.model.dtype} copy of the policy to sample with",
    )


def _hf_sampling(s: Setting) -> Item:
    cfg, N = s.cfg, s.workers
    per_call = max(1, HF_MAX_BATCH_SEQS // cfg.rollout.group_size)
    prompts = min(per_call, math.ceil(cfg.batch.gen_batch_size / N))
    # One worker samples with its fp32 masters under autocast, whose k/v projections return
    # the compute dtype (measured on an H200: bench/RESULTS.md, first contact with a GPU); in
    # float32 the cache is float32. N workers sample with their compute-dtype rollout copy.
    kv_bytes = 4 if s.regime == "fp32" else s.c
    return hf_kv_cache(s.a, prompts * cfg.rollout.group_size, s.seq_len, kv_bytes)


def hf_kv_cache(a: Architecture, rows: int, seq_len: int, kv_bytes: int) -> Item:
    """The hf engine's sampling memory, while it generates: the KV cache of `rows` sequences of
    `seq_len` tokens (`kv_bytes` per value; one layer's more while the cache grows by a
    concatenation or drops finished rows) and a decode step's sampling working set per row and
    vocabulary entry: its logits (`kv_bytes`), the sampler's float32 log-probs, this step's and
    the last one's, and its float64 CDF (engines/hf.py: sampling_logprobs, draw); and one
    layer's attention while it decodes (HF_DECODE_ATTENTION_COPIES)."""
    kv = rows * seq_len * a.kv_bytes_per_token * kv_bytes * (1 + 1 / max(a.layers, 1))
    sampling = rows * a.vocab * (kv_bytes + 4 + 4 + 8)
    attention = HF_DECODE_ATTENTION_COPIES * 2 * rows * seq_len * a.q_dim * kv_bytes
    return Item(
        "kv_hf",
        "hf engine's KV cache",
        kv + sampling + attention,
        ("rollout",),
        detail=f"{rows} sequences × {seq_len} tokens + a decode step's logits, sampler and "
        "one layer's attention",
    )


def _autocast_copies(s: Setting) -> Item:
    a = s.a
    return Item(
        "rollout_weights",
        f"{s.cfg.model.dtype} weights while sampling",
        s.c * (_decoder_linears(a) + a.vocab * a.hidden),
        ("rollout",),
        detail="autocast's cached copies of every Linear weight, the LM head's included, kept "
        "for the whole generation (one autocast block: engines/hf.py)",
    )


def _weight_sync(s: Setting) -> Item:
    a = s.a
    # After each update every parameter is gathered in the compute dtype, one at a time, as
    # the engine reads it (distributed.push_weights); the largest is the embedding.
    return Item(
        "sync",
        "weight sync to the engine",
        s.c * max(a.embedding_params, a.hidden * a.intermediate),
        ("sync",),
        detail="the parameter being gathered (the largest: the embedding or an MLP)",
    )


def _shipped(s: Setting) -> Item:
    # RemoteEngine.load_weights copies every tensor to the host before Ray ships them.
    return Item(
        "shipped",
        "weights shipped to the engine",
        s.whole_weight_bytes * s.a.params,
        ("sync",),
        on_host=True,
        detail="each update's weights on the host, on their way to the engine's process",
    )


def _async_copy(s: Setting) -> Item:
    return Item(
        "async_copy",
        "rollout worker's fp32 copy",
        4 * s.a.params,
        ("resident",),
        detail="async: the engine samples from a copy of the masters while they are updated",
    )


def _snapshot(s: Setting) -> Item:
    what = "a clone of the fp32 state dict" if s.workers == 1 else "the gathered weights"
    return Item(
        "snapshot",
        "weight snapshot for the worker",
        s.whole_weight_bytes * s.a.params,
        ("resident",),
        detail=f"async: {what} after each update, held until the rollout worker loads it",
    )


def _loading(s: Setting) -> Item:
    return Item(
        "load",
        "whole fp32 model while loading",
        4 * s.a.params,
        ("startup",),
        on_host=True,
        detail="each worker loads the policy whole in host memory before sharding it",
    )


# What a first GPU run met beyond the tensors above (issue 22): NCCL's buffers, vLLM's CUDA
# graphs and sampler, one allocator shared by vLLM and training. GPU plans only: a CPU process
# has none of them.
def _nccl(s: Setting) -> Item:
    # FSDP2's all-gather and reduce-scatter run on one NCCL communicator; its per-channel
    # FIFOs are allocated when it first runs and stay for the process's life. (NVLS on
    # NVSwitch nodes can add about 1 GiB more; NCCL_NVLS_ENABLE=0 turns it off.)
    return Item(
        "nccl",
        "NCCL buffers",
        NCCL_CHANNELS * NCCL_PEERS * NCCL_BUFFER_BYTES,
        ("resident",),
        detail=f"{NCCL_CHANNELS} channels × {NCCL_PEERS} peers × "
        f"{NCCL_BUFFER_BYTES / 2**20:.2f} MiB (Simple + LL128 + LL)",
    )


def _vllm_graphs(s: Setting) -> Item:
    # Captured after the KV cache is sized, so outside the engine's share for the whole run.
    return Item(
        "vllm_graphs",
        "vLLM CUDA graphs",
        VLLM_CUDA_GRAPHS_GIB * GIB,
        ("resident",),
        detail="graph pools captured after the share is sized, outside it",
    )


def _vllm_sampler(s: Setting) -> Item:
    cfg = s.cfg
    # Only while generating: the update's tensors do not exist then.
    prompts = math.ceil(cfg.batch.gen_batch_size / s.workers)  # one generation batch, shared
    rows = min(VLLM_MAX_NUM_SEQS, prompts * cfg.rollout.group_size)
    per_logit = VLLM_SAMPLER_BYTES + (VLLM_TOP_P_BYTES if cfg.rollout.top_p < 1 else 0)
    return Item(
        "vllm_sampler",
        "vLLM sampler scratch",
        rows * s.a.vocab * per_logit,
        ("rollout",),
        detail=f"{rows} rows × {s.a.vocab} logits × {per_logit} B"
        + (" (top-p sort included)" if per_logit > VLLM_SAMPLER_BYTES else ""),
    )


def _colocation(s: Setting) -> Item:
    # Resident: once both sides have run, both sides' cached blocks stay in the pool.
    return Item(
        "colocation",
        "vLLM + training margin",
        COLOCATION_MARGIN * s.gpu,
        ("resident",),
        detail=f"{COLOCATION_MARGIN:.0%} of the GPU: one allocator, two workloads",
    )


def _context(s: Setting) -> Item:
    return cuda_context()


def cuda_context() -> Item:
    """Per GPU process: the CUDA context and cuBLAS workspaces (a training or an evaluation plan)."""
    return Item("context", "CUDA context, workspaces", CUDA_CONTEXT_GIB * GIB, ("resident",))


# When an item applies (each a decision made once, shared by the items it concerns).
def _always(s: Setting) -> bool:
    return True


def _several(s: Setting) -> bool:
    return s.workers > 1


def _with_kl(s: Setting) -> bool:
    return s.cfg.algo.kl_coef > 0


def _vllm(s: Setting) -> bool:
    return s.vllm and not s.engine_apart


def _hf(s: Setting) -> bool:
    return not s.vllm and not s.engine_apart


def _apart(s: Setting) -> bool:
    return s.engine_apart


def _overlapped(s: Setting) -> bool:
    return s.overlapped


def _hf_one_async(s: Setting) -> bool:
    # N workers' hf engines sample from their rollout copy already (_hf_several).
    return _hf(s) and s.overlapped and not _several(s)


def _hf_several(s: Setting) -> bool:
    # One worker's hf engine samples with the training model itself: no copy.
    return _hf(s) and _several(s)


def _hf_autocast(s: Setting) -> bool:
    return _hf(s) and s.regime == "autocast"  # autocast: one worker in a low-precision dtype


def _gpu(s: Setting) -> bool:
    return s.device == "cuda"


def _gpu_several(s: Setting) -> bool:
    return _gpu(s) and _several(s)


def _gpu_vllm(s: Setting) -> bool:
    return _gpu(s) and _vllm(s)


TRAINING_ITEMS: tuple[tuple[Callable[[Setting], bool], Callable[[Setting], Item]], ...] = (
    (_always, _weights),
    (_always, _masters),
    (_always, _grads),
    (_several, _grad_buffers),
    (_always, _adam),
    (_with_kl, _reference),
    (_always, _activations),
    (_always, _logprob_head),
    (_always, _layer_backward),
    (_always, _step_scratch),
    (_vllm, _vllm_engine),
    (_hf_several, _rollout_copy),
    (_hf_one_async, _async_copy),
    (_overlapped, _snapshot),
    (_hf, _hf_sampling),
    (_hf_autocast, _autocast_copies),
    (_several, _weight_sync),
    (_apart, _shipped),
    (_several, _loading),
    (_gpu_several, _nccl),
    (_gpu_vllm, _vllm_graphs),
    (_gpu_vllm, _vllm_sampler),
    (_gpu_vllm, _colocation),
    (_gpu, _context),
)
"""A training plan's items, in the order `dapo plan` prints them: (when it applies, the item)."""


def _fragmentation(items: Sequence[Item]) -> Item:
    """The allocator's waste, a share of the update's GPU working set: after every other item."""
    update = sum(i.nbytes for i in items if "update" in i.phases and not i.on_host)
    return Item(
        "fragmentation",
        "allocator fragmentation",
        FRAGMENTATION * update,
        ("resident",),
        detail=f"{FRAGMENTATION:.0%} of the update's working set",
    )


def plan_memory(
    cfg: ExperimentConfig,
    workers: int = 1,
    gpu_memory_gib: float = DEFAULT_GPU_GIB,
    *,
    device: str = "cuda",
    arch: Architecture | None = None,
    engine_apart: bool = False,
) -> Plan:
    """The per-worker memory plan of `cfg` on `workers` GPUs of `gpu_memory_gib` GiB: the items
    of TRAINING_ITEMS, then the allocator's fragmentation.

    `device="cpu"` plans one CPU process (no CUDA context, AdamW's per-tensor step): what the
    tests measure. `arch` skips the look-up (the worker-count search passes it).
    `engine_apart`: the rollout engine runs in a process of its own (plan_rollout_engine).
    """
    if workers < 1:
        raise ValueError(f"workers={workers}: need at least 1")
    if not gpu_memory_gib > 0:
        raise ValueError(f"gpu memory {gpu_memory_gib} GiB: must be > 0")
    a = arch or resolve_architecture(cfg.model)
    s = Setting(cfg, a, workers, gpu_memory_gib, device, engine_apart)
    items = [make(s) for applies, make in TRAINING_ITEMS if applies(s)]
    if _gpu(s):
        items.append(_fragmentation(items))
    kv_tokens, problems = 0.0, []
    if _vllm(s):
        _, kv_tokens, problem = s.vllm_share
        problems += [problem] if problem else []
    plan = Plan(
        arch=s.a,
        workers=workers,
        gpu_bytes=s.gpu,
        device=device,
        regime=s.regime,
        items=tuple(items),
        kv_tokens=kv_tokens,
        seq_len=s.seq_len,
        engine_apart=engine_apart,
        overlapped=s.overlapped and not engine_apart,
    )
    if plan.peak_bytes > s.gpu:
        problems.insert(0, f"needs {_g(plan.peak_bytes)} of {gpu_memory_gib:g} GiB per worker")
    return dataclasses.replace(plan, problems=tuple(problems))


def min_workers(
    cfg: ExperimentConfig,
    gpu_memory_gib: float,
    *,
    arch: Architecture | None = None,
    start: int = 1,
    engine_apart: bool = False,
) -> int | None:
    """The fewest workers (from `start`) whose plan fits, or None when no count up to
    MAX_WORKERS does (per-worker items alone exceed the GPU)."""
    a = arch or resolve_architecture(cfg.model)
    for n in range(start, MAX_WORKERS + 1):
        if plan_memory(cfg, n, gpu_memory_gib, arch=a, engine_apart=engine_apart).fits:
            return n
    return None


def advice(plan: Plan, cfg: ExperimentConfig) -> str:
    """One line: `fits: ...` or `does not fit: needs at least K workers of G GiB (...)`."""
    gib = plan.gpu_bytes / GIB
    if plan.fits:
        return f"fits: {_g(plan.peak_bytes)} of {gib:g} GiB per worker, {plan.workers} worker" + (
            "s" if plan.workers > 1 else ""
        )
    biggest = ", ".join(f"{i.label} {_g(i.nbytes)}" for i in plan.biggest(3))
    apart = plan.engine_apart
    k = min_workers(cfg, gib, arch=plan.arch, start=plan.workers, engine_apart=apart)
    if k is not None:
        return f"does not fit: needs at least {k} workers of {gib:g} GiB (biggest items, GiB: {biggest})"
    for label, size in GPU_SIZES:
        if size > gib:
            k = min_workers(cfg, size, arch=plan.arch, engine_apart=apart)
            if k is not None:
                return (
                    f"does not fit: needs at least {k} workers of {size:g} GiB ({label}); no worker "
                    f"count fits {gib:g} GiB: {plan.problems[-1]} (biggest items, GiB: {biggest})"
                )
    hint = "" if cfg.model.gradient_checkpointing else "; try model.gradient_checkpointing=true"
    return (
        f"does not fit on any number of workers of {gib:g} GiB: {plan.problems[-1]} "
        f"(biggest items, GiB: {biggest}){hint}"
    )


def check_fits(
    cfg: ExperimentConfig,
    workers: int = 1,
    gpu_memory_gib: float | None = None,
    *,
    engine_apart: bool = False,
) -> Plan | None:
    """Before a GPU run: the plan, or PlanError with the plan's advice in one line.

    Returns None (no check) when the run does not target CUDA: `run.device` cpu, or auto on a
    machine without a GPU. `gpu_memory_gib` None reads the first GPU's total memory.
    `engine_apart`: the trainer's plan without the engine (check_engine_fits plans that).
    """
    if cfg.run.device == "cpu":
        return None
    if gpu_memory_gib is None:
        gpu_memory_gib = _cuda_memory_gib()
        if gpu_memory_gib is None:
            return None  # auto without a GPU: the run goes to the CPU
    plan = plan_memory(cfg, workers, gpu_memory_gib, engine_apart=engine_apart)
    if not plan.fits:
        raise PlanError(f"{cfg.preset}/{cfg.arm} on {workers} worker(s): " + advice(plan, cfg))
    return plan


# --- the rollout engine on a GPU of its own (`--rollout-actor`) ---------------------------------
def plan_rollout_engine(
    cfg: ExperimentConfig,
    workers: int = 1,
    gpu_memory_gib: float = DEFAULT_GPU_GIB,
    *,
    arch: Architecture | None = None,
) -> Plan:
    """The memory of one worker's rollout engine on a GPU of its own (each of the arm's
    `workers` has one). vllm: its reserved share (weights, overhead, KV cache), its CUDA graphs
    and sampler scratch. hf: the weights it samples with (one worker's recipe ships the fp32
    masters, which it samples under autocast, with autocast's cached copies; N workers' ship a
    compute-dtype copy), the KV cache of one sampling call. Both: a CUDA context. No optimizer,
    gradients or activations: the trainer's plan holds those."""
    if workers < 1:
        raise ValueError(f"workers={workers}: need at least 1")
    if not gpu_memory_gib > 0:
        raise ValueError(f"gpu memory {gpu_memory_gib} GiB: must be > 0")
    s = Setting(cfg, arch or resolve_architecture(cfg.model), workers, gpu_memory_gib, "cuda")
    items: list[Item] = []
    kv_tokens, problems = 0.0, []
    if s.vllm:
        share, kv_tokens, problem = s.vllm_share
        items += [share, _vllm_graphs(s), _vllm_sampler(s)]
        problems += [problem] if problem else []
    else:
        detail = (
            "the fp32 masters as shipped, sampled under autocast"
            if workers == 1
            else f"the worker's {cfg.model.dtype} copy as shipped"
        )
        items.append(
            Item(
                "weights",
                "engine's weights",
                s.whole_weight_bytes * s.a.params,
                ("resident",),
                detail=detail,
            )
        )
        if workers == 1 and s.regime == "autocast":
            items.append(_autocast_copies(s))
        items.append(_hf_sampling(s))
    items.append(cuda_context())
    plan = Plan(
        arch=s.a,
        workers=workers,
        gpu_bytes=s.gpu,
        device="cuda",
        regime=s.regime,
        items=tuple(items),
        kv_tokens=kv_tokens,
        seq_len=s.seq_len,
    )
    if plan.peak_bytes > s.gpu:
        problems.insert(0, f"needs {_g(plan.peak_bytes)} of {gpu_memory_gib:g} GiB")
    return dataclasses.replace(plan, problems=tuple(problems))


def engine_advice(plan: Plan) -> str:
    """One line: the engine's GPU `fits: ...` or `does not fit: ...` with its biggest items."""
    gib = plan.gpu_bytes / GIB
    if plan.fits:
        return f"rollout engine fits: {_g(plan.peak_bytes)} of {gib:g} GiB on its own GPU"
    biggest = ", ".join(f"{i.label} {_g(i.nbytes)}" for i in plan.biggest(3))
    return (
        f"rollout engine does not fit its own {gib:g} GiB GPU: {'; '.join(plan.problems)} "
        f"(biggest items, GiB: {biggest})"
    )


def check_engine_fits(cfg: ExperimentConfig, workers: int, gpu_memory_gib: float) -> Plan:
    """Before a run whose engines have GPUs of their own: the engine's plan, or PlanError."""
    plan = plan_rollout_engine(cfg, workers, gpu_memory_gib)
    if not plan.fits:
        raise PlanError(f"{cfg.preset}/{cfg.arm}: " + engine_advice(plan))
    return plan


def _cuda_memory_gib() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(0).total_memory / GIB


# --- evaluation (`dapo eval`) -------------------------------------------------------------------
def plan_evaluation(
    cfg: ExperimentConfig,
    problems: int,
    gpu_memory_gib: float = DEFAULT_GPU_GIB,
    *,
    arch: Architecture | None = None,
) -> Plan:
    """The memory of evaluating a checkpoint on one GPU with `cfg`'s engine: data.eval_k samples
    of `problems` problems, prompts of rollout.max_prompt_len and responses of max_response_len.

    No optimizer, no gradients, no activations kept. hf: the model in the compute dtype on the
    GPU, plus the KV cache of the rows one sampling call holds (HF_MAX_BATCH_SEQS // k prompts of
    k samples, at full length) and one step's float32 logits. vllm: only the engine's reserved
    share (the model stays in host memory: the engine loads the checkpoint's directory itself),
    which must hold the weights and one full-length sequence. `arch` defaults to cfg.model's.
    """
    if not gpu_memory_gib > 0:
        raise ValueError(f"gpu memory {gpu_memory_gib} GiB: must be > 0")
    a = arch or resolve_architecture(cfg.model)
    c = DTYPE_BYTES[cfg.model.dtype]
    k = cfg.data.eval_k
    seq_len = cfg.rollout.max_prompt_len + cfg.rollout.max_response_len
    gpu = gpu_memory_gib * GIB
    items: list[Item] = []
    problems_text: list[str] = []
    kv_tokens = 0.0
    if cfg.rollout.engine == "vllm":
        item, kv_tokens, problem = _vllm_share(cfg, a, c * a.params, gpu_memory_gib, seq_len)
        items.append(item)
        problems_text += [problem] if problem else []
    else:
        items.append(
            Item(
                "weights",
                f"{cfg.model.dtype} weights",
                c * a.params,
                ("resident",),
                detail="the checkpoint's model in the compute dtype",
            )
        )
        rows = min(max(1, HF_MAX_BATCH_SEQS // k), max(problems, 1)) * k
        items.append(hf_kv_cache(a, rows, seq_len, c))
    items.append(cuda_context())
    plan = Plan(
        arch=a,
        workers=1,
        gpu_bytes=gpu,
        device="cuda",
        regime=regime(cfg.model.dtype, 1),
        items=tuple(items),
        kv_tokens=kv_tokens,
        seq_len=seq_len,
    )
    if plan.peak_bytes > gpu:
        problems_text.insert(0, f"needs {_g(plan.peak_bytes)} of {gpu_memory_gib:g} GiB")
    return dataclasses.replace(plan, problems=tuple(problems_text))


def check_evaluation_fits(
    cfg: ExperimentConfig,
    problems: int,
    gpu_memory_gib: float | None = None,
    *,
    arch: Architecture | None = None,
) -> Plan | None:
    """Before an evaluation on a GPU: its plan, or PlanError in one line. None (no check) when
    it does not target CUDA, as check_fits."""
    if cfg.run.device == "cpu":
        return None
    if gpu_memory_gib is None:
        gpu_memory_gib = _cuda_memory_gib()
        if gpu_memory_gib is None:
            return None
    plan = plan_evaluation(cfg, problems, gpu_memory_gib, arch=arch)
    if not plan.fits:
        biggest = ", ".join(f"{i.label} {_g(i.nbytes)}" for i in plan.biggest(2))
        hint = (
            "; the vllm engine pages its KV cache within its share: --engine vllm"
            if cfg.rollout.engine != "vllm"
            else ""
        )
        raise PlanError(
            f"evaluating with the {cfg.rollout.engine} engine ({problems} problems × "
            f"{cfg.data.eval_k} samples) does not fit one {gpu_memory_gib:g} GiB GPU: "
            f"{'; '.join(plan.problems)} (biggest items, GiB: {biggest}){hint}"
        )
    return plan


# --- output -------------------------------------------------------------------------------------
def format_plan(plan: Plan, cfg: ExperimentConfig) -> str:
    a = plan.arch
    lines = [
        f"plan: preset {cfg.preset}, arm {cfg.arm}: {a.name} ({_count(a.params)} parameters; "
        f"{a.layers} layers, hidden {a.hidden}, MLP {a.intermediate}, heads {a.heads}/{a.kv_heads} "
        f"kv, vocab {a.vocab}{', tied' if a.tie_embeddings else ''}; from {a.source})",
        f"per worker of {plan.workers} on {plan.gpu_bytes / GIB:g} GiB GPUs ({plan.device}); "
        f"compute {cfg.model.dtype}, fp32 masters, {_regime_text(plan.regime)}; micro-batch "
        f"{cfg.batch.micro_batch_size} × {plan.seq_len} tokens"
        + (
            "; the rollout engine in a process of its own (planned below)"
            if plan.engine_apart
            else ""
        )
        + ("; async: generation overlaps the update" if plan.overlapped else ""),
        "",
        f"  {'item':<31} {'GiB':>8}  {'held':<13} notes",
    ]
    for i in plan.items:
        where = "host" if i.on_host else "/".join(i.phases)
        mark = " (sharded)" if i.sharded and plan.workers > 1 else ""
        lines.append(f"  {i.label:<31} {_g(i.nbytes):>8}  {where:<13} {i.detail}{mark}")
    lines.append(
        f"  {'peak per worker':<31} {_g(plan.peak_bytes):>8}  of {plan.gpu_bytes / GIB:g} GiB "
        "(resident + the largest phase: update, step, rollout, sync"
        + (", the rollout's inside the update's and the step's)" if plan.overlapped else ")")
    )
    if plan.device == "cuda":
        lines.append(f"  {'margin':<31} {_g(plan.margin_bytes):>8}  {_margin_text(plan)}")
    if plan.host_bytes:
        lines.append(f"  {'host memory per worker':<31} {_g(plan.host_bytes):>8}")
    lines.append("")
    lines.append(advice(plan, cfg))
    return "\n".join(lines)


def format_engine_plan(plan: Plan, cfg: ExperimentConfig) -> str:
    """plan_rollout_engine's plan, as format_plan prints a trainer's."""
    lines = [
        f"rollout engine ({cfg.rollout.engine}), one per worker, each on a GPU of its own of "
        f"{plan.gpu_bytes / GIB:g} GiB",
        "",
        f"  {'item':<31} {'GiB':>8}  {'held':<13} notes",
    ]
    for i in plan.items:
        lines.append(f"  {i.label:<31} {_g(i.nbytes):>8}  {'/'.join(i.phases):<13} {i.detail}")
    lines.append(f"  {'peak':<31} {_g(plan.peak_bytes):>8}  of {plan.gpu_bytes / GIB:g} GiB")
    lines.append(f"  {'margin':<31} {_g(plan.margin_bytes):>8}  {_margin_text(plan)}")
    lines += ["", engine_advice(plan)]
    return "\n".join(lines)


def _margin_text(plan: Plan) -> str:
    """Where the plan's slack is: what is left of the GPU, and the estimated allowances (not
    measured tensors) already inside the peak, so a reader sees how much is guesswork."""
    allowances = [i for i in plan.gpu_items if i.key in MARGIN_ITEMS]
    held = ", ".join(f"{i.label} {_g(i.nbytes)}" for i in allowances)
    text = f"free after the peak ({plan.margin_bytes / plan.gpu_bytes:.0%} of the GPU)"
    return text + (f"; allowances inside the peak, GiB: {held}" if held else "")


def _regime_text(reg: str) -> str:
    return {
        "fp32": "float32 throughout",
        "autocast": "one worker: autocast",
        "fsdp": "FSDP2 mixed precision",
    }[reg]


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def _g(nbytes: float) -> str:
    return f"{nbytes / GIB:.2f}"


def _vllm_share(
    cfg: ExperimentConfig,
    a: Architecture,
    weights_bytes: float,
    gpu_memory_gib: float,
    seq_len: int,
) -> tuple[Item, float, str | None]:
    """The colocated vLLM engine's reserved share (rollout.gpu_memory_utilization of the GPU):
    its weights in the compute dtype, its fixed overhead, and a KV cache of what is left. Returns
    the plan item, the KV cache's capacity in tokens, and the one line saying what share is
    needed when it cannot hold one `seq_len`-token sequence (else None)."""
    gpu = gpu_memory_gib * GIB
    c = DTYPE_BYTES[cfg.model.dtype]
    share = cfg.rollout.gpu_memory_utilization * gpu
    kv = share - weights_bytes - VLLM_OVERHEAD_GIB * GIB
    kv_tokens = max(kv, 0.0) / (c * a.kv_bytes_per_token)
    item = Item(
        "engine",
        "vLLM engine share (reserved)",
        share,
        ("resident",),
        detail=f"{cfg.rollout.gpu_memory_utilization:g} × {gpu_memory_gib:g} GiB: weights "
        f"{_g(weights_bytes)}, overhead {VLLM_OVERHEAD_GIB:g}, KV cache {_g(max(kv, 0))} GiB = "
        f"{kv_tokens / 1e3:.0f}k tokens = {kv_tokens / seq_len:.1f} sequences of {seq_len}",
    )
    if kv_tokens >= seq_len:
        return item, kv_tokens, None
    need = (weights_bytes + VLLM_OVERHEAD_GIB * GIB + seq_len * c * a.kv_bytes_per_token) / gpu
    return (
        item,
        kv_tokens,
        f"the vLLM engine's {_g(share)} GiB share cannot hold its {_g(weights_bytes)} GiB of "
        f"weights and one {seq_len}-token sequence: rollout.gpu_memory_utilization >= "
        f"{math.ceil(need * 100) / 100:.2f} needed",
    )
