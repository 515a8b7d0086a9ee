"""Placeholder: being written."""


class GymnasiumVectorAdapter:
    def __init__(self, entry_point, num_envs, *, max_steps, kwargs):
        raise NotImplementedError
