"""Each prompt computed once per micro-batch: a GRPO group's samples packed into one row.

A group's k samples share their prompt, and a padded batch runs the prompt's tokens k times
through the model. Packed, a row holds the prompt once and then each sample's response
(``[prompt | response 1 | response 2 | ...]``); a 4D mask lets a response's tokens attend
to the prompt and to their own earlier tokens only, and position ids restart after the
prompt for every response, so every response token sees exactly the context it had in its
own sequence: the same log-probabilities and gradients (up to float rounding), with
(k - 1) x prompt tokens fewer positions per group. The last prompt position predicts the
first token of every response.

The cost is attention over the packed row: (prompt + k responses)^2 query-key pairs, most
of them masked, where padded rows have k x (prompt + response)^2. So it pays when prompts
are long next to responses; with long responses the dense mask costs more than it saves.
So the trainer packs a micro-batch only where it costs fewer FLOPs (`pays`). Needs every
layer to be full attention over positions from ``position_ids`` (`refusal`: not
sliding-window, ALiBi or state-space layers) taking a 4D mask (sdpa or eager; not
flash-attention's varlen kernels), and a split head. Must not know about losses or the
trainer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from reroll.trainer.logprobs import chunked_logprobs, split_head, text_config
from reroll.trainer.micro_batches import PaddedCost


@dataclass(frozen=True)
class Packed:
    input_ids: Tensor  # [G, W] long: one row per distinct prompt
    position_ids: Tensor  # [G, W] long: restarting after the prompt for each response
    segments: Tensor  # [G, W] long: -1 the prompt, m the row's m-th response, -2 padding
    src_row: Tensor  # [n] the packed row and column whose hidden state predicts target n
    src_col: Tensor  # [n]
    targets: Tensor  # [n] long: the response tokens
    dst_row: Tensor  # [n] the sample and column of target n in the batch's [B, L-1] layout
    dst_col: Tensor  # [n]

    @property
    def positions(self) -> int:
        return self.input_ids.numel()

    @property
    def allowed(self) -> Tensor:
        return self.mask()

    def mask(self, device: torch.device | str | None = None) -> Tensor:
        """[G, 1, W, W] bool, built on ``device`` (no W x W host tensor to copy to a GPU):
        query i may attend to key j when j <= i and j is the prompt or i's own response."""
        seg = self.segments.to(device)
        ar = torch.arange(seg.shape[1], device=seg.device)
        causal = ar.view(1, -1, 1) >= ar.view(1, 1, -1)  # [1, q, k]
        same = (seg.unsqueeze(1) == -1) | (seg.unsqueeze(1) == seg.unsqueeze(2))  # [G, q, k]
        return (causal & same).unsqueeze(1)


def pack(rows: list[list[int]], lengths: list[int], prompt_lens: list[int],
         prompt_ids: list[int]) -> Packed:
    """Samples (token rows, their lengths, prompt lengths and prompt ids: equal ids, equal
    prompts) -> one packed row per prompt id, in order of first appearance."""
    groups: dict[int, list[int]] = {}
    for i, p in enumerate(prompt_ids):
        groups.setdefault(p, []).append(i)
    ids_rows, pos_rows, seg_rows = [], [], []  # seg: -1 prompt, m member m, -2 padding
    src_r, src_c, tgt, dst_r, dst_c = [], [], [], [], []
    for g, members in enumerate(groups.values()):
        p = prompt_lens[members[0]]
        ids, pos, seg = list(rows[members[0]][:p]), list(range(p)), [-1] * p
        for m, i in enumerate(members):
            resp = rows[i][p:lengths[i]]
            start = len(ids)
            for j, tok in enumerate(resp):
                if p + j == 0:  # a sequence's first token is never a target
                    continue
                src_r.append(g)
                src_c.append(p - 1 if j == 0 else start + j - 1)
                tgt.append(tok)
                dst_r.append(i)
                dst_c.append(p + j - 1)
            ids += resp
            pos += range(p, p + len(resp))
            seg += [m] * len(resp)
        ids_rows.append(ids)
        pos_rows.append(pos)
        seg_rows.append(seg)
    width = max(len(x) for x in ids_rows)
    fill = [width - len(x) for x in ids_rows]
    ids = torch.tensor([x + [x[0] if x else 0] * f for x, f in zip(ids_rows, fill)])
    pos = torch.tensor([x + [0] * f for x, f in zip(pos_rows, fill)])
    seg = torch.tensor([x + [-2] * f for x, f in zip(seg_rows, fill)])  # [G, W]
    t = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731
    return Packed(ids, pos, seg, t(src_r), t(src_c), t(tgt), t(dst_r), t(dst_c))


