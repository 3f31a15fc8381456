"""A study server's JSON trials decode to the ``FrozenTrial`` Optuna's constructor makes."""

import copy

from optuna.distributions import CategoricalDistribution, FloatDistribution, distribution_to_json
from optuna.trial import TrialState

from tuner.strategies import study_rows


def test_this_optunas_trials_are_assembled_without_the_constructor_and_equal_constructed_ones():
    assert study_rows._same_as_constructed()
    assert study_rows._trial is study_rows._assembled
    table = {"0": {"c": distribution_to_json(CategoricalDistribution(["a", None, 3])),
                   "f": distribution_to_json(FloatDistribution(0.0, 1.0))}, "1": {}}
    rows = [[5, 2, TrialState.FAIL.value, [], "2024-05-06 07:08:09.000010", "", {"c": None, "f": 0.5}, 0, {}, {}, {}],
            [6, 3, TrialState.WAITING.value, [], "", "", {}, 1, {"u": {"v": 1}}, {"fixed_params": {"x": 1}}, {}]]
    assembled = study_rows.trials_of([table, copy.deepcopy(rows)])
    sets = {0: {name: study_rows._distribution(text) for name, text in table["0"].items()}, 1: {}}
    constructed = [study_rows._constructed([*row[:7], sets[row[7]], *row[8:]]) for row in rows]
    assert [vars(t) for t in assembled] == [vars(t) for t in constructed]
    assert assembled[0].params == {"c": None, "f": 0.5} and assembled[0].values is None
    assert assembled[1].datetime_start is None and assembled[1].system_attrs == {"fixed_params": {"x": 1}}
    assert assembled[0].distributions is not assembled[1].distributions


def test_a_row_is_read_without_making_its_trial_and_says_what_the_trial_says():
    table = {"0": {"x": distribution_to_json(FloatDistribution(0.0, 1.0))}}
    rows = [[9, 4, TrialState.COMPLETE.value, [1.5], "2024-05-06 07:08:09.000010", "2024-05-06 07:08:10.000010",
             {"x": 0.25}, 0, {"status": "ok"}, {"mneme:hash": "h"}, {}],
            [10, 5, TrialState.RUNNING.value, [], "2024-05-06 07:08:09.000010", "", {}, 0, {}, {}, {}]]
    read = study_rows.rows_of([table, rows])
    assert read is rows and all(type(row) is list for row in read)
    assert read[0][7] is read[1][7]  # (one dictionary of distributions an id)
    outlines = [study_rows.outline(row) for row in read]
    trials = [study_rows.trial_of(row) for row in read]
    assert outlines == [study_rows.outline(t) for t in trials]
    assert outlines[1] == (5, TrialState.RUNNING, None, {}, {})
    assert [study_rows.state_of(row) for row in read] == [t.state for t in trials]
    assert trials[0].params == {"x": 0.25} and trials[0].distributions == {"x": FloatDistribution(0.0, 1.0)}
    assert trials[0].distributions is not read[0][7]
