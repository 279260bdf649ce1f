"""Real middleboxes from Debian's packages, started on 127.0.0.1 in front of an upstream URL.

Each kind is one proxy with one body limit, run as a foreground process of its own (its
config, logs and pid file under ``workdir``; never a system service), stopped by its PID.
Its access log is written in a three-field format of ours, so a test counts what the
middlebox really saw — SDK retries included — with :meth:`Middlebox.requests`::

    box = start("haproxy-403", emu.url, limit=48 * 1024, workdir=tmp_path)
    try:
        ...  # an SDK client with base_url=box.url (and a proxy of box.proxy, for squid)
        rejected = [r for r in box.requests() if r.status != 200]
    finally:
        box.stop()

The kinds (``limit`` is the body size in bytes above which a request is refused), and
what an SDK client sees for a body over it (as observed with Debian 12's packages):

- ``nginx-413``: ``client_max_body_size`` — nginx's 413 HTML page.
- ``nginx-444``: the same limit answered with ``return 444``: nginx logs 444 and sends
  nothing; the client sees the connection closed with no response (httpx's
  RemoteProtocolError) or reset while it still sends the body (ConnectionResetError).
- ``apache-413``: Apache 2.4 reverse proxy — 413, Apache's HTML page. Debian's 2.4.71
  does not apply ``LimitRequestBody`` to proxied requests (checked: a body over it reaches
  the upstream), so a mod_rewrite rule on Content-Length gives Apache's own 413.
- ``modsec``: Apache + ModSecurity 2.9 + the OWASP CRS 3.3 as Debian ships them
  (paranoia level 1), ``SecRuleEngine On``, ``SecRequestBodyLimit`` with ``Reject`` —
  413, the same Apache page; a body CRS blocks for its content gets 403, Apache's
  "Forbidden" page. Reached at 127.0.0.1, every request scores 3 (rule 920350, "Host
  header is a numeric IP address"): 2 more from any rule blocks it.
- ``haproxy-403`` / ``haproxy-413``: ``option http-buffer-request`` and a deny on
  ``req.body_size`` — HAProxy's HTML pages ("Request forbidden by administrative rules",
  "Payload Too Large").
- ``squid``: a forward proxy (``request_body_max_size``); ``url`` is the upstream itself
  and ``proxy`` the proxy URL the client must use — 413, ``X-Squid-Error: ERR_TOO_BIG 0``.
- ``caddy``: ``request_body { max_size }`` before ``reverse_proxy`` — an empty 502 to the
  client; the upstream gets the original Content-Length and the body cut at the limit.

``Logged.body_bytes`` is the request's declared Content-Length (None when it had none).
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

__all__ = ["KINDS", "Logged", "Middlebox", "missing", "start"]

KINDS = ("apache-413", "modsec", "haproxy-403", "haproxy-413", "squid", "caddy",
         "nginx-413", "nginx-444")

APACHE_MODULES = Path("/usr/lib/apache2/modules")
CRS_LOAD = Path("/usr/share/modsecurity-crs/owasp-crs.load")
MODSEC_RECOMMENDED = Path("/etc/modsecurity/modsecurity.conf-recommended")
START_TIMEOUT = 20.0
STOP_TIMEOUT = 15.0
# Upstream timeouts well above any turn: a middlebox must never time out on its own here.
PROXY_TIMEOUT = 120
# How long requests() waits for the access log to stop growing: a log line is written
# after the response has gone out, so a read right after a reply could miss its own line.
LOG_SETTLE = 0.15

_PACKAGES = {"apache-413": "apache2", "modsec": "apache2 libapache2-mod-security2 modsecurity-crs",
             "haproxy-403": "haproxy", "haproxy-413": "haproxy", "squid": "squid",
             "caddy": "caddy", "nginx-413": "nginx-light", "nginx-444": "nginx-light"}
_BINARIES = {"apache-413": "apache2", "modsec": "apache2", "haproxy-403": "haproxy",
             "haproxy-413": "haproxy", "squid": "squid", "caddy": "caddy",
             "nginx-413": "nginx", "nginx-444": "nginx"}


@dataclass(frozen=True)
class Logged:
    """One request as the middlebox logged it."""

    status: int
    body_bytes: int | None
    path: str


@dataclass
class Middlebox:
    """A running middlebox (see the module docstring)."""

    kind: str
    url: str
    proxy: str | None
    limit: int
    pid: int
    access_log: Path
    _proc: subprocess.Popen[bytes] = field(repr=False)
    _parse: Callable[[str], Logged | None] = field(repr=False)
    _workdir: Path = field(repr=False)
    _outside: list[Path] = field(default_factory=list, repr=False)

    def requests(self) -> list[Logged]:
        """Every request logged so far, in order (waits for the log to settle first)."""
        text = _settled(self.access_log)
        return [found for line in text.splitlines() if (found := self._parse(line))]

    def stop(self) -> None:
        """Stop the process by its PID (TERM, then KILL); idempotent. Files it wrote
        outside ``workdir`` (see ``_writable_by``) are moved into it, ``access_log`` too."""
        _stop(self._proc)
        for folder in self._outside:
            for item in sorted(folder.iterdir()):
                if item.is_file() and not (self._workdir / item.name).exists():
                    shutil.move(item, self._workdir / item.name)
                    if item == self.access_log:
                        self.access_log = self._workdir / item.name
            shutil.rmtree(folder, ignore_errors=True)
        self._outside.clear()


def binary(kind: str) -> str | None:
    """The path of the kind's executable, or None."""
    name = _BINARIES[kind]
    found = shutil.which(name)
    if found:
        return found
    for folder in ("/usr/sbin", "/usr/bin"):
        if os.access(f"{folder}/{name}", os.X_OK):
            return f"{folder}/{name}"
    return None


