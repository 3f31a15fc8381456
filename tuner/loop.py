"""The tuning loop: ask the strategy, replay through the executor, record, tell.

Up to ``in_flight`` candidates are replaying at once; each result is scored
(:mod:`tuner.objective`), appended to ``trials.jsonl`` and told to the
strategy as soon as it arrives. A failed candidate is recorded with its
reason and the run goes on (unless ``fail_fast``). The executor is anything
with ``submit(config) -> Future[ExperimentResult]``, ``evaluate(config)`` and
``shutdown()``: :class:`replay_server.client.executor.AsyncReplayExecutor` in real
runs (its futures also carry the result as it wrote it to ``results.jsonl``,
which ``trials.jsonl`` reuses).

A trial costs the loop tens of microseconds, so it writes no log line per
trial (``trials.jsonl`` has them all): ``tune.log`` gets a progress line every
``PROGRESS_SECONDS`` and one when the loop ends.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import math
import queue
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, NamedTuple, Protocol

from mneme._internal.heap import Heap
from mneme.model.experiment import (
    STATUS_INVALID_CONFIG,
    STATUS_INVALID_LAUNCH,
    STATUS_VERIFIED,
    ExperimentConfiguration,
    ExperimentResult,
)
from tuner.errors import TuningError
from tuner.interrupts import interrupts_held
from tuner.objective import Objective, Outcome, is_counter
from tuner.progress import Reporter, format_ns
from tuner.results.directory import ResultsDirectory
from tuner.space.search_space import Candidate
from tuner.strategies.sample_strategy import SamplingStrategy

# Executor calls that raise (rather than return a failed result) this many times in a
# row mean the executor itself is broken (servers gone): stop instead of burning the space.
MAX_CONSECUTIVE_EXECUTOR_ERRORS = 5
#: Seconds between the progress lines of ``tune.log``.
PROGRESS_SECONDS = 10.0


class Executor(Protocol):
    """What the tuner needs of an executor."""

    def submit(self, config: ExperimentConfiguration) -> cf.Future: ...

    def evaluate(self, config: ExperimentConfiguration) -> ExperimentResult: ...

    def shutdown(self) -> None: ...


_second_text: tuple[int, str] = (-1, "")  # the last whole second's text (UTC), reused within that second


class EncodedResult(NamedTuple):
    """A result as the executor already wrote it (``results.jsonl``): its ``to_dict()`` and, by record
    key, the JSON texts of the trial record's values it gives (the result's, the configuration's)."""

    record: dict[str, Any]
    texts: dict[str, str]


