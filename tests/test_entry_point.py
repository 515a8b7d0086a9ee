"""resolve_entry_point: 'module:callable' strings and every way they can be wrong."""

from __future__ import annotations

import gymnasium
import pytest

from envs.adapters.entry_point import resolve_entry_point
from tests import fake_envs


def test_resolves_module_callable_and_dotted_attribute() -> None:
    assert resolve_entry_point("gymnasium:make_vec", env_name="gymnasium_vector") is gymnasium.make_vec
    fn = resolve_entry_point("tests.fake_envs:Factories.staggered", env_name="pettingzoo")
    assert fn is fake_envs.Factories.staggered
    assert resolve_entry_point("tests.fake_envs:StaggeredParallelEnv", env_name="pettingzoo") is (
        fake_envs.StaggeredParallelEnv)


@pytest.mark.parametrize("text", ["gymnasium.make_vec", "gymnasium:make_vec:x", ":make_vec", "gymnasium:",
                                  "gymnasium:1st", "gym nasium:make", "tests..fake_envs:x", "gymnasium:make_vec."])
def test_wrong_format(text: str) -> None:
    with pytest.raises(ValueError) as info:
        resolve_entry_point(text, env_name="pettingzoo")
    assert str(info.value) == (
        f"env.entry_point {text!r} (env 'pettingzoo') must look like 'module:callable' (a dotted module path, a "
        f"colon, then an attribute path), e.g. 'mpe2.simple_spread_v3:parallel_env'")


def test_module_that_cannot_be_imported() -> None:
    with pytest.raises(ValueError) as info:
        resolve_entry_point("no_such_pkg_xyz.envs:make", env_name="gymnasium_vector")
    assert str(info.value) == ("env.entry_point 'no_such_pkg_xyz.envs:make' (env 'gymnasium_vector'): module "
                               "'no_such_pkg_xyz.envs' cannot be imported: No module named 'no_such_pkg_xyz'")
    assert isinstance(info.value.__cause__, ImportError)


def test_missing_attribute() -> None:
    with pytest.raises(ValueError, match=r"^env.entry_point 'tests.fake_envs:nope' \(env 'pettingzoo'\): "
                                         r"'tests.fake_envs' has no attribute 'nope'$"):
        resolve_entry_point("tests.fake_envs:nope", env_name="pettingzoo")
    with pytest.raises(ValueError, match=r"'tests.fake_envs.Factories' has no attribute 'nope'$"):
        resolve_entry_point("tests.fake_envs:Factories.nope", env_name="pettingzoo")


def test_not_callable() -> None:
    with pytest.raises(ValueError, match=r"^env.entry_point 'tests.fake_envs:NOT_CALLABLE' \(env 'pettingzoo'\): "
                                         r"tests.fake_envs:NOT_CALLABLE is not callable \(its type is int\)$"):
        resolve_entry_point("tests.fake_envs:NOT_CALLABLE", env_name="pettingzoo")
