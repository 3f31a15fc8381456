"""Search spaces: the parameter model (``search_space``), the built-in knobs and presets
(``knobs``, ``launch_shapes``, ``builtin``) and the space a run uses (``factory``)."""
