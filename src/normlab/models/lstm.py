"""A character-level LSTM language model with the norm of the LN paper (Ba et al. 2016, Sec. 3.1
and the LN-LSTM equations of its appendix), the norm taken from the registry:

    (i, f, g, o) = Norm_x(W_x x_t) + Norm_h(W_h h_{t-1}) + b      (each over the 4*hidden gates)
    c_t = sigmoid(f) * c_{t-1} + sigmoid(i) * tanh(g)
    h_t = sigmoid(o) * tanh(Norm_c(c_t))                          (over the hidden units)

Gate order i, f, g, o and the weight shapes are torch.nn.LSTM's: with norm=none the layer is a
plain LSTM whose bias is torch's bias_ih + bias_hh. torch's fused nn.LSTM has no place for a
norm, so the recurrence is an explicit loop over time; W_x x_t and its norm are computed for all
time steps at once before the loop (the input term does not depend on the recurrence).

Only norms that normalize each sample over its last dim (layernorm, rmsnorm, prmsnorm, dyt, none:
the families whose class declares `tokenwise`, a user's too) fit: BatchNorm
would need statistics per time step, GroupNorm/InstanceNorm of a (B, T, D) stream mix time
steps. They are refused when the model is built, naming the layer and the valid choices.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from normlab.norms import NormConfigError, build_norm, norm_name, norm_traits, norms_with
from normlab.norms.registry import NormLayer

State = tuple[torch.Tensor, torch.Tensor]  # (h, c), each (B, hidden)


def lstm_norm(norm_layer: NormLayer, features: int, layer: str) -> nn.Module:
    """The configured norm over `features` per sample, or NormConfigError naming `layer`."""
    traits = norm_traits(norm_layer)
    if traits is not None and not traits.tokenwise:
        name = norm_name(norm_layer)
        raise NormConfigError(
            f"norm={name} cannot be used in model=lstm (layer {layer}, {features} features): "
            "an LSTM normalizes each sample's own features at every time step (Ba et al. 2016) "
            f"and {name} takes statistics across samples or time steps (per-time-step "
            f"statistics are not implemented); use one of {', '.join(norms_with('tokenwise'))}"
        )
    try:
        return build_norm(norm_layer, features, channel_dim=-1)  # on (B, T, 4H) and (B, H)
    except ValueError as err:
        raise NormConfigError(f"{layer} ({features} features): {err}") from err


class LSTMLayer(nn.Module):
    """One LSTM layer over (B, T, input_size) with the norms of the LN-LSTM."""

    def __init__(
        self,
        input_size: int,
        hidden_size: int,
        norm_layer: NormLayer,
        name: str = "layer",
    ) -> None:
        super().__init__()
        H = self.hidden_size = hidden_size
        self.input_size = input_size
        # torch.nn.LSTM's names and shapes (gates i, f, g, o); one bias (its bias_ih + bias_hh)
        self.weight_ih = nn.Parameter(torch.empty(4 * H, input_size))
        self.weight_hh = nn.Parameter(torch.empty(4 * H, H))
        self.bias = nn.Parameter(torch.empty(4 * H))
        self.norm_x = lstm_norm(norm_layer, 4 * H, f"{name}.norm_x")  # input term W_x x_t
        self.norm_h = lstm_norm(norm_layer, 4 * H, f"{name}.norm_h")  # recurrent term W_h h_{t-1}
        self.norm_c = lstm_norm(norm_layer, H, f"{name}.norm_c")  # cell state, before its tanh
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torch.nn.LSTM's U(-1/sqrt(H), 1/sqrt(H)) weights; bias 0 except the forget gate's 1
        (Jozefowicz et al. 2015: the cell remembers by default). Norms keep their own init."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        nn.init.uniform_(self.weight_ih, -bound, bound)
        nn.init.uniform_(self.weight_hh, -bound, bound)
        H = self.hidden_size
        with torch.no_grad():
            self.bias.zero_()
            self.bias[H : 2 * H] = 1.0

    def zero_state(self, batch: int, like: torch.Tensor) -> State:
        h = like.new_zeros(batch, self.hidden_size)
        return h, h

    def input_term(self, x: torch.Tensor) -> torch.Tensor:
        """Norm_x(W_x x_t) + b for every time step at once: (B, T, I) -> (B, T, 4H)."""
        return self.norm_x(F.linear(x, self.weight_ih)) + self.bias

    def cell(self, gx: torch.Tensor, state: State) -> State:
        """One time step from the input term gx (B, 4H) of input_term and the state (h, c)."""
        h, c = state
        gates = gx + self.norm_h(F.linear(h, self.weight_hh))  # (B, 4H)
        # one sigmoid for i, f, o (g's is unused): one kernel, not 3; chunk: one op in backward
        i, f, _, o = torch.sigmoid(gates).chunk(4, dim=1)
        g = gates.chunk(4, dim=1)[2]
        c = torch.addcmul(f * c, i, torch.tanh(g))
        h = o * torch.tanh(self.norm_c(c))
        return h, c

    def forward(self, x: torch.Tensor, state: State | None = None) -> tuple[torch.Tensor, State]:
        """x (B, T, input_size), state (h, c) or None (zeros) -> outputs (B, T, H), last state."""
        B, T, _ = x.shape
        gx = self.input_term(x)  # (B, T, 4H)
        state = self.zero_state(B, gx) if state is None else state
        outputs = []
        for gx_t in gx.unbind(1):  # unbind: one stack in backward (gx[:, t] fills B*T*4H each)
            state = self.cell(gx_t, state)
            outputs.append(state[0])
        return torch.stack(outputs, dim=1), state  # (B, T, H)


class LSTMLM(nn.Module):
    """Embedding -> num_layers LN-LSTM layers -> linear head: ids (B, T) -> logits (B, T, V).

    `ctx` is the training window (truncated backprop through time: every window starts from a
    zero state); forward takes any length, and generate carries the state across tokens.
    """

    def __init__(
        self,
        vocab_size: int,
        norm_layer: NormLayer,
        hidden_size: int = 256,
        num_layers: int = 1,
        emb_dim: int | None = None,
        ctx: int = 128,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        emb_dim = hidden_size if emb_dim is None else emb_dim
        sizes = {"hidden_size": hidden_size, "num_layers": num_layers, "emb_dim": emb_dim}
        for key, value in {**sizes, "ctx": ctx, "vocab_size": vocab_size}.items():
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{key} must be a positive integer, got {value!r}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)):
            raise ValueError(f"dropout must be a number in [0, 1), got {dropout!r}")
        if not 0 <= dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        self.vocab_size, self.hidden_size, self.num_layers = vocab_size, hidden_size, num_layers
        self.emb_dim, self.ctx, self.dropout = emb_dim, ctx, float(dropout)
        self.tok_emb = nn.Embedding(vocab_size, emb_dim)
        self.layers = nn.ModuleList(
            LSTMLayer(emb_dim if k == 0 else hidden_size, hidden_size, norm_layer, f"layers.{k}")
            for k in range(num_layers)
        )
        self.drop = nn.Dropout(self.dropout)  # on each layer's input and the head's (Zaremba)
        self.lm_head = nn.Linear(hidden_size, vocab_size)

    def forward_bytes(self, batch: int) -> tuple[int, str]:
        """An estimate of the float32 activations a forward pass keeps for backward over batch
        windows of ctx tokens, and how it was computed: about 24*hidden per layer and token
        (input and recurrent terms, their norms, gates and cell), plus the logits."""
        B, T, H, L, V = batch, self.ctx, self.hidden_size, self.num_layers, self.vocab_size
        need = B * T * (24 * H * L + 2 * V) * 4
        how = (
            f"activations batch*ctx*(24*hidden*layers + 2*vocab)*4 = "
            f"{B}*{T}*(24*{H}*{L} + 2*{V})*4 = {need / 2**30:.1f} GiB"
        )
        return need, how

    def run(
        self, idx: torch.Tensor, state: list[State] | None = None
    ) -> tuple[torch.Tensor, list[State]]:
        """ids (B, T) and per-layer states (or None: zeros) -> logits (B, T, V), last states."""
        x = self.tok_emb(idx)  # (B, T, E)
        states = []
        for k, layer in enumerate(self.layers):
            x, s = layer(self.drop(x), None if state is None else state[k])  # (B, T, H)
            states.append(s)
        return self.lm_head(self.drop(x)), states  # (B, T, V)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.run(idx)[0]  # (B, T, V)

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Extend idx (B, T) by max_new_tokens tokens, carrying the state; temperature 0 =
        greedy. The prompt is read once, then one step per new token."""
        if max_new_tokens <= 0:
            return idx
        logits, state = self.run(idx)
        out = [idx]
        for i in range(max_new_tokens):
            last = logits[:, -1]  # (B, V)
            if temperature == 0:
                nxt = last.argmax(dim=-1, keepdim=True)  # (B, 1)
            else:
                probs = F.softmax(last / temperature, dim=-1)  # (B, V)
                nxt = torch.multinomial(probs, 1, generator=generator)  # (B, 1)
            out.append(nxt)
            if i + 1 < max_new_tokens:
                logits, state = self.run(nxt, state)
        return torch.cat(out, dim=1)  # (B, T + max_new_tokens)
