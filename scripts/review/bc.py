"""Minimal raw Braid client for attack experiments (from docs/protocol.md and docs/format.md)."""
import socket, struct, os, base64, hmac, hashlib, time, subprocess, signal

# ---------- crc32c ----------
_T = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    _T.append(c)
def crc32c(b):
    c = 0xFFFFFFFF
    for x in b:
        c = _T[(c ^ x) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF
assert crc32c(b"123456789") == 0xE3069283

def s(x):
    if isinstance(x, str): x = x.encode()
    return struct.pack(">H", len(x)) + x
def by(x): return struct.pack(">I", len(x)) + x
def u8(x): return struct.pack(">B", x)
def u16(x): return struct.pack(">H", x)
def u32(x): return struct.pack(">I", x)
def u64(x): return struct.pack(">Q", x)
def i64(x): return struct.pack(">q", x)

def varint(n, bits=32):
    z = (n << 1) ^ (n >> (bits - 1))
    z &= (1 << bits) - 1 if bits == 32 else (1 << 64) - 1
    out = b""
    while True:
        b = z & 0x7F; z >>= 7
        if z: out += bytes([b | 0x80])
        else:
            out += bytes([b]); return out

def record(i, key, value, ts_delta=0):
    body = b"\x00" + varint(ts_delta, 64) + varint(i)
    body += varint(-1) if key is None else varint(len(key)) + key
    body += varint(-1) if value is None else varint(len(value)) + value
    body += varint(0)
    return varint(len(body)) + body

def batch(values, key=None, base_ts=None, ts_deltas=None, max_ts=None):
    if base_ts is None: base_ts = int(time.time() * 1000)
    if ts_deltas is None: ts_deltas = [0] * len(values)
    recs = b"".join(record(i, key, v, ts_deltas[i]) for i, v in enumerate(values))
    if max_ts is None: max_ts = base_ts + max(ts_deltas)
    after = struct.pack(">hiqqqhii", 0, len(values) - 1, base_ts, max_ts, -1, -1, -1, len(values)) + recs
    crc = crc32c(after)
    rest = struct.pack(">ibI", -1, 2, crc) + after
    return struct.pack(">qi", 0, len(rest)) + rest

def topic_settings(partitions=1, fsync=0, fsync_interval_ms=0, retention_bytes=0, retention_ms=0, max_batch_bytes=0, segment_bytes=0):
    return u32(partitions) + u8(fsync) + u64(fsync_interval_ms) + u64(retention_bytes) + u64(retention_ms) + u32(max_batch_bytes) + u32(segment_bytes)

ERR = {0:"OK",1:"MalformedRequest",2:"UnknownCommand",3:"FrameTooLarge",4:"InvalidArgument",10:"StreamNotFound",11:"StreamExists",12:"TopicNotFound",13:"TopicExists",14:"PartitionNotFound",20:"InvalidBatch",21:"BatchTooLarge",22:"OffsetOutOfRange",23:"NotLeader",30:"GroupNotFound",31:"UnknownMember",32:"StaleGeneration",33:"NotAssigned",40:"StorageError",41:"ShuttingDown",42:"Busy",43:"QuotaExceeded",50:"Internal",60:"AuthenticationFailed",61:"NotAuthenticated",62:"PermissionDenied",63:"UserNotFound",64:"UserExists"}

class Conn:
    def __init__(self, port, host="127.0.0.1", src=None, timeout=30):
        self.sock = socket.socket()
        if src: self.sock.bind((src, 0))
        self.sock.settimeout(timeout)
        self.sock.connect((host, port))
        self.rid = 0
        self.buf = b""
    def send_raw(self, b): self.sock.sendall(b)
    def frame(self, cmd, body, rid=None):
        if rid is None:
            self.rid += 1; rid = self.rid
        return struct.pack(">IQH", 10 + len(body), rid, cmd) + body, rid
    def send(self, cmd, body, rid=None):
        f, rid = self.frame(cmd, body, rid)
        self.sock.sendall(f); return rid
    def _readn(self, n):
        while len(self.buf) < n:
            d = self.sock.recv(1 << 20)
            if not d: raise EOFError("closed")
            self.buf += d
        r, self.buf = self.buf[:n], self.buf[n:]
        return r
    def recv(self):
        ln = struct.unpack(">I", self._readn(4))[0]
        body = self._readn(ln)
        rid, cmd, st = struct.unpack(">QHH", body[:12])
        return rid, cmd, st, body[12:]
    def call(self, cmd, body):
        rid = self.send(cmd, body)
        while True:
            r = self.recv()
            if r[0] == rid or r[0] == 0: return r
    def close(self): self.sock.close()

def errmsg(st, body):
    if st == 0: return "OK"
    try:
        n = struct.unpack(">H", body[:2])[0]; return f"{ERR.get(st,st)}: {body[2:2+n].decode(errors='replace')}"
    except Exception: return f"{ERR.get(st,st)} <{body[:40]!r}>"

# ---------- SCRAM ----------
def H(b): return hashlib.sha256(b).digest()
def HM(k, m): return hmac.new(k, m, hashlib.sha256).digest()
def scram_keys(password, salt, it):
    sp = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, it)
    return sp, H(HM(sp, b"Client Key")), HM(sp, b"Server Key")

