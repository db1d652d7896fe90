"""Starts a sandbox that keeps the network (a world's `sandbox_network`) with a network of its own.

Run as a script, outside the sandbox, by `sandbox.wrap`:
`python3 -I -S netns.py SERVER-PID SLIRP4NETNS NSENTER IP BWRAP [BWRAP-OPTION]... -- COMMAND...`.
Sharing the server's network namespace would hand a tool the host's loopback (an unprotected Redis,
the server's own port) and every network the host is on. Instead bwrap unshares the network, and
slirp4netns joins the new namespace to the outside from user space, with the host's loopback
refused (`--disable-host-loopback`). Inside, before the command starts, routes refuse the private
ranges and every network the host itself is on: a tool reaches the internet and nothing nearer.

This process stays the parent of both, so that the caller sees one process: its stdio is the
sandbox's, its exit status the sandbox's, and its death ends both (bwrap's --die-with-parent, and
slirp4netns' --exit-fd, which is this process's to close). The command itself starts only on this
process's word, once the routes are in place (`_gate`). Standard library only: it runs before
anything else and must start fast.
"""
from __future__ import annotations

import ctypes
import fcntl
import ipaddress
import json
import os
import signal
import subprocess
import sys

RESOLV_CONF = b"nameserver 10.0.2.3\n"  # slirp4netns' DNS, which asks the host's resolver
SLIRP_NETWORK = ipaddress.ip_network("10.0.2.0/24")  # slirp4netns' own: the tap, its gateway, its DNS
# Never reachable from a sandbox: private, shared (CGNAT), link-local and "this" networks. The host's
# loopback is refused by slirp4netns itself; the sandbox's 127.0.0.1 is its own.
REFUSED = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16", "0.0.0.0/8")


def refused_networks(ip: str = "ip") -> list[str]:
    """`REFUSED` and the networks of the host's own addresses (an app bound to 0.0.0.0, the LAN)."""
    found = subprocess.run([ip, "-json", "-4", "addr", "show"], capture_output=True, check=True).stdout
    host = {str(ipaddress.ip_interface(f"{a['local']}/{a['prefixlen']}").network)
            for link in json.loads(found) for a in link.get("addr_info", ()) if a.get("family") == "inet"}
    networks = dict.fromkeys(ipaddress.ip_network(n) for n in (*REFUSED, *sorted(host)))
    # slirp4netns' own network stays reachable: its route is more specific than 10.0.0.0/8's, and
    # a host network as specific as it (a clash slirp4netns could not serve anyway) is left out.
    return [str(n) for n in networks
            if not n.is_loopback and not (n.overlaps(SLIRP_NETWORK) and n.prefixlen >= SLIRP_NETWORK.prefixlen)]


def _read_child_pid(info: int) -> int | None:
    """The sandbox's first pid, from bwrap's --info-fd (None: bwrap failed; it said why on stderr)."""
    data = b""
    while chunk := os.read(info, 4096):
        data += chunk
        try:
            return int(json.loads(data)["child-pid"])
        except ValueError:
            continue
    return None


def _gate(fd: int) -> list[str]:
    """What runs first in the sandbox: it starts the command only when it reads "go" on `fd`. End of
    file is no go, so a launcher that gives up, or dies however it dies (SIGKILL included), never lets
    the command run unfenced. (bwrap's --block-fd took end of file as the go, and the sandbox's first
    process outlives a killed bwrap.)"""
    return ["/bin/sh", "-c", f'read -r word <&{fd} && [ "$word" = go ] && exec "$@" {fd}<&-; exit 126', "gate"]


def _fail(sandbox: subprocess.Popen[bytes], reason: str) -> int:
    """Ends a sandbox whose command never got its go (`_gate`)."""
    exited = sandbox.poll()
    print(f"sandbox network: {reason}" + (f" (bwrap exited with {exited})" if exited is not None else ""),
          file=sys.stderr, flush=True)
    sandbox.kill()
    sandbox.wait()
    return 126


