"""GPU memory handed from a sleeping engine to the waking one, not released to the driver (adr/0016, 2026-11-24).

Memory one process releases is cleared by the driver before another process may map it (~0.3 s for the ~97
GiB of an 8B engine at 0.7 of an H200): the floor of a sleeping switch. The runtime patch
`gpu-sleep-wake-at-bus-speed` can instead export the physical memory it maps as file descriptors (CUDA VMM,
POSIX_FD handles) in pieces of a few fixed sizes; this broker, in the manager's process, holds them between
A's sleep and B's wake, and B maps them in place of fresh memory.

A descriptor is the memory itself, so the broker listens on a Unix socket in a 0700 directory, checks the
peer's uid, and holds pieces only inside a switch window the manager opens just before A's sleep and closes
right after B's wake; outside it every piece it gets is closed at once (freed, as a release would). Nothing
here touches CUDA: the engine side lives in stack.vllm.plugins.runtime_patches.fast_sleep_wake.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import struct
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

MIB = 1024**2
PIECE_SIZES = (512 * MIB, 32 * MIB, 2 * MIB)  # 2 MiB: the VMM granularity every allocation is aligned to
SOCKET_ENV = "VSTACK_SLEEP_HANDOFF_SOCKET"
BATCH = 200  # descriptors per message: SCM_RIGHTS carries at most 253
TIMEOUT_S = 5.0
log = logging.getLogger("stack.engine.handoff")


def allow_many_descriptors(wanted: int = 65536) -> int:
    """Raise this process's soft limit on open files toward `wanted` (within the hard limit): an 8B engine's
    memory is ~1,100 pieces, one descriptor each, beyond the usual soft limit of 1,024. Returns the limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return target
    return soft


def cover(size: int) -> list[int] | None:
    """The pieces, largest first, that map `size` bytes exactly; None where the size is not 2 MiB-aligned."""
    if size <= 0 or size % PIECE_SIZES[-1]:
        return None
    out: list[int] = []
    for piece in PIECE_SIZES:
        n, size = divmod(size, piece)
        out += [piece] * n
    return out


def _send(sock: socket.socket, header: dict, fds: list[int] | None = None) -> None:
    socket.send_fds(sock, [json.dumps(header).encode()], fds or [])


