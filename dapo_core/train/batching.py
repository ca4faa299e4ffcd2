"""Training sequences and how a micro-batch of them becomes tensors.

A `Seq` is one response with its prompt, advantage and log-probs. `pack` lays a micro-batch out
as `[R, C]` tensors in one of two layouts:

* padded (`packed=False`): one sequence per row, right-padded to the longest (prompt at column
  0, so default position ids match generation), with a `[R, C]` attention mask;
* packed (`packed=True`): several sequences per row, first-fit decreasing into rows of C
  tokens (1 to 2 times the longest sequence, whichever costs least; see `pack`), each
  sequence's position ids counting from 0 and no attention mask:
  transformers then builds a block-diagonal causal mask from the position ids (sdpa, eager), or
  runs variable-length attention (flash-attention), so a token attends only to its own
  sequence. A row's unused tail is padding with positions of its own (it attends only to
  itself and nothing reads it). On the tiny preset's micro-batches this cuts the slots from
  1.6 to about 1.1 times the real tokens (bench/RESULTS.md).

Either way position t of the shifted `[R, C−1]` log-prob tensors scores token t + 1, and a
sequence's response log-probs sit at the flat positions `response_index` lists, sequence by
sequence, in order (`gather_rows` reads them back per sequence). The loss sees one sequence per
row whatever the model saw: `per_seq` gathers `[R, C−1]` into `[B, T]` (T = the longest
response, `loss_mask` marks each sequence's tokens), where per-sequence values (old log-probs,
advantages, rollout-correction weights) are placed by `scatter_rows`; sequence-level losses and
aggregations (GRPO's per-sequence mean, GSPO's sequence ratio) therefore never see two
sequences in a row. Building the layout is index arithmetic over all tokens at once; the only
per-sequence Python is the bin assignment over integers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from dapo_core.train.rollout import Group


@dataclass
class Seq:
    """One training sequence: prompt + response tokens, its advantage and log-probs."""

    group: int
    prompt_ids: list[int]
    response_ids: list[int]
    truncated: bool
    advantage: float
    sampler_logprobs: list[float] = field(default_factory=list)
    """log π_sampler of each response token, as the rollout engine reported (may be empty)."""
    old_logprobs: Tensor = field(default_factory=lambda: torch.empty(0))  # [R]
    ref_logprobs: Tensor = field(default_factory=lambda: torch.empty(0))  # [R]
    token_weights: Tensor | None = None  # [R] rollout-correction weights (TIS), constant
    token_mask: Tensor | None = None  # [R] bool: tokens the rollout correction keeps (MIS)
    _ids: Tensor | None = field(default=None, repr=False, compare=False)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def ids(self) -> Tensor:
        """Prompt + response token ids `[length]`, made once (a Seq is packed μ + 1 times)."""
        if self._ids is None:
            self._ids = torch.tensor(self.prompt_ids + self.response_ids, dtype=torch.long)
        return self._ids

    @property
    def loss_tokens(self) -> int:
        """Response tokens that enter the loss (before the overlong filter, which drops rows)."""
        return len(self.response_ids) if self.token_mask is None else int(self.token_mask.sum())


@dataclass
class Packed:
    input_ids: Tensor  # [R, C]
    attention_mask: Tensor | None  # [R, C] padded layout; None packed (positions delimit)
    position_ids: Tensor | None  # [R, C] packed layout; None padded (the default 0..C−1)
    response_tokens: Tensor  # [R, C] 1 on response tokens
    response_mask: Tensor  # [R, C−1] float, aligned with log-prob positions
    response_lengths: Tensor  # [B] long, one per sequence
    response_index: Tensor  # [Σ response lengths] flat positions in [R·(C−1)], by sequence
    loss_index: Tensor  # [B, T] flat position in [R·(C−1)] of response token t (0 past the end)
    loss_mask: Tensor  # [B, T] float, 1 on each sequence's response tokens
    tokens: int
    """Tokens (prompt + response) through the model."""

    def per_seq(self, x: Tensor) -> Tensor:
        """`[R, C−1]` values at the response positions, one sequence per row: `[B, T]` (0 past
        each sequence's end; differentiable)."""
        picked = x.reshape(-1)[self.loss_index]
        return torch.where(self.loss_mask.bool(), picked, torch.zeros_like(picked))


def sequences(groups: Sequence[Group], advantages: Tensor) -> list[Seq]:
    """One Seq per rollout, group by group; advantages `[P*G]` in the same order."""
    flat = advantages.tolist()
    out: list[Seq] = []
    for gi, g in enumerate(groups):
        for r in g.rollouts:
            c = r.completion
            out.append(
                Seq(
                    group=gi,
                    prompt_ids=c.prompt_ids,
                    response_ids=c.token_ids,
                    truncated=c.truncated,
                    advantage=flat[len(out)],
                    sampler_logprobs=c.logprobs,
                )
            )
    return out


def packing_attention_cost(config: object) -> float:
    """Attention's work per token and per slot of row length, relative to the rest of the
    block's, for a Llama-style decoder: 4·C·H multiply-adds of scores and values under a dense
    mask against 2·(4H² + 3·H·I) in the projections and the MLP (H hidden, I intermediate
    size), i.e. 2 / (4H + 3I); 0 when the config does not say."""
    hidden = getattr(config, "hidden_size", None)
    inter = getattr(config, "intermediate_size", None)
    if not isinstance(hidden, int) or not isinstance(inter, int):
        return 0.0
    return 2.0 / (4 * hidden + 3 * inter)


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> tuple[list[int], list[int]]:
    """Bins of `capacity` tokens: each length, longest first, goes to the first bin it fits.

    Returns (row, offset) per item, in the items' order. Rows number from 0 in order of opening.
    """
    row = [0] * len(lengths)
    offset = [0] * len(lengths)
    used: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        n = lengths[i]
        for r, u in enumerate(used):
            if u + n <= capacity:
                row[i], offset[i] = r, u
                used[r] = u + n
                break
        else:
            row[i], offset[i] = len(used), 0
            used.append(n)
    return row, offset


def pack(
    seqs: Sequence[Seq],
    pad_id: int,
    device: torch.device | str,
    *,
    packed: bool = False,
    capacity: int | None = None,
    attention_cost: float = 0.0,
) -> Packed:
    """The tensors of a micro-batch, padded or packed (see the module docstring).

    Packed rows are `capacity` tokens long when given, else the row length C among 1, 1.5 and
    2 times the longest sequence that minimises the estimated work R·C·(1 + attention_cost·C):
    every slot costs the linear layers, and attention under a dense block-diagonal mask costs
    each slot in proportion to C (`attention_cost`, from `packing_attention_cost`).
    """
    lengths = torch.tensor([s.length for s in seqs])  # [B]
    prompt = torch.tensor([len(s.prompt_ids) for s in seqs])  # [B]
    if int(prompt.min()) < 1:
        raise ValueError("a sequence without prompt tokens: its first token has no log-prob")
    longest = int(lengths.max())
    if packed:
        widths = [max(capacity, longest)] if capacity else [longest, longest * 3 // 2, 2 * longest]
        best: tuple[float, int, list[int], list[int]] | None = None
        for w in widths:
            rows, offsets = first_fit_decreasing(lengths.tolist(), w)
            cost = (max(rows) + 1) * w * (1.0 + attention_cost * w)
            if best is None or cost < best[0]:
                best = (cost, w, rows, offsets)
        assert best is not None
        _, width, rows, offsets = best
        row, offset = torch.tensor(rows), torch.tensor(offsets)
        n_rows = max(rows) + 1
    else:
        width, n_rows = longest, len(seqs)
        row, offset = torch.arange(len(seqs)), torch.zeros(len(seqs), dtype=torch.long)
    flat = torch.cat([s.ids for s in seqs])  # [N] every token, sequence by sequence
    which = torch.repeat_interleave(torch.arange(len(seqs)), lengths)  # [N] its sequence
    starts = torch.cumsum(lengths, 0) - lengths  # [B] where each sequence starts in `flat`
    pos = torch.arange(flat.numel()) - starts[which]  # [N] position within its sequence
    dest = row[which] * width + offset[which] + pos  # [N] flat position in [R, C]
    is_resp = pos >= prompt[which]  # [N]

    input_ids = torch.full((n_rows * width,), pad_id, dtype=torch.long)
    input_ids[dest] = flat
    response_tokens = torch.zeros(n_rows * width, dtype=torch.long)
    response_tokens[dest] = is_resp.long()
    response_tokens = response_tokens.view(n_rows, width)
    # Token t + 1 is scored at log-prob position t of its row: (row, col − 1) in [R, C−1].
    resp_dest = dest[is_resp]
    response_index = (resp_dest // width) * (width - 1) + resp_dest % width - 1
    resp_len = lengths - prompt  # [B]
    longest_resp = max(int(resp_len.max()), 1)
    loss_mask = torch.arange(longest_resp)[None, :] < resp_len[:, None]  # [B, T]
    loss_index = torch.zeros(loss_mask.shape, dtype=torch.long)
    loss_index[loss_mask] = response_index  # row-major: sequence by sequence, token by token
    attention = position_ids = None
    if packed:
        col = torch.arange(width)[None, :]  # [1, C]
        used = torch.zeros(n_rows, dtype=torch.long).index_add_(0, row, lengths)  # [R]
        position_ids = (col - used[:, None]).clamp_min(0)  # the tail: its own positions
        position_ids.view(-1)[dest] = pos
        position_ids = position_ids.to(device)
    else:
        attention = (torch.arange(width)[None, :] < lengths[:, None]).long().to(device)
    return Packed(
        input_ids=input_ids.view(n_rows, width).to(device),
        attention_mask=attention,
        position_ids=position_ids,
        response_tokens=response_tokens.to(device),
        response_mask=response_tokens[:, 1:].float().to(device),
        response_lengths=resp_len.to(device),
        response_index=response_index.to(device),
        loss_index=loss_index.to(device),
        loss_mask=loss_mask.float().to(device),
        tokens=int(lengths.sum()),
    )


def scatter_rows(values: Sequence[Tensor], packed: Packed) -> Tensor:
    """Per-sequence response vectors `[R_i]` in the loss layout: `[B, T]`, 0 past each end."""
    mask = packed.loss_mask
    out = torch.zeros(mask.shape, device=mask.device)
    if values:
        out[mask.bool()] = torch.cat(list(values)).to(out.device, out.dtype)
    return out


def gather_rows(x: Tensor, packed: Packed) -> list[Tensor]:
    """Each sequence's response values of model-layout `[R, C−1]` as CPU tensors `[R_i]`."""
    picked = x.detach().reshape(-1)[packed.response_index].cpu()
    return list(picked.split(packed.response_lengths.tolist()))