def _die_with_parent(server: int) -> bool:
    """Ends this process with the server, as bwrap's --die-with-parent did when bwrap was the server's
    child: a killed server must not leave a command running with the network. False: it is gone."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    return os.getppid() == server  # (it may have died before the prctl)


def _connect(pid: int, slirp: str, nsenter: str, ip: str) -> tuple[subprocess.Popen[bytes], int]:
    """Joins the sandbox's namespace (`pid`) to the outside and fences it: slirp4netns, and the fd
    whose closing ends it. Raises RuntimeError."""
    ready_r, ready_w = os.pipe()
    exit_r, exit_w = os.pipe()  # this process keeps exit_w: slirp4netns ends when it is closed
    # What it says while starting is the reason it failed (no /dev/net/tun in a container, …); once it
    # runs, the file may not grow (F_SEAL_GROW: a later write fails), so it never holds more than that.
    said = os.memfd_create("slirp4netns-stderr", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        net = subprocess.Popen(
            # Not --configure: it brings up lo, racing bwrap's own set-up of it ("loopback: Failed
            # RTM_NEWADDR"); the batch below configures tap0 instead.
            [slirp, "--mtu=65520", "--disable-host-loopback", "--enable-sandbox", "--enable-seccomp",
             f"--ready-fd={ready_w}", f"--exit-fd={exit_r}", str(pid), "tap0"],
            pass_fds=(ready_w, exit_r), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=said)
    except OSError as exc:
        raise RuntimeError(f"slirp4netns did not start: {exc}") from None
    finally:
        os.close(ready_w)
        os.close(exit_r)
    if os.read(ready_r, 1) != b"1":
        status = net.wait()
        lines = os.pread(said, 4096, 0).decode(errors="replace").strip().splitlines()
        raise RuntimeError(f"slirp4netns failed (exit status {status})" + (f": {lines[-1]}" if lines else ""))
    fcntl.fcntl(said, fcntl.F_ADD_SEALS, fcntl.F_SEAL_GROW)
    os.close(said)
    os.close(ready_r)
    # Joining the namespace's owner too where bwrap made one (an unprivileged server).
    enter = [nsenter, f"--target={pid}", "--net"] + ([] if os.geteuid() == 0 else ["--user", "--preserve-credentials"])
    batch = ("link set tap0 mtu 65520 up\naddr add 10.0.2.100/24 dev tap0\nroute add default via 10.0.2.2 dev tap0\n"
             + "".join(f"route add prohibit {network}\n" for network in refused_networks(ip)))
    done = subprocess.run([*enter, ip, "-batch", "-"], input=batch.encode(), capture_output=True)
    if done.returncode != 0:
        raise RuntimeError(f"could not fence the network: {done.stderr.decode(errors='replace').strip()}")
    return net, exit_w


def main(args: list[str]) -> int:
    if len(args) < 6 or not args[0].isdigit() or "--" not in args[5:]:
        print("usage: netns.py SERVER-PID SLIRP4NETNS NSENTER IP BWRAP [OPTION]... -- COMMAND...", file=sys.stderr)
        return 2
    server, slirp, nsenter, ip, *argv = args
    if not _die_with_parent(int(server)):
        print("sandbox network: the server that started it is gone", file=sys.stderr)
        return 126
    # Until the command starts, a SIGTERM (a stopping MCP client) ends the sandbox first (below).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    info_r, info_w = os.pipe()
    gate_r, gate_w = os.pipe()
    dns_r, dns_w = os.pipe()
    os.write(dns_w, RESOLV_CONF)
    os.close(dns_w)
    # Last among bwrap's options (before its `--`), so that the resolv.conf lies over /etc's bind; on
    # its target, where it is a symlink (systemd-resolved's, into /run).
    end = argv.index("--", 1)
    ours = ["--info-fd", str(info_w), "--perms", "0644", "--ro-bind-data", str(dns_r),
            os.path.realpath("/etc/resolv.conf")]
    sandbox = subprocess.Popen([*argv[:end], *ours, "--", *_gate(gate_r), *argv[end + 1:]],
                               pass_fds=(info_w, gate_r, dns_r))
    for fd in (info_w, gate_r, dns_r):
        os.close(fd)
    try:
        pid = _read_child_pid(info_r)
        if pid is None:
            return sandbox.wait()
        net, net_exit = _connect(pid, slirp, nsenter, ip)
    except BaseException as exc:  # whatever it was: no "go", so the command never starts
        os.close(gate_w)
        return _fail(sandbox, str(exc) if isinstance(exc, RuntimeError) else f"{type(exc).__name__}: {exc}")
    os.write(gate_w, b"go\n")  # the command starts now, with the routes in place
    os.close(gate_w)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # from now on it ends this process, and so the sandbox
    status = sandbox.wait()
    os.close(net_exit)  # slirp4netns exits
    net.wait()
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