def _recv(sock: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _flags, _addr = socket.recv_fds(sock, 65536, BATCH + 8)
    if not data:
        for fd in fds:
            os.close(fd)
        raise ConnectionError("the other side closed the connection")
    return json.loads(data), fds


def _send_pieces(sock: socket.socket, header: dict, pieces: list[tuple[int, int]]) -> None:
    """(size, fd) pieces in messages of at most BATCH descriptors, each with `header`, its sizes and `more`."""
    for i in range(0, max(len(pieces), 1), BATCH):
        part = pieces[i : i + BATCH]
        _send(sock, {**header, "sizes": [s for s, _ in part], "more": i + BATCH < len(pieces)}, [fd for _, fd in part])


def _recv_pieces(sock: socket.socket, first: tuple[dict, list[int]] | None = None) -> list[tuple[int, int]]:
    """The (size, fd) pieces of the messages _send_pieces sent (from `first`, when already read). On a broken
    transfer every descriptor received so far is closed: a partial hand-over keeps nothing."""
    header, fds = first or _recv(sock)
    got: list[tuple[int, int]] = []
    try:
        got += zip(header["sizes"], fds, strict=True)
        while header.get("more"):
            header, fds = _recv(sock)
            got += zip(header["sizes"], fds, strict=True)
    except (OSError, ValueError, ConnectionError):
        for fd in {*fds, *(fd for _s, fd in got)}:
            os.close(fd)
        raise
    return got


AF_UNIX_PATH_MAX = 107  # sun_path is 108 bytes with its terminating NUL


class HandoffBroker:
    """Pieces by (device, size), held only while a window is open for that device."""

    def __init__(self, directory: Path | None = None) -> None:
        # AF_UNIX paths end at 107 bytes: refuse a folder that long before making anything in it.
        folder = Path(directory or tempfile.gettempdir())
        size = len(os.fsencode(folder / "vstack-handoff-xxxxxxxx" / "handoff.sock"))  # mkdtemp adds 8 characters
        if size > AF_UNIX_PATH_MAX:
            raise ValueError(f"handoff broker: the socket path under {folder} would be {size}"
                             f" bytes, past the {AF_UNIX_PATH_MAX} a Unix socket allows; fix: give a shorter folder"
                             " (the default is the system temp folder, TMPDIR)")
        self._dir = Path(tempfile.mkdtemp(prefix="vstack-handoff-", dir=directory))  # mode 0700
        self.path = str(self._dir / "handoff.sock")
        self._lock = threading.Lock()
        self._pieces: dict[tuple[str, int], list[int]] = defaultdict(list)
        self._windows: set[str] = set()
        self._server: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._dropping: threading.Thread | None = None
        self.stats = {"received": 0, "handed": 0, "dropped": 0, "refused_peers": 0}

    # -- the manager's side --------------------------------------------------------------------------
    def start(self) -> HandoffBroker:
        allow_many_descriptors()
        server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        server.bind(self.path)
        os.chmod(self.path, 0o600)
        server.listen(8)
        self._server = server
        self._thread = threading.Thread(target=self._serve, name="gpu memory handoff", daemon=True)
        self._thread.start()
        return self

    def open_window(self, device: str | None = None) -> None:
        """Keep the pieces a sleeping engine hands over (for `device`, or every device) until close_window. A
        previous window's pieces still being freed are freed first: the new switch reads the GPU's memory."""
        self.wait_dropped()
        with self._lock:
            self._windows.add(device or "*")

    def close_window(self, background: bool = False, keep_bytes: int = 0) -> int:
        """End every window; the pieces nobody took are closed (freed). Returns the bytes dropped. `background`:
        closed by a thread of their own, after this returns. Closing the last descriptor of GPU memory frees it
        in the driver, ~15-23 us a piece on an H200 (4-7 ms for 16.5 GiB in 512 MiB pieces, 30-47 ms for 2,048
        of 2 MiB: adr/0055): a switch need not wait for that. `keep_bytes` (manager.handoff_spare, adr/0057): up
        to that many bytes of them stay as spare, smallest pieces first, for the next wake to map instead of
        asking the driver for memory it clears first; drop_spare() frees them."""
        with self._lock:
            self._windows.clear()
            pieces, self._pieces = self._pieces, _spare(self._pieces, keep_bytes)
            self.stats["dropped"] += sum(len(fds) for fds in pieces.values())
        dropped = sum(size * len(fds) for (_dev, size), fds in pieces.items())
        if not dropped:  # nothing, or everything kept as spare: no thread to start
            return 0
        if not background:
            _close_pieces(pieces)
            return dropped
        self.wait_dropped()  # one drop at a time
        self._dropping = threading.Thread(target=_close_pieces, args=(pieces, dropped), name="gpu memory drop",
                                          daemon=True)  # fmt: skip
        self._dropping.start()
        return dropped

    def drop_spare(self) -> int:
        """Free the spare close_window kept (waiting for the driver), unless a window is open: before an engine
        starts or wakes without the handoff, which asks the driver for memory NVML must show free. The bytes."""
        with self._lock:
            if self._windows:
                return 0
        dropped = self.close_window(background=True)
        self.wait_dropped()
        return dropped

    @property
    def dropping(self) -> bool:
        """Pieces a background close_window took are still being freed."""
        return self._dropping is not None and self._dropping.is_alive()

    def wait_dropped(self) -> None:
        """Until the pieces a background close_window took are freed (at once when there are none)."""
        dropping = self._dropping
        if dropping is not None:
            dropping.join()
            self._dropping = None

    def held_bytes(self, device: str | None = None) -> int:
        with self._lock:
            return sum(size * len(fds) for (dev, size), fds in self._pieces.items() if device in (None, dev))

    def stop(self) -> None:
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.shutdown(socket.SHUT_RDWR)
            self._server.close()
            self._server = None
        self.close_window()
        self.wait_dropped()
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            self._dir.rmdir()

    # -- the engines' side ---------------------------------------------------------------------------
    def _serve(self) -> None:
        while self._server is not None:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._session, args=(conn,), daemon=True, name="handoff session").start()

    def _session(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(TIMEOUT_S)
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _pid, uid, _gid = struct.unpack("3i", creds)
            if uid != os.getuid():  # a descriptor is GPU memory: only our own engines
                self.stats["refused_peers"] += 1
                log.warning("memory handoff: refused a connection from uid %d", uid)
                return
            try:
                header, fds = _recv(conn)
                if header.get("op") == "put":
                    self._put(conn, header, fds)
                elif header.get("op") == "take":
                    self._take(conn, header)
            except (OSError, ValueError, ConnectionError) as exc:
                log.warning("memory handoff: a session ended early (%s)", exc)

    def _put(self, conn: socket.socket, header: dict, fds: list[int]) -> None:
        device = str(header["device"])
        got = _recv_pieces(conn, (header, fds))
        with self._lock:
            keep = device in self._windows or "*" in self._windows
            for size, fd in got:
                if keep:
                    self._pieces[(device, int(size))].append(fd)
                else:
                    os.close(fd)
            self.stats["received" if keep else "dropped"] += len(got)
        _send(conn, {"kept": keep, "pieces": len(got)})

    def _take(self, conn: socket.socket, header: dict) -> None:
        device = str(header["device"])
        out: list[tuple[int, int]] = []
        rest: dict[tuple[str, int], list[int]] = {}
        with self._lock:
            short = False
            for size, count in header["want"].items():
                stock = self._pieces.get((device, int(size)), [])
                n = min(int(count), len(stock))
                short |= n < int(count)
                out += [(int(size), stock.pop()) for _ in range(n)]
            self.stats["handed"] += len(out)
            if short and header.get("final"):  # see take_pieces
                rest = {k: self._pieces.pop(k) for k in [k for k in self._pieces if k[0] == device]}
                self.stats["dropped"] += sum(len(fds) for fds in rest.values())
        if rest:  # freed before the reply: the wake creates its memory only after it
            _close_pieces(rest, sum(size * len(fds) for (_dev, size), fds in rest.items()))
        try:
            _send_pieces(conn, {}, out)
        finally:
            for _size, fd in out:  # sent (the engine holds its own copies) or not: ours are closed either way
                os.close(fd)


def _spare(pieces: dict[tuple[str, int], list[int]], keep_bytes: int) -> dict[tuple[str, int], list[int]]:
    """Take up to `keep_bytes` out of `pieces` (in place), smallest pieces first: a wake's weights are many
    tensors, so most of their pieces are small, and the driver's cost goes by the piece, not the byte."""
    kept: dict[tuple[str, int], list[int]] = defaultdict(list)
    for key in sorted(pieces, key=lambda k: k[1]):
        size, fds = key[1], pieces[key]
        while fds and size <= keep_bytes:
            kept[key].append(fds.pop())
            keep_bytes -= size
    return kept


def _close_pieces(pieces: dict[tuple[str, int], list[int]], size: int = 0) -> None:
    """Close (free) every piece; with `size`, log how long the driver took to free those bytes."""
    t = time.perf_counter()
    for fds in pieces.values():
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
    if size:
        log.info("freed the %.2f GiB no engine took in %.3f s", size / 2**30, time.perf_counter() - t)


# -- what the engine's runtime patch calls ------------------------------------------------------------
def _connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(TIMEOUT_S)
    sock.connect(path)
    return sock


def put_pieces(path: str, device: str, pieces: Iterable[tuple[int, int]]) -> bool:
    """Hand (size, fd) pieces to the broker; True if it kept them (a window is open). The caller still owns
    and closes its descriptors; on any failure the pieces are simply not handed over (freed as a release)."""
    pieces = list(pieces)
    try:
        with _connect(path) as sock:
            _send_pieces(sock, {"op": "put", "device": device}, pieces)
            reply, _ = _recv(sock)
            return bool(reply.get("kept"))
    except (OSError, ValueError, ConnectionError) as exc:
        log.warning("memory handoff: could not hand %d pieces over (%s); released instead", len(pieces), exc)
        return False


def take_pieces(path: str, device: str, want: dict[int, int], final: bool = False) -> list[tuple[int, int]]:
    """Up to `want` {size: count} pieces from the broker as (size, fd); the caller owns the descriptors.

    `final`: no other wake follows in this switch (the KV cache's, or the whole engine's). Where the broker
    cannot give all of `want`, the wake creates the rest fresh, so it first frees every piece of the device
    it holds: pieces of sizes nobody asked for would otherwise hold the memory the wake creates (2026-11-30,
    H200: a 7B's KV cache wanted 512 and 32 MiB pieces; the 15.5 GiB an 8B had released came mostly as 2 MiB
    ones, stayed held, and the wake ran out of memory)."""
    if not want:
        return []
    try:
        with _connect(path) as sock:
            _send(sock, {"op": "take", "device": device, "want": {str(k): v for k, v in want.items()},
                         "final": final})  # fmt: skip
            return _recv_pieces(sock)
    except (OSError, ValueError, ConnectionError) as exc:
        log.warning("memory handoff: no pieces taken (%s); fresh memory instead", exc)
        return []
