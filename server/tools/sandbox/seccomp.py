"""The seccomp filter of every sandbox: the system calls tools never need are refused with EPERM.

A classic BPF program, as bwrap's `--seccomp FD` loads it, built here in pure Python (libseccomp's
bindings are not on PyPI). It refuses what would let a tool reach past its sandbox or the kernel's
defences: a new user namespace (the "root" with network-admin rights that `unshare -Urn` gave),
joining a namespace, tracing or reading another process, eBPF, the kernel keyring, mounts, kernel
modules and kexec, perf events, userfaultfd, file handles, swap and reboot. Only the native ABI
passes: an i386 (`int 0x80`), x32 or arm32 call would reach another syscall table, so all of them
are refused. The program lives in a sealed memfd for the process's life; `launcher` opens it for bwrap.
"""
from __future__ import annotations

import errno
import fcntl
import os
import platform
import struct

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6] (little-endian:
# the low half of args[0] is at 16).
_NR, _ARCH, _ARG0_LOW = 0, 4, 16
# Classic BPF opcodes (linux/filter.h) and seccomp return values (linux/seccomp.h).
_LD_W_ABS, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
CLONE_NEWUSER = 0x10000000
X32_SYSCALL_BIT = 0x40000000

# The refused calls, by name; `clone` and `unshare` only with CLONE_NEWUSER, `clone3` (whose flags lie
# in memory a filter cannot read) with ENOSYS, so that libc falls back to `clone`.
REFUSED = ("ptrace", "process_vm_readv", "process_vm_writev", "bpf", "keyctl", "add_key", "request_key",
           "mount", "umount2", "pivot_root", "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount",
           "mount_setattr", "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
           "perf_event_open", "userfaultfd", "open_by_handle_at", "swapon", "swapoff", "reboot", "setns")
# (AUDIT_ARCH_*, syscall numbers) for each machine the server runs on (asm/unistd_64.h, asm-generic/unistd.h).
ARCHES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (0xC000003E, {
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "bpf": 321, "keyctl": 250,
        "add_key": 248, "request_key": 249, "mount": 165, "umount2": 166, "pivot_root": 155,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
        "mount_setattr": 442, "kexec_load": 246, "kexec_file_load": 320, "init_module": 175,
        "finit_module": 313, "delete_module": 176, "perf_event_open": 298, "userfaultfd": 323,
        "open_by_handle_at": 304, "swapon": 167, "swapoff": 168, "reboot": 169, "setns": 308,
        "clone": 56, "unshare": 272, "clone3": 435}),
    "aarch64": (0xC00000B7, {
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "bpf": 280, "keyctl": 219,
        "add_key": 217, "request_key": 218, "mount": 40, "umount2": 39, "pivot_root": 41,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
        "mount_setattr": 442, "kexec_load": 104, "kexec_file_load": 294, "init_module": 105,
        "finit_module": 273, "delete_module": 106, "perf_event_open": 241, "userfaultfd": 282,
        "open_by_handle_at": 265, "swapon": 224, "swapoff": 225, "reboot": 142, "setns": 268,
        "clone": 220, "unshare": 97, "clone3": 435}),
}
ARCHES["arm64"] = ARCHES["aarch64"]

# One instruction: (code, jump-if-true label, jump-if-false label, k); labels are resolved by `_assemble`.
_Insn = tuple[int, str, str, int]


def program(machine: str | None = None) -> bytes:
    """The filter for `machine` (default: this one's) as bwrap reads it: struct sock_filter[].
    Raises ValueError for a machine it has no syscall table for."""
    machine = machine or platform.machine()
    if machine not in ARCHES:
        raise ValueError(f"no seccomp filter for this machine ({machine})")
    arch, numbers = ARCHES[machine]
    code: list[tuple[str, _Insn]] = [
        ("", (_LD_W_ABS, "", "", _ARCH)),
        ("", (_JEQ_K, "", "deny", arch)),  # another ABI: its numbers mean other calls
        ("", (_LD_W_ABS, "", "", _NR)),
    ]
    if machine == "x86_64":  # x32 calls: the same table with this bit set
        code.append(("", (_JGE_K, "deny", "", X32_SYSCALL_BIT)))
    code += [("", (_JEQ_K, "deny", "", numbers[name])) for name in REFUSED]
    code += [
        ("", (_JEQ_K, "flags", "", numbers["clone"])),
        ("", (_JEQ_K, "flags", "", numbers["unshare"])),
        ("", (_JEQ_K, "nosys", "", numbers["clone3"])),
        ("", (_RET_K, "", "", RET_ALLOW)),
        ("flags", (_LD_W_ABS, "", "", _ARG0_LOW)),
        ("", (_JSET_K, "deny", "allow", CLONE_NEWUSER)),
        ("allow", (_RET_K, "", "", RET_ALLOW)),  # (twice: classic BPF jumps forward only)
        ("deny", (_RET_K, "", "", RET_ERRNO | errno.EPERM)),
        ("nosys", (_RET_K, "", "", RET_ERRNO | errno.ENOSYS)),
    ]
    return _assemble(code)


def _assemble(code: list[tuple[str, _Insn]]) -> bytes:
    """Packs the instructions, turning labels into forward offsets ("" for the next instruction)."""
    where = {label: index for index, (label, _) in enumerate(code) if label}
    out = b""
    for index, (_, (op, yes, no, k)) in enumerate(code):
        jt, jf = (where[label] - index - 1 if label else 0 for label in (yes, no))
        if not (0 <= jt < 256 and 0 <= jf < 256):
            raise ValueError("seccomp filter: a jump out of range")
        out += struct.pack("=HBBI", op, jt, jf, k)
    return out


_memfd: tuple[int, int] | None = None  # (descriptor, inode)


def launcher(fd: int) -> list[str]:
    """What starts bwrap with the filter on `fd`: a shell that opens it, by this process's /proc (so
    that the command line alone suffices, whoever starts it: an MCP client passes no descriptors), and
    then becomes bwrap. bwrap reads it whole before the sandbox starts. Raises ValueError (no filter
    for this machine) or OSError."""
    global _memfd
    if _memfd is None or not _ours(_memfd[0], _memfd[1]):  # (a stray close could hand its number to a pipe)
        made = os.memfd_create("agent-world-seccomp", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.write(made, program())
        # Sealed: nothing in this process can change the filter once it is written.
        fcntl.fcntl(made, fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
        _memfd = (made, os.fstat(made).st_ino)
    return ["/bin/sh", "-c", f'exec "$@" {fd}<"$0"', f"/proc/{os.getpid()}/fd/{_memfd[0]}"]


def _ours(fd: int, inode: int) -> bool:
    try:
        return os.fstat(fd).st_ino == inode
    except OSError:
        return False
