"""The reference's module names, for scripts written for the reference.

``mneme.async_executor``, ``mneme.mneme_types``, ``mneme.recorded_execution``,
``mneme.tuning.search_space`` and ``mneme.tuning.sample_strategy`` are not files of the core: the
distribution declares them in ``pyproject.toml`` as entry points of the group ``mneme.reference_modules``
(the entry point's name is the reference's module name, its value the module that holds the code).
:func:`install` puts a finder at the end of ``sys.meta_path`` (``import mneme`` does it); the first
import of such a name reads the table from the installed distribution's metadata and binds the name to
the very module object that holds the code. The core thus names no package above it, and nothing of
the table is read before a script asks for one of the names.

A parent that is only a prefix of reference names (``mneme.tuning``) is an empty package that holds
just those names.
"""

from __future__ import annotations

import sys

#: The entry-point group that holds the table.
GROUP = "mneme.reference_modules"
#: The distribution whose metadata declares it.
DISTRIBUTION = "mneme"


class _Finder:
    """Finds the reference's module names (a meta path finder, last in ``sys.meta_path``)."""

    def __init__(self) -> None:
        self._table: dict[str, str] | None = None

    def table(self) -> dict[str, str]:
        """The reference's module names and the modules they stand for, from the metadata (once).

        Returns:
            Reference name -> module name; empty where the distribution is not installed.
        """
        if self._table is None:
            from importlib.metadata import PackageNotFoundError, distribution

            try:
                points = distribution(DISTRIBUTION).entry_points.select(group=GROUP)
            except PackageNotFoundError:  # a source tree on sys.path without an installed distribution
                points = ()
            self._table = {point.name: point.value for point in points}
        return self._table

    def find_spec(self, fullname: str, path: object = None, target: object = None):
        """The spec of a reference name, of a parent that is only a prefix of some, else None.

        Args:
            fullname: the module's full name.
            path: the parent package's search path (unused).
            target: the module being reloaded (unused).

        Returns:
            An ``importlib.machinery.ModuleSpec`` or None.
        """
        if not fullname.startswith(DISTRIBUTION + "."):
            return None
        table = self.table()
        from importlib.machinery import ModuleSpec

        if fullname in table:
            return ModuleSpec(fullname, _Alias(table[fullname]))
        if any(name.startswith(fullname + ".") for name in table):
            return ModuleSpec(fullname, _Prefix(sorted(n for n in table if n.startswith(fullname + "."))),
                              is_package=True)
        return None


class _Alias:
    """Loads a reference name as the module that holds the code (the same object)."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec):  # the default module: replaced in sys.modules by exec_module
        return None

    def exec_module(self, module) -> None:
        import importlib

        # The import system hands out what sys.modules holds under the name after this: the target.
        sys.modules[module.__spec__.name] = importlib.import_module(self.target)


class _Prefix:
    """Loads a package that exists only to hold reference names (``mneme.tuning``)."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        module.__path__ = []  # nothing under it but the reference names the finder gives
        module.__doc__ = "The reference's module names " + ", ".join(self.names) + " (mneme._internal.reference_names)."


_FINDER = _Finder()


def install() -> None:
    """Put the finder at the end of ``sys.meta_path`` (once): real modules are always found first."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)


def reference_names() -> dict[str, str]:
    """The reference's module names the installed distribution declares.

    Returns:
        Reference name -> the module that holds the code.
    """
    return dict(_FINDER.table())
