"""`mneme tune`: built-in search spaces and presets, the tuning loop, the results
directory, resume, the tuned-kernels export and reports."""
