"""A results folder's answers in one compressed file: `answers.tar.xz`.

A committed results folder keeps its README (the command, what it shows), its tables and plots, and one
`answers.tar.xz` holding everything the tables are computed from (the verdict files under `verdicts/`, the
runs' logs, a benchmark's JSON and answer files). `--tables-only` and the benchmarks' readers take their
inputs from it as they would from the unpacked files, so the tables rebuild byte for byte from the archive.

    python -m evals.packed evals/results/compare_cpu            # pack what the folder holds besides its README,
                                                               # tables, plots and timings (then delete those files)
    python -m evals.packed evals/results/compare_cpu --list     # what the archive holds
    tar -xJf evals/results/compare_cpu/answers.tar.xz -C /tmp/x # or by hand, with tar

The archive is deterministic (members sorted, times, owners and modes fixed), so packing the same files twice
gives the same bytes. A member of an archive is named `FOLDER/answers.tar.xz:MEMBER` where a command takes a
file (`bench_learning --pool`, `plot_learning`); a pattern (`*`, `?`) after the colon names every member it
matches, in name order.
"""

from __future__ import annotations

import argparse
import fnmatch
import io
import lzma
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PACK = "answers.tar.xz"
# What stays beside the archive, unpacked: what a reader opens first.
KEPT = ("README.md", "table.md", "table.csv", "table.json", "failures.csv", "timings.json", "cpu", "*.png",
        "report.md", "settings.json", "progress.txt", "plan.json")


class PackError(ValueError):
    """A bad archive or member: one line naming it and what is allowed."""


def _kept(rel: Path) -> bool:
    """Kept beside the archive: what `KEPT` names at the top, and a model's own `<name>/metrics.json` table."""
    return (any(fnmatch.fnmatch(rel.parts[0], pattern) for pattern in KEPT) or rel.name == PACK
            or (len(rel.parts) == 2 and rel.name == "metrics.json"))


def packable(folder: Path) -> list[Path]:
    """Files under `folder` that belong in its archive (everything but what `KEPT` names), relative, sorted."""
    return sorted(p.relative_to(folder) for p in folder.rglob("*") if p.is_file() and not _kept(p.relative_to(folder)))


def pack(folder: Path, members: list[Path] | None = None) -> Path:
    """Write `folder/answers.tar.xz` from `members` (relative paths; default: `packable(folder)`), deterministic.
    An archive already there is read first and its members kept unless a file of the same name replaces them."""
    folder = Path(folder)
    members = packable(folder) if members is None else sorted(members)
    data: dict[str, bytes] = {}
    target = folder / PACK
    if target.is_file():
        with tarfile.open(target, "r:xz") as tar:
            for m in tar.getmembers():
                if m.isfile():
                    data[m.name] = tar.extractfile(m).read()
    for rel in members:
        data[rel.as_posix()] = (folder / rel).read_bytes()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(data):
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode, info.uid, info.gid = len(data[name]), 0, 0o644, 0, 0
            tar.addfile(info, io.BytesIO(data[name]))
    target.write_bytes(lzma.compress(buf.getvalue(), preset=9 | lzma.PRESET_EXTREME))
    return target


def names(archive: Path) -> list[str]:
    """The file members of `archive`, sorted."""
    try:
        with tarfile.open(archive, "r:xz") as tar:
            return sorted(m.name for m in tar.getmembers() if m.isfile())
    except (OSError, tarfile.TarError, lzma.LZMAError) as e:
        raise PackError(f"{archive}: cannot be read as a tar.xz archive ({e.__class__.__name__}); allowed: an "
                        f"{PACK} written by python -m evals.packed") from None


def unpack(archive: Path, dest: Path) -> Path:
    """Extract `archive` into `dest` (plain files only, no path outside `dest`); returns `dest`."""
    with tarfile.open(archive, "r:xz") as tar:
        tar.extractall(dest, members=[m for m in tar.getmembers() if m.isfile()], filter="data")
    return dest


@contextmanager
def unpacked(folder: Path) -> Iterator[Path]:
    """The folder to read a results folder's answers from: `folder` itself when its files are unpacked (or it has
    no archive), else a temporary folder holding `folder/answers.tar.xz`'s files, removed afterwards. A folder
    with both its own `verdicts/` and an archive is refused: which one the tables come from would be a guess."""
    folder = Path(folder)
    archive = folder / PACK
    if not archive.is_file():
        yield folder
        return
    loose = packable(folder)
    if loose:
        raise PackError(f"{folder}: holds both {PACK} and unpacked answers ({loose[0]}, ...); allowed: one of them "
                        f"(pack them into the archive with python -m evals.packed {folder}, or delete them)")
    tmp = Path(tempfile.mkdtemp(prefix="answers-"))
    try:
        yield unpack(archive, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def split_spec(spec: str | Path) -> tuple[Path, str | None]:
    """`ARCHIVE.tar.xz:MEMBER` -> (archive, member); a plain path -> (path, None)."""
    text = str(spec)
    head, sep, member = text.partition(f"{PACK}:")
    if sep:
        return Path(head + PACK), member
    return Path(text), None


def expand(specs: list[str | Path]) -> list[str]:
    """Each spec as itself, or `ARCHIVE:PATTERN` as one `ARCHIVE:MEMBER` per matching member (name order); a
    pattern matching nothing is a PackError."""
    out = []
    for spec in specs:
        archive, member = split_spec(spec)
        if member is None or not any(c in member for c in "*?["):
            out.append(str(spec))
            continue
        found = [n for n in names(archive) if fnmatch.fnmatch(n, member)]
        if not found:
            raise PackError(f"{spec}: no member of {archive} matches {member!r}; allowed: a pattern that names at "
                            f"least one (python -m evals.packed {archive.parent} --list)")
        out += [f"{archive}:{n}" for n in found]
    return out


def read_text(spec: str | Path) -> str:
    """The text of a file, or of `ARCHIVE.tar.xz:MEMBER`."""
    archive, member = split_spec(spec)
    if member is None:
        return Path(spec).read_text()
    try:
        with tarfile.open(archive, "r:xz") as tar:
            return tar.extractfile(member).read().decode()
    except KeyError:
        raise OSError(f"{archive} has no member {member!r}") from None
    except (tarfile.TarError, lzma.LZMAError) as e:
        raise OSError(f"{archive}: not a tar.xz archive ({e.__class__.__name__})") from None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m evals.packed", description=__doc__.splitlines()[0])
    p.add_argument("folder", type=Path, help="a results folder")
    p.add_argument("--list", action="store_true", help="print the archive's members; change nothing")
    a = p.parse_args(argv)
    if not a.folder.is_dir():
        p.error(f"{a.folder}: not a folder; allowed: a results folder such as evals/results/compare_cpu")
    if a.list:
        try:
            print("\n".join(names(a.folder / PACK)))
        except PackError as e:
            p.error(str(e))
        return 0
    members = packable(a.folder)
    if not members:
        print(f"{a.folder}: nothing to pack", file=sys.stderr)
        return 0
    target = pack(a.folder, members)
    for rel in members:
        (a.folder / rel).unlink()
    for d in sorted((p for p in a.folder.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        if not any(d.iterdir()):
            d.rmdir()
    print(f"packed {len(members)} files into {target} ({target.stat().st_size / 1e6:.2f} MB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
