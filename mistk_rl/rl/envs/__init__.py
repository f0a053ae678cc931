"""Env managers: in-process, subprocess (synchronous), asynchronous subprocess, and Ray actors
(env copies on a cluster; Ray is imported only when that manager is launched)."""

from mistk_rl.rl.envs.base import EnvManager, EnvManagerError, GymEnvFactory, Timestep, make_env_fns
from mistk_rl.rl.envs.inprocess import BaseEnvManager
from mistk_rl.rl.envs.ray_workers import RayEnvManager
from mistk_rl.rl.envs.subprocess import AsyncSubprocessEnvManager, SubprocessEnvManager

MANAGERS = {
    "base": BaseEnvManager,
    "subprocess": SubprocessEnvManager,
    "async": AsyncSubprocessEnvManager,
}  # the env copies on this machine
# and every manager a gym orchestrator offers (envManager): ray's copies are on a cluster
ALL_MANAGERS = {**MANAGERS, "ray": RayEnvManager}

__all__ = [
    "ALL_MANAGERS",
    "MANAGERS",
    "AsyncSubprocessEnvManager",
    "BaseEnvManager",
    "EnvManager",
    "EnvManagerError",
    "GymEnvFactory",
    "RayEnvManager",
    "SubprocessEnvManager",
    "Timestep",
    "make_env_fns",
]
