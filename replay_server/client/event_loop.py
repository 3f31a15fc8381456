"""The executor's second thread: one asyncio event loop, and events handled in rounds.

``EventLoop`` runs an asyncio loop in a thread of its own (``replay-dispatch``) that holds every
server's gRPC calls (``grpc.aio``) and the executor's scheduling state. Every happening (a submission,
a server's message of responses, a call's end, a server joining or retiring) is an event appended to
one deque (``post``, from any thread); the first event after a round schedules the next round on the
loop, and a round (the executor's ``on_round``) takes every event there is by then, so events that
come together cost the loop one wake-up, not one each. A round also runs every ``TICK`` seconds.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from typing import Any, Callable

#: A round at least this often (seconds): retries wait for a server's back-off, stranded work for its window.
TICK = 0.1


class EventLoop:
    """An asyncio event loop in its own thread, with a deque of events handled in rounds.

    Args:
        on_round: runs a round in the loop's thread; it takes the events of ``events`` itself.
    """

    def __init__(self, on_round: Callable[[], None]) -> None:
        self.events: "collections.deque[tuple]" = collections.deque()
        self._on_round = on_round
        self._round_due = False  # a round is scheduled on the loop and has not started yet
        self._spawned: set = set()  # the loop's tasks (held here: the loop keeps only weak references)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="replay-dispatch", daemon=True)
        self.thread.start()
        self._ident = self.thread.ident

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
            # Stopped (the channels closed): what is left of the calls' tasks ends as asyncio.run ends them.
            left = asyncio.all_tasks(self.loop)
            for task in left:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        finally:
            self.loop.close()

    def post(self, event: tuple) -> None:
        """Hand the executor an event, from any thread: a round runs soon and takes every event there is
        by then."""
        self.events.append(event)
        if not self._round_due:  # (cleared before the round takes the events: none is left behind)
            self._round_due = True
            if threading.get_ident() == self._ident:
                self.loop.call_soon(self._round)
            else:
                self.loop.call_soon_threadsafe(self._round)

    def _round(self) -> None:
        self._round_due = False
        self._on_round()

    def tick(self) -> None:
        """A round now unless one is due, and every ``TICK`` seconds from then on (in the loop's thread)."""
        if not self._round_due:
            self._round_due = True
            self._round()
        self.loop.call_later(TICK, self.tick)

    def post_later(self, delay: float, event: tuple) -> None:
        """Post ``event`` after ``delay`` seconds (in the loop's thread)."""
        self.loop.call_later(delay, self.post, event)

    def spawn(self, coroutine: Any) -> None:
        """Start ``coroutine`` as a task of the loop (in the loop's thread)."""
        task = self.loop.create_task(coroutine)
        self._spawned.add(task)
        task.add_done_callback(self._spawned.discard)

    def call(self, coroutine: Any) -> Any:
        """Run ``coroutine`` on the loop and wait for its value (from any thread but the loop's)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def call_soon(self, function: Callable[[], None]) -> None:
        """Run ``function`` on the loop (from any thread)."""
        self.loop.call_soon_threadsafe(function)

    def stop(self) -> None:
        """Stop the loop (in the loop's thread); its thread then ends."""
        self.loop.stop()

    def end(self, closing: Any) -> None:
        """Run the coroutine ``closing``, stop the loop and wait for its thread (from another thread)."""
        async def end() -> None:
            await closing
            self.loop.stop()

        asyncio.run_coroutine_threadsafe(end(), self.loop)
        self.thread.join()

    def join(self) -> None:
        """Wait for the loop's thread (after it was stopped)."""
        self.thread.join()
