"""The command line of ``mneme serve`` (and ``python -m replay_server``): its arguments and its action."""

from __future__ import annotations

import argparse
import logging

HELP = "run a per-GPU gRPC replay server"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the arguments of ``mneme serve`` to ``parser``."""
    parser.add_argument("--gpu", type=int, required=True, help="index of the GPU this server drives")
    parser.add_argument("--port", type=int, default=None,
                        help="gRPC port (default 50051 + GPU index; 0 picks a free one and prints it)")
    parser.add_argument("--host", default="[::]",
                        help="address to listen on (default all; 127.0.0.1 for local only); beyond loopback a "
                             "--token-file or --tls-cert is needed, or --insecure")
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="serve Prometheus metrics on http://HOST:PORT/metrics (default off)")
    parser.add_argument("--metrics-host", default=None,
                        help="address the metrics listener binds (default: --host's)")
    parser.add_argument("--insecure", action="store_true",
                        help="allow listening beyond loopback without --token-file or --tls-cert (refused "
                             "otherwise): anyone who reaches the port can run kernels on the GPU")
    parser.add_argument("--no-reflection", dest="reflection", action="store_false",
                        help="do not offer gRPC server reflection (on by default; grpcurl and grpc_cli use it)")
    parser.add_argument("--store", default=".",
                        help="artifact store holding the recordings: a directory or s3://bucket/prefix (default .)")
    parser.add_argument("--workers", type=int, default=1,
                        help="worker processes on this GPU, each with its own CUDA context (default 1)")
    parser.add_argument("--tls-cert", help="PEM certificate chain: serve over TLS")
    parser.add_argument("--tls-key", help="PEM private key of --tls-cert")
    parser.add_argument("--tls-client-ca", help="PEM CA bundle: require client certificates signed by it (mutual TLS)")
    parser.add_argument("--token-file", help="file holding a bearer token every call must present")
    parser.add_argument("--watchdog", type=float, default=30.0,
                        help="seconds a replay may run before its worker is killed as hung (default 30)")
    parser.add_argument("--compile-processes", type=int, default=0,
                        help="CPU compile pool size (default: this server's share of the CPUs, less its workers "
                             "and itself, at least min(4, CPUs); -1 disables the pool)")
    parser.add_argument("--batch", type=int, default=8,
                        help="configurations of one instance a worker replays in one engine call at most (1 to 32, "
                             "default 8)")
    parser.add_argument("--prepared-cache-gib", type=float, default=0.0,
                        help="device memory each worker may hold in prepared instances, LRU-evicted "
                             "(default 0: half the GPU's memory, shared by the workers)")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    parser.add_argument("--parent-pid", type=int, default=None,
                        help="stop when the process with this pid is no longer this server's parent "
                             "(it exited or was killed); AsyncReplayExecutor sets it for the servers it starts")
    parser.add_argument("--announce", metavar="DIR_OR_S3_PREFIX",
                        help="announce this server (address, GPU, version, health) there and refresh it with a "
                             "lease; `mneme tune --servers-from` the same location finds it")
    parser.add_argument("--announce-address", metavar="HOST:PORT",
                        help="the address tuners should use (default: this host's name and the bound port)")
    parser.add_argument("--lease", type=float, default=30.0,
                        help="seconds an announcement stays live without a refresh (default 30; refreshed every third)")
    parser.add_argument("--local", action="store_true",
                        help="serve your own `mneme tune` runs on this machine, which use it instead of starting "
                             "servers of their own: listen on 127.0.0.1 (a free port unless --port), require your "
                             "token and announce this server in your cache directory ($MNEME_CACHE_DIR or "
                             "~/.cache/mneme, servers/); --store is the directory holding the recordings")
    parser.add_argument("--keep-alive", type=float, default=0.0, metavar="SECONDS",
                        help="exit after SECONDS without a call (default 0: run until stopped)")
    parser.add_argument("--lock-clocks", choices=("off", "base", "max"), default="off",
                        help="lock the GPU's clocks while serving: base (the base/TDP clock) or max (the highest), "
                             "memory too where the GPU allows; restored when the server stops. Needs root or an "
                             "administrator's grant; where not permitted the server says so once and serves at the "
                             "GPU's own clocks (default off). Every result records the clocks it ran at")
    parser.add_argument("--engine", default=None, help=argparse.SUPPRESS)  # tests: module:factory


def run(args: argparse.Namespace) -> int:
    """Serve until stopped (or idle for ``--keep-alive``); the exit status."""
    from replay_server.server.serve import ServerOptions, serve_forever

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.local:
        _as_local(args)
    options = ServerOptions(
        gpu=args.gpu,
        port=50051 + args.gpu if args.port is None else args.port,
        host=args.host,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        insecure=args.insecure,
        reflection=args.reflection,
        store=args.store,
        workers=args.workers,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_client_ca=args.tls_client_ca,
        token_file=args.token_file,
        watchdog=args.watchdog,
        engine=args.engine,
        compile_processes=args.compile_processes,
        batch=args.batch,
        prepared_cache_bytes=int(args.prepared_cache_gib * (1 << 30)),
        announce=args.announce,
        announce_address=args.announce_address,
        lease=args.lease,
        keep_alive=args.keep_alive,
        local=args.local,
        lock_clocks=args.lock_clocks,
    )
    return serve_forever(options, announce=lambda line: print(line, flush=True), parent_pid=args.parent_pid)


def _as_local(args: argparse.Namespace) -> None:
    """``--local``: loopback, this user's token, announced in this user's servers directory
    (replay_server.kept_servers); the settings it decides cannot be given as well."""
    from pathlib import Path

    from mneme.errors import ConfigurationError
    from replay_server.kept_servers import private_dir, token_file

    given = [flag for flag, value in (("--host", args.host != "[::]"), ("--token-file", args.token_file),
                                      ("--announce", args.announce), ("--tls-cert", args.tls_cert))
             if value]
    if given:
        raise ConfigurationError(f"--local decides {', '.join(given)} itself (loopback, your token, your cache "
                                 "directory); drop them, or drop --local")
    if "://" in args.store:
        raise ConfigurationError(f"--local serves recordings in a local directory; --store {args.store} is not one")
    args.host = "127.0.0.1"
    args.port = 0 if args.port is None else args.port
    args.store = str(Path(args.store).resolve())
    args.token_file = str(token_file())
    args.announce = str(private_dir(create=True))

