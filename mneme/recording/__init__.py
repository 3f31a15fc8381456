"""A recording as the rest of mneme reads it.

* :mod:`mneme.recording.execution`: ``RecordedExecution`` and ``KernelInstance`` (the reference's
  ``mneme.recorded_execution``, :mod:`mneme._internal.reference_names`)
* :mod:`mneme.recording.window`: where the recorder's address windows are (constants only)

Writing recordings is the record agent's job (``record_agent``, through :mod:`mneme.format`).
"""
