# Readers that read nothing, renewed continuously from many source addresses; victim consumer latency
import os, threading, sys, socket
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); from bc import *
p, cp, hp, d = start_server("t10", extra_env={"BRAID_FSYNC":"never"}, extra_args=["--fsync","never"])
c = Conn(cp); c.call(10, s("st")); print(errmsg(*c.call(20, s("st")+s("big")+topic_settings(partitions=8))[2:]))
B = batch([b"z"*(1<<20) for _ in range(3)])  # ~3 MiB keyless
for part in range(8):
    rids = [c.send(30, s("st")+s("big")+u32(part)+by(B)) for _ in range(30)]  # ~90 MiB per partition
    for _ in rids: r = c.recv(); assert r[2]==0, errmsg(r[2], r[3])
print("loaded; rss", rss(p.pid))
NSRC, PER, DUR = int(sys.argv[1]), int(sys.argv[2]), 30
stop = False
def attacker(src, k):
    while not stop:
        try:
            a = Conn(cp, src=src, timeout=60)
            a.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            for j in range(8): a.send(31, s("st")+s("big")+u32((k+j)%8)+u64(0)+u32(64<<20)+u32(0))
            while not stop:
                time.sleep(0.2)
                try: a.sock.send(b"")  # noop
                except Exception: break
                # detect close
                a.sock.setblocking(False)
                try:
                    x = a.sock.recv(1, socket.MSG_PEEK)
                    if x == b"": break
                except BlockingIOError: pass
                except Exception: break
                a.sock.setblocking(True)
            a.close()
        except Exception: time.sleep(0.1)
lat = []; tt = []; T0 = time.time()
def victim():
    v = Conn(cp, src="127.0.0.250", timeout=120)
    while not stop:
        t = time.time(); r = v.call(31, s("st")+s("big")+u32(3)+u64(0)+u32(4<<20)+u32(0)); lat.append(time.time()-t); tt.append(t-T0)
        time.sleep(0.05)
vt = threading.Thread(target=victim, daemon=True); vt.start(); time.sleep(3)
base = len(lat); peak = 0
ts = [threading.Thread(target=attacker, args=(f"127.0.1.{1+i%NSRC}", i), daemon=True) for i in range(NSRC*PER)]
[t.start() for t in ts]
t0 = time.time()
while time.time() - t0 < DUR: time.sleep(1); peak = max(peak, rss(p.pid))
stop = True; time.sleep(2)
def st(xs):
    xs = sorted(x*1000 for x in xs); n = len(xs)
    return f"n={n} p50={xs[n//2]:.0f}ms p99={xs[int(n*.99)]:.0f}ms max={xs[-1]:.0f}ms" if n else "none"
print("slow victim fetches (t, ms):", [(round(t,1), round(l*1000)) for t,l in zip(tt[base:], lat[base:]) if l>0.5]); print(f"victim 4 MiB fetch before: {st(lat[:base])}; during {NSRC}x{PER} hostile readers: {st(lat[base:])}; node peak rss {peak} MB")
os.system("curl -s http://127.0.0.1:%d/metrics | grep -E '^braid_(fetch_budget_waits|connections_closed_stalled|connections_closed_deadline)'" % hp)
p.send_signal(signal.SIGTERM); p.wait()
