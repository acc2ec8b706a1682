import os, sys; sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bc import *
ADMINPW = "admin-pass-123456"
def start_auth(tag, extra_env=None):
    env = {"BRAID_AUTHENTICATION":"true", "BRAID_ADMIN_PASSWORD":ADMINPW}
    if extra_env: env.update(extra_env)
    return start_server(tag, extra_env=env)
def admin(cp, src=None):
    c = Conn(cp, src=src); st, m = login(c, "admin", ADMINPW); assert st == 0, m; return c
def grant(name, kind, stream, perms): return s(name) + u8(kind) + s(stream) + u8(perms)
