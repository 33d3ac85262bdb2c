"""Where a server's CPU goes under load: py-spy samples (Python and native frames), grouped by module.

`record` samples a running server with `py-spy record --native --format raw` (collapsed stacks: one line per
distinct stack, `frame;frame;... count`); `group` puts each sample where its time is spent:
    waiting         blocked in epoll/poll, on a queue, a condition or the GIL: not CPU, left out of the shares
    kernel: ...     a system call at the leaf: its share is taken from perf instead (`perf_kernel_share`)
    ONNX Runtime    inside onnxruntime (the model's run)
    event loop      uvloop, asyncio, and what neither our code nor ORT called (interpreter, allocator)
    <module>        the innermost frame of our code (serving/, ctr_features/, ctr_contract/), with the native
                    work it called (orjson, numpy, the C scan) charged to it
Used by `python -m bench.raw_served --profile`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

OURS = ("serving/", "ctr_features/", "ctr_contract/")
# Reached from the leaf before any frame of ours: the loop's own work (its C code, task steps, callbacks).
LOOP = ("asyncio/", "uvloop", "_asyncio", "concurrent/futures/", "threading.py", "libuv", "loop.c", "linux.c")
# A frame on the stack means the thread is blocked, not running: these samples are no CPU.
WAITING = (
    "epoll_wait (",
    "epoll_pwait (",
    "poll (libc",
    "select_poll",
    "_queue_SimpleQueue_get",
    "Condition.wait (",
    "pthread_cond_wait (",
    "pthread_cond_timedwait (",
    "sem_wait (",
    "sem_timedwait (",
    "nanosleep (",
)
# libc leaves that are system calls worth a line of their own.
SYSCALLS = {
    "write": "kernel: socket write",
    "writev": "kernel: socket write",
    "send": "kernel: socket write",
    "sendmsg": "kernel: socket write",
    "read": "kernel: socket read",
    "recv": "kernel: socket read",
    "recvmsg": "kernel: socket read",
    "getpid": "kernel: getpid (asyncio.get_running_loop)",
}
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<where>[^()]*)\)$")


def py_spy() -> str:
    """The py-spy executable beside this Python (the dev extra installs it), or on PATH."""
    beside = Path(sys.executable).with_name("py-spy")
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise FileNotFoundError("py-spy is not installed: pip install -e '.[dev]'")
    return found


def record(pid: int, seconds: int, out: Path, rate: int = 100) -> Path:
    """Sample `pid` (every thread) for `seconds` into `out` (collapsed stacks)."""
    cmd = [py_spy(), "record", "-p", str(pid), "--rate", str(rate), "--duration", str(seconds)]
    cmd += ["--native", "--format", "raw", "-o", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=seconds + 60)
    return out


def category(frames: list[str]) -> str | None:
    """Where one sample's time goes (root-first frames); None: the thread was waiting."""
    if any(w in f for f in frames for w in WAITING):
        return None
    leaf = _FRAME.match(frames[-1])
    if leaf is not None and "libc.so" in leaf["where"] and leaf["func"] in SYSCALLS:
        return SYSCALLS[leaf["func"]]
    for frame in reversed(frames):
        m = _FRAME.match(frame)
        where = m["where"] if m else frame
        if "onnxruntime" in where:
            return "ONNX Runtime"
        if where.startswith(OURS):
            return where.split(":")[0].removesuffix(".py")
        if any(part in where for part in LOOP):
            return "event loop"
    return "event loop"


def group(collapsed: Path) -> Counter[str]:
    """Samples per category (waiting ones under None's key "waiting")."""
    counts: Counter[str] = Counter()
    for line in collapsed.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            counts[category(stack.split(";")) or "waiting"] += int(n)
    return counts


def perf_kernel_share(pid: int, seconds: int, out: Path) -> float:
    """The share of `pid`'s CPU samples (every thread) spent in the kernel, from `perf record` (cycles).

    py-spy's samples stop the threads (ptrace), which catches them at system calls far more often than they
    run there, so the kernel's share comes from perf, whose samples are not biased that way."""
    subprocess.run(
        ["perf", "record", "-q", "-F", "499", "-p", str(pid), "-o", str(out), "--", "sleep", str(seconds)],
        check=True,
        capture_output=True,
        timeout=seconds + 60,
    )
    report = subprocess.run(
        ["perf", "report", "-i", str(out), "--sort", "dso", "--stdio", "--percent-limit", "0"],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    shares = {m[2]: float(m[1]) for m in re.finditer(r"^\s+([\d.]+)%\s+(\S+)", report, re.MULTILINE)}
    return shares.get("[kernel.kallsyms]", 0.0) / 100


def table(counts: Counter[str], kernel_share: float, cpu_us: float, top: int = 20) -> str:
    """A markdown table: the kernel's share (perf), then each user-space category's share of the rest (py-spy
    samples, system-call leaves left out), and µs a request: the share of `cpu_us`, the server's CPU time per
    request measured over the same load."""
    user = {k: v for k, v in counts.items() if k != "waiting" and not k.startswith("kernel")}
    total = sum(user.values()) or 1
    ranked = sorted(user.items(), key=lambda kv: -kv[1])
    shown, rest = ranked[:top], ranked[top:]
    if rest:
        shown.append((f"{len(rest)} others", sum(v for _, v in rest)))
    lines = ["| where | share of server CPU | µs a request |", "|---|---|---|"]
    lines.append(f"| kernel (sockets, scheduling; perf) | {kernel_share:.1%} | {kernel_share * cpu_us:.1f} |")
    for name, n in shown:
        share = n / total * (1 - kernel_share)
        lines.append(f"| {name} | {share:.1%} | {share * cpu_us:.1f} |")
    lines.append(f"| **all** ({total} py-spy samples) | 100% | {cpu_us:.1f} |")
    return "\n".join(lines)
