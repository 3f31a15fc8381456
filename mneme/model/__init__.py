"""The experiment model: what a configuration is, what a replay reports, how verification is set.

* :mod:`mneme.model.experiment`: ``ExperimentConfiguration``, ``Dim3``, ``ExperimentResult``, statuses
* :mod:`mneme.model.verification`: ``VerificationSettings``, how replays verify (passed whole)
* :mod:`mneme.model.json_text`: the configurations' JSON texts, made once per configuration

The reference's module name ``mneme.mneme_types`` is :mod:`mneme.model.experiment` itself
(declared in the distribution's metadata, :mod:`mneme._internal.reference_names`).
"""