def login(c, user, password, mech="SCRAM-SHA-256"):
    cn = base64.b64encode(os.urandom(12)).decode()
    first_bare = f"n={user},r={cn}"
    rid, cmd, st, body = c.call(2, s(mech) + by(("n,," + first_bare).encode()))
    if st: return st, errmsg(st, body)
    sf = body[4:].decode()
    parts = dict(p.split("=", 1) for p in sf.split(","))
    salt = base64.b64decode(parts["s"]); it = int(parts["i"]); nonce = parts["r"]
    sp, stored, server = scram_keys(password, salt, it)
    final_wo = f"c=biws,r={nonce}"
    am = f"{first_bare},{sf},{final_wo}".encode()
    ck = HM(sp, b"Client Key"); sig = HM(stored, am)
    proof = bytes(a ^ b for a, b in zip(ck, sig))
    rid, cmd, st, body = c.call(2, s(mech) + by(f"{final_wo},p={base64.b64encode(proof).decode()}".encode()))
    return st, errmsg(st, body)

def user_body(name, password, salt=None, it=4096):
    salt = salt or os.urandom(16)
    _, stored, server = scram_keys(password, salt, it)
    return s(name) + by(salt) + u32(it) + by(stored) + by(server)

# ---------- server ----------
BIN = os.path.abspath(os.environ.get("BRAID_BIN", "target/release/braid"))
# Data directories and server logs (on the real disk: /tmp is, here).
WORK = os.environ.get("REVIEW_DIR", "/tmp/braid-review")
os.makedirs(WORK, exist_ok=True)
def start_server(tag, extra_env=None, extra_args=(), config=None):
    import random
    cp = random.randint(20000, 50000); hp = cp + 1
    d = f"{WORK}/data_{tag}"
    import shutil; shutil.rmtree(d, ignore_errors=True)  # a fresh node each run
    env = dict(os.environ); env.pop("RUST_BACKTRACE", None)
    if extra_env: env.update(extra_env)
    args = [BIN, "server", "--client-addr", f"127.0.0.1:{cp}", "--http-addr", f"127.0.0.1:{hp}", "--data-dir", d] + list(extra_args)
    if config: args += ["--config", config]
    log = open(f"{WORK}/log_{tag}.txt", "w")
    p = subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)
    for _ in range(100):
        try:
            c = Conn(cp, timeout=2); c.close(); break
        except Exception: time.sleep(0.1)
    time.sleep(0.3)
    return p, cp, hp, d

def rss(pid):
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmRSS"): return int(l.split()[1]) // 1024
