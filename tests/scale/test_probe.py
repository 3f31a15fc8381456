"""replay_server.probe: the health check of Kubernetes exec probes, against a real server with a token."""

from __future__ import annotations

import signal

from replay_server.probe import main
from replay_server.testing.servers import free_port, start_server, store  # noqa: F401


def test_probe_says_serving_with_or_without_the_token(store, tmp_path, capsys):
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    proc, address = start_server(store, tmp_path / "log", "--token-file", str(token))
    try:
        assert main(["--address", address, "--token-file", str(token),
                     "--tls-if-exists", str(tmp_path / "no-ca.crt")]) == 0
        assert capsys.readouterr().out.strip() == "SERVING"
        assert main(["--address", address]) == 0  # health answers without the token (kubelet's gRPC probe)
        assert capsys.readouterr().out.strip() == "SERVING"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert main(["--address", f"127.0.0.1:{free_port()}", "--timeout", "1"]) == 2
    err = capsys.readouterr().err
    assert "UNAVAILABLE" in err or "DEADLINE_EXCEEDED" in err, err
