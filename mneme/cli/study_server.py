"""`mneme study-server URL`: Optuna's storage proxy for tuners sharing a study (tuner/study_server.py)."""

from __future__ import annotations

import argparse
import logging

from mneme.cli.command import Command


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("url", metavar="DATABASE_URL",
                        help="the study database: sqlite:///PATH (one node) or postgresql://USER@HOST/DB")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1; beyond loopback needs --insecure)")
    parser.add_argument("--port", type=int, default=13000, help="port (default 13000; 0 picks a free one)")
    parser.add_argument("--threads", type=int, default=16, help="request threads (default 16)")
    parser.add_argument("--fronts", type=int, default=None,
                        help="processes that serve gRPC and the tuners' reads in front of the one holding the study "
                             "(a journal: URL only; default 2 for a journal, 0: that process serves gRPC itself)")
    parser.add_argument("--insecure", action="store_true",
                        help="allow listening beyond loopback: the proxy has no authentication")
    parser.add_argument("--log-level", default="WARNING", help="logging level (default WARNING)")


def run(args: argparse.Namespace) -> int:
    from mneme.errors import ConfigurationError
    from tuner.study_server import serve

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.threads < 1:
        raise ConfigurationError(f"--threads {args.threads}: give at least 1")
    return serve(args.url, args.host, args.port, insecure=args.insecure, threads=args.threads,
                 announce=lambda line: print(line, flush=True), fronts=args.fronts)


COMMANDS = [Command("study-server", "serve an Optuna study database to tuners (--optuna-storage grpc://HOST:PORT)",
                    configure, run)]
