"""What a service takes on for one caller: a ceiling on every size a request controls.

A request that would go over one gets 400 naming the limit, before anything is allocated or
started. The defaults are generous for the envs this project runs and far below what would
take the machine down (a [4000, 4000] observation space made a DQN allocate a 16 GB first
layer; numEnvs 1024 with subprocess envs started 1,027 processes). Raise one with
``mistk-rl serve ... --limit NAME=VALUE``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

from mistk_rl.errors import InvalidRequest


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 16 * 1024 * 1024  # a request body; more gets 413
    max_file_bytes: int = 1024 * 1024 * 1024  # a file put into the data dir (putFile)
    max_json_depth: int = 64  # nesting of a JSON body (hyperparameters, properties)
    max_long_polls: int = 1024  # status long-polls waiting at once; more get 429
    max_space_elements: int = 1_000_000  # numbers in one observation or action, or in its
    # mask or one-hot encoding (a Discrete(n) counts n): `mistk_rl.spaces.space_elements`
    max_model_params: int = 50_000_000  # parameters of a model an agent builds (200 MB f32)
    max_envs: int = 256  # env copies in one startEpisode
    max_env_processes: int = 64  # env worker processes an orchestrator keeps at once
    max_streams: int = 64  # step streams open at once; one more is refused with 429
    stream_idle_s: int = 75  # a step stream that sends nothing this long is closed
    frame_timeout_s: int = 10  # a frame begun and not finished within this is dropped
    # bytes a worker holds of step frames and request bodies not yet whole, over all its
    # connections; a connection whose next bytes would pass it is closed (a WARNING says so)
    max_buffered_bytes: int = 256 * 1024 * 1024

    @classmethod
    def parse(cls, items: Sequence[str]) -> "Limits":
        """Defaults with ``NAME=VALUE`` overrides (the CLI's ``--limit``)."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {}
        for item in items:
            name, _, value = item.partition("=")
            name = name.strip().replace("-", "_")
            if name not in names:
                raise ValueError(f"unknown limit {name!r}; limits: {', '.join(sorted(names))}")
            try:
                values[name] = int(value)
            except ValueError:
                raise ValueError(f"limit {name}: {value!r} is not an integer") from None
            if values[name] < 1:
                raise ValueError(f"limit {name} must be at least 1")
        return cls(**values)

    def check(self, name: str, value: int, what: str) -> None:
        """Raise InvalidRequest (400, naming the limit) when `value` is over limit `name`."""
        limit = getattr(self, name)
        if value > limit:
            raise InvalidRequest(
                f"{what} is {value:,}, over the limit {name}={limit:,} (the "
                f"service's operator can raise it: --limit {name}=N)",
                limit=name,
            )
