#!/usr/bin/env python3
"""mpu's TCPStore and PyTorch's speak the same protocol, both ways:
torch.distributed.TCPStore serves and mpu's client (store_peer client) reads
torch's keys, writes its own, adds, compare-sets, waits (timing out, then a
key set later); then mpu's server (store_peer serve) is used by torch's
TCPStore client (is_master=False) and PrefixStore: every Store call.
Last, under torchrun itself (its elastic agent serving the store,
TORCHELASTIC_USE_AGENT_STORE=True): three ranks of store_peer rendezvous
share rank 0's blob and see rank 1's abort.
Exits 77 (skipped) when this python3 cannot import torch.

usage: test_store_torch.py STORE_PEER
"""
import subprocess
import sys
import threading
import time
from datetime import timedelta

try:
    import torch.distributed as dist
except ImportError as e:
    print("SKIP: this Python cannot import torch (%s); scripts/pyenv.sh installs it where it can" % e)
    sys.exit(77)

peer = sys.argv[1]


def check(ok, what):
    if not ok:
        raise SystemExit("FAIL: " + what)


# ---- torch serves, mpu's client asks ----
master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                       timeout=timedelta(seconds=30))
master.set("from_torch", b"hello")
master.add("counter", 2)
threading.Timer(0.5, lambda: master.set("late", b"1")).start()
done = subprocess.run([peer, "client", str(master.port)], capture_output=True, text=True,
                      timeout=120)
check(done.returncode == 0, "mpu's client on torch's store: " + done.stderr)
check(master.get("from_mpu") == b"bytes\x00x", "torch reads mpu's binary value")
check(master.add("counter", 0) == 7, "mpu's add on torch's counter")
check(master.get("cas") == b"first", "mpu's compare_set")
check(dist.PrefixStore("pre", master).get("k") == b"pv", "mpu's prefix is PrefixStore's")
print("torch server, mpu client: OK")

# ---- mpu serves, torch's client asks ----
srv = subprocess.Popen([peer, "serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
try:
    port = int(srv.stdout.readline().split()[1])
    a = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
    b = dist.TCPStore("localhost", port, is_master=False, timeout=timedelta(seconds=30))
    a.set("k", b"v")
    check(b.get("k") == b"v", "get")
    check(a.add("n", 3) == 3 and b.add("n", -1) == 2, "add")
    check(a.get("n") == b"2", "add keeps decimal text")
    check(a.compare_set("c", "", "x") == b"x", "compare_set of a missing key")
    check(a.compare_set("c", "y", "z") == b"x", "compare_set with a wrong expectation")
    check(a.compare_set("c", "x", "z") == b"z", "compare_set")
    check(a.check(["k", "n"]) and not a.check(["k", "nothing"]), "check")
    t0 = time.time()
    try:
        a.wait(["nothing"], timedelta(milliseconds=300))
        check(False, "wait should time out")
    except Exception as e:  # torch raises DistStoreError
        check("timeout" in str(e).lower(), "wait timed out: %s" % e)
    check(time.time() - t0 < 10, "wait timeout in time")
    check(a.get("k") == b"v", "the connection works after a cancelled wait")
    threading.Timer(0.3, lambda: b.set("later", b"1")).start()
    a.wait(["later"], timedelta(seconds=20))  # answered when another client sets it
    a.append("ap", b"ab")
    a.append("ap", b"cd")
    check(b.get("ap") == b"abcd", "append")
    a.multi_set(["m1", "m2"], [b"1", b"2"])
    check(b.multi_get(["m1", "m2"]) == [b"1", b"2"], "multi_set / multi_get")
    n = a.num_keys()
    check(a.delete_key("m1") and not a.delete_key("m1"), "delete_key")
    check(a.num_keys() == n - 1, "num_keys")
    p = dist.PrefixStore("pre", a)
    p.set("q", b"w")
    check(b.get("pre/q") == b"w", "PrefixStore on mpu's server")
    print("mpu server, torch client: OK")
finally:
    srv.stdin.close()
    srv.wait(timeout=30)
check(srv.returncode == 0, "store_peer serve exited %s" % srv.returncode)

# ---- under torchrun: the agent's store ----
done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                       "--nproc-per-node", "3", "--no-python", peer, "rendezvous"],
                      capture_output=True, text=True, timeout=240)
oks = [l for l in done.stdout.splitlines() if "the agent's store, ok=1" in l]
check(done.returncode == 0 and len(oks) == 3,
      "torchrun: exit %d\n%s\n%s" % (done.returncode, done.stdout, done.stderr[-3000:]))
print("torchrun, the agent's store: OK")
