"""The recurrent actor-critic: encoder -> MLP torso -> LSTM cell -> actor and critic heads, trained by BPTT over rows.

The recurrent state of one agent is ``[h, c]`` concatenated (``state_size = 2 * hidden_size`` floats), so it
travels as one float32 array through the actor host, the assembler and the wire. Two entry points share the
same weights and cell: ``step`` (actor hosts: one step for a batch of agents) and ``forward_rows`` (the
learner: T steps of S rows from the state each row's step 0 was acted with). Before step t of a row the
state is zeroed wherever ``dones[:, t]`` is set, which is exactly what the actor host did when it acted.
"""

from __future__ import annotations

import torch
from torch import nn

from configs.schema import ModelSection
from envs.base import EnvSpec
from policies.distributions import ActionDistribution, ActionHead
from policies.encoders import make_encoder
from policies.layers import layer, torso, torso_width


class LSTMPolicy(nn.Module):
    """Observation -> encoder (``policies.encoders``) -> tanh MLP torso -> ``nn.LSTMCell`` -> (action params, value).

    One torso feeds the cell and both heads read the cell's output ``h`` (``model.shared_torso`` does not
    apply: the critic needs the memory too). Weights are orthogonal (heads with gains 0.01 and 1 like
    ``MLPPolicy``), biases zero.
    """

    def __init__(self, spec: EnvSpec, model: ModelSection) -> None:
        super().__init__()
        self.hidden_size = model.hidden_size
        self.encoder = make_encoder(spec, model)
        self.torso = torso(self.encoder.out_features, model)
        self.cell = nn.LSTMCell(torso_width(self.encoder.out_features, model), model.hidden_size)
        for name, param in self.cell.named_parameters():
            if name.startswith("weight"):
                nn.init.orthogonal_(param, 1.0)
            else:
                nn.init.zeros_(param)
        self.actor = ActionHead(spec.action, model.hidden_size)
        self.distribution = ActionDistribution(spec.action)
        self.critic = layer(model.hidden_size, 1, 1.0)
        self.state_size = 2 * model.hidden_size
        """Floats of recurrent state per agent: h then c."""

    def split_state(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[n, 2H] -> (h [n, H], c [n, H])."""
        if state.shape[-1] != self.state_size:
            raise ValueError(f"state has width {state.shape[-1]}, expected {self.state_size}")
        return state[..., : self.hidden_size], state[..., self.hidden_size:]

    def step(self, obs: torch.Tensor,
             state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step for n agents: obs [n, *obs_shape], state [n, 2H] -> params [n, P], values [n], state [n, 2H].

        No reset happens here: the caller zeroes the state of agents whose episode just began.
        """
        h, c = self.cell(self.torso(self.encoder(obs)), self.split_state(state))
        return self.actor(h), self.critic(h).squeeze(-1), torch.cat([h, c], dim=-1)

    def forward_rows(self, obs: torch.Tensor, dones: torch.Tensor,
                     state0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows obs [S, T, *obs_shape], dones [S, T], state0 [S, 2H] -> params [S, T, P], values [S, T].

        The torso runs on all S * T steps at once; the cell loops over T, zeroing the state before step t
        where ``dones[:, t]`` is nonzero (an episode began there), so no gradient crosses an episode start.
        """
        features = self.torso(self.encoder(obs))
        h, c = self.split_state(state0)
        starts = (dones != 0).unsqueeze(-1)
        outputs = []
        for t in range(features.shape[1]):
            h = torch.where(starts[:, t], torch.zeros_like(h), h)
            c = torch.where(starts[:, t], torch.zeros_like(c), c)
            h, c = self.cell(features[:, t], (h, c))
            outputs.append(h)
        hidden = torch.stack(outputs, dim=1)
        return self.actor(hidden), self.critic(hidden).squeeze(-1)

    def forward(self, obs: torch.Tensor, dones: torch.Tensor,
                state0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Same as ``forward_rows`` (a recurrent policy has no stateless forward)."""
        return self.forward_rows(obs, dones, state0)