def _row_widths(lengths: list[int], prompt_lens: list[int], prompt_ids: list[int]) -> list[int]:
    """Tokens of each packed row: its prompt once plus its samples' responses."""
    width: dict[int, int] = {}
    for n, p, g in zip(lengths, prompt_lens, prompt_ids):
        width[g] = width.get(g, p) + n - p
    return list(width.values())


def packed_positions(lengths: list[int], prompt_lens: list[int],
                     prompt_ids: list[int]) -> tuple[int, int]:
    """(positions `pack` forwards for these samples: rows x the longest packed row, tokens
    among them that are not padding)."""
    rows = _row_widths(lengths, prompt_lens, prompt_ids)
    return (len(rows) * max(rows), sum(rows)) if rows else (0, 0)


# Model types whose every layer is full attention over rotary (or learned) positions taken
# from ``position_ids``, so a 4D mask and restarted positions reproduce each sample's context.
# Not: ALiBi models (Bloom, MPT; positions from the mask), hybrids with convolution or state
# space layers (LFM2, Jamba, Falcon-H1, Qwen3-Next: they ignore the mask), and sliding-window
# layers (refused by `refusal` whatever the type: a 4D mask overrides the window).
TYPES = {"llama", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mistral", "mixtral", "gemma",
         "olmo", "olmo2", "granite", "phi3", "starcoder2"}


def refusal(model: nn.Module) -> str | None:
    """Why `shared_prompt_logprobs` cannot run on ``model``, or None."""
    cfg = text_config(model)
    impl = getattr(model.config, "_attn_implementation", None)
    if impl not in ("sdpa", "eager"):
        return f"its attention ({impl!r}) does not take a 4D mask: use sdpa or eager"
    if split_head(model) is None:
        return "its output embedding cannot be split off (reroll.trainer.logprobs.split_head)"
    kind = getattr(cfg, "model_type", "")
    if kind not in TYPES:
        return (f"model type {kind!r} is not one whose layers are all full attention over "
                f"positions from position_ids ({', '.join(sorted(TYPES))})")
    types = set(getattr(cfg, "layer_types", None) or ())
    if types - {"full_attention"} or (not types and getattr(cfg, "sliding_window", None)
                                      and getattr(cfg, "use_sliding_window", True)):
        return "it has sliding-window layers, which a 4D mask would override"
    return None


def widths(model: nn.Module) -> tuple[int, int]:
    """(hidden size, MLP intermediate size) of ``model``, what `pays` weighs (0 where the config
    has none: then packing never pays)."""
    cfg = text_config(model)
    return (getattr(cfg, "hidden_size", 0) or 0, getattr(cfg, "intermediate_size", 0) or 0)


def pays(lengths: list[int], prompt_lens: list[int], prompt_ids: list[int], hidden: int,
         intermediate: int) -> bool:
    """Whether packing costs fewer FLOPs than the padded batch: per layer, a position costs
    ~2 x its linear weights (4 H^2 + 3 H I) and a query-key pair 4 H, and the packed rows'
    dense attention spans (prompt + responses)^2 where padded rows span their own length^2.
    So few long responses behind a short prompt go padded."""
    if not lengths:
        return False
    rows = _row_widths(lengths, prompt_lens, prompt_ids)
    return _packed_cheaper(len(rows), max(rows), len(lengths), max(lengths), hidden,
                           intermediate)


