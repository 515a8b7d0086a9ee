"""The PufferLib side of ops/bench/peer_pufferlib.py; runs INSIDE the peer venv (.bench/pufferlib-venv).

Wraps one batch of Sluice's own vectorised env (``envs.registry.make_vec_env``) as a native
``pufferlib.PufferEnv`` whose agents are all the batch's agent slots (CartPole: E envs = E agents;
gridworld: E envs x A agents) and steps it with pufferlib-core's ``pufferlib.vector.Multiprocessing``
backend, one such env per worker process, with uniformly random actions drawn per step in the main
process (the null policy) and nothing else. Zero-copy: the env's ``StepBuffers`` are built on PufferLib's
own shared-memory buffers (observations, actions, rewards, terminals, truncations; ``active`` is PufferLib's
``masks``), so our numba kernels write straight into them; only the fields PufferLib has no buffer for
(final_obs, episode stats, action masks) are private arrays of the wrapper.

Prints one JSON object (agent steps/s over a fixed window after a warm-up that includes numba compile or
cache load). Not meant to be run by hand; peer_pufferlib.py runs it, from the repository root, as
``.bench/pufferlib-venv/bin/python -m ops.bench.pufferlib_side --env cartpole --workers 2 --envs-per-worker N
--mode sync|async --seconds S``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import gymnasium
import numpy as np
import psutil
import pufferlib
import pufferlib.vector

from configs.loader import load_config
from envs.base import StepBuffers
from envs.registry import make_vec_env

REPO = Path(__file__).resolve().parents[2]

ENV_CONFIGS = {
    "cartpole": "configs/cartpole.yaml",
    "grid3": "configs/grid_3agents.yaml",
    "grid24": "configs/grid_24agents.yaml",
}
"""Bench env name -> the run config whose `env` section describes it (as our pipeline bench uses)."""


def env_config(name: str):
    """The `env` section (EnvConfig) of the run config behind a bench env name."""
    return load_config(REPO / ENV_CONFIGS[name]).env


class SluiceBatchEnv(pufferlib.PufferEnv):
    """``num_envs`` of our envs as one native PufferEnv of ``num_envs * spec.num_agents`` agents."""

    def __init__(self, env_name: str, num_envs: int, buf=None, seed: int = 0):
        self.vec = make_vec_env(env_config(env_name), num_envs)
        spec = self.vec.spec
        if spec.action.kind != "discrete":
            raise ValueError(f"{env_name}: only discrete action spaces are wrapped here, got {spec.action.kind}")
        dtype = np.dtype(spec.obs_dtype)
        if np.issubdtype(dtype, np.integer):
            info = np.iinfo(dtype)
            low, high = info.min, info.max
        else:
            low, high = -np.inf, np.inf
        self.single_observation_space = gymnasium.spaces.Box(low=low, high=high, shape=spec.obs_shape, dtype=dtype)
        self.single_action_space = gymnasium.spaces.Discrete(spec.num_actions)
        self.num_agents = num_envs * spec.num_agents
        self.seed = 0 if seed is None else int(seed)
        super().__init__(buf)  # PufferLib's buffers: its shared memory in a worker, private arrays otherwise
        slots = self.num_agents
        self.buffers = StepBuffers(
            obs=self.observations,
            actions=self.actions,
            rewards=self.rewards,
            terminated=self.terminals,
            truncated=self.truncations,
            active=self.masks,
            final_obs=np.zeros((slots, *spec.obs_shape), dtype=dtype),
            episode_done=np.zeros(slots, dtype=bool),
            episode_return=np.zeros(slots, dtype=np.float32),
            episode_length=np.zeros(slots, dtype=np.int32),
            episode_stats=np.zeros((slots, len(spec.episode_stats)), dtype=np.float32),
            action_mask=np.ones((slots, spec.mask_size), dtype=np.uint8),
            global_state=np.zeros((slots, spec.state_size), dtype=np.float32),
            final_global_state=np.zeros((slots, spec.state_size), dtype=np.float32),
        )
        for name, want in (("obs", dtype), ("actions", spec.action.dtype), ("rewards", "float32"),
                           ("terminated", "bool"), ("truncated", "bool"), ("active", "bool")):
            if getattr(self.buffers, name).dtype != np.dtype(want):
                raise TypeError(f"PufferLib's buffer for {name} is {getattr(self.buffers, name).dtype}, not {want}")

    def reset(self, seed=None):
        self.vec.reset(self.buffers, self.seed if seed is None else int(seed))
        return self.observations, []

    def step(self, actions):
        # `actions` is PufferLib's action buffer itself (a worker steps with its shared-memory view); copy
        # only if it is handed something else (e.g. the Serial backend's slices are views too).
        if actions is not self.actions and not np.may_share_memory(actions, self.actions):
            self.actions[:] = actions
        self.vec.step(self.buffers)
        return self.observations, self.rewards, self.terminals, self.truncations, []

    def close(self):
        self.vec.close()


def _creator(env_name: str, num_envs: int, buf=None, seed: int = 0) -> SluiceBatchEnv:
    return SluiceBatchEnv(env_name, num_envs, buf=buf, seed=seed)


def bench(env_name: str, workers: int, envs_per_worker: int, mode: str, seconds: float, warmup: float,
          seed: int) -> dict:
    """Step ``workers`` PufferEnvs of ``envs_per_worker`` of our envs each with PufferLib Multiprocessing."""
    num_envs = workers  # PufferEnvs: one per worker, each holding envs_per_worker of our envs
    batch_size = num_envs if mode == "sync" else num_envs // 2
    vecenv = pufferlib.vector.make(
        _creator, env_args=(env_name, envs_per_worker), backend=pufferlib.vector.Multiprocessing,
        num_envs=num_envs, num_workers=workers, batch_size=batch_size, zero_copy=True, seed=seed,
        overwork=True,  # psutil may count fewer physical cores than logical ones; workers is fixed by the bench
    )
    worker_pids = [p.pid for p in vecenv.processes]
    leftover: list[int] = []
    try:
        num_actions = int(vecenv.single_action_space.n)
        agents_per_batch = vecenv.agents_per_batch
        rng = np.random.default_rng(seed)
        vecenv.async_reset(seed)

        def run_for(duration: float) -> tuple[int, int, float]:
            steps = agent_steps = 0
            start = time.perf_counter()
            while True:
                for _ in range(20):
                    _o, _r, _d, _t, _ta, _infos, _ids, masks = vecenv.recv()
                    agent_steps += int(np.count_nonzero(masks))
                    vecenv.send(rng.integers(0, num_actions, size=agents_per_batch, dtype=np.int32))
                    steps += 1
                elapsed = time.perf_counter() - start
                if elapsed >= duration:
                    return steps, agent_steps, elapsed

        run_for(warmup)
        cpu_before = os.times()
        load_before = os.getloadavg()[0]
        steps, agent_steps, elapsed = run_for(seconds)
        cpu_after = os.times()
        vecenv.recv()  # leave no step in flight
    finally:
        vecenv.close()  # terminates the workers (SIGTERM); wait for them so none outlive the bench
        for p in vecenv.processes:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        leftover = [pid for pid in worker_pids if psutil.pid_exists(pid)
                    and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    spec_env = env_config(env_name)
    return {
        "bench": "pufferlib_multiprocessing",
        "env": env_name,
        "mode": mode,
        "pufferlib_version": pufferlib.__version__,
        "backend": "pufferlib.vector.Multiprocessing",
        "workers": workers,
        "envs_per_worker": envs_per_worker,
        "total_envs": workers * envs_per_worker,
        "agents_per_env": spec_env.num_agents,
        "total_agent_slots": vecenv.num_agents,
        "pufferlib_num_envs": num_envs,
        "pufferlib_batch_size": batch_size,
        "agents_per_batch": agents_per_batch,
        "zero_copy": True,
        "warmup_s": warmup,
        "seconds": round(elapsed, 3),
        "batches": steps,
        "agent_steps": agent_steps,
        "pufferlib_agent_steps_per_s": round(agent_steps / elapsed),
        "main_process_cpu_s": round((cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system), 3),
        "loadavg_1m_before": round(load_before, 2),
        "leftover_worker_pids": leftover,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", required=True, choices=sorted(ENV_CONFIGS))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--envs-per-worker", type=int, required=True)
    parser.add_argument("--mode", choices=("sync", "async"), default="sync",
                        help="sync: batch_size = num_envs; async: batch_size = num_envs / 2 (double-buffered)")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.mode == "async" and args.workers % 2:
        parser.error("--mode async needs an even number of workers (batch_size = num_envs / 2)")
    record = bench(args.env, args.workers, args.envs_per_worker, args.mode, args.seconds, args.warmup, args.seed)
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
