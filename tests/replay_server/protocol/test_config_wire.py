"""A configuration over the wire: what ``config_from_proto`` reads is what was sent, field for field and type for type."""

from __future__ import annotations

import random

from mneme.model.experiment import ExperimentConfiguration
from replay_server.protocol import replay_pb2
from replay_server.protocol.convert import config_from_proto, config_to_proto


def _random_config(seed: int) -> ExperimentConfiguration:
    r = random.Random(seed)
    return ExperimentConfiguration.from_dict({
        "grid": {"x": r.randint(1, 1 << 20), "y": r.randint(1, 4), "z": r.randint(1, 2)},
        "block": {"x": r.choice([32, 64, 1024]), "y": r.randint(1, 2)}, "shared_mem": r.randint(0, 1 << 17),
        "specialize": r.random() < 0.5, "set_launch_bounds": r.random() < 0.5,
        "max_threads": r.choice([None, 256, 1024]), "min_blocks_per_sm": r.choice([None, 1, 8]),
        "specialize_dims": r.random() < 0.5, "passes": r.choice(["default<O3>", "default<Oz>"]),
        "codegen_opt": r.randint(0, 4), "codegen_method": "serial", "prune": r.random() < 0.5,
        "internalize": r.random() < 0.5})


def test_a_configuration_comes_back_as_it_was_sent():
    for seed in range(300):
        config = _random_config(seed)
        back = config_from_proto(replay_pb2.Configuration.FromString(config_to_proto(config).SerializeToString()))
        assert back == config and back.to_dict() == config.to_dict()
        assert type(back.grid.x) is int and type(back.specialize) is bool and type(back.passes) is str


def test_an_empty_message_reads_as_from_dict_reads_its_fields():
    empty = replay_pb2.Configuration()
    assert config_from_proto(empty) == ExperimentConfiguration.from_dict({
        "grid": {"x": 0, "y": 0, "z": 0}, "block": {"x": 0, "y": 0, "z": 0}, "shared_mem": 0, "specialize": False,
        "set_launch_bounds": False, "max_threads": None, "min_blocks_per_sm": None, "specialize_dims": False,
        "passes": "", "codegen_opt": 0, "codegen_method": "", "prune": False, "internalize": False})
