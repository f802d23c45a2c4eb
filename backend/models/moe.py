"""Mixture-of-experts MLPs (Mixtral, Qwen2-MoE, Qwen3-MoE, Granite MoE, GLM-4.5) for the shared decoder
(transformer.py).

In the layers a family names, the MLP is a router and E experts, each a gated MLP of its own
(`intermediate_size` columns): every token goes to the k experts with the largest softmax
probability, and the layer's output is their outputs weighted by those probabilities
(renormalised over the k where the family does). GLM-4.5 scores each expert by
sigmoid(logit) instead, chooses by that plus a learnt bias, and scales the weights
(reference.moe_route's `sigmoid`); where its config limits the choice to the best `topk_group`
of `n_group` groups of experts (DeepSeek-V3's, and DeepSeek-V2's over softmax probabilities),
MoeSpec.groups / kept_groups / group_score say so. Qwen2-MoE adds a shared expert that every
token passes through, weighted by sigmoid(shared_gate @ x); Granite's and GLM's shared experts
are added as they are. Llama 4 scales its one chosen expert's input by the weight, not its
output (MoeSpec.scale_input). Nemotron-H's experts (and shared expert) are plain MLPs, up, the
squared ReLU, down, with no gate (MoeSpec.gated False); Nemotron 3 Super's routed experts work in
a latent space, the normalised rows projected down to it before them and their weighted sum back
up after (MoeSpec.latent_size), the router and the shared expert on the rows as they are.
LongCat-Flash adds zero-computation experts (MoeSpec.identity_experts): the router scores them beside the
others, and one chosen adds its weight times the input rows (no weights of its own).
The op: `kernels.moe_mlp` (routing and grouped GEMMs over the routed rows on a GPU,
kernels/triton_moe.py; reference.moe_mlp's loop over the experts elsewhere).

Checkpoints store the experts one by one (`experts.{j}.gate_proj.weight`, Mixtral's `w1` / `w3`
/ `w2`), as published, or stacked (`experts.gate_up_proj` `[E, 2I, H]`, `experts.down_proj`
`[E, H, I]`), as transformers >= 5 keeps them in memory, or stacked under the family's published
names (Granite's `input_linear` / `output_linear`); all load. Under tensor parallelism each
rank holds its share of every expert's columns (and of the shared expert's), the router whole:
every rank routes each token the same way, and the all-reduce after the MLP sums the shares.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from tritonformer import kernels
from tritonformer.kernels.fp8 import scaled
from tritonformer.kernels.reference import moe_grouped


# The router's linear applies the block's PreNorm and writes the normalised rows for the experts
# (False: a norm kernel writes them first; a benchmark comparing sets it).
ROUTER_NORMALISES = True


@dataclass(frozen=True)
class MoeNames:
    """Where a layer's MoE block keeps its tensors, relative to `layers.{i}.`: `blocks` lists the
    block's possible names (Mixtral's published `block_sparse_moe`, transformers' `mlp`) and
    `routers` the router's inside it (Granite's published `router.layer`, transformers'
    `router`): the first one the checkpoint has is used. Per-expert projections are
    `{block}.experts.{j}.{gate|up|down}.weight`; `stacked` lists the names of ([gate; up], down)
    with the experts stacked. The shared expert (relative to the layer): `shared`, with
    `gate_proj` / `up_proj` / `down_proj` inside or, where `shared_fused` names them, one
    [gate; up] projection and the down one; `shared_gate` its sigmoid gate (None: none).
    `score_bias`: the router's bias of the choice, beside its weight or the block's (`[E]` or
    `[1, E]`: ERNIE's `moe_statics.e_score_correction_bias`). `columns`: the
    stacked tensors are stored as x @ W (gpt-oss: gate/up `[E, H, 2I]` with the gate and up
    columns interleaved, down `[E, I, H]`), transposed and split into [gate; up] at load; their
    biases (MoeSpec.expert_bias) are `{name}_bias` beside them. `interleaved` False: those columns are
    [gate | up] instead, the gate's first (Llama 4's `[E, H, 2I]`). Ungated experts (MoeSpec.gated
    False) have no gate: their stacked up projection is `[E, I, H]`. `latent`: the projections into
    and out of the routed experts' latent space (MoeSpec.latent_size), in the block."""

    blocks: tuple[str, ...] = ("mlp",)
    routers: tuple[str, ...] = ("gate",)
    gate: str = "gate_proj"
    up: str = "up_proj"
    down: str = "down_proj"
    stacked: tuple[tuple[str, str], ...] = (("experts.gate_up_proj", "experts.down_proj"),)
    shared: str = "mlp.shared_expert"
    shared_gate: str | None = "mlp.shared_expert_gate"
    shared_fused: tuple[str, str] | None = None
    score_bias: str = "e_score_correction_bias"
    columns: bool = False
    interleaved: bool = True
    latent: tuple[str, str] = ("fc1_latent_proj", "fc2_latent_proj")


