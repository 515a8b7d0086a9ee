"""The envs Sluice ships: CartPole, the gridworld, Connect Four, simple_spread, the learner probes (each by its
``env.name``, listed in ``envs.builtin.table``) and the synthetic benchmark env (a native env, by entry point).

They stand on the envs root (``envs.base``, ``envs.spaces``, ``envs.errors``) only: never on the registry or the
adapters (tests/test_import_rules.py)."""
