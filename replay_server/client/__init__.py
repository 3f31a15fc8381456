"""The client side of the replay servers: ``AsyncReplayExecutor`` and the servers it uses.

* :mod:`replay_server.client.executor`: the executor (the reference's :mod:`mneme.async_executor`)
* :mod:`replay_server.client.local_servers`: servers a client starts on this machine's GPUs

The client imports the contract (:mod:`replay_server.protocol`) and the shared pieces at the package's
root (:mod:`replay_server.discovery`, :mod:`replay_server.kept_servers`), never :mod:`replay_server.server`.
"""
