"""`ExperimentResult.relocated`: in the model, on the wire, in the CLI's output."""

from __future__ import annotations

import json

from mneme._proto.convert import result_from_proto, result_to_proto
from mneme.cli import replay as cli
from mneme.mneme_types import ExperimentResult


def test_relocated_round_trips_through_dict_and_proto():
    result = ExperimentResult(verified=True, executed=True, status="verified", exec_time=[5, 6], relocated=True)
    assert ExperimentResult.from_dict(result.to_dict()).relocated
    assert result_from_proto(result_to_proto(result)).relocated
    assert not result_from_proto(result_to_proto(ExperimentResult())).relocated


def test_cli_output_reports_relocated():
    result = ExperimentResult(verified=True, relocated=True).to_dict()
    assert json.loads(cli.format_output({}, result, as_json=True))["Result"]["relocated"] is True
    assert '"relocated": true' in cli.format_output({}, result, as_json=False)


def test_reset_flag():
    parser = cli.argparse.ArgumentParser()
    cli.configure(parser)
    assert parser.parse_args(["-rdb", "x.json"]).reset == "auto"
    assert parser.parse_args(["-rdb", "x.json", "--reset", "always"]).reset == "always"
