"""The client side of the replay servers: ``AsyncReplayExecutor`` and the servers it uses.

* :mod:`replay_server.client.executor`: the executor (the reference's :mod:`mneme.async_executor`), a
  facade over the modules below
* :mod:`replay_server.client.connection`: ``ConnectionSettings``, how the executor reaches its servers
* :mod:`replay_server.client.scheduling`: what is sent where and when, retries, giving up (pure)
* :mod:`replay_server.client.channels`: gRPC channels, credentials, the token and the calls
* :mod:`replay_server.client.event_loop`: the executor's second thread, its event loop and rounds
* :mod:`replay_server.client.results_log`: ``results.jsonl`` and ``ReplayFuture``
* :mod:`replay_server.client.local_servers`: servers a client starts on this machine's GPUs
* :mod:`replay_server.client.reuse`: local servers left running that a client may use

The client imports the contract (:mod:`replay_server.protocol`) and the shared pieces at the package's
root (:mod:`replay_server.discovery`, :mod:`replay_server.kept_servers`), never :mod:`replay_server.server`.
"""
