"""`mistk-rl serve` (and `python -m mistk_rl serve`): one agent or orchestrator class as a
service. The framework's own command line, so that starting a service needs nothing above
the framework (`mistk_rl.deploy.launch` runs `python -m mistk_rl serve ...`)."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import os
import socket
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from mistk_rl.limits import Limits
from mistk_rl.wire.spin import spin_from_env

# `serve`'s options after ROLE and TARGET: (flag, argparse keywords)
SERVE_OPTIONS: list[tuple[str, dict[str, Any]]] = [
    (
        "--host",
        dict(
            default="127.0.0.1",
            help="address to bind (default loopback; 0.0.0.0 exposes the service)",
        ),
    ),
    (
        "--port",
        dict(
            type=int,
            default=None,
            help="port (default 8081 agent, 8080 orchestrator; 0: a free one, printed at start)",
        ),
    ),
    (
        "--data-dir",
        dict(default="data", help="directory that model and episode paths resolve inside"),
    ),
    (
        "--token",
        dict(
            default=None,
            help="bearer token required on every call but apiVersion "
            "(default: $MISTK_RL_TOKEN, else none)",
        ),
    ),
    (
        "--allow-agent-host",
        dict(
            action="append",
            default=[],
            help="orchestrator: a non-loopback host agents may be "
            "registered at (repeatable; also $MISTK_RL_AGENT_HOSTS, "
            "comma-separated)",
        ),
    ),
    (
        "--env-module",
        dict(
            action="append",
            default=[],
            help="orchestrator: a module to import at start whose envs may be "
            "used (as their registered ids, or MODULE:ID); repeatable. Without "
            "it only envs registered with gymnasium are accepted",
        ),
    ),
    (
        "--agent-timeout",
        dict(
            type=float,
            default=20.0,
            help="orchestrator: seconds to wait for one agent call before "
            "the episode fails naming the agent and the call",
        ),
    ),
    (
        "--limit",
        dict(
            action="append",
            default=[],
            metavar="NAME=VALUE",
            help="raise or lower a limit (repeatable): "
            + ", ".join(f"{f.name} (default {f.default:,})" for f in dataclasses.fields(Limits)),
        ),
    ),
    (
        "--max-body-bytes",
        dict(
            type=int,
            default=None,
            help="larger request bodies get 413 (= --limit max_body_bytes=N)",
        ),
    ),
    (
        "--share",
        dict(
            action="append",
            default=[],
            metavar="NAME=DIR",
            help="paths starting NAME/ resolve inside DIR instead of the data dir "
            "(repeatable): a directory several services share, such as a league's "
            "snapshots",
        ),
    ),
    (
        "--log-level",
        dict(
            default="info",
            choices=["debug", "info", "warning", "error"],
            help="the lowest level logged (default info: control operations and every "
            "refusal; debug adds an access line per step and per status)",
        ),
    ),
    (
        "--log-format",
        dict(
            default=os.environ.get("MISTK_RL_LOG_FORMAT", "text"),
            choices=["text", "json"],
            help="log lines as text or as one JSON object each (time, level, logger, "
            "message, operation, status, duration_ms, request_id, trace_id); default text, "
            "or MISTK_RL_LOG_FORMAT",
        ),
    ),
    ("--fd", dict(type=int, default=None, help=argparse.SUPPRESS)),
]


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `serve`, on `parser` (a sub-command's parser, or this module's own)."""
    parser.add_argument("role", choices=["agent", "orchestrator"])
    parser.add_argument("target", help="MODULE:CLASS, e.g. agents.random_agent:RandomAgent")
    for flag, options in SERVE_OPTIONS:
        parser.add_argument(flag, **options)
    parser.set_defaults(func=serve_command)


def serve_command(args: argparse.Namespace) -> int:
    """Run the service `args` describe until it is stopped (SIGTERM or Ctrl-C)."""
    from mistk_rl.service.server import ServeOptions, serve

    hosts = [h for h in os.environ.get("MISTK_RL_AGENT_HOSTS", "").split(",") if h]
    limits = list(args.limit)
    if args.max_body_bytes is not None:
        limits.append(f"max_body_bytes={args.max_body_bytes}")
    port = args.port if args.port is not None else (8081 if args.role == "agent" else 8080)
    fd = args.fd
    try:
        parsed = Limits.parse(limits)
        shares = _shares(args.share)
        if fd is None:  # bound here, so a taken port is one clear line, not retries
            listener = _listen(args.host, port)
            fd, port = listener.fileno(), listener.getsockname()[1]
            print(
                f"mistk-rl serve: {args.role} {args.target} on "
                f"http://{_url_host(args.host)}:{port}/v1/mistk/{args.role}",
                flush=True,
            )
    except ValueError as exc:
        print(f"mistk-rl serve: {exc}", file=sys.stderr)
        return 2
    serve(
        ServeOptions(
            role=args.role,
            target=args.target,
            host=args.host,
            port=port,
            data_dir=Path(args.data_dir),
            token=args.token or os.environ.get("MISTK_RL_TOKEN"),
            fd=fd,
            allow_agent_hosts=hosts + list(args.allow_agent_host),
            env_modules=list(args.env_module),
            agent_timeout=args.agent_timeout,
            limits=parsed,
            shares=shares,
            log_level=args.log_level,
            log_format=args.log_format,
        )
    )
    return 0


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket at host:port (ValueError saying what to do when it cannot be)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(256)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ValueError(
                f"port {port} on {host} is in use (another service?): choose "
                "another with --port, or --port 0 for a free one"
            ) from exc
        raise ValueError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc} (--host, --port)"
        ) from exc
    os.set_inheritable(listener.fileno(), True)
    return listener


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _shares(given: list[str]) -> dict[str, Path]:
    """``--share NAME=DIR`` options as {NAME: DIR}."""
    shares = {}
    for item in given:
        name, sep, directory = item.partition("=")
        if not sep or not name or "/" in name or name in (".", "..") or not directory:
            raise ValueError(f"--share {item!r}: expected NAME=DIR (NAME one path component)")
        shares[name] = Path(directory)
    return shares


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mistk_rl")
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_arguments(sub.add_parser("serve", help=__doc__.splitlines()[0]))
    args = parser.parse_args(argv)
    try:
        spin_from_env()  # (its workers and clients read it: refused at start, not mid-run)
    except ValueError as exc:
        print(f"mistk_rl serve: {exc}", file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
