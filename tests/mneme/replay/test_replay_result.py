"""`ExperimentResult.relocated` and `relocation_reason`: in the model, on the wire, in the CLI's output."""

from __future__ import annotations

import json

from mneme.cli import replay as cli
from mneme.model.experiment import ExperimentResult
from replay_server.protocol.convert import result_from_proto, result_to_proto

WHY = "reserving 0x200000000000-0x200000200000 (2 MiB) failed: taken"


def test_relocated_round_trips_through_dict_and_proto():
    result = ExperimentResult(verified=True, executed=True, status="verified", exec_time=[5, 6], relocated=True,
                              relocation_reason=WHY)
    for back in (ExperimentResult.from_dict(result.to_dict()), result_from_proto(result_to_proto(result))):
        assert back.relocated and back.relocation_reason == WHY
    fresh = result_from_proto(result_to_proto(ExperimentResult()))
    assert not fresh.relocated and fresh.relocation_reason == ""


def test_cli_output_reports_relocated():
    result = ExperimentResult(verified=True, relocated=True, relocation_reason=WHY).to_dict()
    shown = json.loads(cli.format_output({}, result, as_json=True))["Result"]
    assert shown["relocated"] is True and shown["relocation_reason"] == WHY
    assert '"relocated": true' in cli.format_output({}, result, as_json=False)


def test_reset_flag():
    parser = cli.argparse.ArgumentParser()
    cli.configure(parser)
    assert parser.parse_args(["-rdb", "x.json"]).reset == "auto"
    assert parser.parse_args(["-rdb", "x.json", "--reset", "always"]).reset == "always"
