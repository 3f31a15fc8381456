"""Two tuners of one study race for one configuration: an enqueued (WAITING) trial, the baseline, that one
takes after the other drew the same configuration in a new trial. Exactly one of them replays it, on every
storage path (a journal file, the study server over a journal file or SQLite), within a run and across a
resubmission (a new server over the study, new tuners resuming it)."""

from __future__ import annotations

import contextlib
from collections import Counter

import optuna
import pytest
from test_deploy_study_server import StudyServer
from test_shared_study import OnePoint

from tuner.strategies.shared_study import DUPLICATE_ATTR, HASH_ATTR, SharedStudyStrategy, open_storage

KINDS = ["journal", "server-journal", "server-sqlite"]


class Planned(optuna.samplers.BaseSampler):
    """Draws the given points in order, one per new trial, then random ones."""

    def __init__(self, *points: int) -> None:
        self.points = list(points)
        self.given: dict[int, int] = {}
        self.random = optuna.samplers.RandomSampler(seed=0)

    def infer_relative_search_space(self, study, trial):
        return {}

    def sample_relative(self, study, trial, search_space):
        return {}

    def sample_independent(self, study, trial, name, distribution):
        if trial._trial_id not in self.given:
            self.given[trial._trial_id] = (self.points.pop(0) if self.points else
                                           self.random.sample_independent(study, trial, name, distribution))
        return self.given[trial._trial_id]


@contextlib.contextmanager
def looked_before_the_enqueue(strategy: SharedStudyStrategy):
    """``strategy``'s ``Study.ask`` finds no WAITING trial: it looked for them just before another process
    enqueued one (a study server's client answers that query from its last look in any case)."""
    strategy.study._pop_waiting_trial_id = lambda: None
    try:
        yield
    finally:
        del strategy.study._pop_waiting_trial_id


class Study:
    """A storage of ``kind`` and the tuners (strategies) on it; ``resubmit`` is a new job: a new server over
    the same study, and new tuners."""

    def __init__(self, kind: str, tmp_path) -> None:
        self.kind = kind
        self.backend = (f"sqlite:///{tmp_path / 'study.db'}" if kind == "server-sqlite"
                        else f"journal:{tmp_path / 'study.log'}")
        self.server = StudyServer(self.backend) if kind.startswith("server") else None

    @property
    def url(self) -> str:
        return self.server.url if self.server is not None else self.backend

    def tuner(self, *points: int, **options) -> SharedStudyStrategy:
        strategy = SharedStudyStrategy(OnePoint((64, 128, 192, 256)), "random", storage=self.url,
                                       study_name="race", seed=1, **options)
        strategy.study.sampler = Planned(*points)
        return strategy

    def resubmit(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = StudyServer(self.backend)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


@pytest.fixture(params=KINDS)
def study(request, tmp_path):
    made = Study(request.param, tmp_path)
    yield made
    made.close()


@pytest.mark.parametrize("resubmitted", [False, True], ids=["one-job", "resubmitted"])
def test_an_enqueued_trial_and_a_new_one_never_both_replay_a_configuration(study, resubmitted):
    first = study.tuner(128)  # enqueues the baseline (64), then draws 128 in a new trial
    with looked_before_the_enqueue(first):
        mine = [first.ask()]
    assert mine[0].params["block_dim_x"] == 128
    waiting = [t for t in first.study.get_trials(deepcopy=False) if t.state.name == "WAITING"]
    assert len(waiting) == 1 and waiting[0].user_attrs.get("baseline")
    if resubmitted:  # the first job ends with the baseline still enqueued; a second job resumes the study
        first.tell(mine.pop(), [128.0])
        study.resubmit()
        first = study.tuner()
    # Another tuner draws the baseline's configuration in a new trial (a higher number than the WAITING one).
    second = study.tuner(64, 192, 256, enqueue_baseline=False)
    with looked_before_the_enqueue(second):
        theirs = [second.ask()]
    # The first tuner takes the WAITING trial, then asks on.
    mine += [first.ask(), first.ask()]
    theirs.append(second.ask())
    asked = [c for c in mine + theirs if c is not None]
    hashes = Counter(c.hash for c in asked)
    assert max(hashes.values()) == 1, f"handed out twice: {[c.params for c in asked if hashes[c.hash] > 1]}"
    for strategy, candidates in ((first, mine), (second, theirs)):
        for candidate in candidates:
            if candidate is not None:
                strategy.tell(candidate, [float(candidate.params["block_dim_x"])])
    first.ask(), second.ask()  # the duplicates take their claims' values
    first.close(), second.close()
    trials = optuna.load_study(study_name="race", storage=open_storage(study.url)).get_trials()
    evaluated = Counter(t.system_attrs[HASH_ATTR] for t in trials
                        if HASH_ATTR in t.system_attrs and DUPLICATE_ATTR not in t.system_attrs
                        and t.state.name == "COMPLETE")
    assert evaluated and max(evaluated.values()) == 1
    baseline = [t for t in trials if t.user_attrs.get("baseline")]
    assert len(baseline) == 1, "the baseline is enqueued once"
    assert baseline[0].params == {"block_dim_x": 64} and HASH_ATTR in baseline[0].system_attrs
