"""How an executor reaches its replay servers: one settings object, passed whole.

``ConnectionSettings`` holds the servers' addresses (or None: local servers the executor starts),
the bearer token, TLS, the retry rules, the transport, and the options of local servers (GPUs,
extra ``mneme serve`` arguments and environment, start-up timeout, ``--keep-servers``' idle time,
``--lock-clocks``, a test engine). ``mneme tune`` builds it from its flags (``tuner.options``) and hands it to
``AsyncReplayExecutor(connection=...)`` as it is. It is checked when it is made; files (token, TLS)
are read when the executor connects.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from mneme.errors import ConfigurationError

#: How requests travel: all over one ReplayBatchStream call per server (fewer gRPC messages per
#: configuration in client and server), or one Replay call each.
TRANSPORTS = ("stream", "unary")
#: How long a server may hold a ready response back to send it with the next ones (``ReplayBatch.
#: hold_responses_seconds``), by default. It holds them only while more of the client's requests wait in
#: its queue, so no worker waits for them; a client taking thousands of results a second then handles a
#: message per several results instead of per one or two (docs/serving.md, "Scale").
HOLD_RESPONSES_SECONDS = 0.005
#: ``mneme serve --lock-clocks`` values (``replay_server.server.clocks``; not imported: the client stays apart).
LOCK_CLOCKS = ("off", "base", "max")


@dataclass(frozen=True)
class ConnectionSettings:
    """How an ``AsyncReplayExecutor`` reaches its replay servers.

    Attributes:
        servers: ``host:port`` of running servers; None: start one local server per GPU (loopback,
            a random token) and stop them with the executor.
        token: the servers' bearer token.
        token_file: a file holding it (``mneme serve --token-file``); give one of the two.
        tls_ca: CA bundle: talk TLS to the servers and verify their certificates.
        tls_cert: client certificate for mutual TLS (with ``tls_key``).
        tls_key: its private key.
        tls_server_name: the name the servers' certificates carry, when they are dialed by IP.
        max_attempts: attempts of a configuration whose server went away before it is failed.
        retry_window: seconds without any reachable server before waiting work is failed.
        transport: ``stream`` (one ``ReplayBatchStream`` call per server) or ``unary`` (one
            ``Replay`` call per configuration).
        hold_responses: seconds a server may hold a ready response to send it with others (stream;
            0: each at once; None: ``HOLD_RESPONSES_SECONDS``).
        local_gpus: the GPUs of local servers (default: every visible one; with ``engine``, GPU 0).
        server_args: more ``mneme serve`` arguments for local servers.
        server_env: more environment variables for local servers.
        startup_timeout: seconds local servers have to start listening.
        keep_alive: seconds local servers this executor starts stay after it, for later runs
            (``mneme tune --keep-servers``; 0: they stop with it).
        engine: the local servers' ``--engine`` (``module:factory``: a test engine).
        lock_clocks: the local servers' ``--lock-clocks`` (``off``, ``base``, ``max``): their GPUs' clocks
            locked while they serve. Kept servers are not reused with it (they may run at other clocks),
            and the servers it starts are not kept.
    """

    servers: Sequence[str] | None = None
    token: str | None = None
    token_file: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_server_name: str | None = None
    max_attempts: int = 3
    retry_window: float = 60.0
    transport: str = "stream"
    hold_responses: float | None = None
    local_gpus: Sequence[int] | None = None
    server_args: Sequence[str] = ()
    server_env: Mapping[str, str] | None = None
    startup_timeout: float = 120.0
    keep_alive: float = 0.0
    engine: str | None = None
    lock_clocks: str = "off"

    def __post_init__(self) -> None:
        if self.servers is not None:
            if isinstance(self.servers, str) or not all(isinstance(s, str) and s for s in self.servers):
                raise ConfigurationError(f"servers={self.servers!r}: give a list of 'host:port', or None for local GPUs")
            if not self.servers:
                raise ConfigurationError("servers is empty: give at least one 'host:port', or None for local GPUs")
            object.__setattr__(self, "servers", tuple(self.servers))
        if self.token and self.token_file:
            raise ConfigurationError("give token or token_file, not both")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigurationError("tls_cert and tls_key go together (client certificate for mutual TLS)")
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ConfigurationError(f"max_attempts={self.max_attempts!r}: give at least 1")
        if not _number(self.retry_window) or self.retry_window < 0:
            raise ConfigurationError(f"retry_window={self.retry_window!r}: give seconds (0 or more)")
        if self.transport not in TRANSPORTS:
            raise ConfigurationError(f"transport={self.transport!r}: use one of {', '.join(TRANSPORTS)}")
        if self.hold_responses is not None:
            from replay_server.protocol.convert import MAX_HOLD_RESPONSES_SECONDS

            if not _number(self.hold_responses) or not 0 <= self.hold_responses <= MAX_HOLD_RESPONSES_SECONDS:
                raise ConfigurationError(f"hold_responses={self.hold_responses}: give 0..{MAX_HOLD_RESPONSES_SECONDS:g} "
                                         "seconds (0: each result as soon as it is ready)")
        if self.local_gpus is not None:
            if isinstance(self.local_gpus, (str, int)) or not all(
                    isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in self.local_gpus):
                raise ConfigurationError(f"local_gpus={self.local_gpus!r}: give a list of GPU indices")
            object.__setattr__(self, "local_gpus", tuple(self.local_gpus))
        if isinstance(self.server_args, str) or not all(isinstance(a, str) for a in self.server_args):
            raise ConfigurationError(f"server_args={self.server_args!r}: give a list of mneme serve arguments")
        object.__setattr__(self, "server_args", tuple(self.server_args))
        if self.server_env is not None and not isinstance(self.server_env, Mapping):
            raise ConfigurationError(f"server_env={self.server_env!r}: give a mapping of variable names to values")
        if not _number(self.startup_timeout) or self.startup_timeout <= 0:
            raise ConfigurationError(f"startup_timeout={self.startup_timeout!r}: give seconds (more than 0)")
        if not _number(self.keep_alive) or self.keep_alive < 0:
            raise ConfigurationError(f"keep_alive={self.keep_alive!r}: give seconds (0: the servers stop with the executor)")
        if self.lock_clocks not in LOCK_CLOCKS:
            raise ConfigurationError(f"lock_clocks={self.lock_clocks!r}: use one of {', '.join(LOCK_CLOCKS)}")
        if self.lock_clocks != "off" and self.keep_alive:
            raise ConfigurationError("locked clocks are for the local servers a run starts and stops; servers kept "
                                     "for later runs would serve those at the locked clocks too: drop one of them")

    def with_(self, **changes: Any) -> "ConnectionSettings":
        """These settings with ``changes`` (checked again).

        Args:
            **changes: fields and their new values.

        Returns:
            The new settings.
        """
        return replace(self, **changes)

    @property
    def hold_seconds(self) -> float:
        """How long a server may hold a ready response.

        Returns:
            ``hold_responses``, else ``HOLD_RESPONSES_SECONDS``.
        """
        return HOLD_RESPONSES_SECONDS if self.hold_responses is None else float(self.hold_responses)

    @property
    def tls(self) -> bool:
        """Whether any TLS setting is given (they apply to remote servers only).

        Returns:
            True when ``tls_ca``, ``tls_cert`` or ``tls_key`` is given.
        """
        return bool(self.tls_ca or self.tls_cert or self.tls_key)

    def local_server_gpus(self) -> list[int] | None:
        """The GPUs local servers run on.

        Returns:
            ``local_gpus``; with a test ``engine`` and none given, GPU 0 (no GPU to count); else None
            (every visible GPU).
        """
        if self.local_gpus is not None:
            return list(self.local_gpus)
        return [0] if self.engine else None

    def local_server_args(self) -> list[str]:
        """The extra ``mneme serve`` arguments of local servers.

        Returns:
            ``--engine ENGINE`` when an engine is given, ``--lock-clocks MODE`` when locking, then ``server_args``.
        """
        return [*(["--engine", self.engine] if self.engine else []),
                *(["--lock-clocks", self.lock_clocks] if self.lock_clocks != "off" else []), *self.server_args]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