@dataclass(frozen=True)
class MoeSpec:
    num_experts: int
    top_k: int
    intermediate_size: int  # each expert's
    normalize: bool  # renormalise the k routing weights to sum to 1
    round_weights: bool  # routing weights rounded to the activation dtype (Qwen) or kept fp32 (Mixtral)
    layers: tuple[bool, ...]  # per layer: MoE, or the dense MLP of the decoder's intermediate_size
    shared_intermediate_size: int = 0  # a shared expert's columns (Qwen2-MoE, Granite, GLM), 0: none
    names: MoeNames = field(default_factory=MoeNames)
    scoring: str = "softmax"  # or "sigmoid" (GLM-4.5), "sparsemixer" (Phi-3.5-MoE): reference.moe_route
    score_bias: bool = False  # the choice's bias (the checkpoint's e_score_correction_bias): reference.moe_route
    scale: float = 1.0  # the routing weights times this (routed_scaling_factor)
    router_fp32: bool = False  # the router's logits from fp32 x and weights (GLM-4.5's router casts both)
    router_bias: bool = False  # the router's logits have a bias (gpt-oss)
    expert_bias: bool = False  # every expert's gate/up and down projections have biases (gpt-oss)
    # Llama 4 (top 1): the chosen expert's input is x times its routing weight (sigmoid of its logit, rounded to
    # x's dtype), not its output; SiLU-gated, that is not the same. Run as that x routed with weight exactly 1.
    scale_input: bool = False
    # Group-limited choice (reference.moe_route): the experts in `groups` equal groups (`n_group`), the k
    # chosen among the best `kept_groups` (`topk_group`) only, the groups ranked by `group_score`:
    # "top2_sum" (DeepSeek-V3, GLM-4.5) or "max" (DeepSeek-V2). groups <= kept_groups: no limit.
    groups: int = 1
    kept_groups: int = 1
    group_score: str = "top2_sum"
    # False: each expert (and the shared expert) is up, the decoder's plain activation, down, with no gate
    # (Nemotron-H's, squared ReLU): its stacked up projection `[E, I, H]` stands where [gate; up] does.
    gated: bool = True
    # > 0: the routed experts read and write rows of this width (Nemotron 3 Super's moe_latent_size): the
    # normalised rows times `latent[0]` `[L, H]` before them, their weighted sum times `latent[1]` `[H, L]` after.
    latent_size: int = 0
    # sparsemixer's band (scoring "sparsemixer", the config's router_jitter_noise): reference.moe_route
    mask_eps: float = 0.0
    # > 0: that many identity experts after the num_experts that compute (LongCat-Flash's zero_expert_num): the
    # router's rows (and its choice bias) cover both; a stacked [gate; up] of either count loads (transformers'
    # LongCat stacks rows for the identity experts too, which it never reads)
    identity_experts: int = 0
    # Sigmoid scoring whose k are chosen by logit + score bias, not score + bias (Kolibri-1's router; without a bias
    # the same choice): weighted by their scores as sigmoid routing weighs them (MoeLayer.__call__, chosen_by_logit)
    logit_choice: bool = False

    def __post_init__(self):
        if self.logit_choice and (self.scoring != "sigmoid" or self.groups > 1 or self.scale_input
                                  or self.identity_experts):
            raise ValueError("a choice by logit + bias (logit_choice) is sigmoid scoring's, ungrouped, without "
                             "scale_input or identity experts")
        if not 0 < self.top_k <= self.num_experts + self.identity_experts:
            extra = f" plus {self.identity_experts} identity experts" if self.identity_experts else ""
            raise ValueError(f"num_experts_per_tok ({self.top_k}) must be between 1 and num_experts "
                             f"({self.num_experts}){extra}")
        if self.identity_experts and (self.scale_input or self.latent_size or self.groups > self.kept_groups
                                      or self.names.columns or not self.gated):
            raise ValueError("identity experts are supported beside gated experts stored [E, out, in], without "
                             "scale_input, a latent space or group-limited routing")
        moe_grouped(self.num_experts, self.top_k, self.groups, self.kept_groups, self.group_score)  # (raises)
        if self.scale_input and (self.top_k != 1 or self.scoring != "sigmoid" or self.normalize or self.score_bias
                                 or self.scale != 1.0 or self.groups > 1 or self.expert_bias):
            raise ValueError("experts whose input is scaled by the routing weight (scale_input) are the top 1 by "
                             "sigmoid score, unnormalised, unbiased, unscaled and ungrouped")
        if (self.latent_size or not self.gated) and (self.scale_input or self.names.columns
                                                      or self.names.shared_fused or self.expert_bias):
            raise ValueError("ungated or latent experts are stored as separate or stacked [E, out, in] projections "
                             "without biases (not scale_input's, columns', a fused shared expert's)")

    def split(self, world: int) -> "MoeSpec":
        """One tensor-parallel rank's share: its columns of every expert (and shared expert)."""
        return replace(self, intermediate_size=self.intermediate_size // world,
                       shared_intermediate_size=self.shared_intermediate_size // world)


@dataclass
class MoeLayer:
    router: torch.Tensor  # [E, H] (fp32 where the family routes from fp32 logits)
    gate_up: torch.Tensor  # [E, 2I, H]: each expert's [gate; up]
    down: torch.Tensor  # [E, H, I]
    top_k: int
    normalize: bool
    round_weights: bool
    shared_gate_up: torch.Tensor | None = None  # [2S, H]
    shared_down: torch.Tensor | None = None  # [H, S]
    shared_gate: torch.Tensor | None = None  # [1, H]; None: the shared expert's output added as it is
    scoring: str = "softmax"
    score_bias: torch.Tensor | None = None  # [E] fp32
    scale: float = 1.0
    router_bias: torch.Tensor | None = None  # [E]
    gate_up_bias: torch.Tensor | None = None  # [E, 2I]: each expert's [gate; up] biases
    down_bias: torch.Tensor | None = None  # [E, H] (under tensor parallelism on one rank only)
    groups: int = 1  # the group-limited choice (MoeSpec.groups, kept_groups, group_score)
    kept_groups: int = 1
    group_score: str = "top2_sum"
    scale_input: bool = False  # (MoeSpec.scale_input)
    latent_in: torch.Tensor | None = None  # [L, H]: the rows into the routed experts' space (MoeSpec.latent_size)
    latent_out: torch.Tensor | None = None  # [H, L]: their weighted sum back out of it
    mask_eps: float = 0.0  # (MoeSpec.mask_eps)
    identity_experts: int = 0  # (MoeSpec.identity_experts: the router's last ids)
    logit_choice: bool = False  # (MoeSpec.logit_choice)

    def __call__(self, x: torch.Tensor, activation: str, prenorm: kernels.PreNorm | None = None) -> torch.Tensor:
        """The block's output `[T, H]` for its input x `[T, H]`, normalised or (`prenorm`) to be
        normalised so (`activation`: the gated one, kernels.linear_act's name). The router's
        linear applies the prenorm and writes the normalised rows for the experts (on a decode
        row: in its prologue, no launch of its own). `activation` gated: gate_up holds each expert's
        [gate; up]; plain (MoeSpec.gated False): its up projection."""
        fp32_logits = self.router.dtype == torch.float32 and x.dtype != torch.float32
        if prenorm is not None and (fp32_logits or not ROUTER_NORMALISES):  # the rows first, by a norm kernel
            x, prenorm = kernels.prenormed(x, prenorm), None
        if fp32_logits:
            logits = torch.nn.functional.linear(x.float(), self.router)
        elif prenorm is None:
            logits = kernels.linear_act(x, self.router, self.router_bias)
        else:
            normed = torch.empty_like(x)
            logits = kernels.linear_act(x, self.router, self.router_bias, prenorm=replace(prenorm, normed_out=normed))
            x = normed
        if self.scale_input:  # x * sigmoid(the largest logit) to the top-1 expert, with weight softmax / itself = 1
            scaled_x = x * torch.sigmoid(logits.max(dim=-1, keepdim=True).values.float()).to(x.dtype)
            out = kernels.moe_mlp(scaled_x, logits, self.gate_up, self.down, 1, True, None, activation, "softmax")
        else:
            bias = self.score_bias
            if self.logit_choice:  # the chosen k's logits, the others' -inf: sigmoid routing then takes those k
                logits, bias = chosen_by_logit(logits, self.top_k, bias), None
            routed = x if self.latent_in is None else kernels.linear_act(x, self.latent_in)
            out = kernels.moe_mlp(routed, logits, self.gate_up, self.down, self.top_k, self.normalize,
                                  x.dtype if self.round_weights else None, activation, self.scoring, bias,
                                  self.scale, gate_up_bias=self.gate_up_bias, down_bias=self.down_bias,
                                  groups=self.groups, kept_groups=self.kept_groups, group_score=self.group_score,
                                  mask_eps=self.mask_eps, identity_experts=self.identity_experts)
            if self.latent_out is not None:
                out = kernels.linear_act(out, self.latent_out)
        if self.shared_gate_up is not None:
            shared = kernels.linear_act(kernels.linear_act(x, self.shared_gate_up, None, activation), self.shared_down)
            if self.shared_gate is not None:
                shared = torch.sigmoid(kernels.linear_act(x, self.shared_gate)) * shared
            out = out + shared
        return out

    def scale_output(self, factor: float | None) -> None:
        """The block's output times `factor` (Granite's residual multiplier), folded into the
        experts' and the shared expert's down projections (a linear map: the sum scales too, and
        so does its projection out of a latent space)."""
        self.down = scaled(self.down, factor)
        if self.down_bias is not None and factor is not None:
            self.down_bias = self.down_bias * factor
        if self.shared_down is not None:
            self.shared_down = scaled(self.shared_down, factor)

    def expert_bytes(self) -> int:
        return (self.gate_up[0].numel() + self.down[0].numel()) * self.gate_up.element_size()

    def shared_params(self) -> int:
        """The weights every token reads: the router, the shared expert and the latent projections."""
        shared = (self.shared_gate_up, self.shared_down, self.shared_gate, self.latent_in, self.latent_out)
        return self.router.numel() + sum(t.numel() for t in shared if t is not None)

    def read_bytes(self, tokens: int | None) -> float:
        """Bytes of weights one step over `tokens` rows reads: the router, the shared expert and the
        experts routed to, E * (1 - (1 - k / E) ** tokens) of them where routing is uniform (k
        at one token; nearly all of them at 64 tokens of Qwen3-30B-A3B's 8 of 128: 98%).
        None: every expert (the layer's whole size)."""
        experts = self.gate_up.shape[0]
        routed = experts if tokens is None else experts * (1 - (1 - self.top_k / experts) ** tokens)
        shared = self.shared_params() - self.router.numel()
        return (self.router.numel() * self.router.element_size() + shared * self.gate_up.element_size()
                + routed * self.expert_bytes())

    def active_params(self) -> int:
        """Weights one token multiplies by (2 FLOPs each): the router, the shared expert and k experts."""
        return self.shared_params() + self.top_k * (self.gate_up[0].numel() + self.down[0].numel())


def chosen_by_logit(logits: torch.Tensor, top_k: int, bias: torch.Tensor | None) -> torch.Tensor:
    """`[T, E]` router logits with each row's k largest logit + `bias` (`[E]`, or none) kept, the others -inf: the
    k experts that sigmoid routing (score sigmoid(logit), no bias) then chooses, weighted sigmoid(logit) (the
    others' scores 0). In fp32, on the device, no host sync (a decode graph replays it)."""
    logits = logits.float()
    ids = (logits if bias is None else logits + bias).topk(top_k, dim=-1).indices
    return torch.full_like(logits, float("-inf")).scatter_(1, ids, logits.gather(1, ids))


def load_moe_layer(spec: MoeSpec, state: dict, read: Callable[..., torch.Tensor], prefix: str, hidden: int,
                   part: slice | None = None, shared_part: slice | None = None, first_rank: bool = True) -> MoeLayer:
    """Layer `prefix`'s MoE block from the checkpoint's tensors (`state`, to see which names it
    has), each read by `read(name, shape, index=None)` (the decoder's: the shape checked, the
    `index` part only, on the model's device and dtype); `part` / `shared_part`: this
    tensor-parallel rank's columns of each expert / of the shared expert (None: all);
    `first_rank`: whether this rank adds the experts' down biases (one rank does: the
    all-reduce after the MLP sums the ranks' outputs)."""
    n = spec.names
    block = next((b for b in n.blocks if any(f"{prefix}{b}.{r}.weight" in state for r in n.routers)), n.blocks[0])
    base = f"{prefix}{block}."
    router = next((r for r in n.routers if f"{base}{r}.weight" in state), n.routers[0])
    experts, inter = spec.num_experts, spec.intermediate_size
    width = spec.latent_size or hidden  # (the rows the routed experts read and write)
    halves = 2 if spec.gated else 1  # (an expert's [gate; up], or its up projection alone)

    def gated(weight: str, size: int, rows: slice | None, *lead: int, width: int = hidden,
              kept: int | None = None) -> torch.Tensor:
        """[gate; up] rows (up alone where ungated) of a stacked `[..., halves * size, width]` tensor, this rank's
        of each half; `kept`: the first that many of the (one) leading dim only."""
        pick = (slice(None),) * len(lead) if kept is None else (slice(0, kept),)
        if rows is None:
            return read(weight, (*lead, halves * size, width), None if kept is None else pick)
        return torch.cat([read(weight, (*lead, halves * size, width), (*pick, slice(half * size + rows.start,
                                                                                     half * size + rows.stop)))
                          for half in range(halves)], dim=len(lead))

    cols = (slice(None), part or slice(None))
    stacked = next(((base + g, base + d) for g, d in n.stacked if _weight(base + g, state) in state), None)
    biases = None
    if n.columns:  # x @ W, gate and up columns interleaved (gpt-oss) or not (Llama 4): rows, [gate; up]
        gate_up, down, biases = _column_experts(spec, read, stacked, hidden, part)
    elif stacked is not None:  # stacked, as transformers >= 5 holds them or a family publishes them
        stored, name = experts, _weight(stacked[0], state)
        if spec.identity_experts and tuple(state[name].shape)[:1] == (experts + spec.identity_experts,):
            stored = experts + spec.identity_experts  # (rows for the identity experts too: the first ones read)
        gate_up = gated(name, inter, part, stored, width=width, kept=experts if stored != experts else None)
        down = read(_weight(stacked[1], state), (experts, width, inter), (slice(None), *cols))
    else:  # one expert at a time, as published
        stacked_gate_up, stacked_down = [], []
        for j in range(experts):
            e = f"{base}experts.{j}."
            rows = part or slice(None)
            stacked_gate_up.append(torch.cat([read(f"{e}{name}.weight", (inter, width), rows)
                                              for name in (n.gate, n.up)[2 - halves:]]))
            stacked_down.append(read(f"{e}{n.down}.weight", (width, inter), cols))
        gate_up, down = torch.stack(stacked_gate_up), torch.stack(stacked_down)
    scored = experts + spec.identity_experts  # (the router's rows: the identity experts' after the others')
    router_weight = read(f"{base}{router}.weight", (scored, hidden))
    layer = MoeLayer(router_weight.float() if spec.router_fp32 else router_weight, gate_up, down, spec.top_k,
                     spec.normalize, spec.round_weights, scoring=spec.scoring, scale=spec.scale, groups=spec.groups,
                     kept_groups=spec.kept_groups, group_score=spec.group_score, scale_input=spec.scale_input,
                     mask_eps=spec.mask_eps, identity_experts=spec.identity_experts, logit_choice=spec.logit_choice)
    if spec.router_bias:
        layer.router_bias = read(f"{base}{router}.bias", (scored,))
    if biases is not None:
        layer.gate_up_bias, down_bias = biases
        layer.down_bias = down_bias if first_rank else None
    if spec.score_bias:  # beside the router's weight or the block's (ERNIE's published names), `[E]` or `[1, E]`
        key = next((k for k in (f"{base}{router}.{n.score_bias}", base + n.score_bias) if k in state),
                   f"{base}{router}.{n.score_bias}")
        shape = (1, scored) if tuple(getattr(state.get(key), "shape", ())) == (1, scored) else (scored,)
        layer.score_bias = read(key, shape).reshape(scored).float()
    if spec.shared_intermediate_size:
        size, s = spec.shared_intermediate_size, f"{prefix}{n.shared}."
        rows = shared_part or slice(None)
        if n.shared_fused:
            layer.shared_gate_up = gated(s + n.shared_fused[0] + ".weight", size, shared_part)
            layer.shared_down = read(s + n.shared_fused[1] + ".weight", (hidden, size), (slice(None), rows))
        else:
            layer.shared_gate_up = torch.cat([read(s + name, (size, hidden), rows)
                                              for name in ("gate_proj.weight", "up_proj.weight")[2 - halves:]])
            layer.shared_down = read(s + "down_proj.weight", (hidden, size), (slice(None), rows))
        if n.shared_gate:
            layer.shared_gate = read(f"{prefix}{n.shared_gate}.weight", (1, hidden))
    if spec.latent_size:  # (whole on every rank: the projection out is linear, the ranks' shares sum after it)
        layer.latent_in = read(f"{base}{n.latent[0]}.weight", (spec.latent_size, hidden))
        layer.latent_out = read(f"{base}{n.latent[1]}.weight", (hidden, spec.latent_size))
    return layer


def _column_experts(spec: MoeSpec, read: Callable[..., torch.Tensor], stacked: tuple[str, str] | None, hidden: int,
                    part: slice | None):
    """(gate_up `[E, 2I, H]` [gate; up], down `[E, H, I]`, (their biases) or None) of experts
    stored as x @ W with the gate and up columns interleaved (gpt-oss's `[E, H, 2I]` and
    `[E, I, H]`); `part`: this rank's columns of each expert. A rank reads only its share: its
    gate and up columns are the contiguous stored columns [2 * start, 2 * stop), its down rows
    [start, stop). Stored [gate | up] (MoeNames.interleaved False: Llama 4's), a rank reads columns
    [start, stop) of each half."""
    if stacked is None:
        raise KeyError("checkpoint is missing the stacked experts (gate_up_proj / down_proj)")
    experts, inter = spec.num_experts, spec.intermediate_size
    pairs = None if part is None else (slice(None), slice(None), slice(2 * part.start, 2 * part.stop))
    rows = None if part is None else (slice(None), part)

    def split(interleaved: torch.Tensor) -> torch.Tensor:  # [..., gate, up, gate, ...] rows -> [gate; up]
        return torch.cat([interleaved[:, 0::2], interleaved[:, 1::2]], dim=1).contiguous()

    if not spec.names.interleaved:  # [gate | up] columns, each half this rank's share
        cols = part or slice(0, inter)
        halves = [read(stacked[0], (experts, hidden, 2 * inter),
                       (slice(None), slice(None), slice(h * inter + cols.start, h * inter + cols.stop)))
                  for h in (0, 1)]
        gate_up = torch.cat(halves, dim=2).transpose(1, 2).contiguous()
    else:
        gate_up = split(read(stacked[0], (experts, hidden, 2 * inter), pairs).transpose(1, 2))
    down = read(stacked[1], (experts, inter, hidden), rows).transpose(1, 2).contiguous()
    if not spec.expert_bias:
        return gate_up, down, None
    gate_up_bias = split(read(stacked[0] + "_bias", (experts, 2 * inter), None if part is None else pairs[1:]))
    return gate_up, down, (gate_up_bias, read(stacked[1] + "_bias", (experts, hidden)))


def _weight(name: str, state: dict) -> str:
    """A stacked tensor's key: transformers' bare parameter name, or a published `.weight` one."""
    return name if name in state else name + ".weight"


def tensor_shapes(spec: MoeSpec, prefix: str, hidden: int) -> dict[str, tuple[int, ...]]:
    """The tensors of layer `prefix`'s MoE block by name, the experts stacked as transformers >= 5
    names them (what a random-weight model at a published shape is built from)."""
    n, e, inter, width = spec.names, spec.num_experts, spec.intermediate_size, spec.latent_size or hidden
    base = f"{prefix}{n.blocks[0]}."
    gate_up, down = n.stacked[0]
    scored = e + spec.identity_experts
    shapes = {f"{base}{n.routers[0]}.weight": (scored, hidden),
              base + gate_up: (e, (2 if spec.gated else 1) * inter, width),
              base + down: (e, width, inter)}
    if spec.latent_size:
        shapes.update({f"{base}{n.latent[0]}.weight": (width, hidden), f"{base}{n.latent[1]}.weight": (hidden, width)})
    if n.columns:
        shapes.update({base + gate_up: (e, hidden, 2 * inter), base + down: (e, inter, hidden)})
    if spec.router_bias:
        shapes[f"{base}{n.routers[0]}.bias"] = (scored,)
    if spec.expert_bias:
        shapes.update({f"{base}{gate_up}_bias": (e, 2 * inter), f"{base}{down}_bias": (e, hidden)})
    if spec.score_bias:
        shapes[f"{base}{n.routers[0]}.{n.score_bias}"] = (scored,)
    if spec.shared_intermediate_size:
        size, s = spec.shared_intermediate_size, f"{prefix}{n.shared}."
        if n.shared_fused:
            shapes.update({f"{s}{n.shared_fused[0]}.weight": (2 * size, hidden),
                           f"{s}{n.shared_fused[1]}.weight": (hidden, size)})
        else:
            shapes.update({s + "up_proj.weight": (size, hidden), s + "down_proj.weight": (hidden, size)})
            if spec.gated:
                shapes[s + "gate_proj.weight"] = (size, hidden)
        if n.shared_gate:
            shapes[f"{prefix}{n.shared_gate}.weight"] = (1, hidden)
    return shapes


def num_experts(cfg: dict, default: int | None = None) -> int:
    """The config's expert count: `num_experts` as Qwen's published configs write it,
    `num_local_experts` as Mixtral's (and transformers' own dicts of either) do, `n_routed_experts`
    as GLM's, `moe_num_experts` as ERNIE's."""
    names = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
    count = next((cfg[name] for name in names if name in cfg), default)
    if count is None:
        raise KeyError(f"a mixture-of-experts config needs one of {', '.join(names)}")
    return count


def moe_layers(cfg: dict) -> tuple[bool, ...]:
    """Qwen MoE's rule for which layers are MoE: every `decoder_sparse_step`-th one (counting from
    1), but those `mlp_only_layers` lists, and none where there are no experts."""
    step, dense = cfg.get("decoder_sparse_step", 1), set(cfg.get("mlp_only_layers") or ())
    return tuple(i not in dense and num_experts(cfg) > 0 and (i + 1) % step == 0
                 for i in range(cfg["num_hidden_layers"]))
