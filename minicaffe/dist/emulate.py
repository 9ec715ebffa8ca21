"""An emulated cluster on one machine: each node in its own network namespace, on a shaped link.

    sudo python -m minicaffe.dist.emulate --nodes 4 --bandwidth 1gbit --delay 0.1ms -- \\
        python -m minicaffe.train lenet --iters 200

builds, for N nodes (names carry this process's id, addresses come from 198.18.0.0/15, the
range set aside for benchmarking networks)::

    namespace mc<pid>sw:   bridge br0 (the switch)
    namespace mc<pid>n<r>: eth0 = 198.18.0.<r+1>/24, one end of a veth pair whose other end
                           is a port of br0; lo up
    each direction of each link shaped by tc: netem delay <delay> rate <bandwidth> on the
    node's eth0 (node -> switch) and on the switch port (switch -> node); where the kernel
    has no netem, tbf shapes the rate and the latency is not emulated (it says so)

then runs the command once per namespace with MINICAFFE_RANK, MINICAFFE_WORLD_SIZE,
MINICAFFE_RENDEZVOUS=198.18.0.1:29500 and a fresh MINICAFFE_DIST_SECRET in its environment
(``{rank}`` in the command is replaced by the node's rank).  Node 0's output is shown; the
others' goes to files named at start-up.  Everything is removed on exit, also after an error,
Ctrl-C or SIGTERM.  It needs root and iproute2 (``ip netns``, ``tc``); without them it says so.
Where namespaces are not allowed, ``--link 1gbit`` on the train tool emulates the link inside
the transport instead (a token bucket per connection).
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from .transport import DistError, new_secret, parse_delay, parse_rate

SUBNET = "198.18.0"
PORT = 29500


def why_not():
    """None if namespaces can be made here, else the reason."""
    if os.geteuid() != 0:
        return "network namespaces need root (run with sudo), or use --link RATE on the train tool instead"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"'{tool}' (iproute2) is not installed; use --link RATE on the train tool instead"
    probe = f"mcprobe{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"'ip netns add' failed ({r.stderr.strip()}); use --link RATE on the train tool instead"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _run(*cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise DistError(f"'{' '.join(cmd)}' failed: {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout


def tbf_burst(rate_bytes):
    """tbf's bucket for a link of ``rate_bytes``/s: a whole GSO segment (64 KiB) and a tick's worth
    of bytes at least, 10 ms of traffic (after an idle spell that much passes at once: the
    simulator models it, ``simulate.Link.burst``)."""
    return int(max(256 * 1024, rate_bytes / 100))


class Cluster:
    """``with Cluster(4, "1gbit", "0.1ms") as c: c.popen(rank, argv, env)``; removed on exit."""

    def __init__(self, nodes, bandwidth="1gbit", delay="0.1ms", tag=None):
        if not 1 <= nodes <= 250:
            raise DistError(f"--nodes must be in 1..250, got {nodes}")
        reason = why_not()
        if reason:
            raise DistError(reason)
        self.n = nodes
        self.rate_bytes = parse_rate(bandwidth)
        self.delay_s = parse_delay(delay)
        self.bandwidth, self.delay = bandwidth, delay
        self.tag = tag or f"mc{os.getpid()}"
        self.switch = f"{self.tag}sw"
        self.names = [f"{self.tag}n{r}" for r in range(nodes)]
        self.made = []
        self.netem = True
        self.notes = []  # what could not be emulated here

    def address(self, rank):
        return f"{SUBNET}.{rank + 1}"

    @property
    def rendezvous(self):
        return f"{self.address(0)}:{PORT}"

    def __enter__(self):
        try:
            self._build()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc):
        self.remove()
        return False

    def _shape(self, ns, dev):
        """Shape one direction of a link: netem (latency + rate) where the kernel has it, else
        tbf for the rate alone (the latency is then not emulated; said once at start-up)."""
        rate_bit = int(self.rate_bytes * 8)
        tc = ["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", dev, "root"]
        if self.netem:
            r = subprocess.run(
                [*tc, "netem", "delay", f"{self.delay_s * 1e6:.0f}us", "rate", f"{rate_bit}bit", "limit", "100000"],
                capture_output=True,
                text=True,
            )
            if r.returncode == 0:
                return
            if "unknown" not in r.stderr.lower():
                raise DistError(f"tc netem on {ns}/{dev} failed: {r.stderr.strip()}")
            self.netem = False
            self.notes.append(
                "this kernel has no netem qdisc (sch_netem): links are rate-shaped with tbf, "
                f"the {self.delay} latency is not emulated"
            )
        burst = tbf_burst(self.rate_bytes)
        _run(*tc, "tbf", "rate", f"{rate_bit}bit", "burst", str(burst), "latency", "200ms")

    def _build(self):
        _run("ip", "netns", "add", self.switch)
        self.made.append(self.switch)
        sw = ["ip", "netns", "exec", self.switch]
        _run(*sw, "ip", "link", "add", "br0", "type", "bridge")
        _run(*sw, "ip", "link", "set", "br0", "up")
        for r, ns in enumerate(self.names):
            _run("ip", "netns", "add", ns)
            self.made.append(ns)
            a, b = f"{self.tag}a{r}"[-15:], f"{self.tag}b{r}"[-15:]
            _run("ip", "link", "add", a, "type", "veth", "peer", "name", b)
            _run("ip", "link", "set", a, "netns", ns)
            _run("ip", "link", "set", b, "netns", self.switch)
            nx = ["ip", "netns", "exec", ns]
            _run(*nx, "ip", "link", "set", a, "name", "eth0")
            _run(*nx, "ip", "addr", "add", f"{self.address(r)}/24", "dev", "eth0")
            _run(*nx, "ip", "link", "set", "eth0", "up")
            _run(*nx, "ip", "link", "set", "lo", "up")
            _run(*sw, "ip", "link", "set", b, "master", "br0")
            _run(*sw, "ip", "link", "set", b, "up")
            self._shape(ns, "eth0")
            self._shape(self.switch, b)

    def remove(self):
        """Delete every namespace made (their veth pairs and qdiscs go with them)."""
        for ns in reversed(self.made):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.made = []

    def popen(self, rank, argv, env=None, **kwargs):
        return subprocess.Popen(["ip", "netns", "exec", self.names[rank], *argv], env=env, **kwargs)


def leftovers():
    """Namespaces a killed run may have left (names mc<pid>n<r> / mc<pid>sw)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith("mc") and line.split()[0][2:3].isdigit()]