def now_iso() -> str:
    """``datetime.now(timezone.utc).isoformat(timespec="milliseconds")``, a trial record's timestamp: the
    date and time of day are made once per second (most of the formatting's cost, and there is one per trial)."""
    global _second_text
    fraction, whole = math.modf(time.time())
    second, micros = int(whole), round(fraction * 1e6)  # as datetime.fromtimestamp rounds the clock
    if micros == 1_000_000:
        second, micros = second + 1, 0
    cached_second, text = _second_text
    if second != cached_second:
        text = datetime.fromtimestamp(second, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
        _second_text = (second, text)
    return f"{text}.{micros // 1000:03d}+00:00"


@dataclass
class LoopState:
    """What the loop has seen, earlier runs (``--resume``) included."""

    records: list[dict[str, Any]] = field(default_factory=list)
    done_hashes: set[str] = field(default_factory=set)
    banned_blocks: dict[tuple[int, int, int], int] = field(default_factory=dict)  # block -> trial that failed
    evaluated_now: int = 0
    resumed_skipped: int = 0
    banned_skipped: int = 0
    executor_errors: int = 0
    stopped: str = ""
    best: dict[str, Any] | None = None

    def counts(self) -> Counter:
        return Counter(r["status"] for r in self.records)


class TuningLoop:
    """One run of candidates through the executor."""

    def __init__(
        self,
        *,
        strategy: SamplingStrategy,
        executor: Executor,
        results: ResultsDirectory,
        objective: Objective,
        reporter: Reporter,
        log: logging.Logger,
        state: LoopState,
        budget: int | None = None,
        timeout: float | None = None,
        in_flight: int = 1,
        fail_fast: bool = False,
        adaptive_invalid_ban: bool = True,
    ) -> None:
        self.strategy = strategy
        self.executor = executor
        self.results = results
        self.objective = objective
        self.reporter = reporter
        self.log = log
        self.state = state
        self.budget = budget
        self.timeout = timeout
        self.in_flight = max(1, in_flight)
        self.fail_fast = fail_fast
        self.adaptive_invalid_ban = adaptive_invalid_ban
        self._consecutive_executor_errors = 0
        self._earlier = {r["hash"]: r for r in state.records if r.get("hash")}
        self._statuses: Counter = Counter()  # this run's trials by status (the progress lines)
        self._best_text = "-"
        for record in state.records:  # an earlier run's (--resume): its best and its bans hold
            self._update_best(record)
            if record.get("status") == STATUS_INVALID_LAUNCH and adaptive_invalid_ban:
                block = record["configuration"]["block"]
                state.banned_blocks.setdefault((block["x"], block["y"], block["z"]), record["trial"])

    # -- the loop -------------------------------------------------------------------
    def run(self) -> LoopState:
        """Run until the space, the budget or the time is used up; Ctrl-C propagates after cleanup."""
        start = self._start = time.monotonic()
        self._next_progress = start + PROGRESS_SECONDS
        pending: dict[cf.Future, tuple[Candidate, float]] = {}
        heap = Heap()  # (the run's trials stay: the collector looks only at what is new)
        heap.settle()  # (held from the first batch on)
        # Futures put themselves here when done: waiting costs the same with 2 or 500 in flight.
        self._done: "queue.SimpleQueue[cf.Future]" = queue.SimpleQueue()
        try:
            while True:
                while not self.state.stopped and len(pending) < self.in_flight:
                    if self.timeout is not None and time.monotonic() - start >= self.timeout:
                        self.state.stopped = "timeout"
                    elif self.budget is not None and self.state.evaluated_now + len(pending) >= self.budget:
                        self.state.stopped = "budget"
                    else:
                        room = self.in_flight - len(pending)
                        if self.budget is not None:
                            room = min(room, self.budget - self.state.evaluated_now - len(pending))
                        candidates = self.strategy.ask_many(room)
                        if not candidates:  # nothing new until a pending result is told
                            break
                        for candidate in candidates:
                            self._dispatch(candidate, pending)
                # What it held back (a shared study's trial ends) goes before the wait; no more than the budget's
                # worth is drawn ahead.
                self.strategy.flush(self._upcoming(len(pending)))
                if not pending:
                    break
                try:
                    finished = [self._done.get(timeout=1.0)]
                except queue.Empty:
                    continue
                while True:  # and every other result that is in: one batch
                    try:
                        finished.append(self._done.get_nowait())
                    except queue.Empty:
                        break
                with interrupts_held():  # once for the batch (each trial's write is held anyway)
                    for future in finished:
                        candidate, started = pending.pop(future)
                        self._finish(candidate, self._result_of(future), time.monotonic() - started,
                                     _encoded(future, candidate))
                    self.results.flush()  # the batch's records in one write, before a signal stops the run
                if time.monotonic() >= self._next_progress:
                    self._log_progress()
                heap.settle()
        except KeyboardInterrupt:
            for future in pending:
                future.cancel()
            self.state.stopped = "interrupted"
            raise
        finally:
            heap.release()
            self._log_progress()
        if not self.state.stopped:
            self.state.stopped = "exhausted"
        return self.state

    def _upcoming(self, pending: int) -> int | None:
        """The most candidates the loop will still ask for (None: no budget)."""
        if self.state.stopped:
            return 0
        if self.budget is None:
            return None
        return max(0, self.budget - self.state.evaluated_now - pending)

    def _log_progress(self) -> None:
        """``tune.log``'s progress line: this run's trials so far, by outcome, their rate and the best."""
        now = time.monotonic()
        self._next_progress = now + PROGRESS_SECONDS
        done = sum(self._statuses.values())
        elapsed = max(now - self._start, 1e-9)
        by_status = ", ".join(f"{n} {status}" for status, n in self._statuses.most_common())
        self.log.info("progress: %d trials in %.1f s (%.0f/s)%s; best %s", done, elapsed, done / elapsed,
                      f": {by_status}" if by_status else "", self._best_text)

    def _dispatch(self, candidate: Candidate, pending: dict) -> None:
        """Submit a candidate, or settle it at once when no replay is needed."""
        key = candidate.hash
        config = candidate.configuration
        if key in self.state.done_hashes:
            self.state.resumed_skipped += 1
            prior = self._earlier.get(key) or {}
            self.strategy.tell(candidate, prior.get("objective_values"), status=prior.get("status"))
            return
        banned_by = self.state.banned_blocks.get(config.block.as_tuple())
        if banned_by is not None:
            self.state.banned_skipped += 1
            self.log.info("skip %s: block %s was banned after the invalid launch of trial %d",
                          key, config.block.as_tuple(), banned_by)
            self.strategy.tell(candidate, None, status=STATUS_INVALID_LAUNCH)
            return
        errors = config.validation_errors()
        if errors:
            result = ExperimentResult.failure(STATUS_INVALID_CONFIG, "; ".join(errors))
            self._finish(candidate, result, 0.0)
            self.results.flush()
            return
        try:
            future = self.executor.submit(config)
        except Exception as exc:  # noqa: BLE001 - the executor refused: count it, keep going
            self._executor_failed(candidate, exc)
            return
        pending[future] = (candidate, time.monotonic())
        future.add_done_callback(self._done.put)

    def _result_of(self, future: cf.Future) -> ExperimentResult | Exception:
        try:
            result = future.result()
        except Exception as exc:  # noqa: BLE001 - an executor bug or lost server, not the candidate's fault
            return exc
        if not isinstance(result, ExperimentResult):
            return TypeError(f"the executor returned {type(result).__name__}, not an ExperimentResult")
        return result

    def _executor_failed(self, candidate: Candidate, exc: Exception) -> None:
        """The executor raised instead of returning a result: log, count, give up after a streak.

        Not written to ``trials.jsonl``: the candidate was never evaluated, so
        ``--resume`` tries it again.
        """
        self.state.executor_errors += 1
        self._consecutive_executor_errors += 1
        self.strategy.tell(candidate, None)
        self.log.error("executor error on %s: %s: %s", candidate.hash, type(exc).__name__, exc)
        self.reporter.message(f"executor error: {type(exc).__name__}: {exc}")
        if self._consecutive_executor_errors >= MAX_CONSECUTIVE_EXECUTOR_ERRORS:
            self.state.stopped = "executor-failed"
            raise TuningError(
                f"the replay executor failed {self._consecutive_executor_errors} times in a row "
                f"(last: {type(exc).__name__}: {exc}); check the replay servers (--servers) or the GPU, "
                f"then continue with --resume --results-dir {self.results.path}"
            )

    def _finish(self, candidate: Candidate, result: ExperimentResult | Exception, elapsed: float,
                encoded: EncodedResult | None = None) -> None:
        """Score, tell and record one result (``encoded``: what the executor already made of it)."""
        if isinstance(result, Exception):
            self._executor_failed(candidate, result)
            return
        self._consecutive_executor_errors = 0
        outcome = self.objective.evaluate(result)
        self.strategy.annotate(candidate, outcome)
        pruned = self.strategy.tell(candidate, outcome.values, outcome.running)
        record = self._record(candidate, result, outcome, pruned, elapsed, encoded)
        with interrupts_held():  # the file and the count agree, whenever Ctrl-C comes
            self.results.append_trial(record, encoded.texts if encoded else None)
            self.state.records.append(record)
            self.state.done_hashes.add(record["hash"])
            self.state.evaluated_now += 1
        self._statuses[outcome.status] += 1
        self._update_best(record)
        self.reporter.trial(record, self._best_text)
        if outcome.status == STATUS_INVALID_LAUNCH and self.adaptive_invalid_ban:
            block = candidate.configuration.block.as_tuple()
            self.state.banned_blocks.setdefault(block, record["trial"])
            self.log.info("ban block %s after the invalid launch of trial %d", block, record["trial"])
        if outcome.status != STATUS_VERIFIED and self.fail_fast:
            self.state.stopped = "fail-fast"
            self.reporter.message(
                f"--fail-fast: trial {record['trial']} ended with {outcome.status}: {outcome.reason}"
            )

    def _record(self, candidate: Candidate, result: ExperimentResult, outcome: Outcome,
                pruned: bool, elapsed: float, encoded: EncodedResult | None = None) -> dict[str, Any]:
        return {
            "trial": len(self.state.records),
            "sampler_trial": candidate.number,
            "status": outcome.status,
            "verified": outcome.status == STATUS_VERIFIED,
            "params": candidate.params,
            "configuration": candidate.configuration.to_dict(),
            "hash": candidate.hash,
            "metric": outcome.metric,
            "speedup": outcome.speedup,
            "objective_values": list(outcome.values) if outcome.values is not None else None,
            "pruned": pruned,
            "error": outcome.reason,
            **_counters(result),
            "result": encoded.record if encoded else result.to_dict(),
            "elapsed_s": round(elapsed, 6),
            "timestamp": now_iso(),
        }

    # -- best ------------------------------------------------------------------
    def _update_best(self, record: dict[str, Any]) -> None:
        if record.get("status") != STATUS_VERIFIED or record.get("metric") is None:
            return
        best, rank = self.state.best, self.objective.rank_value
        if best is None or rank(record) < rank(best):
            self.state.best = record
            self._best_text = self.best_text()

    def best_text(self) -> str:
        best = self.state.best
        if best is None:
            return "-"
        speed = f" (x{best['speedup']:.3f})" if best.get("speedup") else ""
        primary = self.objective.primary
        energy = (f", {best['objective_values'][0]:.4g} J/launch" if primary == "energy"
                  else f", EDP {best['objective_values'][0]:.4g} J*s" if primary == "edp"
                  else f", {primary}={best['objective_values'][0]:.6g}" if is_counter(primary) else "")
        return f"{format_ns(best['metric'])}{speed}{energy}"


def _counters(result: ExperimentResult) -> dict[str, Any]:
    """A trial record's hardware counters (``mneme tune --metrics``): ``metrics`` and, when they could not be
    collected, ``metrics_error``; nothing for a run that asked for none."""
    out: dict[str, Any] = {}
    if result.metrics:
        out["metrics"] = dict(result.metrics)
    if result.metrics_error:
        out["metrics_error"] = result.metrics_error
    return out


def _encoded(future: cf.Future, candidate: Candidate) -> EncodedResult | None:
    """What an executor that writes ``results.jsonl`` already made of a result (its ``ReplayFuture``
    carries the result's dict and JSON text), with the configuration's JSON text (made once per
    configuration): the trial record reuses them instead of converting and encoding both again.
    None from other executors (or for a result that needed more than strict JSON)."""
    result_json = getattr(future, "result_json", None)
    if result_json is None:
        return None
    return EncodedResult(future.result_dict,
                         {"configuration": candidate.configuration.to_json(), "result": result_json})