def _packed_cheaper(rows: int, width: int, n: int, longest: int, hidden: int,
                    intermediate: int) -> bool:
    """`pays` from the two layouts' sizes: ``rows`` packed rows of ``width`` against ``n``
    padded rows of ``longest``."""
    per_pos, per_pair = 2 * (4 * hidden * hidden + 3 * hidden * intermediate), 4 * hidden
    packed = rows * width * per_pos + rows * width * width * per_pair
    padded = n * longest * per_pos + n * longest * longest * per_pair
    return packed < padded


class PackedCost(PaddedCost):
    """Positions a run of samples forwards in the layout the trainer gives it, kept as
    samples join: packed by prompt (rows x the widest row) where that costs fewer FLOPs
    (`pays`), else padded. `plan_micro_batches`' measure under ``train.share_prompt``, so a
    token budget counts the positions a pass really runs."""

    def __init__(self, lengths: Sequence[int], prompt_lens: Sequence[int],
                 prompt_ids: Sequence[int], hidden: int, intermediate: int):
        self.prompt_lens, self.prompt_ids = prompt_lens, prompt_ids
        self.widths = (hidden, intermediate)
        super().__init__(lengths)

    def reset(self) -> None:
        super().reset()
        self.rows: dict[int, int] = {}  # prompt id -> its packed row's tokens so far
        self.width = 0

    def _row(self, i: int) -> int:
        p = self.prompt_lens[i]
        return self.rows.get(self.prompt_ids[i], p) + self.lengths[i] - p

    def with_(self, i: int) -> int:
        g = len(self.rows) + (self.prompt_ids[i] not in self.rows)
        w = max(self.width, self._row(i))
        n, longest = self.n + 1, max(self.widest, self.lengths[i])
        return g * w if _packed_cheaper(g, w, n, longest, *self.widths) else n * longest

    def add(self, i: int) -> None:
        row = self._row(i)
        self.rows[self.prompt_ids[i]] = row
        self.width = max(self.width, row)
        super().add(i)


def shared_prompt_logprobs(model: nn.Module, input_ids: Tensor, lengths: list[int],
                           prompt_lens: list[int], prompt_ids: list[int], width: int,
                           temperature: float = 1.0, chunk: int = 0, entropy: bool = False
                           ) -> tuple[Tensor, Tensor | None]:
    """(log-probs [B, width], entropies or None) of each sample's response tokens, in the
    batch layout (column c predicts token c + 1; 0 at prompt and padding columns), from
    one forward pass over the packed rows."""
    head = split_head(model)
    pk = pack(input_ids.tolist(), lengths, prompt_lens, prompt_ids)
    dev = input_ids.device
    allowed = pk.mask(dev)
    if model.config._attn_implementation == "eager":  # additive: 0 / most negative
        dtype = next(model.parameters()).dtype
        allowed = torch.zeros(allowed.shape, dtype=dtype, device=dev).masked_fill_(
            ~allowed, torch.finfo(dtype).min)
    hidden = head.decoder(input_ids=pk.input_ids.to(dev), position_ids=pk.position_ids.to(dev),
                          attention_mask=allowed, use_cache=False)[0]  # [G, W, H]
    src = hidden[pk.src_row.to(dev), pk.src_col.to(dev)]  # [n, H]
    # chunked_logprobs takes [B, L, H] and the L-1 targets: one dummy position at the end
    h = torch.cat([src, src.new_zeros(1, src.shape[-1])]).unsqueeze(0)  # [1, n + 1, H]
    logp, ent = chunked_logprobs(h, head, pk.targets.to(dev).unsqueeze(0), temperature,
                                 chunk, entropy)  # [1, n]
    at = (pk.dst_row.to(dev), pk.dst_col.to(dev))
    out = torch.zeros(len(lengths), width, dtype=logp.dtype, device=dev).index_put(at, logp[0])
    if ent is not None:
        ent = torch.zeros(len(lengths), width, dtype=ent.dtype, device=dev).index_put(at, ent[0])
    return out, ent
