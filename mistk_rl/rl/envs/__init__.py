"""Env managers: in-process, subprocess (synchronous) and asynchronous subprocess."""
from mistk_rl.rl.envs.base import (EnvManager, EnvManagerError, GymEnvFactory, Timestep,
                                   make_env_fns)
from mistk_rl.rl.envs.inprocess import BaseEnvManager
from mistk_rl.rl.envs.subprocess import AsyncSubprocessEnvManager, SubprocessEnvManager

MANAGERS = {"base": BaseEnvManager, "subprocess": SubprocessEnvManager,
            "async": AsyncSubprocessEnvManager}

__all__ = ["MANAGERS", "AsyncSubprocessEnvManager", "BaseEnvManager", "EnvManager",
           "EnvManagerError", "GymEnvFactory", "SubprocessEnvManager", "Timestep",
           "make_env_fns"]
