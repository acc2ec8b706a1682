# Others' produce latency while one tenant deletes a stream of 3 x 1000 partitions (each with data)
import os, sys, threading; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__))); from bc import *
p, cp, hp, d = start_server("t21")
c = Conn(cp, timeout=300); c.call(10, s("evil")); c.call(10, s("good")); c.call(20, s("good")+s("t")+topic_settings())
for i in range(3):
    print(errmsg(*c.call(20, s("evil")+s(f"b{i}")+topic_settings(partitions=1000))[2:]))
    rids = [c.send(30, s("evil")+s(f"b{i}")+u32(j)+by(batch([b"x"*100]))) for j in range(1000)]
    for _ in rids: c.recv()
lat = []; stop = False
def producer():
    v = Conn(cp)
    while not stop:
        t = time.time(); r = v.call(30, s("good")+s("t")+u32(0)+by(batch([b"v"*1000]))); lat.append(time.time()-t)
th = threading.Thread(target=producer); th.start(); time.sleep(2); base = len(lat)
t = time.time(); r = c.call(11, s("evil")); print("DeleteStream:", errmsg(r[2], r[3]), f"{time.time()-t:.1f}s")
time.sleep(1); stop = True; th.join()
def st(xs):
    xs = sorted(x*1000 for x in xs); n = len(xs); return f"n={n} p50={xs[n//2]:.1f}ms p99={xs[int(n*.99)]:.1f}ms max={xs[-1]:.1f}ms"
print("produce before", st(lat[:base]), "| during", st(lat[base:]))
p.send_signal(signal.SIGTERM); p.wait()
