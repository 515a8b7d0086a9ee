"""What puts a user's env behind the VecEnv contract: Gymnasium (``gym_adapter``, ``gym_vector_adapter``, with the
space mapping in ``gym_spaces``), PettingZoo (``pettingzoo_adapter`` for ParallelEnvs,
``pettingzoo_aec_adapter`` for turn-based AEC envs) and native VecEnvs (``native``), each found by
``env.name`` in ``envs.adapters.table``; ``entry_point`` resolves the 'module:callable' strings they are built from.

They stand on the envs root (``envs.base``, ``envs.spaces``, ``envs.errors``) only: never on the registry or the
built-in envs (tests/test_import_rules.py)."""
