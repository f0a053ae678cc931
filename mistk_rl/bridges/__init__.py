"""Bridges between the contract and other protocols: dm_env_rpc both ways, and an
orchestrator's envs as a gymnasium env for callers that drive the loop themselves."""

import os

# gRPC's fork handlers (on by default) can abort a process that forks while gRPC threads run
# ("epoll_wait error: Bad file descriptor", SIGABRT in the child): ours fork only to exec a
# service (subprocess) or from a forkserver that never loaded gRPC, so they are not needed.
# Read when gRPC is first imported: set here, before any bridge imports it.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