def wait_all(procs, grace=15.0):
    """Wait for every process; once one fails, give the others ``grace`` seconds, then kill them.
    -> the first non-zero exit status (0 if none)."""
    code, deadline = 0, None
    while any(q.poll() is None for q in procs):
        bad = [q.returncode for q in procs if q.returncode not in (None, 0)]
        if bad and deadline is None:
            code, deadline = bad[0], time.monotonic() + grace
        if deadline is not None and time.monotonic() > deadline:
            for q in procs:
                if q.poll() is None:
                    q.kill()
        time.sleep(0.1)
    return code or next((q.returncode for q in procs if q.returncode), 0)


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m minicaffe.dist.emulate",
        description="run a command on N emulated machines (network namespaces joined by shaped links)",
    )
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--bandwidth", default="1gbit", help="each link's rate, each way (default 1gbit)")
    p.add_argument("--delay", default="0.1ms", help="each link's one-way latency (default 0.1ms)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command every node runs")
    args = p.parse_args(argv)
    cmd = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not cmd:
        p.error("give the command after --, e.g. -- python -m minicaffe.train lenet")
    secret = os.environ.get("MINICAFFE_DIST_SECRET") or new_secret()
    logs = None
    procs, files = [], []

    def on_term(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    code = 0
    try:
        with Cluster(args.nodes, args.bandwidth, args.delay) as c:
            logs = tempfile.mkdtemp(prefix="minicaffe-emulate-")
            print(
                f"emulate: {args.nodes} nodes {c.address(0)}..{c.address(args.nodes - 1)} on links of "
                f"{args.bandwidth} each way, {args.delay} one-way; rendezvous {c.rendezvous}; "
                f"nodes 1..{args.nodes - 1} log to {logs}/",
                file=sys.stderr,
                flush=True,
            )
            for note in c.notes:
                print(f"emulate: {note}", file=sys.stderr, flush=True)
            try:
                for r in range(args.nodes):
                    env = dict(os.environ, MINICAFFE_DIST_SECRET=secret, MINICAFFE_RANK=str(r))
                    env.update(MINICAFFE_WORLD_SIZE=str(args.nodes), MINICAFFE_RENDEZVOUS=c.rendezvous)
                    env["MINICAFFE_LOCAL_NODES"] = str(args.nodes)  # they share this machine's cores
                    env["MINICAFFE_LINK_RATE"] = args.bandwidth  # what the hybrid rule plans with
                    argv_r = [a.replace("{rank}", str(r)) for a in cmd]
                    if r == 0:
                        procs.append(c.popen(r, argv_r, env))
                    else:
                        f = open(os.path.join(logs, f"node{r}.log"), "w")  # noqa: SIM115
                        files.append(f)
                        procs.append(c.popen(r, argv_r, env, stdout=f, stderr=subprocess.STDOUT))
                code = wait_all(procs)
            except KeyboardInterrupt:  # stop the nodes before their namespaces go
                for q in procs:
                    if q.poll() is None:
                        q.send_signal(signal.SIGINT)
                for q in procs:
                    try:
                        q.wait(20)
                    except subprocess.TimeoutExpired:
                        q.kill()
                print("emulate: interrupted; the namespaces are removed", file=sys.stderr)
                return 130
    except DistError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
        for f in files:
            f.close()
    if code == 0 and logs:
        shutil.rmtree(logs, ignore_errors=True)
    else:
        print(f"emulate: a node failed (exit {code}); node logs kept in {logs}/", file=sys.stderr)
    return 1 if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