def missing(kind: str) -> str | None:
    """A one-line reason why ``kind`` cannot run here, or None when it can."""
    if kind not in KINDS:
        raise ValueError(f"unknown middlebox {kind!r}; use one of {', '.join(KINDS)}")
    needed: list[Path] = []
    if kind in ("apache-413", "modsec"):
        needed += [APACHE_MODULES / f"mod_{m}.so" for m in _apache_modules(kind)]
    if kind == "modsec":
        needed += [CRS_LOAD, MODSEC_RECOMMENDED]
    absent = [str(p) for p in needed if not p.exists()]
    if binary(kind) is None:
        absent.insert(0, _BINARIES[kind])
    if not absent:
        return None
    return (f"{kind}: {', '.join(absent)} not found (apt-get install {_PACKAGES[kind]}); "
            "the middlebox cannot run")


def start(kind: str, upstream: str, *, limit: int, workdir: Path) -> Middlebox:
    """Start ``kind`` on a free 127.0.0.1 port in front of ``upstream`` (a base URL such as
    ``http://127.0.0.1:8000``), refusing bodies over ``limit`` bytes; returns once it listens."""
    reason = missing(kind)
    if reason is not None:
        raise RuntimeError(reason)
    exe = binary(kind)
    assert exe is not None
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    parts = urlsplit(upstream)
    up = f"{parts.hostname}:{parts.port}"
    port = _free_port()
    recipe = _RECIPES[kind]
    launch = recipe(exe, kind, workdir, port, up, limit)
    try:
        with (workdir / "stdout.log").open("wb") as stdout:
            proc = subprocess.Popen(launch.argv, stdout=stdout, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=launch.env, cwd=workdir,
                                    start_new_session=True)
    except BaseException:
        for folder in launch.outside:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    box = Middlebox(kind=kind, url=f"http://127.0.0.1:{port}" if kind != "squid" else upstream,
                    proxy=f"http://127.0.0.1:{port}" if kind == "squid" else None,
                    limit=limit, pid=proc.pid, access_log=launch.access_log, _proc=proc,
                    _parse=launch.parse, _workdir=workdir, _outside=launch.outside)
    try:
        _wait_listening(port, proc, workdir)
    except BaseException:
        box.stop()
        raise
    return box


