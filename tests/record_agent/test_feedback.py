"""What `mneme record` tells its user: the summary line and the progress of a long conversion."""

from record_agent.feedback import ConversionProgress, pending_bytes, recorded_line
from record_agent.session import RecordSummary
from record_agent.testing import write_entry, write_module


def test_summary_line_says_what_how_much_and_how_long():
    s = RecordSummary(0, output="rec", instances=8, kernels=["a", "b", "c"], launches_seen=100,
                      snapshot_bytes=71_640_000_000, copied_bytes=4_340_000_000, stored_bytes=240_000_000,
                      stall_s=0.6, spool_wait_s=1.25, after_exit_s=2.5)
    line = recorded_line(s)
    assert line.startswith("mneme record: recorded 8 instance(s) of 3 kernel(s) into rec (100 launches watched)")
    assert "71.6 GB of device state captured (4.3 GB copied off the GPU, 240.0 MB new data stored)" in line
    assert "stalled 0.60 s for snapshots and 1.25 s for the agent (spool full)" in line
    assert "conversion ran 2.50 s after it exited" in line


def test_summary_line_gives_the_bytes_per_instance_and_the_pool_that_chose_the_scope():
    s = RecordSummary(0, output="rec", instances=3, kernels=["a"], snapshot_bytes=14_000_000, copied_bytes=14_000_000,
                      stored_bytes=1_000_000, instance_bytes=[2_000_000, 4_000_000, 8_000_000],
                      pool_allocators=["PyTorch caching allocator"])
    line = recorded_line(s)
    assert "14.0 MB of device state captured, median 4.0 MB per instance (largest 8.0 MB) (14.0 MB copied" in line
    assert line.endswith("; snapshots hold the reachable allocations (PyTorch caching allocator detected)")


def test_progress_counts_the_bytes_left_and_renders_on_stderr(tmp_path):
    write_module(tmp_path)
    write_entry(tmp_path, 0, n=256)
    left = pending_bytes(tmp_path)
    assert left == 2 * 3 * 4 * 256  # both phases of three 1 KiB arrays
    with ConversionProgress(left, enabled=True) as progress:
        progress.advance(1, left)
    assert ConversionProgress(left)._bar is None  # not a terminal (and small): no bar
