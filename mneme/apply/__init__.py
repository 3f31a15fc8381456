"""Applying tuned configurations to an unmodified application (``mneme run --apply``).

Policy lives here: which tuning results count (``results``), what each tuned
kernel runs and which launches it may replace (``plan``), and how the
application is started with the apply library and cleaned up after
(``session``). ``native/apply`` (``mneme/lib/libmneme_apply.so``) only
executes the plan inside the application. docs/apply.md has the rules.
"""

from mneme.apply.plan import ApplyOptions, ApplyPlan, build_plan
from mneme.apply.results import TunedKernel, read_results

__all__ = ["ApplyOptions", "ApplyPlan", "TunedKernel", "build_plan", "read_results"]