# -- process plumbing ------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _logs(workdir: Path) -> str:
    """The tails of the middlebox's own logs, for a start-up failure's message."""
    out = []
    for name in ("stdout.log", "error.log", "cache.log"):
        path = workdir / name
        if path.exists():
            out.append(f"--- {name}\n{path.read_text(errors='replace')[-2000:]}")
    return "\n".join(out)


def _wait_listening(port: int, proc: subprocess.Popen[bytes], workdir: Path) -> None:
    name = Path(str(proc.args[0] if isinstance(proc.args, list) else proc.args)).name
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{_logs(workdir)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{name} did not listen on 127.0.0.1:{port} within "
                       f"{START_TIMEOUT}s:\n{_logs(workdir)}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """TERM to the PID (each program stops its own children on it), then KILL to its
    process group — started with its own session, so the group's id is that PID and
    holds only what it spawned (Apache's child). The group is killed only while its
    leader is alive and unreaped, so the id cannot belong to anyone else."""
    if proc.poll() is not None:
        return
    try:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=STOP_TIMEOUT)
        return
    except subprocess.TimeoutExpired:
        pass
    except ProcessLookupError:
        proc.wait()
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _settled(path: Path) -> str:
    """The file's text once two reads ``LOG_SETTLE`` apart agree (at most ~2 s)."""
    last = None
    for _ in range(int(2 / LOG_SETTLE)):
        text = path.read_text(errors="replace") if path.exists() else ""
        if text == last:
            return text
        last = text
        time.sleep(LOG_SETTLE)
    return last or ""


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment without proxy variables (nothing may leave 127.0.0.1)."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(extra)
    return env


def _unprivileged() -> tuple[str, str] | None:
    """When root, the user Apache and Squid drop to (they refuse to serve as root)."""
    if os.geteuid() != 0:
        return None
    for name in ("www-data", "proxy", "nobody"):
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        return name, grp.getgrgid(entry.pw_gid).gr_name
    return None


def _writable_by(user: tuple[str, str] | None, prefix: str) -> Path:
    """A private directory the dropped-privilege user can write: test tmp dirs sit under
    a root-only parent (``/tmp/pytest-of-root``, mode 0700) it cannot even traverse. Its
    files are moved into ``workdir`` and it is removed when the middlebox stops."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    if user is not None:
        shutil.chown(path, user[0], user[1])
    return path


# -- log lines ---------------------------------------------------------------------------------

def _int_or_none(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def _three_fields(line: str) -> Logged | None:
    """``STATUS CONTENT-LENGTH PATH`` (``-`` for no Content-Length), as every config here
    writes it except Caddy's."""
    fields = line.split()
    if len(fields) < 3 or not fields[0].isdigit():
        return None
    path = fields[2]
    if path.startswith("error:"):  # Squid's record of a connection that sent no request
        return None
    if "://" in path:           # an absolute-form target (forward proxy)
        path = urlsplit(path).path or "/"
    return Logged(int(fields[0]), _int_or_none(fields[1].strip('"')), path)


def _caddy_line(line: str) -> Logged | None:
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    if "status" not in entry or "request" not in entry:
        return None
    request = entry["request"]
    length = (request.get("headers") or {}).get("Content-Length") or [None]
    return Logged(int(entry["status"]), _int_or_none(str(length[0])),
                  urlsplit(request.get("uri", "")).path)


# -- recipes: one function per program ------------------------------------------------------------

@dataclass
class _Launch:
    argv: list[str]
    access_log: Path
    parse: Callable[[str], Logged | None]
    env: dict[str, str] = field(default_factory=_clean_env)
    outside: list[Path] = field(default_factory=list)   # dirs made by _writable_by


def _nginx(exe: str, kind: str, workdir: Path, port: int, up: str, limit: int) -> _Launch:
    access = workdir / "access.log"
    temp = "\n".join(f"  {name}_temp_path {workdir / name};"
                     for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    # 444 is nginx's "close the connection, say nothing": hung on the 413 nginx raises
    # for the size limit, so the drop happens at exactly the same bodies as nginx-413.
    drop = ("    error_page 413 = @drop;\n    location @drop { return 444; }\n"
            if kind == "nginx-444" else "")
    conf = workdir / "nginx.conf"
    conf.write_text(f"""{"user root;" if os.geteuid() == 0 else ""}
daemon off;
master_process off;
pid {workdir / "nginx.pid"};
error_log {workdir / "error.log"} warn;
events {{ worker_connections 64; }}
http {{
  log_format boxes '$status $content_length $uri';
  access_log {access} boxes;
{temp}
  server {{
    listen 127.0.0.1:{port};
    client_max_body_size {limit};
    client_body_buffer_size {limit};
{drop}    location / {{
      proxy_pass http://{up};
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering on;
      proxy_read_timeout {PROXY_TIMEOUT}s;
    }}
  }}
}}
""")
    return _Launch([exe, "-p", str(workdir), "-e", str(workdir / "error.log"), "-c", str(conf)],
                   access, _three_fields)


def _apache_modules(kind: str) -> list[str]:
    mods = ["mpm_event", "authz_core", "proxy", "proxy_http", "rewrite"]
    if kind == "modsec":
        mods += ["unique_id", "security2"]
    return mods


def _apache(exe: str, kind: str, workdir: Path, port: int, up: str, limit: int) -> _Launch:
    access = workdir / "access.log"
    user = _unprivileged()
    run = workdir / "run"
    run.mkdir(exist_ok=True)
    outside: list[Path] = []
    loads = "\n".join(f"LoadModule {m}_module {APACHE_MODULES / f'mod_{m}.so'}"
                      for m in _apache_modules(kind))
    if kind == "apache-413":
        # LimitRequestBody is not applied to proxied requests on Debian's 2.4: refuse on
        # the declared length with mod_rewrite, which answers with Apache's own 413 page.
        guard = f"""RewriteEngine On
RewriteCond %{{HTTP:Content-Length}} -gt{limit}
RewriteRule ^ - [R=413,L]"""
    else:
        # ModSecurity writes its collections (CRS keeps one per client IP) as the user
        # Apache drops to: a directory that user can reach.
        data = _writable_by(user, "modsec-")
        outside.append(data)
        guard = f"""# Debian ships modsecurity.conf-recommended for the admin to copy: taken whole
# (SecRequestBodyAccess On, the JSON body processor for application/json), then what an
# admin changes to enforce: the engine on and the body limit.
Include {MODSEC_RECOMMENDED}
SecRuleEngine On
SecRequestBodyLimit {limit}
SecRequestBodyNoFilesLimit {limit}
SecRequestBodyLimitAction Reject
SecAuditLog {workdir / "modsec_audit.log"}
SecTmpDir {data}
SecDataDir {data}
Include {CRS_LOAD}"""
    conf = workdir / "apache2.conf"
    conf.write_text(f"""ServerRoot "{workdir}"
ServerName 127.0.0.1
Listen 127.0.0.1:{port}
PidFile {workdir / "apache2.pid"}
DefaultRuntimeDir {run}
Mutex file:{run} default
ErrorLog {workdir / "error.log"}
LogLevel warn
{loads}
{f"User {user[0]}" if user else ""}
{f"Group {user[1]}" if user else ""}
LogFormat "%>s %{{Content-Length}}i %U" boxes
CustomLog {access} boxes
Timeout {PROXY_TIMEOUT}
KeepAlive On
# One child with a few threads: the clients' keep-alive connections must not queue
# behind each other (``-X`` serves one connection at a time).
ServerLimit 1
StartServers 1
ThreadsPerChild 8
MaxRequestWorkers 8
{guard}
ProxyRequests Off
ProxyPass / http://{up}/
ProxyPassReverse / http://{up}/
""")
    # -DFOREGROUND: the parent stays in the foreground (its PID is ours) and stops its
    # child when it gets TERM.
    return _Launch([exe, "-DFOREGROUND", "-d", str(workdir), "-f", str(conf)], access,
                   _three_fields,
                   env=_clean_env(LANG="C"), outside=outside)


def _haproxy(exe: str, kind: str, workdir: Path, port: int, up: str, limit: int) -> _Launch:
    status = 403 if kind == "haproxy-403" else 413
    conf = workdir / "haproxy.cfg"
    # req.body_size only sees what fits in one buffer: tune.bufsize well above the limit
    # (and its headers), so a body over the limit is seen as over the limit.
    bufsize = max(16384, 2 * limit + 16384)
    conf.write_text(f"""global
  tune.bufsize {bufsize}
  log stdout format raw daemon
  pidfile {workdir / "haproxy.pid"}
defaults
  mode http
  log global
  option http-buffer-request
  # The harness probes the port with a bare connect: not a request.
  option dontlognull
  timeout connect 5s
  timeout client {PROXY_TIMEOUT}s
  timeout server {PROXY_TIMEOUT}s
  timeout http-request {PROXY_TIMEOUT}s
frontend boxes
  bind 127.0.0.1:{port}
  http-request capture req.hdr(content-length) len 12
  log-format "%ST %[capture.req.hdr(0)] %HPO"
  http-request deny deny_status {status} if {{ req.body_size gt {limit} }}
  default_backend upstream
backend upstream
  server emulator {up}
""")
    # -db: stay in the foreground, one process; its log goes to stdout, i.e. access.log.
    access = workdir / "stdout.log"
    return _Launch([exe, "-db", "-f", str(conf)], access, _three_fields)


def _squid(exe: str, kind: str, workdir: Path, port: int, up: str, limit: int) -> _Launch:
    user = _unprivileged()
    # Squid writes its logs as the user it drops to: they live where that user can write.
    logs = _writable_by(user, "squid-")
    access = logs / "access.log"
    conf = workdir / "squid.conf"
    conf.write_text(f"""http_port 127.0.0.1:{port}
{f"cache_effective_user {user[0]}" if user else ""}
{f"cache_effective_group {user[1]}" if user else ""}
acl to_upstream dst 127.0.0.1
http_access allow localhost to_upstream
http_access deny all
request_body_max_size {limit} bytes
cache deny all
logformat boxes %>Hs %{{Content-Length}}>h %ru
access_log stdio:{access} boxes
cache_log {logs / "cache.log"}
cache_store_log none
pid_filename {logs / "squid.pid"}
coredump_dir {logs}
visible_hostname boxes.test
pinger_enable off
icp_port 0
htcp_port 0
shutdown_lifetime 0 seconds
# Nothing leaves 127.0.0.1, not even Squid's DNS client socket (it binds all addresses).
dns_nameservers 127.0.0.1
udp_incoming_address 127.0.0.1
udp_outgoing_address 127.0.0.1
read_timeout {PROXY_TIMEOUT} seconds
forward_timeout {PROXY_TIMEOUT} seconds
""")
    return _Launch([exe, "-N", "-f", str(conf)], access, _three_fields, outside=[logs])


def _caddy(exe: str, kind: str, workdir: Path, port: int, up: str, limit: int) -> _Launch:
    access = workdir / "access.log"
    conf = workdir / "Caddyfile"
    conf.write_text(f"""{{
  admin off
  auto_https off
}}
http://127.0.0.1:{port} {{
  # The site address only matches requests: without bind, Caddy listens on every address.
  bind 127.0.0.1
  log {{
    output file {access}
    format json
  }}
  request_body {{
    max_size {limit}B
  }}
  reverse_proxy {up}
}}
""")
    # Caddy keeps its state under HOME/XDG: all of it inside workdir.
    env = _clean_env(HOME=str(workdir), XDG_DATA_HOME=str(workdir / "data"),
                     XDG_CONFIG_HOME=str(workdir / "config"))
    return _Launch([exe, "run", "--config", str(conf), "--adapter", "caddyfile",
                    "--pidfile", str(workdir / "caddy.pid")], access, _caddy_line, env=env)


_RECIPES: dict[str, Callable[[str, str, Path, int, str, int], _Launch]] = {
    "apache-413": _apache, "modsec": _apache, "haproxy-403": _haproxy,
    "haproxy-413": _haproxy, "squid": _squid, "caddy": _caddy, "nginx-413": _nginx,
    "nginx-444": _nginx,
}
