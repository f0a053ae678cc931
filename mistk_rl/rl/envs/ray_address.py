"""Whether a Ray cluster answers at an address, found out in seconds.

`ray.init` on an address where nothing answers retries for minutes (over 200 s measured),
and ``auto`` is such an address more often than it looks: it means the cluster named in
Ray's ``ray_current_cluster`` file, which a cluster that is gone leaves behind. So before
joining, both the env copies on Ray (`ray_workers`, beside this module) and the services
placed there (`mistk_rl.deploy.cluster.Cluster`) resolve the address as Ray would and try
one TCP connection to it.
"""

from __future__ import annotations

import socket
from typing import Optional


def unreachable(address: str, timeout: float = 5.0) -> Optional[str]:
    """Why no cluster answers at `address` (``auto``, ``HOST:PORT``, ``ray://HOST:PORT``),
    or None when something listens there (``local`` starts one: None as well)."""
    if address == "local":
        return None
    if address.startswith("ray://"):  # a Ray client server
        bootstrap = address.removeprefix("ray://")
    else:
        try:  # as ray.init resolves it: auto -> the last cluster this machine ran
            from ray._private.services import canonicalize_bootstrap_address

            resolved = canonicalize_bootstrap_address(address)
        except (ImportError, ValueError, ConnectionError) as exc:
            return str(exc)
        if resolved is None:
            return "none is running on this machine"
        bootstrap = resolved
    host, _, port = bootstrap.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except (OSError, ValueError) as exc:
        where = f"{bootstrap}, Ray's last cluster here," if address == "auto" else bootstrap
        return f"nothing answers at {where} ({exc})"
    return None
