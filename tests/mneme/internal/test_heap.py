"""The heap keeper: the collector's full passes are off while any heap is held, and come back after."""

import gc

from mneme._internal.heap import NO_FULL_PASSES, Heap


def test_full_passes_are_off_while_a_heap_is_held_and_back_after_the_last_release():
    before = gc.get_threshold()
    first, second = Heap(), Heap()
    try:
        first.settle()
        assert gc.get_threshold() == (*before[:2], NO_FULL_PASSES)
        second.settle()
        second.settle()  # (held once per heap)
        first.release()
        assert gc.get_threshold()[2] == NO_FULL_PASSES  # the second still holds it
        second.release()
        assert gc.get_threshold() == before
        second.release()  # (a second release changes nothing)
        assert gc.get_threshold() == before
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


def test_a_cycle_made_while_held_is_freed_by_a_young_pass_or_at_the_release():
    import weakref

    class Node:
        pass

    heap = Heap()
    try:
        heap.settle()
        node = Node()
        node.self = node
        alive = weakref.ref(node)
        del node
        gc.collect(1)  # (the young generations are still collected)
        assert alive() is None
    finally:
        heap.release()
