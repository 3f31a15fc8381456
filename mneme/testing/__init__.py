"""Fixtures for tests and benchmarks of mneme and of code built on it.

Synthetic recordings made without a GPU (``synthetic``, ``synthetic_recordings``,
``store_recordings``, ``faulty_recording``), a fake native engine (``fake_native_engine``),
a local S3 server (``moto_s3``) and the GPU check the GPU tests skip on (``gpu``).
The record agent, the replay servers and the tuner keep fixtures of their own in
``record_agent.testing``, ``replay_server.testing`` and ``tuner.testing``.
"""
