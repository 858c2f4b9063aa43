"""Descriptors a peer may send where the owner expects none (the
SharedLoader's channels, the return socket of pickled Buffers).

A peer chooses what it sends, and closing what it sent can block: the last
close of a TCP socket with SO_LINGER set and unsent data to a peer that
does not read waits out the linger (as long as the sender likes;
O_NONBLOCK does not help), and a recv() without room for descriptors drops
them in the kernel the same way, in the receiving thread (issue 36, the
third review, item 2). So:

- refuse_rights(sock): SO_PASSRIGHTS 0 (Linux 6.16) on a socket that
  receives no descriptors: a peer's SCM_RIGHTS then fails in the peer
  (EPERM) and nothing reaches this process; accepted sockets inherit it
  from their listener;
- where the kernel has no SO_PASSRIGHTS, recv_dropping_rights() receives
  any descriptors itself and close_received() closes each one without
  waiting: the C library's pp_share_close_received, which closes a memory
  file at once and hands anything else (a socket after SO_LINGER {1, 0})
  to the process's closer thread. Before, it closed here: an AF_UNIX
  socket whose own queue held a lingering TCP socket released it in this
  thread, which waited out the linger (issue 36, the fifth review, item
  4: 8.2 s in rv36e's close_nested).
"""

import os
import socket
import struct
from typing import List, Tuple

from pinpool import _core

# SO_PASSRIGHTS is 83 in asm-generic/socket.h (Linux 6.16), which these
# architectures use; the others number their socket options otherwise.
_GENERIC = ("x86_64", "i686", "i386", "aarch64", "arm64", "riscv64",
            "s390x", "loongarch64")
SO_PASSRIGHTS = getattr(socket, "SO_PASSRIGHTS",
                        83 if os.uname().machine in _GENERIC else None)
# SCM_MAX_FD: the most descriptors one message can carry.
_MAX_FDS = 253


def refuse_rights(sock: socket.socket) -> bool:
    """Set SO_PASSRIGHTS 0 on sock: True where the kernel honours it."""
    if SO_PASSRIGHTS is None:
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_PASSRIGHTS, 0)
        return bool(sock.getsockopt(socket.SOL_SOCKET, SO_PASSRIGHTS) == 0)
    except OSError:  # ENOPROTOOPT: before Linux 6.16
        return False


def close_received(fd: int) -> None:
    """Close a descriptor a peer sent (consumed), without waiting on the
    peer (docs/sharing.md: the closer thread)."""
    _core._close_received(fd)


def fds_of(anc: List[Tuple[int, int, bytes]]) -> List[int]:
    """The descriptors of recvmsg's ancillary data."""
    fds: List[int] = []
    for level, kind, raw in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += struct.unpack(f"{len(raw) // 4}i", raw[:len(raw) // 4 * 4])
    return fds


def recv_dropping_rights(sock: socket.socket, n: int, flags: int = 0) -> bytes:
    """sock.recv(n, flags), with room for every descriptor a message can
    carry: those are closed here (close_received), never dropped by the
    kernel in a close that waits."""
    data, anc, _, _ = sock.recvmsg(n, socket.CMSG_SPACE(_MAX_FDS * 4),
                                   flags | socket.MSG_CMSG_CLOEXEC)
    for f in fds_of(anc):
        close_received(f)
    return data
