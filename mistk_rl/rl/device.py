"""Where a policy's model runs: an agent config's `device`, resolved here and nowhere else.

`auto` (the default) is CUDA when torch sees a GPU, else the CPU: a service placed on a
Ray node with `gpus: 1` sees the GPU it was given through CUDA_VISIBLE_DEVICES, and one
without sees none. `cuda` insists on a GPU, so a run that meant to train on one does not
quietly train on the CPU instead.

Only the model, its target network and its optimizer state live on the device. Replay
buffers, rollouts, normalisation statistics and every random generator stay on the CPU, so
a seeded run draws the same numbers on either device, and checkpoints and local-inference
copies never depend on one. Tensors cross in three places: batches at the learner
(`Learner.train`, `plan`, `restore_plan`), observations at the actor (`Actor.act`), and
a rollout's bootstrap values (`PPOPolicy.value`). What comes back (actions, log-probs,
values, priorities) is CPU.
"""

from __future__ import annotations

import torch

from mistk_rl.rl.config import AgentConfigError

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(name: str) -> torch.device:
    """The torch device `name` (one of DEVICES) means here; a AgentConfigError naming `device`
    for another name, or for `cuda` where torch sees no GPU."""
    if name not in DEVICES:
        raise AgentConfigError(f"device must be one of {', '.join(DEVICES)}, not {name!r}")
    if name == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if name == "cuda":
        raise AgentConfigError(
            "device: 'cuda' was asked for, but torch sees no CUDA GPU here "
            "(torch.cuda.is_available() is False); use 'auto' or 'cpu'"
        )
    return torch.device("cpu")
