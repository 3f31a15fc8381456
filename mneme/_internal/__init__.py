"""Rules shared by every part of mneme, and by nothing outside it.

One module a rule: names that may travel in requests (``names``), the cache
directories (``cache_dir``), how child processes are started (``child_process``),
where the native libraries are (``native_libs``), signal forwarding to an
application (``signals``), the driver's view of a GPU (``devices``) and the
start-up trace (``startup_trace``), the reference's module names (``reference_names``). Not public API: these may change without notice.
"""
