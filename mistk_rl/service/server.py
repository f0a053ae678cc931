"""`mistk-rl serve`: one implementation class behind gunicorn (one worker, ASGI).

State lives in the worker's memory, so there is exactly one worker process; scale out by
running more services. The implementation class is imported before gunicorn starts, so a
typo fails at once with a clear message instead of in a worker boot loop.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import logging.config
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from gunicorn.app.base import BaseApplication
from uvicorn_worker import UvicornWorker

from mistk_rl.framework.agent import AbstractAgent
from mistk_rl.framework.orchestrator import AbstractOrchestrator
from mistk_rl.limits import Limits
from mistk_rl.service.logs import logging_config
from mistk_rl.service.uvicorn_protocol import CoalescingHttpTools, check_uvicorn

ROLES = {"agent": AbstractAgent, "orchestrator": AbstractOrchestrator}
log = logging.getLogger(__name__)


@dataclass
class ServeOptions:
    role: str
    target: str  # "module:Class"
    host: str = "127.0.0.1"
    port: int = 8081
    data_dir: Path = Path("data")
    token: Optional[str] = None
    fd: Optional[int] = None  # serve on an inherited listening socket instead of host:port
    allow_agent_hosts: list[str] = field(default_factory=list)
    env_modules: list[str] = field(default_factory=list)  # modules envs may come from
    agent_timeout: float = 20.0  # seconds an orchestrator waits for one agent call
    limits: Limits = field(default_factory=Limits)
    # NAME -> DIR: paths NAME/... resolve inside DIR (`mistk_rl.files.resolve_in`)
    shares: dict[str, Path] = field(default_factory=dict)
    log_level: str = "info"
    log_format: str = "text"  # or "json" (`mistk_rl.service.logs`)
    worker_class: str = "mistk_rl.service.server.ServiceWorker"


def import_implementation(role: str, target: str) -> type:
    """The class named by ``module:Class``, checked to be an agent or orchestrator."""
    module_name, _, class_name = target.partition(":")
    if not module_name or not class_name:
        raise ValueError(f"expected MODULE:CLASS, got {target!r}")
    module = importlib.import_module(module_name)
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ValueError(f"module {module_name!r} has no {class_name!r}")
    if not (isinstance(cls, type) and issubclass(cls, ROLES[role])):
        raise ValueError(f"{target} is not a subclass of {ROLES[role].__name__}")
    return cls


def build_app(options: ServeOptions, cls: type):
    """Instantiate the implementation and wrap it in its connexion app (in the worker)."""
    from mistk_rl.service.app import create_app
    from mistk_rl.service.handlers import AgentService, OrchestratorService

    _one_thread_for_math()
    impl = cls()
    if options.role == "agent":
        service: Any = AgentService(
            impl, options.data_dir, limits=options.limits, shares=options.shares
        )
    else:
        service = OrchestratorService(
            impl,
            options.data_dir,
            agent_token=options.token,
            allowed_agent_hosts=options.allow_agent_hosts,
            agent_timeout=options.agent_timeout,
            env_modules=options.env_modules,
            limits=options.limits,
            shares=options.shares,
        )
    return create_app(service, token=options.token, limits=options.limits)


def _one_thread_for_math() -> None:
    """The machines have 2 cores shared by services and env workers."""
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


class ServiceWorker(UvicornWorker):
    """uvicorn as these services need it: one answer is one send (`_HeadWithBody`), no
    Date or Server header (bytes on every answer that nobody reads), no access log and no
    proxy headers (loopback or a private network: nothing rewrites the client), uvloop
    where it is installed."""

    CONFIG_KWARGS: dict[str, Any] = {
        "http": CoalescingHttpTools,
        "server_header": False,
        "date_header": False,
        "access_log": False,
        "proxy_headers": False,
        "loop": "uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
    }


class _Gunicorn(BaseApplication):
    def __init__(self, options: ServeOptions, cls: type) -> None:
        self.options, self.cls = options, cls
        super().__init__()

    def load_config(self) -> None:
        opts = self.options
        bind = f"fd://{opts.fd}" if opts.fd is not None else f"{opts.host}:{opts.port}"
        settings = {
            "bind": [bind],
            "workers": 1,
            "worker_class": opts.worker_class,
            "graceful_timeout": 3,
            "timeout": 60,
            "keepalive": 75,
            "loglevel": opts.log_level,
            # gunicorn's lines and the service's in one format (`mistk_rl.service.logs`)
            "logconfig_dict": logging_config(opts.log_format, opts.log_level),
            "proc_name": f"mistk-rl-{opts.role}",
            # gunicorn's control socket is one path per user: every service on the
            # machine would take it over from the last (and remove it on exit)
            "control_socket_disable": True,
        }
        for key, value in settings.items():
            self.cfg.set(key, value)

    def load(self):
        return build_app(self.options, self.cls)


def serve(options: ServeOptions) -> None:
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    logging.config.dictConfig(logging_config(options.log_format, options.log_level))
    logging.getLogger("transitions").setLevel(logging.WARNING)  # one line per callback
    check_uvicorn()  # (here, before gunicorn: a worker that cannot boot would be retried)
    cls = import_implementation(options.role, options.target)
    for module in options.env_modules:  # importing registers their envs; a typo fails here
        importlib.import_module(module)
    options.data_dir = Path(options.data_dir).resolve()
    options.data_dir.mkdir(parents=True, exist_ok=True)
    for name, directory in options.shares.items():
        options.shares[name] = Path(directory).resolve()
        options.shares[name].mkdir(parents=True, exist_ok=True)
    _Gunicorn(options, cls).run()
