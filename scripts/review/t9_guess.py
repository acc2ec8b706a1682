# Login guessing against one user from many loopback source addresses (127.0.0.x)
import threading, sys
from authlib import *
p, cp, hp, d = start_auth("t9")
a = admin(cp); a.call(50, user_body("victim", "right-password"))
NSRC = int(sys.argv[1]); PER = int(sys.argv[2]); DUR = 20
fails = []; other = {}; stop = False
def worker(src):
    while not stop:
        try:
            c = Conn(cp, src=src, timeout=15)
            st, m = login(c, "victim", "wrong%d" % len(fails))
            if st == 60: fails.append(time.time())
            else: other[m[:60]] = other.get(m[:60], 0)+1
            c.close()
        except Exception as e: other[str(e)[:60]] = other.get(str(e)[:60], 0)+1; time.sleep(0.05)
ts = [threading.Thread(target=worker, args=(f"127.0.0.{2+i%NSRC}",), daemon=True) for i in range(NSRC*PER)]
t0 = time.time(); [t.start() for t in ts]; time.sleep(DUR); stop = True
n = len([f for f in fails if f - t0 > 5])
print(f"{NSRC} sources x {PER} conns: {len(fails)} failed logins in {DUR}s; steady rate (after 5 s) {n/(DUR-5):.1f}/s; other: {other}")
time.sleep(1)
c = Conn(cp, src="127.0.0.200"); t = time.time(); st, m = login(c, "victim", "right-password"); print(f"right password: {m} after {time.time()-t:.2f}s")
os.system("curl -s http://127.0.0.1:%d/metrics | grep -E 'logins_delayed|authentication_failures|refused_unauth'" % hp)
p.send_signal(signal.SIGTERM); p.wait()
