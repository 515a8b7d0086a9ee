"""The data-parallel learner's process group (issue 15): torch.distributed, gloo on CPU and NCCL on CUDA.

``init_learner_group`` joins the group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or one given
by ``init_method`` (tests: ``file://`` or ``tcp://127.0.0.1:PORT``), and returns a ``ProcessGroupReducer`` that
``learner.ppo.update.ppo_update`` takes as its ``reducer``. Every collective waits at most ``timeout``; past it, a
``CollectiveTimeout`` names the rank and the collective: a peer that died or fell behind never hangs a rank forever.
After a CollectiveTimeout the group is unusable and its timed-out work is still pending: end the process with
``os._exit`` (a normal interpreter exit can abort, SIGABRT, in the gloo work's destructor).

Same rows, same update. With the batch's rows split over the K ranks (rank r holding rows r*S/K .. (r+1)*S/K - 1,
the rank plan of ``configs.rank_plan``), one update equals the single-process update on the whole batch within float
tolerance where the minibatches hold the same rows, because:

- the V-trace ratios and GAE advantages are per row, so each rank computes its own rows' exactly;
- the prioritized sampling probabilities divide by the *global* sum of the rows' priorities (all-reduced), and the
  importance weights ``(N * P(i)) ** -beta`` use the global row count N = K * segments per rank;
- with ``norm_adv`` the minibatch advantages are normalised by the mean and std of the whole (all-ranks) minibatch,
  gathered before the loss, rather than inside the loss with the rank's own;
- every loss is a mean over the rank's minibatch rows, and the ranks' minibatches have equal sizes, so the mean of
  the ranks' gradients (one flattened all-reduce per optimizer step, before clipping) is the gradient of the global
  minibatch's loss; clipping and the NaN skip then see the same gradient on every rank;
- the value-target normaliser merges the gathered returns of the whole batch; explained variance, the advantage and
  ratio means and the importance-weight statistics are computed on gathered tensors, the loss metrics and the
  target_kl test on the ranks' average (so every rank takes the same early-stopping decision).

Where a rank-local choice necessarily differs from the single-process one:

- **Which rows form a minibatch.** A single process draws minibatch_segments rows from all S rows (prioritized,
  without replacement); rank r draws minibatch_segments / K from its own S / K rows. The minibatch is stratified by
  rank: the marginal probability of each row differs from the single process's (unless prio_alpha is 0), and the
  random streams differ, so with more than one minibatch per epoch the two updates see different minibatches.
  The importance weights still use the global P(i) and N. With one minibatch per epoch (minibatch = batch) every
  row is in it on both sides and the updates agree; the equality test uses that setting.
- **Summation order.** Sums over ranks add partial sums, so results match to float tolerance, not bit for bit.
- **Observation normalisation** (``model.obs_norm``, updated in ``learner/ppo/algorithm.py`` before the update)
  merges every rank's count, mean and variance (gathered), exactly as one process merging all the observations.
- **Equal shares.** The rank plan gives every rank the same number of rows; ``gather`` needs it.
- **COMA** (``learner/coma/learner.py``): each rank replays only its own rows' transitions (a buffer of
  ceil(buffer_size / K)) and draws coma.batch_size / K of each gradient step from it, so a step's transitions are
  stratified by rank; target-action and counterfactual noise is drawn per rank. The critic's and actors' gradients
  are averaged before clipping, so every rank takes the same step; with the same transitions and no noise that is the
  single process's step (tests/test_distributed_update.py).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

DEFAULT_TIMEOUT = datetime.timedelta(seconds=300)
"""How long a collective (or joining the group) may wait for the other ranks before the rank gives up."""


class CollectiveTimeout(RuntimeError):
    """A collective or the rendezvous did not complete in time: a peer rank died, hung or fell behind."""


@dataclass(frozen=True, kw_only=True)
class ProcessGroupReducer:
    """The ``learner.update.reducer.Reducer`` of one rank of an initialised process group."""

    rank: int
    """This process's rank."""
    world_size: int
    """Learner ranks K."""
    timeout: datetime.timedelta
    """Longest wait of one collective."""

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The element-wise sum over the ranks (a new tensor)."""
        total = tensor.detach().clone()
        self._wait("all_reduce", lambda: dist.all_reduce(total, op=dist.ReduceOp.SUM, async_op=True))
        return total

    def average(self, tensor: torch.Tensor) -> torch.Tensor:
        """The element-wise mean over the ranks (a new tensor)."""
        return self.sum(tensor) / self.world_size

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's tensor, concatenated along dim 0 in rank order."""
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        local = tensor.detach().contiguous()
        self._wait("all_gather", lambda: dist.all_gather(parts, local, async_op=True))
        return torch.cat(parts)

    def average_gradients(self, parameters: Iterable[nn.Parameter]) -> None:
        """One all-reduce of every gradient flattened together, divided by K and copied back."""
        grads = [p.grad for p in parameters if p.grad is not None]
        if not grads:
            return
        flat = self.average(torch.cat([g.reshape(-1) for g in grads]))
        offset = 0
        for grad in grads:
            grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
            offset += grad.numel()

    def broadcast_module(self, module: nn.Module) -> None:
        """Every parameter and buffer of ``module`` becomes rank 0's (every rank calls it at the same point), so the
        ranks start from identical weights whatever their seeds or files."""
        for tensor in [*module.parameters(), *module.buffers()]:
            self._wait("broadcast", lambda tensor=tensor: dist.broadcast(tensor.data, src=0, async_op=True))

    def _wait(self, name: str, start: Callable[[], dist.Work]) -> None:
        try:
            start().wait(timeout=self.timeout)
        except RuntimeError as error:
            raise CollectiveTimeout(
                f"learner rank {self.rank} of {self.world_size}: {name} failed or did not complete within "
                f"{self.timeout.total_seconds():g} s (a peer rank died, hung or fell behind): {error}") from error


def init_learner_group(device: torch.device, *, timeout: datetime.timedelta = DEFAULT_TIMEOUT,
                       init_method: str | None = None, rank: int | None = None,
                       world_size: int | None = None, store: dist.Store | None = None) -> ProcessGroupReducer:
    """Join the learner ranks' process group (NCCL for a CUDA device, gloo otherwise) and return its reducer.

    Without ``init_method`` or ``store`` (torchrun's ``env://``) the rank and world size come from torchrun's RANK
    and WORLD_SIZE; a ``store`` (learner/ranks/context.py passes torchrun's, under a prefix) replaces the rendezvous. Raises
    CollectiveTimeout when the other ranks do not all join within ``timeout``."""
    rank = int(os.environ["RANK"]) if rank is None else rank
    world_size = int(os.environ["WORLD_SIZE"]) if world_size is None else world_size
    backend = "nccl" if device.type == "cuda" else "gloo"
    try:
        if store is not None:
            dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
        else:
            dist.init_process_group(backend=backend, init_method=init_method or "env://", rank=rank,
                                    world_size=world_size, timeout=timeout)
    except RuntimeError as error:  # torch.distributed's DistStoreError (timeouts) is one
        raise CollectiveTimeout(
            f"learner rank {rank} of {world_size}: the ranks did not all join the {backend} process group "
            f"at {init_method or 'the store'} within {timeout.total_seconds():g} s: {error}") from error
    return ProcessGroupReducer(rank=rank, world_size=world_size, timeout=timeout)


def close_learner_group() -> None:
    """Leave the process group (a no-op when none was joined)."""
    if dist.is_initialized():
        dist.destroy_process_group()
