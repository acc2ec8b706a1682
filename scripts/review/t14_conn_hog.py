# One logged-in tenant takes every connection slot (connections_max is node-wide, not per user)
import sys; from authlib import *
CM = int(sys.argv[1])
p, cp, hp, d = start_auth("t14", extra_env={"BRAID_CONNECTIONS_MAX": str(CM)})
a = admin(cp); a.call(10, s("evil")); a.call(10, s("good"))
a.call(50, user_body("mallory", "m")); a.call(53, grant("mallory", 2, "evil", 1))
a.call(50, user_body("alice", "a")); a.call(53, grant("alice", 2, "good", 1))
a.close()
# fast login reusing the salted password
def fast_login(c, user, sp, stored):
    cn = base64.b64encode(os.urandom(9)).decode(); fb = f"n={user},r={cn}"
    r = c.call(2, s("SCRAM-SHA-256")+by(("n,,"+fb).encode())); sf = r[3][4:].decode()
    parts = dict(x.split("=",1) for x in sf.split(","))
    fw = f"c=biws,r={parts['r']}"; am = f"{fb},{sf},{fw}".encode()
    proof = bytes(x^y for x,y in zip(HM(sp,b"Client Key"), HM(stored, am)))
    r = c.call(2, s("SCRAM-SHA-256")+by(f"{fw},p={base64.b64encode(proof).decode()}".encode())); return r[2], parts
c0 = Conn(cp); r = c0.call(2, s("SCRAM-SHA-256")+by(b"n,,n=mallory,r=x")); parts = dict(x.split("=",1) for x in r[3][4:].decode().split(","))
sp, stored, _ = scram_keys("m", base64.b64decode(parts["s"]), int(parts["i"])); c0.close()
hog = []; t0 = time.time()
for i in range(CM + 50):
    try:
        c = Conn(cp, src=f"127.0.{3+i//200}.{1+i%200}", timeout=5); st, _ = fast_login(c, "mallory", sp, stored)
        if st == 0: hog.append(c)
        else: break
    except Exception as e: break
print(f"mallory holds {len(hog)} logged-in connections (connections_max {CM}) after {time.time()-t0:.1f}s")
ok = 0
for i in range(20):
    try:
        c = Conn(cp, src="127.0.250.1", timeout=5); st, m = login(c, "alice", "a"); ok += (st == 0); c.close()
    except Exception as e: last = e
print(f"alice logins that succeeded: {ok}/20; node rss {rss(p.pid)} MB")
os.system("curl -s http://127.0.0.1:%d/metrics | grep -E '^braid_connections_(refused|active)'" % hp)
os.system(f"grep -E 'refus' {WORK}/log_t14.txt | tail -2 | cut -c1-250")
p.send_signal(signal.SIGTERM); p.wait()
