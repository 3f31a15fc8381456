"""The reproducer folder's raw files (format 1): what the standalone program reads.

``launch.txt``: one ``key value`` line each (``#`` starts a comment line); the
kernel, the launch shape, the argument bytes in hex, the launch attributes.
``regions.txt``: one line per recorded region, ``index kind base size offset
written policy name``; the region's bytes are ``size`` bytes at ``offset`` of
``memory/prologue.bin`` (before the launch) and of ``memory/epilogue.bin``
(after it). ``pointers.txt``: one line per 8-byte value that points into a
recorded region, ``where region offset target`` (``where``: ``prologue``,
``epilogue`` or ``args``; ``region`` is ``-`` for the arguments), which the
program rewrites when ``target`` does not live at its recorded address.
docs/replay.md#standalone-reproducer is the specification.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mneme.errors import ArtifactError

FORMAT_VERSION = 1
WHERE = ("prologue", "epilogue", "args")


@dataclass(frozen=True)
class RawRegion:
    """One line of ``regions.txt``: a recorded range and where its bytes are in the memory files."""

    index: int
    kind: str  # heap | global
    base: int
    size: int
    offset: int  # in memory/prologue.bin and memory/epilogue.bin
    written: bool  # the kernel changes it: the program resets it before every launch
    policy: str  # the recorded verification policy ("bitwise", or e.g. "f32:ulp:16"); the program compares bytewise
    name: str = ""

    def line(self) -> str:
        return (f"{self.index} {self.kind} {self.base:#x} {self.size} {self.offset} {int(self.written)} "
                f"{self.policy} {self.name or '-'}")

    @property
    def label(self) -> str:
        return self.name or hex(self.base)


@dataclass(frozen=True)
class PointerSite:
    """One line of ``pointers.txt``: an 8-byte value at ``offset`` of a region's bytes (or of the arguments)
    that points into region ``target``."""

    where: str  # prologue | epilogue | args
    region: int | None  # None for args
    offset: int
    target: int

    def line(self) -> str:
        return f"{self.where} {'-' if self.region is None else self.region} {self.offset} {self.target}"


@dataclass(frozen=True)
class RawLaunch:
    """``launch.txt``: the kernel, the launch, the argument bytes, the launch attributes."""

    kernel: str
    demangled: str
    static_hash: str
    record_id: str
    code_tier: str  # recorded | ptx | llvm (compile_for's tiers)
    arch: str
    heap: str  # fixed | relocatable (the recording's address space)
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    args: bytes
    iterations: int = 3
    warmup: int = 2
    params: tuple[tuple[int, int, str], ...] = ()  # (offset, size, kind), for the reader's information
    attributes: tuple[tuple[int, str, bytes], ...] = ()  # (CUlaunchAttributeID, name, CUlaunchAttributeValue bytes)
    jit_max_registers: int | None = None

    def text(self) -> str:
        lines = [
            f"# mneme reproducer launch, format {FORMAT_VERSION} (README.md describes every key)",
            f"format {FORMAT_VERSION}",
            f"kernel {self.kernel}",
            f"demangled {self.demangled}",
            f"static_hash {self.static_hash}",
            f"record_id {self.record_id}",
            f"code_tier {self.code_tier}",
            f"arch {self.arch}",
            f"heap {self.heap}",
            "grid {} {} {}".format(*self.grid),
            "block {} {} {}".format(*self.block),
            f"shared_mem {self.shared_mem}",
            f"iterations {self.iterations}",
            f"warmup {self.warmup}",
        ]
        if self.jit_max_registers is not None:
            lines.append(f"jit_max_registers {self.jit_max_registers}")
        lines += [f"args_size {len(self.args)}", f"args {self.args.hex()}".rstrip()]
        lines += [f"param {o} {s} {k}" for o, s, k in self.params]
        lines += [f"attribute {i} {n} {v.hex()}" for i, n, v in self.attributes]
        return "\n".join(lines) + "\n"


def regions_text(regions: list[RawRegion]) -> str:
    head = (f"# mneme reproducer regions, format {FORMAT_VERSION}\n"
            "# index kind base size offset written policy name\n")
    return head + "".join(r.line() + "\n" for r in regions)


def pointers_text(sites: list[PointerSite]) -> str:
    head = (f"# mneme reproducer pointer sites, format {FORMAT_VERSION}\n"
            "# where region offset target\n")
    return head + "".join(s.line() + "\n" for s in sites)


# -- readers (tests, and anyone checking a folder from Python) ------------------------------------------


def _lines(path: Path):
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        text = text.strip()
        if text and not text.startswith("#"):
            key, _, rest = text.partition(" ")
            yield number, key, rest.strip()


def read_launch(directory: str | Path) -> RawLaunch:
    """Parse ``launch.txt``.

    Args:
        directory: the reproducer folder.

    Returns:
        The launch it describes; an ArtifactError names the line of anything malformed.
    """
    path = Path(directory) / "launch.txt"
    values: dict[str, str] = {}
    params, attributes = [], []
    for number, key, rest in _lines(path):
        try:
            if key == "param":
                o, s, k = rest.split()
                params.append((int(o), int(s), k))
            elif key == "attribute":
                i, n, v = rest.split()
                attributes.append((int(i), n, bytes.fromhex(v)))
            else:
                values[key] = rest
        except ValueError as exc:
            raise ArtifactError(f"{path} line {number}: {exc}") from None
    try:
        if int(values.pop("format")) != FORMAT_VERSION:
            raise ArtifactError(f"{path}: not format {FORMAT_VERSION}")
        args = bytes.fromhex(values.pop("args", ""))
        if int(values.pop("args_size")) != len(args):
            raise ArtifactError(f"{path}: args_size does not match args")
        jit = values.pop("jit_max_registers", None)
        launch = RawLaunch(
            kernel=values.pop("kernel"), demangled=values.pop("demangled", ""),
            static_hash=values.pop("static_hash"), record_id=values.pop("record_id"),
            code_tier=values.pop("code_tier"), arch=values.pop("arch"), heap=values.pop("heap"),
            grid=tuple(int(v) for v in values.pop("grid").split()),  # type: ignore[arg-type]
            block=tuple(int(v) for v in values.pop("block").split()),  # type: ignore[arg-type]
            shared_mem=int(values.pop("shared_mem")), args=args,
            iterations=int(values.pop("iterations")), warmup=int(values.pop("warmup")),
            params=tuple(params), attributes=tuple(attributes),
            jit_max_registers=None if jit is None else int(jit),
        )  # fmt: skip
    except (KeyError, ValueError) as exc:
        raise ArtifactError(f"{path}: missing or malformed {exc}") from None
    if values:
        raise ArtifactError(f"{path}: unknown keys {', '.join(sorted(values))}")
    return launch


def read_regions(directory: str | Path) -> list[RawRegion]:
    """Parse ``regions.txt``.

    Args:
        directory: the reproducer folder.

    Returns:
        The regions, in file order (their bytes follow each other in the memory files).
    """
    path = Path(directory) / "regions.txt"
    out = []
    for number, key, rest in _lines(path):
        parts = rest.split(None, 6)
        if len(parts) != 7:
            raise ArtifactError(f"{path} line {number}: expected index kind base size offset written policy name")
        kind, base, size, offset, written, policy, name = parts
        out.append(RawRegion(int(key), kind, int(base, 0), int(size), int(offset), written == "1", policy,
                             "" if name == "-" else name))
    return out


def read_pointers(directory: str | Path) -> list[PointerSite]:
    """Parse ``pointers.txt``.

    Args:
        directory: the reproducer folder.

    Returns:
        The pointer sites, in file order.
    """
    path = Path(directory) / "pointers.txt"
    out = []
    for number, where, rest in _lines(path):
        parts = rest.split()
        if where not in WHERE or len(parts) != 3:
            raise ArtifactError(f"{path} line {number}: expected where region offset target")
        region = None if parts[0] == "-" else int(parts[0])
        out.append(PointerSite(where, region, int(parts[1]), int(parts[2])))
    return out


@dataclass
class MemoryWriter:
    """Appends regions' bytes to ``memory/prologue.bin`` and ``memory/epilogue.bin``, keeping the offsets."""

    directory: Path
    offset: int = 0
    _files: list = field(default_factory=list)

    def __enter__(self) -> "MemoryWriter":
        memory = self.directory / "memory"
        memory.mkdir(exist_ok=True)
        self._files = [open(memory / "prologue.bin", "wb"), open(memory / "epilogue.bin", "wb")]
        return self

    def append(self, prologue: bytes, epilogue: bytes) -> int:
        """Write one region's bytes; the offset they start at in both files."""
        if len(prologue) != len(epilogue):
            raise ArtifactError(f"a region has {len(prologue)} prologue and {len(epilogue)} epilogue bytes")
        start = self.offset
        self._files[0].write(prologue)
        self._files[1].write(epilogue)
        self.offset += len(prologue)
        return start

    def __exit__(self, *exc: object) -> None:
        for f in self._files:
            f.close()
