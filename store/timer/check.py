"""``basalt store check``'s look at the timer's files (read-only, pread only).

What a start does with each finding (store.timer.service): a checkpoint that
does not decode, a TimerLog file missing or shorter than the checkpoint says,
an entry before the checkpoint's end that fails its crc, or a wheel of the
wrong size - the start rebuilds the TimerLog and wheel from the timer topic's
ConsumeQueue (nothing delivered twice below the checkpoint, nothing lost).
Entries past the checkpoint's end are a crash's leftovers: the start cuts
them and files them again (a note, not a problem).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from basalt.store.timer.checkpoint import TimerState, decode_state
from basalt.store.timer.files import ENTRY_SIZE, SLOT_SIZE, decode_entry

#: Entries before the checkpoint's end whose crc check reads (the last written).
CHECKED_TAIL_ENTRIES = 4096

Problem = Callable[[str, str, Path], None]


def check_timer_files(root: Path, problem: Problem, note: Callable[[str], None]) -> None:
    """Check ``root``'s config/timercheck, timerlog/ and timerwheel; report each
    finding with ``problem(code, message, path)`` or ``note(message)``."""
    cp_path = root / "config" / "timercheck"
    log_dir = root / "timerlog"
    wheel = root / "timerwheel"
    files = _log_files(log_dir)
    if not cp_path.exists():
        if files:
            problem(
                "timer-checkpoint",
                "TimerLog files without config/timercheck (a start rebuilds the timer "
                "from the timer topic, delivering past-due timers again)",
                cp_path,
            )
        return
    try:
        state = decode_state(_read(cp_path, 0, os.path.getsize(cp_path)))
    except (ValueError, OSError) as e:
        problem("timer-checkpoint", f"{e} (a start rebuilds the timer)", cp_path)
        return
    if wheel.exists() and os.path.getsize(wheel) != state.ring_slots * SLOT_SIZE:
        problem(
            "timer-wheel",
            f"timerwheel is {os.path.getsize(wheel)} bytes, the checkpoint's ring needs "
            f"{state.ring_slots * SLOT_SIZE} (a start rebuilds the timer)",
            wheel,
        )
    _check_log(log_dir, files, state, problem, note)


def _log_files(log_dir: Path) -> dict[int, Path]:
    if not log_dir.is_dir():
        return {}
    return {int(p.name): p for p in log_dir.iterdir() if len(p.name) == 20 and p.name.isdigit()}


def _check_log(
    log_dir: Path,
    files: dict[int, Path],
    state: TimerState,
    problem: Problem,
    note: Callable[[str], None],
) -> None:
    end, size = state.log_end, state.log_file_size
    if end == 0 or size <= 0:
        return
    capacity = (size // ENTRY_SIZE) * ENTRY_SIZE
    first = min(files) if files else None
    if first is None:
        problem("timer-log", f"no TimerLog file; the checkpoint ends at {end}", log_dir)
        return
    start = first
    last = (end - 1) - (end - 1) % size
    while start <= last:
        path = files.get(start)
        need = min(end - start, capacity)
        if path is None:
            problem(
                "timer-log", f"TimerLog file {start:020d} is missing", log_dir / f"{start:020d}"
            )
        elif os.path.getsize(path) < need:
            problem(
                "timer-log",
                f"{path.name} has {os.path.getsize(path)} bytes, the checkpoint needs {need}",
                path,
            )
        start += size
    for start, path in sorted(files.items()):
        if start % size:
            problem("timer-log", f"{path.name} is not at a multiple of {size}", path)
        written = start + os.path.getsize(path)
        if written > end and start <= end:
            note(
                f"{path.name}: {written - end} bytes past the timer checkpoint (a start cuts them)"
            )
    # The last entries the checkpoint vouches for must read back.
    tail_file = end - end % size if end % size else end - size
    path = files.get(tail_file)
    if path is None:
        return
    local_end = min(end - tail_file, capacity)
    local_start = max(0, local_end - CHECKED_TAIL_ENTRIES * ENTRY_SIZE)
    data = _read(path, local_start, local_end - local_start)
    for i in range(0, len(data) - ENTRY_SIZE + 1, ENTRY_SIZE):
        if decode_entry(tail_file + local_start + i, data[i : i + ENTRY_SIZE]) is None:
            problem(
                "timer-log",
                f"{path.name}: entry at {local_start + i} fails its crc "
                "(a start rebuilds the timer)",
                path,
            )
            return


def _read(path: Path, offset: int, length: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.pread(fd, length, offset)
    finally:
        os.close(fd)


__all__ = ["check_timer_files"]
